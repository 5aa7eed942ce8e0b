//! Identity headers attest-proxy adds to each forwarded request.
//!
//! join-core trusts these only because it accepts connections from attest-proxy's uid alone,
//! and attest-proxy removes every header with [`PREFIX`] (and the usual forwarding headers) that
//! a client sent before adding its own.

/// Every identity header starts with this prefix; the proxy strips all of them from client requests.
pub const PREFIX: &str = "x-attested-";
/// The attestation variant that was verified, e.g. `qemu-vtpm`.
pub const VARIANT: &str = "x-attested-variant";
/// The TCP peer address of the attested node, `ip:port`.
pub const PEER_ADDR: &str = "x-attested-peer-addr";
/// The digest of the measurement policy the node was verified against.
pub const POLICY_DIGEST: &str = "x-attested-policy-digest";
/// SHA-256 (lowercase hex) of the attestation evidence attest-proxy verified: the same digest
/// as the `evidence` field of attest-proxy's audit line for the connection, so token-issuer's
/// record of a release leads back to the attestation decision.
pub const EVIDENCE_SHA256: &str = "x-attested-evidence-sha256";

/// Headers that claim a client identity in other conventions; the proxy strips them too.
pub const FOREIGN_IDENTITY_HEADERS: &[&str] = &[
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
];

/// Whether a client-sent header must be removed before forwarding.
pub fn is_identity_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with(PREFIX) || FOREIGN_IDENTITY_HEADERS.contains(&name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_are_recognised_case_insensitively() {
        assert!(is_identity_header("X-Attested-Variant"));
        assert!(is_identity_header("x-attested-anything-else"));
        assert!(is_identity_header("X-Forwarded-For"));
        assert!(!is_identity_header("content-type"));
        assert!(!is_identity_header("x-attest"));
    }
}
