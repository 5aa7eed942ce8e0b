//! The measurement policy in force, and the validator built from it.
//!
//! Each connection takes the current validator once (a cheap `Arc` clone under a short lock) and
//! verifies with it lock-free, so a policy swap never waits for, or blocks, a verification.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use attestation::{Validator, Variant};

/// Why no validator could be built.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The attestation config file could not be read.
    #[error("cannot read attestation config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The attestation config is not a valid policy for the variant.
    #[error("attestation config {path} is not a valid {variant} policy")]
    Invalid {
        path: PathBuf,
        variant: Variant,
        #[source]
        source: attestation::policy::PolicyError,
    },
    /// No validator exists for the configured variant.
    #[error("attestation variant {0} is not supported by this build")]
    Unsupported(Variant),
}

/// A validator together with the digest of the policy it enforces.
#[derive(Clone, Debug)]
pub struct Active {
    pub validator: Arc<dyn Validator>,
    pub digest: String,
}

/// Builds the validator for `variant` from the attestation config file at `path`.
pub fn load(variant: Variant, path: &Path) -> Result<Active, PolicyError> {
    let raw = std::fs::read(path).map_err(|source| PolicyError::Read {
        path: path.to_owned(),
        source,
    })?;
    let policy = attestation::policy::Policy::from_attestation_config(&raw).map_err(|source| {
        PolicyError::Invalid {
            path: path.to_owned(),
            variant,
            source,
        }
    })?;
    let digest = policy.digest();
    let validator: Arc<dyn Validator> = match variant {
        Variant::QemuVtpm => Arc::new(attestation::vtpm::QemuVtpmValidator::new(policy)),
        other => return Err(PolicyError::Unsupported(other)),
    };
    Ok(Active { validator, digest })
}

/// The validator in force; swapped whole when the policy changes.
#[derive(Debug)]
pub struct Current(RwLock<Arc<Active>>);

impl Current {
    pub fn new(active: Active) -> Self {
        Self(RwLock::new(Arc::new(active)))
    }

    /// The validator to use for one connection.
    pub fn get(&self) -> Arc<Active> {
        // A poisoned lock still holds a complete Arc; keep serving with it.
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}
