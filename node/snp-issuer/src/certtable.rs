//! The SNP certificate table: the certificates the hypervisor hands a guest with its extended
//! report (configfs-tsm's `auxblob` when the provider is `sev_guest`; the certificate buffer of
//! `SNP_GET_EXT_REPORT`).
//!
//! Layout (AMD's GHCB specification, "SNP Extended Guest Request"): a header of entries, each a
//! 16-byte GUID, a little-endian u32 offset and a little-endian u32 length, ended by an entry of
//! 24 zero bytes; each offset counts from the start of the table and points past the header.
//! The GUID bytes are in the order its text form is written (as go-sev-guest reads them).
//!
//! The table comes from the host, which the guest does not trust: the certificates are only
//! carried to the verifier, which checks them against AMD's root. This parser only has to refuse
//! malformed tables clearly and never read outside the buffer.

use std::fmt;

/// A certificate table entry's key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guid(pub [u8; 16]);

impl Guid {
    /// AMD's root key (ARK).
    pub const ARK: Guid = Guid([
        0xc0, 0xb4, 0x06, 0xa4, 0xa8, 0x03, 0x49, 0x52, 0x97, 0x43, 0x3f, 0xb6, 0x01, 0x4c, 0xd0,
        0xae,
    ]);
    /// AMD's signing key (ASK), or for a VLEK the ASVK.
    pub const ASK: Guid = Guid([
        0x4a, 0xb7, 0xb3, 0x79, 0xbb, 0xac, 0x4f, 0xe4, 0xa0, 0x2f, 0x05, 0xae, 0xf3, 0x27, 0xc7,
        0x82,
    ]);
    /// The chip's versioned endorsement key (VCEK).
    pub const VCEK: Guid = Guid([
        0x63, 0xda, 0x75, 0x8d, 0xe6, 0x64, 0x45, 0x64, 0xad, 0xc5, 0xf4, 0xb9, 0x3b, 0xe8, 0xac,
        0xcd,
    ]);
    /// A cloud provider's versioned loaded endorsement key (VLEK).
    pub const VLEK: Guid = Guid([
        0xa8, 0x07, 0x4b, 0xc2, 0xa2, 0x5a, 0x48, 0x3e, 0xaa, 0xe6, 0x39, 0xc0, 0x45, 0xa0, 0xb8,
        0xa1,
    ]);

    /// The name of a GUID this crate knows, for messages.
    pub fn name(&self) -> Option<&'static str> {
        match *self {
            Guid::ARK => Some("ARK"),
            Guid::ASK => Some("ASK"),
            Guid::VCEK => Some("VCEK"),
            Guid::VLEK => Some("VLEK"),
            _ => None,
        }
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        let hex = |r: std::ops::Range<usize>| -> String {
            b[r].iter().map(|x| format!("{x:02x}")).collect()
        };
        write!(
            f,
            "{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}({self})"),
            None => write!(f, "{self}"),
        }
    }
}

/// The size of one header entry.
pub const ENTRY_SIZE: usize = 24;
/// The largest table accepted: the kernel's limit for the certificate buffer is a few pages
/// (`SEV_FW_BLOB_MAX_SIZE`, 16 KiB) and configfs caps outblobs at 32 KiB; AMD certificates are
/// under 2 KiB each.
pub const MAX_TABLE: usize = 64 * 1024;

/// Why a certificate table was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertTableError {
    #[error("the certificate table has {0} bytes, more than the limit of {MAX_TABLE}")]
    TooLarge(usize),
    #[error(
        "the certificate table ends inside entry {index} of its header (no all-zero end entry)"
    )]
    Unterminated { index: usize },
    #[error(
        "certificate table entry {index} ({guid:?}) points into the header: offset {offset}, the header ends at {header_end}"
    )]
    IntoHeader {
        index: usize,
        guid: Guid,
        offset: u32,
        header_end: usize,
    },
    #[error(
        "certificate table entry {index} ({guid:?}) points outside the table: offset {offset}, length {length}, table size {size}"
    )]
    OutOfBounds {
        index: usize,
        guid: Guid,
        offset: u32,
        length: u32,
        size: usize,
    },
    #[error("certificate table entry {index} has an empty certificate for {guid:?}")]
    Empty { index: usize, guid: Guid },
    #[error("the certificate table lists {guid:?} twice")]
    Duplicate { guid: Guid },
}

/// A parsed certificate table: each GUID with its certificate (DER, as the host gave it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertTable {
    entries: Vec<(Guid, Vec<u8>)>,
}

impl CertTable {
    /// Parses a table. An empty buffer is an empty table (a host with no certificates to give
    /// may return nothing at all); anything else needs its all-zero end entry.
    pub fn parse(bytes: &[u8]) -> Result<CertTable, CertTableError> {
        if bytes.len() > MAX_TABLE {
            return Err(CertTableError::TooLarge(bytes.len()));
        }
        if bytes.is_empty() {
            return Ok(CertTable::default());
        }
        let mut header = Vec::new();
        let mut chunks = bytes.chunks(ENTRY_SIZE);
        loop {
            let index = header.len();
            let entry = match chunks.next() {
                Some(entry) if entry.len() == ENTRY_SIZE => entry,
                _ => return Err(CertTableError::Unterminated { index }),
            };
            if entry.iter().all(|&b| b == 0) {
                break;
            }
            let mut guid = [0u8; 16];
            guid.copy_from_slice(&entry[..16]);
            let word = |at: usize| {
                u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
            };
            header.push((Guid(guid), word(16), word(20)));
        }
        let header_end = (header.len() + 1) * ENTRY_SIZE;
        let mut entries: Vec<(Guid, Vec<u8>)> = Vec::with_capacity(header.len());
        for (index, (guid, offset, length)) in header.into_iter().enumerate() {
            if (offset as usize) < header_end {
                return Err(CertTableError::IntoHeader {
                    index,
                    guid,
                    offset,
                    header_end,
                });
            }
            let end = (offset as usize).checked_add(length as usize);
            let Some(cert) = end.and_then(|end| bytes.get(offset as usize..end)) else {
                return Err(CertTableError::OutOfBounds {
                    index,
                    guid,
                    offset,
                    length,
                    size: bytes.len(),
                });
            };
            if cert.is_empty() {
                return Err(CertTableError::Empty { index, guid });
            }
            if entries.iter().any(|(g, _)| *g == guid) {
                return Err(CertTableError::Duplicate { guid });
            }
            entries.push((guid, cert.to_vec()));
        }
        Ok(CertTable { entries })
    }

    /// Lays out a table: the header, its end entry, then the certificates in order. What a
    /// host does; the simulated hardware of the tests uses it.
    pub fn encode(entries: &[(Guid, &[u8])]) -> Vec<u8> {
        let header_end = (entries.len() + 1) * ENTRY_SIZE;
        let mut out =
            Vec::with_capacity(header_end + entries.iter().map(|(_, c)| c.len()).sum::<usize>());
        let mut offset = header_end;
        for (guid, cert) in entries {
            out.extend_from_slice(&guid.0);
            out.extend_from_slice(&u32::try_from(offset).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(&u32::try_from(cert.len()).unwrap_or(u32::MAX).to_le_bytes());
            offset += cert.len();
        }
        out.extend_from_slice(&[0; ENTRY_SIZE]);
        for (_, cert) in entries {
            out.extend_from_slice(cert);
        }
        out
    }

    /// The certificate listed under `guid`.
    pub fn get(&self, guid: Guid) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(g, _)| *g == guid)
            .map(|(_, c)| c.as_slice())
    }

    /// Every entry, in the table's order.
    pub fn entries(&self) -> &[(Guid, Vec<u8>)] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn guids_print_as_amd_writes_them() {
        assert_eq!(
            Guid::VLEK.to_string(),
            "a8074bc2-a25a-483e-aae6-39c045a0b8a1"
        );
        assert_eq!(
            Guid::VCEK.to_string(),
            "63da758d-e664-4564-adc5-f4b93be8accd"
        );
        assert_eq!(
            Guid::ASK.to_string(),
            "4ab7b379-bbac-4fe4-a02f-05aef327c782"
        );
        assert_eq!(
            Guid::ARK.to_string(),
            "c0b406a4-a803-4952-9743-3fb6014cd0ae"
        );
    }

    #[test]
    fn a_table_round_trips_and_is_laid_out_as_the_spec_says() {
        let bytes = CertTable::encode(&[(Guid::VLEK, b"vlek-der"), (Guid::ARK, b"ark")]);
        // Two entries and the end entry, then the certificates.
        assert_eq!(bytes.len(), 3 * 24 + 8 + 3);
        assert_eq!(&bytes[..16], &Guid::VLEK.0);
        assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 72);
        assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), 8);
        assert_eq!(u32::from_le_bytes(bytes[40..44].try_into().unwrap()), 80);
        assert!(bytes[48..72].iter().all(|&b| b == 0));
        let table = CertTable::parse(&bytes).unwrap();
        assert_eq!(table.get(Guid::VLEK), Some(&b"vlek-der"[..]));
        assert_eq!(table.get(Guid::ARK), Some(&b"ark"[..]));
        assert_eq!(table.get(Guid::VCEK), None);
        assert_eq!(table.entries().len(), 2);
    }

    #[test]
    fn empty_buffers_and_lone_end_entries_are_empty_tables() {
        assert!(CertTable::parse(&[]).unwrap().is_empty());
        assert!(CertTable::parse(&[0; 24]).unwrap().is_empty());
        // A host's page-sized buffer: the end entry, then zero padding.
        assert!(CertTable::parse(&[0; 4096]).unwrap().is_empty());
    }

    #[test]
    fn malformed_tables_are_refused_by_name() {
        let good = CertTable::encode(&[(Guid::VLEK, b"vlek")]);
        // No end entry.
        assert_eq!(
            CertTable::parse(&good[..24]),
            Err(CertTableError::Unterminated { index: 1 })
        );
        assert_eq!(
            CertTable::parse(&good[..30]),
            Err(CertTableError::Unterminated { index: 1 })
        );
        // An offset into the header.
        let mut bad = good.clone();
        bad[16..20].copy_from_slice(&10u32.to_le_bytes());
        assert!(matches!(
            CertTable::parse(&bad),
            Err(CertTableError::IntoHeader {
                offset: 10,
                header_end: 48,
                ..
            })
        ));
        // A length past the end, and one that overflows.
        let mut bad = good.clone();
        bad[20..24].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            CertTable::parse(&bad),
            Err(CertTableError::OutOfBounds {
                length: 5,
                size: 52,
                ..
            })
        ));
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&[0xff; 8]);
        assert!(matches!(
            CertTable::parse(&bad),
            Err(CertTableError::OutOfBounds { .. })
        ));
        // An empty certificate; the same GUID twice.
        let empty = CertTable::encode(&[(Guid::VLEK, b"")]);
        assert!(matches!(
            CertTable::parse(&empty),
            Err(CertTableError::Empty { index: 0, .. })
        ));
        let twice = CertTable::encode(&[(Guid::ASK, b"a"), (Guid::ASK, b"b")]);
        assert_eq!(
            CertTable::parse(&twice),
            Err(CertTableError::Duplicate { guid: Guid::ASK })
        );
        assert_eq!(
            CertTable::parse(&vec![1; MAX_TABLE + 1]),
            Err(CertTableError::TooLarge(MAX_TABLE + 1))
        );
    }
}
