//! Why a document was rejected. Every variant names the check that failed, so the node's error
//! and the audit line say exactly why.

use crate::MeasurementMismatch;

/// A rejected attestation document.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The document is not well-formed.
    #[error("malformed attestation document: {0}")]
    Malformed(String),
    /// The document is larger than any legitimate one.
    #[error("attestation document of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// Enforced measurements did not match the policy.
    #[error("measurements do not match the policy: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Measurements(Vec<MeasurementMismatch>),
}
