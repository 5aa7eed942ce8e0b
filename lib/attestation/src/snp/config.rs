//! The SEV-SNP part of Constellation's attestation config, and the checks it drives on a
//! verified report.
//!
//! Beside `measurements`, the config of an SNP variant names the minimum firmware
//! (`bootloaderVersion`, `teeVersion`, `snpVersion`, `microcodeVersion`: a number, or `"latest"`,
//! which Constellation resolves from its own API and which is refused here because no such API is
//! reachable), the AMD root to trust (`amdRootKey`, PEM; AMD's built-in ARKs when absent), and for
//! Azure the accepted ID key digests (`firmwareSignerConfig`). `smtAllowed` (ours; default true,
//! as Constellation) says whether a guest policy that allows SMT is accepted.

use serde::Deserialize;

use super::report::Tcb;
use super::{SnpError, Trust, VerifiedReport};

/// Guest policy bits (AMD SEV-SNP ABI, "GUEST_POLICY").
pub mod policy_bits {
    pub const SMT: u64 = 1 << 16;
    pub const MIGRATE_MA: u64 = 1 << 18;
    pub const DEBUG: u64 = 1 << 19;
}

/// Why an SNP config could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnpConfigError {
    #[error("attestation config: {0}")]
    Json(String),
    #[error(
        "attestation config: {field} is \"latest\", which Constellation resolves from its own API; this service cannot reach it, so set the number (e.g. from the report of a current node: attest-tool prints it)"
    )]
    Latest { field: &'static str },
    #[error(
        "attestation config: {field} must be a number from 0 to 255 or \"latest\", got {value}"
    )]
    BadVersion { field: &'static str, value: String },
    #[error("attestation config: {field} is missing; an SNP config must set the minimum firmware")]
    MissingVersion { field: &'static str },
    #[error("attestation config: amdRootKey: {0}")]
    RootKey(SnpError),
    #[error("attestation config: firmwareSignerConfig: {0}")]
    FirmwareSigner(String),
}

/// What a report's ID key digest must be (azure-sev-snp).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirmwareSigner {
    pub accepted_digests: Vec<[u8; 48]>,
    pub enforcement: Enforcement,
}

/// Constellation's `enforcementPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// The digest must be one of the accepted ones.
    Equal,
    /// Constellation then asks Microsoft Azure Attestation; this service has no MAA client, so
    /// it enforces as `Equal` and says so at load.
    MaaFallback,
    /// A digest that is not accepted is only reported.
    WarnOnly,
}

/// The SNP settings of one variant's attestation config.
#[derive(Clone, Debug)]
pub struct SnpConfig {
    /// The minimum of the TCB the signer was issued for (REPORTED_TCB) and of COMMITTED_TCB.
    pub minimum_tcb: Tcb,
    /// The minimum of LAUNCH_TCB, the firmware the guest was launched on (the same numbers).
    pub minimum_launch_tcb: Tcb,
    pub smt_allowed: bool,
    pub firmware_signer: Option<FirmwareSigner>,
    pub trust: Trust,
    /// Whether `amdRootKey` replaced the built-in ARKs.
    pub custom_root: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    bootloader_version: Option<serde_json::Value>,
    tee_version: Option<serde_json::Value>,
    snp_version: Option<serde_json::Value>,
    microcode_version: Option<serde_json::Value>,
    amd_root_key: Option<String>,
    smt_allowed: Option<bool>,
    firmware_signer_config: Option<RawFirmwareSigner>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFirmwareSigner {
    #[serde(default)]
    accepted_key_digests: Vec<String>,
    enforcement_policy: Option<String>,
}

fn version(value: Option<&serde_json::Value>, field: &'static str) -> Result<u8, SnpConfigError> {
    match value {
        None | Some(serde_json::Value::Null) => Err(SnpConfigError::MissingVersion { field }),
        Some(serde_json::Value::String(s)) if s.eq_ignore_ascii_case("latest") => {
            Err(SnpConfigError::Latest { field })
        }
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| SnpConfigError::BadVersion {
                field,
                value: n.to_string(),
            }),
        Some(other) => Err(SnpConfigError::BadVersion {
            field,
            value: other.to_string(),
        }),
    }
}

impl SnpConfig {
    /// Reads the SNP settings from a whole attestation config (the `measurements` are read by
    /// [`crate::Policy`]).
    pub fn from_attestation_config(json: &[u8]) -> Result<SnpConfig, SnpConfigError> {
        let raw: Raw =
            serde_json::from_slice(json).map_err(|e| SnpConfigError::Json(e.to_string()))?;
        let tcb = Tcb {
            fmc: None,
            bootloader: version(raw.bootloader_version.as_ref(), "bootloaderVersion")?,
            tee: version(raw.tee_version.as_ref(), "teeVersion")?,
            snp: version(raw.snp_version.as_ref(), "snpVersion")?,
            microcode: version(raw.microcode_version.as_ref(), "microcodeVersion")?,
        };
        let (trust, custom_root) = match raw.amd_root_key.as_deref() {
            None | Some("") => (Trust::builtin(), false),
            Some(pem) => (
                Trust::from_pem(pem.as_bytes()).map_err(SnpConfigError::RootKey)?,
                true,
            ),
        };
        let firmware_signer = raw
            .firmware_signer_config
            .map(|f| {
                let accepted_digests = f
                    .accepted_key_digests
                    .iter()
                    .map(|d| {
                        hex::decode(d)
                            .ok()
                            .and_then(|b| <[u8; 48]>::try_from(b).ok())
                            .ok_or_else(|| {
                                SnpConfigError::FirmwareSigner(format!(
                                    "accepted key digest {d:?} is not 48 bytes of hex"
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let enforcement = match f.enforcement_policy.as_deref() {
                    None | Some("Equal") => Enforcement::Equal,
                    Some("MAAFallback") => Enforcement::MaaFallback,
                    Some("WarnOnly") => Enforcement::WarnOnly,
                    Some(other) => {
                        return Err(SnpConfigError::FirmwareSigner(format!(
                            "enforcementPolicy {other:?} is not Equal, MAAFallback or WarnOnly"
                        )));
                    }
                };
                Ok(FirmwareSigner {
                    accepted_digests,
                    enforcement,
                })
            })
            .transpose()?;
        Ok(SnpConfig {
            minimum_tcb: tcb,
            minimum_launch_tcb: tcb,
            smt_allowed: raw.smt_allowed.unwrap_or(true),
            firmware_signer,
            trust,
            custom_root,
        })
    }

    /// The lines these settings add to the canonical text a config digest hashes: the minimum
    /// TCBs, SMT, the accepted ID key digests and their enforcement, and the trusted ARKs.
    pub fn canonical(&self) -> String {
        let mut out = format!(
            "snp:min-tcb:{}\nsnp:min-launch-tcb:{}\nsnp:smt:{}\n",
            self.minimum_tcb, self.minimum_launch_tcb, self.smt_allowed
        );
        if let Some(signer) = &self.firmware_signer {
            let mut digests: Vec<String> =
                signer.accepted_digests.iter().map(hex::encode).collect();
            digests.sort();
            out.push_str(&format!(
                "snp:id-key:{:?}:{}\n",
                signer.enforcement,
                digests.join(",")
            ));
        }
        let mut arks: Vec<String> = self
            .trust
            .arks()
            .iter()
            .map(|a| hex::encode(a.sha256()))
            .collect();
        arks.sort();
        out.push_str(&format!("snp:ark:{}\n", arks.join(",")));
        out
    }

    /// Applies the config to a verified report. Returns notes for what is only reported (an ID
    /// key digest under `WarnOnly`), or the first check that fails.
    pub fn check(&self, verified: &VerifiedReport) -> Result<Vec<String>, SnpPolicyError> {
        self.check_report(&verified.report, verified.product())
    }

    /// [`SnpConfig::check`] on a report of `product` whose signature is not checked yet: the
    /// validator runs it before it asks AMD for anything, so a report the policy refuses anyway
    /// costs no fetch; its verdict counts only once the same bytes verify.
    pub fn check_report(
        &self,
        report: &super::Report,
        product: super::Product,
    ) -> Result<Vec<String>, SnpPolicyError> {
        let policy = report.policy();
        if policy & policy_bits::DEBUG != 0 {
            return Err(SnpPolicyError::Debug);
        }
        if policy & policy_bits::MIGRATE_MA != 0 {
            return Err(SnpPolicyError::MigrationAgent);
        }
        if policy & policy_bits::SMT != 0 && !self.smt_allowed {
            return Err(SnpPolicyError::Smt);
        }
        if report.vmpl() != 0 {
            return Err(SnpPolicyError::Vmpl(report.vmpl()));
        }
        let current = report.current_tcb(product);
        let committed = report.committed_tcb(product);
        // Provisional firmware (CURRENT above COMMITTED) is permitted, as Constellation does;
        // firmware below what the platform committed to is not.
        if !current.at_least(&committed) {
            return Err(SnpPolicyError::CurrentBelowCommitted { current, committed });
        }
        for (which, tcb, minimum) in [
            ("reported", report.reported_tcb(product), &self.minimum_tcb),
            ("committed", committed, &self.minimum_tcb),
            (
                "launch",
                report.launch_tcb(product),
                &self.minimum_launch_tcb,
            ),
        ] {
            if !tcb.at_least(minimum) {
                return Err(SnpPolicyError::TcbBelowMinimum {
                    which,
                    tcb,
                    minimum: *minimum,
                });
            }
        }
        let mut notes = Vec::new();
        if let Some(signer) = &self.firmware_signer {
            let digest = report.id_key_digest();
            if !signer.accepted_digests.iter().any(|d| d == digest) {
                match signer.enforcement {
                    Enforcement::WarnOnly => notes.push(format!(
                        "ID key digest {} is not an accepted one (warn only)",
                        hex::encode(digest)
                    )),
                    Enforcement::Equal | Enforcement::MaaFallback => {
                        return Err(SnpPolicyError::IdKeyDigest(hex::encode(digest)));
                    }
                }
            }
        }
        Ok(notes)
    }
}

/// Which policy check refused a verified report.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnpPolicyError {
    #[error("the guest policy allows debugging (DEBUG)")]
    Debug,
    #[error("the guest policy allows a migration agent (MIGRATE_MA)")]
    MigrationAgent,
    #[error("the guest policy allows SMT, which the config does not (smtAllowed: false)")]
    Smt,
    #[error("the report was requested at VMPL {0}, not 0")]
    Vmpl(u32),
    #[error("the current firmware ({current}) is below the committed firmware ({committed})")]
    CurrentBelowCommitted { current: Tcb, committed: Tcb },
    #[error("the {which} TCB ({tcb}) is below the configured minimum ({minimum})")]
    TcbBelowMinimum {
        which: &'static str,
        tcb: Tcb,
        minimum: Tcb,
    },
    #[error("the report's ID key digest {0} is not in firmwareSignerConfig.acceptedKeyDigests")]
    IdKeyDigest(String),
}
