//! Attestation: the documents nodes present in aTLS certificates, and their validation.
//!
//! Each variant lives in a module of its own under [`variants`], behind the [`Validator`] and
//! [`Issuer`] traits; what the variants share (TPM structures, the vTPM document, event logs, the
//! measurement policy, the audit record, the kept evidence and the dry run over it) sits beside
//! `variants`, one module each. The
//! aTLS layer (crate `atls`) finds the document in the client certificate by the variant's OID and
//! hands it here together with the connection's nonce; a validator checks the evidence, then the
//! measurement policy, and returns the user data the evidence binds (aTLS requires it to equal the
//! hash of the certificate's public key).

pub mod audit;
pub mod audit_trail;
pub mod dry_run;
pub mod error;
pub mod eventlog;
pub mod evidence;
pub mod gce;
mod generations;
pub mod issuer;
pub mod parse_memo;
pub mod policy;
pub mod saved;
pub mod signature_memo;
pub mod snp;
pub mod tdx;
pub mod tpm;
pub mod variant;
pub mod variants;
pub mod vtpm;

pub use error::Error;
pub use policy::{Measurement, Policy, PolicyError};
pub use variants::gcp_sev_es::GcpSevEsValidator;
pub use variants::qemu_vtpm::{AkTrust, QemuVtpmConfig, QemuVtpmValidator, ak_digest};

pub use variant::Variant;

use std::fmt;

/// A measurement that did not match the policy: an enforced one rejects the node, a warn-only
/// one is reported in [`Verified::warnings`] and logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeasurementMismatch {
    /// The PCR (or other measurement register) index.
    pub index: u32,
    /// The value the policy expects.
    pub expected: Vec<u8>,
    /// The value the evidence carries; `None` if the evidence lacks this register.
    pub actual: Option<Vec<u8>>,
    /// Whether the policy only warns about this register.
    pub warn_only: bool,
}

impl fmt::Display for MeasurementMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let actual = self
            .actual
            .as_deref()
            .map(hex_string)
            .unwrap_or_else(|| "missing".to_owned());
        write!(
            f,
            "measurement {}: expected {}, got {}",
            self.index,
            hex_string(&self.expected),
            actual
        )?;
        if self.warn_only {
            f.write_str(" (warn only)")?;
        }
        Ok(())
    }
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a validator established about a document it accepted.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The variant whose evidence was verified.
    pub variant: Variant,
    /// The user data the evidence binds; aTLS compares it with the certificate key's hash.
    pub user_data: Vec<u8>,
    /// Warn-only measurements that did not match.
    pub warnings: Vec<MeasurementMismatch>,
    /// What the hardware evidence established, for the audit line (product, TCB, signer, chip
    /// or CSP, policy bits), and checks that only warned; empty for qemu-vtpm.
    pub notes: Vec<String>,
}

/// Checks one variant's attestation documents against a measurement policy.
///
/// Validation is CPU-bound and synchronous; async callers run it off their reactor threads.
pub trait Validator: Send + Sync + fmt::Debug {
    /// The variant this validator accepts.
    fn variant(&self) -> Variant;

    /// Validates `document`, which must have been issued for `nonce`, and returns what it proves.
    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error>;
}

/// Produces one variant's attestation documents on a node.
pub trait Issuer: Send + Sync + fmt::Debug {
    /// The variant this issuer produces.
    fn variant(&self) -> Variant;

    /// Produces a document binding `user_data` to the verifier's `nonce`.
    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError>;
}

/// Why an issuer could not produce a document.
#[derive(Debug, thiserror::Error)]
#[error("cannot issue {variant} attestation: {reason}")]
pub struct IssueError {
    pub variant: Variant,
    pub reason: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl IssueError {
    /// An issuer's own error, as the [`Issuer`] trait reports it: its text is the reason and the
    /// error itself the source.
    pub fn from_error(
        variant: Variant,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        IssueError {
            variant,
            reason: error.to_string(),
            source: Some(Box::new(error)),
        }
    }
}
