//! What join-core checks on each request before asking any backend.

use std::net::SocketAddr;

use plumbing::identity;
use tonic::metadata::MetadataMap;

use crate::error::RequestError;
use crate::keys::{MEASUREMENT_SECRET_ID, SSH_CA_SEED_ID};

/// Longest disk UUID accepted. LUKS UUIDs, what Constellation nodes send, are 36 characters.
pub const MAX_DISK_UUID_LEN: usize = 64;
/// Largest kubelet CSR accepted. A DER CSR with an RSA-4096 key and a handful of SANs is under
/// 2 KiB; anything near this limit is not a kubelet's.
pub const MAX_CSR_LEN: usize = 16 * 1024;

/// Who attest-proxy says the node is. Trusted only because the socket admits attest-proxy alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The attestation variant attest-proxy verified, e.g. `qemu-vtpm`.
    pub variant: String,
    /// The node's TCP address as attest-proxy saw it.
    pub peer_addr: SocketAddr,
    /// SHA-256 (hex) of the evidence attest-proxy verified; empty if it sent none (token-issuer
    /// then refuses control-plane files, which it releases only with this digest on record).
    pub evidence_sha256: String,
}

impl Identity {
    /// Reads the identity headers; a request without them did not pass the proxy's checks.
    pub fn from_metadata(metadata: &MetadataMap) -> Result<Self, RequestError> {
        let variant = header(metadata, identity::VARIANT)?;
        let peer_addr = header(metadata, identity::PEER_ADDR)?
            .parse()
            .map_err(|_| RequestError::MalformedIdentity {
                header: identity::PEER_ADDR,
            })?;
        let evidence_sha256 = match metadata.get(identity::EVIDENCE_SHA256) {
            None => String::new(),
            Some(value) => match value.to_str() {
                Ok(text) if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    text.to_ascii_lowercase()
                }
                _ => {
                    return Err(RequestError::MalformedIdentity {
                        header: identity::EVIDENCE_SHA256,
                    });
                }
            },
        };
        Ok(Self {
            variant: variant.to_owned(),
            peer_addr,
            evidence_sha256,
        })
    }
}

fn header<'a>(metadata: &'a MetadataMap, name: &'static str) -> Result<&'a str, RequestError> {
    let value = metadata
        .get(name)
        .ok_or(RequestError::NotForwarded { header: name })?;
    match value.to_str() {
        Ok(text) if !text.is_empty() => Ok(text),
        _ => Err(RequestError::MalformedIdentity { header: name }),
    }
}

/// The disk UUID becomes a key id at the key service, so it must not be able to name any other
/// key: only ASCII letters, digits and `-`, and never a key id join-core uses itself.
/// Case is kept as sent: a different spelling is a different key, as in Constellation.
pub fn check_disk_uuid(disk_uuid: &str) -> Result<(), RequestError> {
    let refuse = |reason: String| Err(RequestError::DiskUuid { reason });
    if disk_uuid.is_empty() {
        return refuse("empty".into());
    }
    if disk_uuid.len() > MAX_DISK_UUID_LEN {
        return refuse(format!(
            "{} bytes long; at most {MAX_DISK_UUID_LEN} allowed",
            disk_uuid.len()
        ));
    }
    if let Some(bad) = disk_uuid
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return refuse(format!(
            "contains {bad:?}; only ASCII letters, digits and '-' are allowed"
        ));
    }
    // Both already fail the character check above or would be refused here; stated outright
    // so that loosening that check can never hand a node the cluster's own keys.
    if disk_uuid == MEASUREMENT_SECRET_ID || disk_uuid == SSH_CA_SEED_ID {
        return refuse("names a reserved key".into());
    }
    Ok(())
}

/// Only the cheap checks; token-issuer parses and verifies the CSR itself.
pub fn check_certificate_request(der: &[u8]) -> Result<(), RequestError> {
    let refuse = |reason: String| Err(RequestError::CertificateRequest { reason });
    match der.first() {
        None => refuse("empty".into()),
        Some(_) if der.len() > MAX_CSR_LEN => refuse(format!(
            "{} bytes long; at most {MAX_CSR_LEN} allowed",
            der.len()
        )),
        // Every DER CSR is a SEQUENCE; PEM or garbage is refused here rather than by a parser
        // two processes away.
        Some(&tag) if tag != 0x30 => refuse("not DER (does not start with a SEQUENCE)".into()),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_uuids() {
        for good in ["8c3e1d9a-4f2b-4a51-9d0e-7b6c5a4f3e21", "ABC-123", "x"] {
            check_disk_uuid(good).unwrap();
        }
        for bad in [
            "",
            "measurementSecret",
            "ca_emergency_ssh",
            "../etc/passwd",
            "uuid with space",
            "ü",
            "a\n",
            &"a".repeat(MAX_DISK_UUID_LEN + 1),
        ] {
            assert!(check_disk_uuid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn certificate_requests() {
        check_certificate_request(&[0x30, 0x82, 0x01, 0x00]).unwrap();
        assert!(check_certificate_request(&[]).is_err());
        assert!(check_certificate_request(b"-----BEGIN CERTIFICATE REQUEST-----").is_err());
        let mut huge = vec![0u8; MAX_CSR_LEN + 1];
        huge[0] = 0x30;
        assert!(check_certificate_request(&huge).is_err());
    }

    #[test]
    fn identity_headers() {
        let mut metadata = MetadataMap::new();
        assert!(matches!(
            Identity::from_metadata(&metadata),
            Err(RequestError::NotForwarded { header }) if header == identity::VARIANT
        ));
        metadata.insert(identity::VARIANT, "qemu-vtpm".parse().unwrap());
        assert!(matches!(
            Identity::from_metadata(&metadata),
            Err(RequestError::NotForwarded { header }) if header == identity::PEER_ADDR
        ));
        metadata.insert(identity::PEER_ADDR, "not an address".parse().unwrap());
        assert!(matches!(
            Identity::from_metadata(&metadata),
            Err(RequestError::MalformedIdentity { .. })
        ));
        metadata.insert(identity::PEER_ADDR, "[2001:db8::1]:443".parse().unwrap());
        let id = Identity::from_metadata(&metadata).unwrap();
        assert_eq!(id.variant, "qemu-vtpm");
        assert_eq!(id.peer_addr.to_string(), "[2001:db8::1]:443");
        assert_eq!(id.evidence_sha256, "");
        metadata.insert(identity::EVIDENCE_SHA256, "not hex".parse().unwrap());
        assert!(matches!(
            Identity::from_metadata(&metadata),
            Err(RequestError::MalformedIdentity { header }) if header == identity::EVIDENCE_SHA256
        ));
        metadata.insert(identity::EVIDENCE_SHA256, "AB".repeat(32).parse().unwrap());
        let id = Identity::from_metadata(&metadata).unwrap();
        assert_eq!(id.evidence_sha256, "ab".repeat(32));
    }
}
