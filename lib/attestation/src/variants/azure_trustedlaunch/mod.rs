//! azure-trustedlaunch: the vTPM document of an Azure Trusted Launch VM, whose attestation key
//! Azure certifies.
//!
//! A Trusted Launch VM has a vTPM and no confidential-computing hardware: Azure's host runs the
//! vTPM and can read the VM's memory. What this variant proves is "a VM Azure runs, with an AK
//! Azure certified, booted what its PCRs say" — Azure itself is trusted, as it can forge both.
//!
//! Azure persists the AK at 0x81000003 and its certificate in NV index 0x01C101D0; the node sends
//! the certificate and its issuing CA as InstanceInfo ([`ak_cert`]). In the order of the trust
//! chain: the quotes verify with the document's AK and bind the nonce and InstanceInfo (as for
//! qemu-vtpm); the AK certificate chains to a trusted Azure vTPM root at the verification time
//! and certifies exactly that AK; only then are the quoted PCRs compared with `measurements`.
//!
//! The roots are [`builtin_roots`] (Azure Virtual TPM Root Certificate Authority 2023, valid to
//! 2048, and Constellation's: Azure's AME root, which expired on 2026-05-24, so it verifies only
//! documents dated before), or, where the config has `azureVtpmRoots`, exactly the anchors it
//! lists instead (PEM strings, each one or more CA certificates), as `amdRootKey` replaces AMD's
//! root: so an operator can narrow trust to one hierarchy as well as name another. Azure runs
//! more than one vTPM CA hierarchy; where a VM's certificate is issued by a CA that the 2023 root
//! certifies through an intermediate (AK ← CA ← intermediate ← root), the node's document carries
//! only the first CA, so the operator lists that intermediate.

pub mod ak_cert;

use serde::Deserialize;

use crate::policy::{Policy, PolicyError};
use crate::variants::sev_snp::{Clock, system_clock};
use crate::vtpm::{compare_pcrs, verify_document};
use crate::{Error, Validator, Variant, Verified, tpm};

pub use ak_cert::{AkCertError, Anchor, InstanceInfo, VerifiedAkCert};

/// Azure's AME root, the one root Constellation's azure-trustedlaunch validator trusts (its
/// exact bytes from Constellation's source, `internal/attestation/azure/trustedlaunch`); valid
/// 2016-05-24 to 2026-05-24.
const AME_ROOT_PEM: &[u8] = include_bytes!("roots/ame-root.pem");

/// Azure Virtual TPM Root Certificate Authority 2023 (Microsoft Corporation), the root of the AK
/// certificates Azure's vTPMs carry, as Microsoft's Trusted Launch FAQ publishes it (serial
/// 51f431da2c92088a4e29e0d929de4aa7, SHA-1 thumbprint cdb9bc34197a5355f652f1583fbd4e9a1d4801f0);
/// valid 2023-06-01 to 2048-06-01.
const AZURE_VTPM_ROOT_2023_PEM: &[u8] = include_bytes!("roots/azure-vtpm-root-2023.pem");

/// The config key of the operator's Azure vTPM trust anchors.
pub const ROOTS_KEY: &str = "azureVtpmRoots";

/// What a document without its certificates is refused with.
const NO_AK_CERT: &str = "the document has no InstanceInfo (the AK certificate and its CA)";

/// The roots trusted without configuration: Azure's current vTPM root, then Constellation's.
pub fn builtin_roots() -> Vec<Anchor> {
    // The built-in PEMs are part of this crate and parsed by a test, so this cannot fail.
    [AZURE_VTPM_ROOT_2023_PEM, AME_ROOT_PEM]
        .into_iter()
        .flat_map(|pem| Anchor::from_pem(pem).unwrap_or_default())
        .collect()
}

/// Why an azure-trustedlaunch config is refused.
#[derive(Debug, thiserror::Error)]
pub enum TrustedLaunchConfigError {
    #[error("azureVtpmRoots entry {index} is not a PEM CA certificate: {source}")]
    Root {
        index: usize,
        #[source]
        source: AkCertError,
    },
    /// An empty list would trust no root and refuse every node.
    #[error(
        "azureVtpmRoots is empty: list the roots to trust instead of the built-in ones, or leave it out to trust the built-in ones"
    )]
    NoRoots,
}

/// The azure-trustedlaunch attestation config: the measurements and the trusted roots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedLaunchConfig {
    pub policy: Policy,
    /// The configured roots, or the built-in ones where the config lists none.
    pub roots: Vec<Anchor>,
}

#[derive(Deserialize)]
struct RawRoots {
    #[serde(default, rename = "azureVtpmRoots")]
    roots: Option<Vec<String>>,
}

impl TrustedLaunchConfig {
    /// Parses `{"measurements": {...}, "azureVtpmRoots": ["<PEM>", ...]}`; at least one
    /// measurement must be enforced, and the roots (optional, not empty) replace the built-in
    /// ones. A config Constellation's CLI rewrote without them (it knows no such field) therefore
    /// trusts the built-in roots; where the fleet chains to a listed anchor, attest-proxy's
    /// reload guard holds such a config back, as it would refuse the nodes accepted lately.
    pub fn from_attestation_config(json: &[u8]) -> Result<TrustedLaunchConfig, PolicyError> {
        let policy = Policy::enforcing_from_attestation_config(json)?;
        let raw: RawRoots = serde_json::from_slice(json).map_err(PolicyError::Json)?;
        let Some(listed) = raw.roots else {
            return Ok(TrustedLaunchConfig {
                policy,
                roots: builtin_roots(),
            });
        };
        if listed.is_empty() {
            return Err(TrustedLaunchConfigError::NoRoots.into());
        }
        let mut roots: Vec<Anchor> = Vec::new();
        for (index, pem) in listed.iter().enumerate() {
            let anchors = Anchor::from_pem(pem.as_bytes())
                .map_err(|source| TrustedLaunchConfigError::Root { index, source })?;
            for anchor in anchors {
                let parsed = ak_cert::parse_cert(anchor.der(), "trusted root")
                    .map_err(|source| TrustedLaunchConfigError::Root { index, source })?;
                crate::issuer::may_sign(&parsed, crate::issuer::Usage::Certificates).map_err(
                    |reason| TrustedLaunchConfigError::Root {
                        index,
                        source: AkCertError::Chain(format!(
                            "the trusted root {} {reason}",
                            anchor.subject()
                        )),
                    },
                )?;
                if !roots.contains(&anchor) {
                    roots.push(anchor);
                }
            }
        }
        Ok(TrustedLaunchConfig { policy, roots })
    }

    /// Covers the measurements and every trusted root (by SHA-256, in ascending order).
    pub fn digest(&self) -> String {
        let mut lines: Vec<String> = self
            .roots
            .iter()
            .map(|r| format!("azure-vtpm-root:{}\n", hex::encode(r.sha256())))
            .collect();
        lines.sort();
        self.policy.digest_with(&lines.concat())
    }
}

/// Validates azure-trustedlaunch documents.
#[derive(Clone)]
pub struct TrustedLaunchValidator {
    policy: Policy,
    roots: Vec<Anchor>,
    clock: Clock,
}

impl std::fmt::Debug for TrustedLaunchValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedLaunchValidator")
            .field("policy", &self.policy)
            .field(
                "roots",
                &self.roots.iter().map(Anchor::subject).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl TrustedLaunchValidator {
    pub fn new(config: TrustedLaunchConfig) -> Self {
        TrustedLaunchValidator {
            policy: config.policy,
            roots: config.roots,
            clock: system_clock(),
        }
    }

    /// The validator an attestation config describes, with the digest covering it.
    pub fn from_attestation_config(json: &[u8]) -> Result<(Self, String), PolicyError> {
        let config = TrustedLaunchConfig::from_attestation_config(json)?;
        let digest = config.digest();
        Ok((TrustedLaunchValidator::new(config), digest))
    }

    /// Verifies at the time `clock` gives instead of now (tests, offline verification).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl Validator for TrustedLaunchValidator {
    fn variant(&self) -> Variant {
        Variant::AzureTrustedLaunch
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        let info = InstanceInfo::parse(doc.hardware_evidence(NO_AK_CERT)?)?;
        let ak_pub = doc
            .attestation
            .as_ref()
            .map(|a| a.ak_pub.as_slice())
            .unwrap_or_default();
        let ak = tpm::Public::parse(ak_pub).map_err(Error::AkPublic)?;
        let verified = ak_cert::verify(&info, &ak, &self.roots, (self.clock)())?;
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        Ok(Verified {
            variant: Variant::AzureTrustedLaunch,
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes: vec![format!(
                "AK certified by Azure: {}, issued by {}, anchored at {} (SHA-256 {})",
                verified.subject,
                verified.ca,
                verified.anchor,
                hex::encode(verified.anchor_sha256)
            )],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn the_builtin_roots_are_azures_2023_root_and_constellations_ame_root() {
        let roots = builtin_roots();
        let subjects: Vec<String> = roots.iter().map(|r| r.subject().to_owned()).collect();
        assert_eq!(
            subjects,
            [
                "C=US, O=Microsoft Corporation, CN=Azure Virtual TPM Root Certificate Authority 2023",
                "DC=GBL, DC=AME, CN=ameroot"
            ]
        );
        // The SHA-1 thumbprint Microsoft publishes for the 2023 root, and Constellation's bytes.
        assert_eq!(
            hex::encode(aws_lc_rs::digest::digest(
                &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
                roots[0].der()
            )),
            "cdb9bc34197a5355f652f1583fbd4e9a1d4801f0"
        );
        assert_eq!(
            hex::encode(roots[1].sha256()),
            "ea76599d86897382aa519ff2bc0fa6b9c15d60da2ebe53e72139cd317b0797ed"
        );
        for root in &roots {
            let parsed = ak_cert::parse_cert(root.der(), "trusted root").unwrap();
            crate::issuer::may_sign(&parsed, crate::issuer::Usage::Certificates).unwrap();
        }
        let root_2023 = ak_cert::parse_cert(roots[0].der(), "trusted root").unwrap();
        assert_eq!(
            root_2023.validity().not_after.to_datetime().year(),
            2048,
            "the 2023 root is valid until 2048"
        );
    }

    /// Listed roots replace the built-in ones, so an operator can narrow trust to one hierarchy:
    /// a config naming only the AME root no longer trusts the 2023 root.
    #[test]
    fn listed_roots_replace_the_built_in_ones() {
        let ame = String::from_utf8(AME_ROOT_PEM.to_vec()).unwrap();
        let narrowed = serde_json::json!({
            "measurements": {"4": {"expected": A}},
            "azureVtpmRoots": [ame],
        });
        let config =
            TrustedLaunchConfig::from_attestation_config(narrowed.to_string().as_bytes()).unwrap();
        assert_eq!(config.roots, Anchor::from_pem(AME_ROOT_PEM).unwrap());
        let root_2023 = Anchor::from_pem(AZURE_VTPM_ROOT_2023_PEM).unwrap();
        assert!(
            !config.roots.contains(&root_2023[0]),
            "the 2023 root is not trusted unless listed"
        );
        assert_ne!(
            config.digest(),
            TrustedLaunchConfig::from_attestation_config(
                format!(r#"{{"measurements": {{"4": {{"expected": "{A}"}}}}}}"#).as_bytes()
            )
            .unwrap()
            .digest(),
            "the policy digest names the roots in force"
        );
    }

    #[test]
    fn configs_parse_roots_and_refuse_bad_ones_by_entry() {
        let plain = format!(r#"{{"measurements": {{"4": {{"expected": "{A}"}}}}}}"#);
        let config = TrustedLaunchConfig::from_attestation_config(plain.as_bytes()).unwrap();
        assert_eq!(
            config.roots,
            builtin_roots(),
            "without a list: the built-in roots"
        );
        let empty =
            format!(r#"{{"measurements": {{"4": {{"expected": "{A}"}}}}, "azureVtpmRoots": []}}"#);
        let err = TrustedLaunchConfig::from_attestation_config(empty.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("azureVtpmRoots is empty"), "{err}");

        let ame = String::from_utf8(AME_ROOT_PEM.to_vec()).unwrap();
        let twice = serde_json::json!({
            "measurements": {"4": {"expected": A}},
            "azureVtpmRoots": [ame, ame],
        });
        let again =
            TrustedLaunchConfig::from_attestation_config(twice.to_string().as_bytes()).unwrap();
        assert_eq!(again.roots.len(), 1, "a root listed twice is one root");

        let bad = serde_json::json!({
            "measurements": {"4": {"expected": A}},
            "azureVtpmRoots": [ame, "not a PEM"],
        });
        let err =
            TrustedLaunchConfig::from_attestation_config(bad.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("azureVtpmRoots entry 1"), "{err}");

        let nothing =
            format!(r#"{{"measurements": {{"4": {{"expected": "{A}", "warnOnly": true}}}}}}"#);
        assert!(matches!(
            TrustedLaunchConfig::from_attestation_config(nothing.as_bytes()),
            Err(PolicyError::NothingEnforced)
        ));
    }
}
