//! The SEV-SNP part of the attestation config, and the checks it drives on a verified report.
//!
//! Constellation's fields, beside `measurements`:
//! - `bootloaderVersion`, `teeVersion`, `snpVersion`, `microcodeVersion`: the minimum TCB of a
//!   Milan report (a number, or `"latest"`, which Constellation resolves from its own API and
//!   which is refused here because no such API is reachable);
//! - `amdRootKey` (PEM): the AMD root to trust; AMD's built-in ARKs when absent;
//! - `firmwareSignerConfig` (`{"acceptedKeyDigests": [96 hex], "enforcementPolicy"}`): the
//!   accepted ID key digests (ID_KEY_DIGEST, the key that signed the launch's ID block).
//!   azure-sev-snp must set it (see [`SnpConfig::for_variant`]).
//!
//! Fields of this service, all SNP variants, each checked only when set (an empty list is a
//! config error: it would refuse every report):
//! - `minimumTcb`: the minimum TCB of the other products, which count their SVNs on scales of
//!   their own: `{"Genoa": {the four fields}, "Turin": {"fmcVersion" and the four fields}}`.
//!   A report of a product without a minimum is refused by name (Constellation applies its four
//!   fields to every product);
//! - `launchMeasurements`: [96 hex], the accepted launch MEASUREMENTs;
//! - `acceptedAuthorKeyDigests`: [96 hex], the accepted AUTHOR_KEY_DIGESTs;
//! - `hostData`: 64 hex, the HOST_DATA the host must have given the guest at launch;
//! - `allowedChipIds`: [128 hex], the CHIP_IDs of the machines allowed (a report with a masked
//!   CHIP_ID, as AWS's, then never passes);
//! - `smtAllowed` (default true, as Constellation): whether a guest policy that allows SMT is
//!   accepted;
//! - `vlekCspDomains` (aws-sev-snp): the domains the VLEK's CSP may be in
//!   (`CN=cc-<region>.<domain>`), `["amazonaws.com"]` unless set: AMD issues VLEKs to other
//!   clouds too.

use serde::Deserialize;

use super::report::Tcb;
use super::{Product, SnpError, Trust, VerifiedReport};
use crate::Variant;

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
    Latest { field: String },
    #[error(
        "attestation config: {field} must be a number from 0 to 255 or \"latest\", got {value}"
    )]
    BadVersion { field: String, value: String },
    #[error("attestation config: {field} is missing; an SNP config must set the minimum firmware")]
    MissingVersion { field: String },
    #[error("attestation config: minimumTcb: {0}")]
    MinimumTcb(String),
    #[error("attestation config: amdRootKey: {0}")]
    RootKey(SnpError),
    #[error("attestation config: firmwareSignerConfig: {0}")]
    FirmwareSigner(String),
    #[error("attestation config: {field}: {reason}")]
    BadPin { field: &'static str, reason: String },
    /// A variant whose firmware would otherwise be unpinned.
    #[error("attestation config: {variant} needs {field}: {reason}")]
    Unpinned {
        variant: Variant,
        field: &'static str,
        reason: &'static str,
    },
    /// `vlekCspDomains` is empty or names something that is not a domain.
    #[error("attestation config: vlekCspDomains: {0}")]
    VlekCspDomains(String),
}

/// What a report's ID key digest must be (Constellation's `firmwareSignerConfig`).
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

/// The minimum TCB of each product: the same minimum reads differently on each product's SVN
/// scale, and only Turin has an FMC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinimumTcbs {
    /// Constellation's four top-level fields.
    pub milan: Tcb,
    /// `minimumTcb.Genoa`.
    pub genoa: Option<Tcb>,
    /// `minimumTcb.Turin`, with its `fmcVersion`.
    pub turin: Option<Tcb>,
}

impl MinimumTcbs {
    /// The same minimum for every product (Turin's FMC at 0): for tests and tools.
    pub fn all(tcb: Tcb) -> MinimumTcbs {
        MinimumTcbs {
            milan: tcb,
            genoa: Some(tcb),
            turin: Some(Tcb {
                fmc: Some(tcb.fmc.unwrap_or(0)),
                ..tcb
            }),
        }
    }

    pub fn for_product(&self, product: Product) -> Option<&Tcb> {
        match product {
            Product::Milan => Some(&self.milan),
            Product::Genoa => self.genoa.as_ref(),
            Product::Turin => self.turin.as_ref(),
        }
    }
}

/// What pins the guest's firmware and platform beyond the TCB: each is checked only when set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirmwarePins {
    /// `launchMeasurements`: the accepted launch MEASUREMENTs.
    pub measurements: Option<Vec<[u8; 48]>>,
    /// `acceptedAuthorKeyDigests`: the accepted AUTHOR_KEY_DIGESTs.
    pub author_key_digests: Option<Vec<[u8; 48]>>,
    /// `hostData`: the HOST_DATA the guest must have been launched with.
    pub host_data: Option<[u8; 32]>,
    /// `allowedChipIds`: the CHIP_IDs allowed.
    pub chip_ids: Option<Vec<[u8; 64]>>,
}

/// The SNP settings of one variant's attestation config.
#[derive(Clone, Debug)]
pub struct SnpConfig {
    /// The minimum, per product, of the TCB the signer was issued for (REPORTED_TCB), of
    /// COMMITTED_TCB and of LAUNCH_TCB (the firmware the guest was launched on).
    pub minimum_tcb: MinimumTcbs,
    pub smt_allowed: bool,
    pub firmware_signer: Option<FirmwareSigner>,
    pub pins: FirmwarePins,
    pub trust: Trust,
    /// Whether `amdRootKey` replaced the built-in ARKs.
    pub custom_root: bool,
    /// `vlekCspDomains` (aws-sev-snp): the domains a VLEK's CSP may be in,
    /// `CN=cc-<region>.<domain>`; [`DEFAULT_VLEK_CSP_DOMAINS`] unless set.
    pub vlek_csp_domains: Vec<String>,
}

/// The CSP domain of AWS's VLEKs in its commercial partition (`CN=cc-eu-west-1.amazonaws.com`);
/// other partitions list theirs in `vlekCspDomains`.
pub const DEFAULT_VLEK_CSP_DOMAINS: [&str; 1] = ["amazonaws.com"];

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    bootloader_version: Option<serde_json::Value>,
    tee_version: Option<serde_json::Value>,
    snp_version: Option<serde_json::Value>,
    microcode_version: Option<serde_json::Value>,
    minimum_tcb: Option<serde_json::Map<String, serde_json::Value>>,
    amd_root_key: Option<String>,
    smt_allowed: Option<bool>,
    firmware_signer_config: Option<RawFirmwareSigner>,
    launch_measurements: Option<Vec<String>>,
    accepted_author_key_digests: Option<Vec<String>>,
    host_data: Option<String>,
    allowed_chip_ids: Option<Vec<String>>,
    vlek_csp_domains: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFirmwareSigner {
    #[serde(default)]
    accepted_key_digests: Vec<String>,
    enforcement_policy: Option<String>,
}

fn version(value: Option<&serde_json::Value>, field: String) -> Result<u8, SnpConfigError> {
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

/// The four fields Constellation names (with `prefix` before each name), and `fmcVersion` when
/// `fmc` says the product has one.
fn tcb_fields(
    object: &serde_json::Map<String, serde_json::Value>,
    prefix: &str,
    fmc: bool,
) -> Result<Tcb, SnpConfigError> {
    let field = |name: &str| version(object.get(name), format!("{prefix}{name}"));
    Ok(Tcb {
        fmc: if fmc {
            Some(field("fmcVersion")?)
        } else {
            None
        },
        bootloader: field("bootloaderVersion")?,
        tee: field("teeVersion")?,
        snp: field("snpVersion")?,
        microcode: field("microcodeVersion")?,
    })
}

/// `minimumTcb`: Genoa's and Turin's minimums (Milan's are the top-level fields).
fn other_products(
    minimum: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Option<Tcb>, Option<Tcb>), SnpConfigError> {
    let (mut genoa, mut turin) = (None, None);
    for (name, value) in minimum {
        let object = value.as_object().ok_or_else(|| {
            SnpConfigError::MinimumTcb(format!("{name}: not an object of version fields"))
        })?;
        let allowed: &[&str] = match name.as_str() {
            "Genoa" => &[
                "bootloaderVersion",
                "teeVersion",
                "snpVersion",
                "microcodeVersion",
            ],
            "Turin" => &[
                "fmcVersion",
                "bootloaderVersion",
                "teeVersion",
                "snpVersion",
                "microcodeVersion",
            ],
            "Milan" => {
                return Err(SnpConfigError::MinimumTcb(
                    "Milan's minimum is the top-level bootloaderVersion, teeVersion, snpVersion and microcodeVersion (Constellation's fields), not minimumTcb.Milan".to_owned(),
                ));
            }
            other => {
                return Err(SnpConfigError::MinimumTcb(format!(
                    "{other:?} is not Genoa or Turin"
                )));
            }
        };
        if let Some(unknown) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(SnpConfigError::MinimumTcb(format!(
                "{name}.{unknown} is not one of {}",
                allowed.join(", ")
            )));
        }
        let prefix = format!("minimumTcb.{name}.");
        if name == "Genoa" {
            genoa = Some(tcb_fields(object, &prefix, false)?);
        } else {
            turin = Some(tcb_fields(object, &prefix, true)?);
        }
    }
    Ok((genoa, turin))
}

/// A list of `N`-byte hex values; a present list must not be empty.
fn hex_list<const N: usize>(
    values: Option<Vec<String>>,
    field: &'static str,
) -> Result<Option<Vec<[u8; N]>>, SnpConfigError> {
    let Some(values) = values else {
        return Ok(None);
    };
    if values.is_empty() {
        return Err(SnpConfigError::BadPin {
            field,
            reason: "empty: no report could pass; leave the field out to not check it".to_owned(),
        });
    }
    values
        .iter()
        .map(|v| hex_value::<N>(v, field))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn hex_value<const N: usize>(value: &str, field: &'static str) -> Result<[u8; N], SnpConfigError> {
    hex::decode(value)
        .ok()
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| SnpConfigError::BadPin {
            field,
            reason: format!("{value:?} is not {N} bytes of hex"),
        })
}

impl SnpConfig {
    /// Reads the SNP settings from a whole attestation config (the `measurements` are read by
    /// [`crate::Policy`]), checking what every SNP variant needs.
    pub fn from_attestation_config(json: &[u8]) -> Result<SnpConfig, SnpConfigError> {
        let raw: Raw =
            serde_json::from_slice(json).map_err(|e| SnpConfigError::Json(e.to_string()))?;
        let milan = Tcb {
            fmc: None,
            bootloader: version(raw.bootloader_version.as_ref(), "bootloaderVersion".into())?,
            tee: version(raw.tee_version.as_ref(), "teeVersion".into())?,
            snp: version(raw.snp_version.as_ref(), "snpVersion".into())?,
            microcode: version(raw.microcode_version.as_ref(), "microcodeVersion".into())?,
        };
        let (genoa, turin) = match &raw.minimum_tcb {
            Some(minimum) => other_products(minimum)?,
            None => (None, None),
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
        let pins = FirmwarePins {
            measurements: hex_list(raw.launch_measurements, "launchMeasurements")?,
            author_key_digests: hex_list(
                raw.accepted_author_key_digests,
                "acceptedAuthorKeyDigests",
            )?,
            host_data: raw
                .host_data
                .as_deref()
                .map(|v| hex_value(v, "hostData"))
                .transpose()?,
            chip_ids: hex_list(raw.allowed_chip_ids, "allowedChipIds")?,
        };
        let vlek_csp_domains = match raw.vlek_csp_domains {
            None => DEFAULT_VLEK_CSP_DOMAINS.map(str::to_owned).to_vec(),
            Some(domains) if domains.is_empty() => {
                return Err(SnpConfigError::VlekCspDomains(
                    "the list is empty, which would refuse every VLEK; leave it out for AWS's \
                     amazonaws.com"
                        .to_owned(),
                ));
            }
            Some(domains) => {
                if let Some(bad) = domains
                    .iter()
                    .find(|d| d.is_empty() || d.starts_with('.') || d.contains(['/', ' ', '=']))
                {
                    return Err(SnpConfigError::VlekCspDomains(format!(
                        "{bad:?} is not a domain name (e.g. amazonaws.com.cn)"
                    )));
                }
                domains
            }
        };
        Ok(SnpConfig {
            minimum_tcb: MinimumTcbs {
                milan,
                genoa,
                turin,
            },
            smt_allowed: raw.smt_allowed.unwrap_or(true),
            firmware_signer,
            pins,
            trust,
            custom_root,
            vlek_csp_domains,
        })
    }

    /// [`SnpConfig::from_attestation_config`], refusing what leaves `variant`'s firmware
    /// unpinned: azure-sev-snp needs `firmwareSignerConfig` enforcing its ID key digests (or
    /// `launchMeasurements`), for nothing else there binds the report to Azure's firmware: a
    /// VM at VMPL 0 on any SNP host could write a software key of its own into REPORT_DATA.
    /// Constellation's config always carries the field but its loader accepts it absent; this
    /// one is stricter.
    pub fn for_variant(variant: Variant, json: &[u8]) -> Result<SnpConfig, SnpConfigError> {
        let config = SnpConfig::from_attestation_config(json)?;
        if variant == Variant::AzureSevSnp && config.pins.measurements.is_none() {
            match &config.firmware_signer {
                None => {
                    return Err(SnpConfigError::Unpinned {
                        variant,
                        field: "firmwareSignerConfig",
                        reason: "absent or null, nothing would pin the firmware (the launch MEASUREMENT is not otherwise compared), so a VM on any SNP host could join; set acceptedKeyDigests (Constellation's default accepted one is in deploy/examples) or launchMeasurements. Stricter than Constellation, which accepts the field absent",
                    });
                }
                Some(signer) if signer.enforcement == Enforcement::WarnOnly => {
                    return Err(SnpConfigError::Unpinned {
                        variant,
                        field: "firmwareSignerConfig",
                        reason: "enforcementPolicy WarnOnly pins nothing; use Equal (or MAAFallback, enforced as Equal), or set launchMeasurements. Stricter than Constellation, which accepts WarnOnly",
                    });
                }
                Some(_) => {}
            }
        }
        Ok(config)
    }

    /// The lines these settings add to the canonical text a config digest hashes: the minimum
    /// TCBs, SMT, the accepted ID key digests and their enforcement, the firmware pins and the
    /// trusted ARKs.
    pub fn canonical(&self) -> String {
        let opt = |tcb: Option<&Tcb>| tcb.map_or_else(|| "-".to_owned(), ToString::to_string);
        let mut out = format!(
            "snp:min-tcb:{}\nsnp:min-tcb-genoa:{}\nsnp:min-tcb-turin:{}\nsnp:smt:{}\n",
            self.minimum_tcb.milan,
            opt(self.minimum_tcb.genoa.as_ref()),
            opt(self.minimum_tcb.turin.as_ref()),
            self.smt_allowed
        );
        if let Some(signer) = &self.firmware_signer {
            out.push_str(&format!(
                "snp:id-key:{:?}:{}\n",
                signer.enforcement,
                sorted_hex(&signer.accepted_digests)
            ));
        }
        let pins = &self.pins;
        for (name, list) in [
            (
                "measurements",
                pins.measurements.as_ref().map(|l| sorted_hex(l)),
            ),
            (
                "author-keys",
                pins.author_key_digests.as_ref().map(|l| sorted_hex(l)),
            ),
            ("host-data", pins.host_data.map(hex::encode)),
            ("chip-ids", pins.chip_ids.as_ref().map(|l| sorted_hex(l))),
        ] {
            if let Some(list) = list {
                out.push_str(&format!("snp:{name}:{list}\n"));
            }
        }
        let mut arks: Vec<String> = self
            .trust
            .arks()
            .iter()
            .map(|a| hex::encode(a.sha256()))
            .collect();
        arks.sort();
        out.push_str(&format!("snp:ark:{}\n", arks.join(",")));
        if self.vlek_csp_domains != DEFAULT_VLEK_CSP_DOMAINS {
            let mut domains = self.vlek_csp_domains.clone();
            domains.sort();
            out.push_str(&format!("snp:vlek-csp-domains:{}\n", domains.join(",")));
        }
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
        let minimum = self
            .minimum_tcb
            .for_product(product)
            .ok_or(SnpPolicyError::NoMinimumTcb(product))?;
        for (which, tcb) in [
            ("reported", report.reported_tcb(product)),
            ("committed", committed),
            ("launch", report.launch_tcb(product)),
        ] {
            if !tcb.at_least(minimum) {
                return Err(SnpPolicyError::TcbBelowMinimum {
                    which,
                    tcb,
                    minimum: *minimum,
                });
            }
        }
        let pins = &self.pins;
        if let Some(accepted) = &pins.measurements {
            if !accepted.contains(report.measurement()) {
                return Err(SnpPolicyError::Measurement(hex::encode(
                    report.measurement(),
                )));
            }
        }
        if let Some(accepted) = &pins.author_key_digests {
            if !accepted.contains(report.author_key_digest()) {
                return Err(SnpPolicyError::AuthorKeyDigest(hex::encode(
                    report.author_key_digest(),
                )));
            }
        }
        if let Some(expected) = &pins.host_data {
            if expected != report.host_data() {
                return Err(SnpPolicyError::HostData(hex::encode(report.host_data())));
            }
        }
        if let Some(allowed) = &pins.chip_ids {
            if !allowed.contains(report.chip_id()) {
                return Err(SnpPolicyError::ChipId(hex::encode(report.chip_id())));
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

fn sorted_hex<const N: usize>(values: &[[u8; N]]) -> String {
    let mut values: Vec<String> = values.iter().map(hex::encode).collect();
    values.sort();
    values.join(",")
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
    #[error(
        "the report is from a {0} CPU and the config sets no minimum TCB for it (minimumTcb.{0}); its SVNs are on a scale of their own. Stricter than Constellation, which applies bootloaderVersion, teeVersion, snpVersion and microcodeVersion to every product"
    )]
    NoMinimumTcb(Product),
    #[error("the report's launch MEASUREMENT {0} is not in launchMeasurements")]
    Measurement(String),
    #[error("the report's AUTHOR_KEY_DIGEST {0} is not in acceptedAuthorKeyDigests")]
    AuthorKeyDigest(String),
    #[error("the report's HOST_DATA {0} is not the configured hostData")]
    HostData(String),
    #[error("the report's CHIP_ID {0} is not in allowedChipIds")]
    ChipId(String),
    #[error("the report's ID key digest {0} is not in firmwareSignerConfig.acceptedKeyDigests")]
    IdKeyDigest(String),
}
