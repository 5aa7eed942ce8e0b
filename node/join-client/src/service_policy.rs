//! What the node requires of the join service before it sends anything: evidence, in the server's
//! certificate, that satisfies the node's service policy (ARCHITECTURE.md, "The service attests
//! itself"). Without one the node joins whatever answers, as a Constellation node does, and the
//! host, which controls the network, can read and edit the answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use attestation::audit::{Decision, Evidence, Subject};
use attestation::{PolicyError, QemuVtpmConfig, QemuVtpmValidator, Variant};

/// Why a service policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ServicePolicyError {
    /// The file could not be read.
    #[error("cannot read the service policy {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid attestation config for the variant.
    #[error("service policy {} is not a valid {variant} attestation config", path.display())]
    Invalid {
        path: PathBuf,
        variant: Variant,
        #[source]
        source: PolicyError,
    },
    /// The node cannot check this variant yet: the hardware variants need AMD's or Intel's
    /// collateral, which the node does not fetch.
    #[error("join-client verifies qemu-vtpm services only, not {0}")]
    Unsupported(Variant),
}

/// A loaded service policy: the server-side check and the digest that names it in audit records.
#[derive(Clone, Debug)]
pub struct ServicePolicy {
    policy: atls::ServerPolicy,
    digest: String,
}

impl ServicePolicy {
    /// Reads an attestation config for `variant`, in the format the service's own config has
    /// (for qemu-vtpm: `measurements` and `trustedAkDigests`). It describes the control-plane
    /// node the service runs on, which is why it is a file of its own: in Constellation a
    /// joined node's PCR 15 differs from a joining node's.
    pub fn load(variant: Variant, path: &Path) -> Result<Self, ServicePolicyError> {
        let raw = std::fs::read(path).map_err(|source| ServicePolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        match variant {
            Variant::QemuVtpm => {
                let config = QemuVtpmConfig::from_attestation_config(&raw).map_err(|source| {
                    ServicePolicyError::Invalid {
                        path: path.to_owned(),
                        variant,
                        source,
                    }
                })?;
                let digest = config.digest();
                Ok(Self {
                    policy: atls::ServerPolicy::new(Arc::new(QemuVtpmValidator::from_config(
                        config,
                    ))),
                    digest,
                })
            }
            other => Err(ServicePolicyError::Unsupported(other)),
        }
    }

    /// The check the aTLS client runs on the server's certificate.
    pub fn server_policy(&self) -> &atls::ServerPolicy {
        &self.policy
    }

    /// The policy's digest, as audit records name policies.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The audit record of a refused server at `peer`, as attest-proxy records refused nodes.
    pub fn refusal(
        &self,
        peer: impl std::fmt::Display,
        certificate: &[u8],
        error: &atls::ServerVerifyError,
    ) -> Decision {
        Decision::rejected(
            Subject::now(
                peer,
                self.policy.variant(),
                self.digest.clone(),
                Evidence::Certificate(certificate),
            ),
            error,
        )
        .with_check(error.check())
    }
}
