//! The SEV-SNP attestation report (AMD SEV-SNP ABI, `ATTESTATION_REPORT`): 1184 bytes, signed
//! over its first 0x2A0 bytes.
//!
//! The fields are read at their fixed offsets (AMD SEV-SNP ABI specification, table
//! "ATTESTATION_REPORT Structure"), and everything a careful parser checks is checked: the exact
//! length, the versions this verifier knows, the reserved ranges that must be zero, the reserved
//! policy bit that must be one, the signature algorithm, and the signature's unused high bytes.
//!
//! Why not the `sev` crate's decoder: it needs the CPU generation to decode the TCB fields and
//! guesses it from the report, so it refuses version 2 reports whose CHIP_ID is masked (AWS's
//! VLEK-signed reports are such reports). Here the TCB is decoded for the product the
//! certificate chain names (Turin moved the fields), so the product is never assumed from
//! unsigned data.

use super::{Product, SnpError};

/// The size of a report.
pub const REPORT_LEN: usize = 0x4A0;
/// The signature covers bytes `0..SIGNED_LEN`.
pub const SIGNED_LEN: usize = 0x2A0;

/// Report versions this verifier knows the layout of: 2, 3 (and 4, its firmware-only successor
/// with the same layout) and 5.
const KNOWN_VERSIONS: [u32; 4] = [2, 3, 4, 5];

/// ECDSA P-384 with SHA-384, the only signature algorithm AMD defines for reports.
const SIG_ALGO_ECDSA_P384_SHA384: u32 = 1;

const OFFSET_CURRENT_TCB: usize = 0x38;
const OFFSET_PLATFORM_INFO: usize = 0x40;
const OFFSET_FLAGS: usize = 0x48;
const OFFSET_REPORTED_TCB: usize = 0x180;
const OFFSET_COMMITTED_TCB: usize = 0x1E0;
const OFFSET_LAUNCH_TCB: usize = 0x1F0;
const OFFSET_SIGNATURE: usize = 0x2A0;
/// r and s are 72-byte little-endian fields, of which P-384 uses 48 bytes.
const SIG_COMPONENT_LEN: usize = 72;
const P384_LEN: usize = 48;

/// Which key signed the report (bits 2–4 of the flags at 0x48).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigningKey {
    /// The chip's versioned chip endorsement key.
    Vcek,
    /// A cloud provider's versioned loaded endorsement key.
    Vlek,
}

impl std::fmt::Display for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SigningKey::Vcek => "VCEK",
            SigningKey::Vlek => "VLEK",
        })
    }
}

/// A TCB version, decoded for one product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tcb {
    /// Turin's FMC SVN; `None` before Turin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fmc: Option<u8>,
    pub bootloader: u8,
    pub tee: u8,
    pub snp: u8,
    pub microcode: u8,
}

impl Tcb {
    /// Decodes a TCB_VERSION for `product`: Milan and Genoa keep BL, TEE, SNP and microcode in
    /// bytes 0, 1, 6 and 7; Turin has FMC, BL, TEE, SNP in bytes 0–3 and microcode in byte 7.
    pub fn decode(raw: u64, product: Product) -> Tcb {
        let b = raw.to_le_bytes();
        match product {
            Product::Milan | Product::Genoa => Tcb {
                fmc: None,
                bootloader: b[0],
                tee: b[1],
                snp: b[6],
                microcode: b[7],
            },
            Product::Turin => Tcb {
                fmc: Some(b[0]),
                bootloader: b[1],
                tee: b[2],
                snp: b[3],
                microcode: b[7],
            },
        }
    }

    /// Encodes the TCB_VERSION for `product`; the inverse of [`Tcb::decode`] (Turin's FMC is
    /// zero when absent).
    pub fn encode(&self, product: Product) -> u64 {
        let mut b = [0u8; 8];
        match product {
            Product::Milan | Product::Genoa => {
                b[0] = self.bootloader;
                b[1] = self.tee;
                b[6] = self.snp;
                b[7] = self.microcode;
            }
            Product::Turin => {
                b[0] = self.fmc.unwrap_or(0);
                b[1] = self.bootloader;
                b[2] = self.tee;
                b[3] = self.snp;
                b[7] = self.microcode;
            }
        }
        u64::from_le_bytes(b)
    }

    /// Whether every component is at least `min`'s.
    pub fn at_least(&self, min: &Tcb) -> bool {
        self.fmc.unwrap_or(0) >= min.fmc.unwrap_or(0)
            && self.bootloader >= min.bootloader
            && self.tee >= min.tee
            && self.snp >= min.snp
            && self.microcode >= min.microcode
    }
}

impl std::fmt::Display for Tcb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(fmc) = self.fmc {
            write!(f, "fmc {fmc} ")?;
        }
        write!(
            f,
            "bl {} tee {} snp {} ucode {}",
            self.bootloader, self.tee, self.snp, self.microcode
        )
    }
}

/// A report whose layout has been checked; nothing in it is trusted until
/// [`super::verify_report`] has verified its signature.
#[derive(Clone, Debug)]
pub struct Report {
    raw: Box<[u8; REPORT_LEN]>,
    signing_key: SigningKey,
}

impl Report {
    /// Parses exactly one report. Trailing bytes are refused: a report is a fixed-size structure
    /// (callers that hold a report inside a larger buffer slice it out first).
    pub fn parse(bytes: &[u8]) -> Result<Report, SnpError> {
        let raw: &[u8; REPORT_LEN] = bytes
            .try_into()
            .map_err(|_| SnpError::ReportLength(bytes.len()))?;
        let version = u32_at(raw, 0);
        if !KNOWN_VERSIONS.contains(&version) {
            return Err(SnpError::ReportVersion(version));
        }
        check_reserved(raw, version)?;
        let sig_algo = u32_at(raw, 0x34);
        if sig_algo != SIG_ALGO_ECDSA_P384_SHA384 {
            return Err(SnpError::ReportField(format!(
                "signature algorithm {sig_algo}, expected 1 (ECDSA P-384 with SHA-384)"
            )));
        }
        let policy = u64_at(raw, 0x08);
        if policy & (1 << 17) == 0 {
            return Err(SnpError::ReportField(
                "guest policy bit 17 (reserved, must be one) is zero".to_owned(),
            ));
        }
        if policy >> 26 != 0 {
            return Err(SnpError::ReportField(format!(
                "guest policy 0x{policy:x} sets reserved bits above 25"
            )));
        }
        let flags = u32_at(raw, OFFSET_FLAGS);
        let signing_key = match (flags >> 2) & 0b111 {
            0 => SigningKey::Vcek,
            1 => SigningKey::Vlek,
            7 => {
                return Err(SnpError::ReportField(
                    "the report is unsigned (signing key 7: none)".to_owned(),
                ));
            }
            other => {
                return Err(SnpError::ReportField(format!(
                    "signing key {other} is reserved"
                )));
            }
        };
        if flags >> 5 != 0 {
            return Err(SnpError::ReportField(format!(
                "flags 0x{flags:x} set reserved bits above 4"
            )));
        }
        for component in [
            &raw[OFFSET_SIGNATURE..OFFSET_SIGNATURE + SIG_COMPONENT_LEN],
            &raw[OFFSET_SIGNATURE + SIG_COMPONENT_LEN..OFFSET_SIGNATURE + 2 * SIG_COMPONENT_LEN],
        ] {
            if component[P384_LEN..].iter().any(|&b| b != 0) {
                return Err(SnpError::ReportField(
                    "a signature component is longer than 48 bytes".to_owned(),
                ));
            }
        }
        Ok(Report {
            raw: Box::new(*raw),
            signing_key,
        })
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.raw[..SIGNED_LEN]
    }

    /// The signature as the provider's fixed-size big-endian `r ‖ s`.
    pub fn signature_fixed(&self) -> [u8; 2 * P384_LEN] {
        let mut out = [0u8; 2 * P384_LEN];
        for (i, start) in [OFFSET_SIGNATURE, OFFSET_SIGNATURE + SIG_COMPONENT_LEN]
            .into_iter()
            .enumerate()
        {
            let le = &self.raw[start..start + P384_LEN];
            for (j, byte) in le.iter().rev().enumerate() {
                out[i * P384_LEN + j] = *byte;
            }
        }
        out
    }

    /// The raw report.
    pub fn as_bytes(&self) -> &[u8] {
        self.raw.as_slice()
    }

    pub fn version(&self) -> u32 {
        u32_at(self.raw.as_slice(), 0)
    }

    pub fn guest_svn(&self) -> u32 {
        u32_at(self.raw.as_slice(), 0x04)
    }

    pub fn signing_key(&self) -> SigningKey {
        self.signing_key
    }

    /// Whether MASK_CHIP_ID was set: CHIP_ID is then zero and cannot name the chip.
    pub fn chip_id_masked(&self) -> bool {
        u32_at(self.raw.as_slice(), OFFSET_FLAGS) & 0b10 != 0
    }

    pub fn policy(&self) -> u64 {
        u64_at(self.raw.as_slice(), 0x08)
    }

    pub fn family_id(&self) -> &[u8; 16] {
        self.array(0x10)
    }

    pub fn image_id(&self) -> &[u8; 16] {
        self.array(0x20)
    }

    pub fn vmpl(&self) -> u32 {
        u32_at(self.raw.as_slice(), 0x30)
    }

    pub fn report_data(&self) -> &[u8; 64] {
        self.array(0x50)
    }

    pub fn measurement(&self) -> &[u8; 48] {
        self.array(0x90)
    }

    pub fn host_data(&self) -> &[u8; 32] {
        self.array(0xC0)
    }

    pub fn id_key_digest(&self) -> &[u8; 48] {
        self.array(0xE0)
    }

    pub fn author_key_digest(&self) -> &[u8; 48] {
        self.array(0x110)
    }

    pub fn report_id(&self) -> &[u8; 32] {
        self.array(0x140)
    }

    pub fn chip_id(&self) -> &[u8; 64] {
        self.array(0x1A0)
    }

    /// The firmware version (major, minor, build) now and when last committed.
    pub fn current_version(&self) -> (u8, u8, u8) {
        (self.raw[0x1EA], self.raw[0x1E9], self.raw[0x1E8])
    }

    pub fn committed_version(&self) -> (u8, u8, u8) {
        (self.raw[0x1EE], self.raw[0x1ED], self.raw[0x1EC])
    }

    fn array<const N: usize>(&self, offset: usize) -> &[u8; N] {
        self.raw[offset..offset + N]
            .try_into()
            .unwrap_or_else(|_| unreachable!("offsets lie inside the fixed-size report"))
    }

    pub fn platform_info(&self) -> u64 {
        u64_at(self.raw.as_slice(), OFFSET_PLATFORM_INFO)
    }

    /// The CPUID family and model the firmware wrote (versions 3 and later).
    pub fn cpuid(&self) -> Option<(u8, u8)> {
        (self.version() >= 3).then(|| (self.raw[0x188], self.raw[0x189]))
    }

    pub fn reported_tcb(&self, product: Product) -> Tcb {
        Tcb::decode(u64_at(self.raw.as_slice(), OFFSET_REPORTED_TCB), product)
    }

    pub fn current_tcb(&self, product: Product) -> Tcb {
        Tcb::decode(u64_at(self.raw.as_slice(), OFFSET_CURRENT_TCB), product)
    }

    pub fn committed_tcb(&self, product: Product) -> Tcb {
        Tcb::decode(u64_at(self.raw.as_slice(), OFFSET_COMMITTED_TCB), product)
    }

    pub fn launch_tcb(&self, product: Product) -> Tcb {
        Tcb::decode(u64_at(self.raw.as_slice(), OFFSET_LAUNCH_TCB), product)
    }
}

/// The reserved ranges of each layout, all of which must be zero.
fn check_reserved(raw: &[u8; REPORT_LEN], version: u32) -> Result<(), SnpError> {
    let cpuid_end = if version >= 3 { 0x18B } else { 0x188 };
    let mut ranges: Vec<(usize, usize)> = vec![
        (0x4C, 0x50),
        (cpuid_end, 0x1A0),
        (0x1EB, 0x1EC),
        (0x1EF, 0x1F0),
        (OFFSET_SIGNATURE + 2 * SIG_COMPONENT_LEN, REPORT_LEN),
    ];
    ranges.push(if version >= 5 {
        (0x208, SIGNED_LEN)
    } else {
        (0x1F8, SIGNED_LEN)
    });
    for (start, end) in ranges {
        if let Some(offset) = raw[start..end].iter().position(|&b| b != 0) {
            return Err(SnpError::ReportReserved(start + offset));
        }
    }
    Ok(())
}

fn u32_at(raw: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&raw[offset..offset + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(raw: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[offset..offset + 8]);
    u64::from_le_bytes(b)
}
