//! What the node requires of the join service before it sends anything: evidence, in the server's
//! certificate, that satisfies the node's service policy (ARCHITECTURE.md, "The service attests
//! itself"). Without one the node joins whatever answers, as a Constellation node does, and the
//! host, which controls the network, can read and edit the answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use attestation::audit::{Decision, Evidence, Subject};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::variants::tdx::{TdxKind, TdxValidator};
use attestation::{PolicyError, QemuVtpmConfig, QemuVtpmValidator, Variant};

/// How long past its `nextUpdate` the node accepts the vendor collateral in the service's
/// certificate by default: attest-proxy's own default (`--collateral-max-stale`), so a service
/// that still accepts its collateral for nodes is still accepted by them.
pub const DEFAULT_COLLATERAL_MAX_STALE: Duration = Duration::from_secs(24 * 60 * 60);

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
    /// The node cannot check this variant.
    #[error(
        "join-client verifies qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx and azure-tdx services, not {0}"
    )]
    Unsupported(Variant),
    /// gcp-sev-snp and gcp-sev-es evidence is only as good as the GCE API's word on the
    /// service's key, which a node cannot ask.
    #[error(
        "join-client cannot verify a {0} service: its attestation key is vouched for by the GCE API, which needs a Google credential the node does not have"
    )]
    GcpUnsupported(Variant),
    /// A qemu-vtpm service policy that trusts any attestation key: anyone in the network path
    /// could then present a quote of their own making and be called verified.
    #[error(
        "service policy {} sets \"trustAnyAk\": true, under which any machine in the network path could impersonate the join service with a quote of its own; list the control-plane nodes' keys in \"trustedAkDigests\" (attest-tool ak-digest prints them), or leave out --service-policy to join without verifying the service",
        path.display()
    )]
    TrustsAnyKey { path: PathBuf },
}

/// Which validator a service policy builds.
enum Kind {
    Vtpm,
    Snp(Binding),
    Tdx(TdxKind),
}

/// A loaded service policy: the server-side check and the digest that names it in audit records.
#[derive(Clone, Debug)]
pub struct ServicePolicy {
    policy: atls::ServerPolicy,
    digest: String,
}

impl ServicePolicy {
    /// Reads an attestation config for `variant`, in the format the service's own config has
    /// (for qemu-vtpm: `measurements` and `trustedAkDigests`; for SEV-SNP and TDX also the
    /// hardware settings and `amdRootKey`/`intelRootKey`). It describes the control-plane node
    /// the service runs on, which is why it is a file of its own: in Constellation a joined
    /// node's PCR 15 differs from a joining node's. SEV-SNP and TDX services are checked with the
    /// vendor collateral their certificate carries, accepted up to
    /// [`DEFAULT_COLLATERAL_MAX_STALE`] past its `nextUpdate`.
    pub fn load(variant: Variant, path: &Path) -> Result<Self, ServicePolicyError> {
        Self::load_allowing_stale(variant, path, DEFAULT_COLLATERAL_MAX_STALE)
    }

    /// [`ServicePolicy::load`], accepting the service's vendor collateral at most
    /// `collateral_max_stale` past its `nextUpdate`.
    pub fn load_allowing_stale(
        variant: Variant,
        path: &Path,
        collateral_max_stale: Duration,
    ) -> Result<Self, ServicePolicyError> {
        // Before the file is read: a variant that cannot be checked is the error to report.
        let check = match variant {
            Variant::QemuVtpm => Kind::Vtpm,
            Variant::AwsSevSnp => Kind::Snp(Binding::Aws),
            Variant::AzureSevSnp => Kind::Snp(Binding::Azure),
            Variant::QemuTdx => Kind::Tdx(TdxKind::Qemu),
            Variant::AzureTdx => Kind::Tdx(TdxKind::Azure),
            Variant::GcpSevSnp | Variant::GcpSevEs => {
                return Err(ServicePolicyError::GcpUnsupported(variant));
            }
            other => return Err(ServicePolicyError::Unsupported(other)),
        };
        let raw = std::fs::read(path).map_err(|source| ServicePolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |source| ServicePolicyError::Invalid {
            path: path.to_owned(),
            variant,
            source,
        };
        let (policy, digest) = match check {
            Kind::Vtpm => {
                let config = QemuVtpmConfig::from_attestation_config(&raw).map_err(invalid)?;
                if config.ak_trust.is_any() {
                    return Err(ServicePolicyError::TrustsAnyKey {
                        path: path.to_owned(),
                    });
                }
                let digest = config.digest();
                let validator = Arc::new(QemuVtpmValidator::from_config(config));
                (atls::ServerPolicy::new(validator), digest)
            }
            Kind::Snp(binding) => {
                // The collateral comes from each server certificate; none is held here.
                let none = Arc::new(attestation::snp::StaticCollateral::new());
                let (validator, digest) =
                    SevSnpValidator::from_attestation_config(binding, &raw, none)
                        .map_err(invalid)?;
                (
                    atls::ServerPolicy::amd(validator, collateral_max_stale),
                    digest,
                )
            }
            Kind::Tdx(kind) => {
                let none = Arc::new(attestation::tdx::StaticCollateral::new());
                let (validator, digest) =
                    TdxValidator::from_attestation_config(kind, &raw, none).map_err(invalid)?;
                (
                    atls::ServerPolicy::intel(validator, collateral_max_stale),
                    digest,
                )
            }
        };
        Ok(Self { policy, digest })
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The example with each `"<N hex: ...>"` placeholder replaced by N hex digits.
    fn filled_in(example: &str) -> String {
        let mut out = String::new();
        let mut rest = example;
        while let Some(start) = rest.find("\"<") {
            out.push_str(&rest[..start]);
            let end = start + rest[start..].find(">\"").unwrap() + 2;
            let digits: String = rest[start + 2..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            out.push_str(&format!("\"{}\"", "a".repeat(digits.parse().unwrap())));
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn hardware_service_policies_load_in_the_services_own_format() {
        // The deployment's own example configs: a node's service policy has their format.
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples");
        let dir = tempfile::tempdir().unwrap();
        for variant in [
            Variant::AwsSevSnp,
            Variant::AzureSevSnp,
            Variant::QemuTdx,
            Variant::AzureTdx,
        ] {
            let example =
                std::fs::read_to_string(examples.join(format!("{variant}.attestationConfig.json")))
                    .unwrap();
            let path = dir.path().join(variant.name());
            std::fs::write(&path, filled_in(&example)).unwrap();
            let policy = ServicePolicy::load(variant, &path).unwrap();
            assert_eq!(policy.server_policy().variant(), variant);
            assert!(!policy.digest().is_empty());
            let debug = format!("{:?}", policy.server_policy());
            assert!(
                debug.contains("collateral_max_stale: 86400s"),
                "{variant}: {debug}"
            );
        }
        let gcp = examples.join("gcp-sev-snp.attestationConfig.json");
        let err = ServicePolicy::load(Variant::GcpSevSnp, &gcp).unwrap_err();
        assert!(
            matches!(err, ServicePolicyError::GcpUnsupported(Variant::GcpSevSnp)),
            "{err}"
        );
        let es = examples.join("gcp-sev-es.attestationConfig.json");
        let err = ServicePolicy::load(Variant::GcpSevEs, &es).unwrap_err();
        assert!(err.to_string().contains("gcp-sev-es service"), "{err}");
    }
}
