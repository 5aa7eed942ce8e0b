//! The TDX part of the attestation config, and the checks it drives on a verified quote.
//!
//! Constellation's fields, beside `measurements`: `qeSVN` and `pceSVN` (minimum SVNs of the
//! quoting and provisioning certification enclaves, as the quote header states them),
//! `teeTCBSVN` (16 bytes hex, a minimum for each byte of the TD report's TEE_TCB_SVN),
//! `qeVendorID` (16 bytes hex), `mrSeam` (48 bytes hex, the TDX module's measurement), `xfam`
//! (8 bytes hex) and `intelRootKey` (PEM; Intel's root built in when absent). Of these, a field
//! that is absent, zero or empty is not checked, as with Constellation.
//!
//! Fields of this service:
//! - `acceptedTcbStatuses`: the TCB statuses accepted, default `["UpToDate"]`; Revoked can
//!   never be accepted;
//! - `mrtds`: [96 hex], the accepted MRTDs (the TD's initial memory: its firmware);
//! - `mrSeams`: [96 hex], the accepted MRSEAMs, a list so that a TDX module update can be rolled
//!   out; `mrSeam` adds one more.
//!
//! What a variant must pin ([`TdxConfig::for_variant`], stricter than Constellation): both TDX
//! variants an MRSEAM (`mrSeams` or `mrSeam`); azure-tdx the MRTD (`mrtds`), since its
//! `measurements` are vTPM PCRs that a TD of any firmware can quote; qemu-tdx the MRTD too, which
//! its `measurements` do when index 0 (MRTD, as Constellation numbers it) is enforced, or
//! `mrtds`. A TD without SEPT_VE_DISABLE is refused, except on azure-tdx, whose paravisor never
//! sets it.

use dcap_qvl::TcbStatus;
use serde::Deserialize;

use super::{TdxError, Trust, VerifiedQuote};
use crate::Variant;
use crate::policy::Policy;

/// Why a TDX config could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TdxConfigError {
    #[error("attestation config: {0}")]
    Json(String),
    #[error(
        "attestation config: {field} is \"latest\", which Constellation resolves from its own API; this service cannot reach it, so set the number"
    )]
    Latest { field: &'static str },
    #[error("attestation config: {field} must be a number from 0 to 65535, got {value}")]
    BadSvn { field: &'static str, value: String },
    #[error("attestation config: {field} must be {len} bytes of hex, got {value:?}")]
    BadHex {
        field: &'static str,
        len: usize,
        value: String,
    },
    #[error("attestation config: intelRootKey: {0}")]
    RootKey(TdxError),
    #[error("attestation config: acceptedTcbStatuses: {0}")]
    Statuses(String),
    #[error("attestation config: {field}: empty: no quote could pass; leave the field out")]
    Empty { field: &'static str },
    /// A variant whose firmware would otherwise be unpinned.
    #[error("attestation config: {variant} needs {field}: {reason}")]
    Unpinned {
        variant: Variant,
        field: &'static str,
        reason: &'static str,
    },
}

/// The TDX settings of one variant's attestation config.
#[derive(Clone, Debug)]
pub struct TdxConfig {
    pub min_qe_svn: u16,
    pub min_pce_svn: u16,
    pub min_tee_tcb_svn: Option<[u8; 16]>,
    pub qe_vendor_id: Option<[u8; 16]>,
    /// The accepted MRSEAMs (`mrSeams` and `mrSeam`).
    pub mr_seams: Option<Vec<[u8; 48]>>,
    /// The accepted MRTDs (`mrtds`).
    pub mrtds: Option<Vec<[u8; 48]>>,
    pub xfam: Option<[u8; 8]>,
    /// Whether a TD must set SEPT_VE_DISABLE; only azure-tdx's paravisor TDs go without.
    pub sept_ve_disable_required: bool,
    pub trust: Trust,
    /// Whether `intelRootKey` replaced the built-in root.
    pub custom_root: bool,
    /// The TCB statuses accepted (never Revoked).
    pub accepted_statuses: Vec<TcbStatus>,
}

impl Default for TdxConfig {
    /// Checks nothing beyond Intel's: the built-in root, UpToDate only, SEPT_VE_DISABLE set.
    fn default() -> Self {
        TdxConfig {
            min_qe_svn: 0,
            min_pce_svn: 0,
            min_tee_tcb_svn: None,
            qe_vendor_id: None,
            mr_seams: None,
            mrtds: None,
            xfam: None,
            sept_ve_disable_required: true,
            trust: Trust::builtin(),
            custom_root: false,
            accepted_statuses: vec![TcbStatus::UpToDate],
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(rename = "qeSVN")]
    qe_svn: Option<serde_json::Value>,
    #[serde(rename = "pceSVN")]
    pce_svn: Option<serde_json::Value>,
    #[serde(rename = "teeTCBSVN")]
    tee_tcb_svn: Option<String>,
    #[serde(rename = "qeVendorID")]
    qe_vendor_id: Option<String>,
    mr_seam: Option<String>,
    mr_seams: Option<Vec<String>>,
    mrtds: Option<Vec<String>>,
    xfam: Option<String>,
    intel_root_key: Option<String>,
    accepted_tcb_statuses: Option<Vec<String>>,
}

fn svn(value: Option<&serde_json::Value>, field: &'static str) -> Result<u16, TdxConfigError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(0),
        Some(serde_json::Value::String(s)) if s.eq_ignore_ascii_case("latest") => {
            Err(TdxConfigError::Latest { field })
        }
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| TdxConfigError::BadSvn {
                field,
                value: n.to_string(),
            }),
        Some(other) => Err(TdxConfigError::BadSvn {
            field,
            value: other.to_string(),
        }),
    }
}

/// A fixed-size hex field; absent or empty is `None`, all zero is `None` too (Constellation's
/// unset value).
fn bytes<const N: usize>(
    value: Option<&str>,
    field: &'static str,
) -> Result<Option<[u8; N]>, TdxConfigError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let bytes = hex::decode(value)
        .ok()
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| TdxConfigError::BadHex {
            field,
            len: N,
            value: value.to_owned(),
        })?;
    Ok(bytes.iter().any(|&b| b != 0).then_some(bytes))
}

/// A list of 48-byte hex values; a present list must not be empty.
fn list48(
    values: Option<&[String]>,
    field: &'static str,
) -> Result<Option<Vec<[u8; 48]>>, TdxConfigError> {
    let Some(values) = values else {
        return Ok(None);
    };
    if values.is_empty() {
        return Err(TdxConfigError::Empty { field });
    }
    values
        .iter()
        .map(|v| {
            hex::decode(v)
                .ok()
                .and_then(|b| <[u8; 48]>::try_from(b).ok())
                .ok_or_else(|| TdxConfigError::BadHex {
                    field,
                    len: 48,
                    value: v.clone(),
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A TCB status by the name Intel's collateral uses.
pub fn parse_status(name: &str) -> Option<TcbStatus> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

impl TdxConfig {
    /// Reads the TDX settings from a whole attestation config (the `measurements` are read by
    /// [`crate::Policy`]).
    pub fn from_attestation_config(json: &[u8]) -> Result<TdxConfig, TdxConfigError> {
        let raw: Raw =
            serde_json::from_slice(json).map_err(|e| TdxConfigError::Json(e.to_string()))?;
        let (trust, custom_root) = match raw.intel_root_key.as_deref() {
            None | Some("") => (Trust::builtin(), false),
            Some(pem) => (
                Trust::from_pem(pem.as_bytes()).map_err(TdxConfigError::RootKey)?,
                true,
            ),
        };
        let accepted_statuses = match raw.accepted_tcb_statuses {
            None => vec![TcbStatus::UpToDate],
            Some(names) if names.is_empty() => {
                return Err(TdxConfigError::Statuses(
                    "empty: no quote could be accepted".to_owned(),
                ));
            }
            Some(names) => {
                let mut statuses = Vec::new();
                for name in names {
                    let status = parse_status(&name).ok_or_else(|| {
                        TdxConfigError::Statuses(format!("{name:?} is not a TCB status"))
                    })?;
                    if status == TcbStatus::Revoked {
                        return Err(TdxConfigError::Statuses(
                            "Revoked can never be accepted".to_owned(),
                        ));
                    }
                    if !statuses.contains(&status) {
                        statuses.push(status);
                    }
                }
                statuses
            }
        };
        let mut mr_seams = list48(raw.mr_seams.as_deref(), "mrSeams")?;
        if let Some(single) = bytes::<48>(raw.mr_seam.as_deref(), "mrSeam")? {
            let list = mr_seams.get_or_insert_with(Vec::new);
            if !list.contains(&single) {
                list.push(single);
            }
        }
        Ok(TdxConfig {
            min_qe_svn: svn(raw.qe_svn.as_ref(), "qeSVN")?,
            min_pce_svn: svn(raw.pce_svn.as_ref(), "pceSVN")?,
            min_tee_tcb_svn: bytes(raw.tee_tcb_svn.as_deref(), "teeTCBSVN")?,
            qe_vendor_id: bytes(raw.qe_vendor_id.as_deref(), "qeVendorID")?,
            mr_seams,
            mrtds: list48(raw.mrtds.as_deref(), "mrtds")?,
            xfam: bytes(raw.xfam.as_deref(), "xfam")?,
            sept_ve_disable_required: true,
            trust,
            custom_root,
            accepted_statuses,
        })
    }

    /// [`TdxConfig::from_attestation_config`], refusing what leaves `variant`'s firmware
    /// unpinned, given the variant's measurement `policy` (see the module docs), and exempting
    /// azure-tdx (only) from SEPT_VE_DISABLE.
    pub fn for_variant(
        variant: Variant,
        json: &[u8],
        policy: &Policy,
    ) -> Result<TdxConfig, TdxConfigError> {
        let mut config = TdxConfig::from_attestation_config(json)?;
        let unpinned = |field, reason| TdxConfigError::Unpinned {
            variant,
            field,
            reason,
        };
        if config.mr_seams.is_none() {
            return Err(unpinned(
                "mrSeams",
                "no MRSEAM is pinned, so a TD under any TDX module Intel signed would pass; list the accepted TDX modules' MRSEAMs (attest-tool tdx verify prints a quote's), or set Constellation's mrSeam. Stricter than Constellation, which leaves mrSeam optional",
            ));
        }
        match variant {
            Variant::AzureTdx => {
                if config.mrtds.is_none() {
                    return Err(unpinned(
                        "mrtds",
                        "no MRTD is pinned, and the measurements are vTPM PCRs that a TD of any firmware can quote, so any UpToDate TD anywhere could join with a key of its own; list the accepted MRTDs (attest-tool tdx verify prints a quote's). Stricter than Constellation, which does not check the MRTD on azure-tdx",
                    ));
                }
                config.sept_ve_disable_required = false;
            }
            Variant::QemuTdx => {
                let mrtd_measured = policy.measurements().get(&0).is_some_and(|m| !m.warn_only);
                if config.mrtds.is_none() && !mrtd_measured {
                    return Err(unpinned(
                        "measurements[0] (MRTD) enforced, or mrtds",
                        "no MRTD is pinned (measurement 0 is absent or warnOnly), so a TD of any firmware could pass",
                    ));
                }
            }
            _ => {}
        }
        Ok(config)
    }

    /// The lines these settings add to the canonical text a config digest hashes.
    pub fn canonical(&self) -> String {
        let opt = |v: Option<&[u8]>| v.map(hex::encode).unwrap_or_else(|| "-".to_owned());
        let list = |v: Option<&[[u8; 48]]>| {
            v.map_or_else(
                || "-".to_owned(),
                |v| {
                    let mut v: Vec<String> = v.iter().map(hex::encode).collect();
                    v.sort();
                    v.join(",")
                },
            )
        };
        let mut statuses: Vec<String> = self
            .accepted_statuses
            .iter()
            .map(ToString::to_string)
            .collect();
        statuses.sort();
        format!(
            "tdx:qe-svn:{}\ntdx:pce-svn:{}\ntdx:tee-tcb-svn:{}\ntdx:qe-vendor:{}\ntdx:mr-seam:{}\ntdx:mrtd:{}\ntdx:xfam:{}\ntdx:sept-ve-disable:{}\ntdx:statuses:{}\ntdx:root:{}\n",
            self.min_qe_svn,
            self.min_pce_svn,
            opt(self.min_tee_tcb_svn.as_ref().map(|v| &v[..])),
            opt(self.qe_vendor_id.as_ref().map(|v| &v[..])),
            list(self.mr_seams.as_deref()),
            list(self.mrtds.as_deref()),
            opt(self.xfam.as_ref().map(|v| &v[..])),
            self.sept_ve_disable_required,
            statuses.join(","),
            self.trust.fingerprint(),
        )
    }

    /// Applies the config to a verified quote. Returns the audit notes (the status and every
    /// advisory ID), or the first check that fails.
    pub fn check(&self, verified: &VerifiedQuote) -> Result<Vec<String>, TdxPolicyError> {
        let quote = &verified.quote;
        let td = quote.td();
        if td.is_debug() {
            return Err(TdxPolicyError::Debug);
        }
        if !self.accepted_statuses.contains(&verified.status) {
            return Err(TdxPolicyError::Status {
                status: verified.status.to_string(),
                advisories: verified.advisory_ids.join(","),
                accepted: self
                    .accepted_statuses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        if self.sept_ve_disable_required && !quote.sept_ve_disable() {
            return Err(TdxPolicyError::SeptVeDisable);
        }
        if quote.qe_svn() < self.min_qe_svn {
            return Err(TdxPolicyError::Svn {
                which: "QE",
                svn: quote.qe_svn(),
                minimum: self.min_qe_svn,
            });
        }
        if quote.pce_svn() < self.min_pce_svn {
            return Err(TdxPolicyError::Svn {
                which: "PCE",
                svn: quote.pce_svn(),
                minimum: self.min_pce_svn,
            });
        }
        if let Some(minimum) = &self.min_tee_tcb_svn {
            if let Some(index) = (0..16).find(|&i| td.tee_tcb_svn[i] < minimum[i]) {
                return Err(TdxPolicyError::TeeTcbSvn {
                    index,
                    svn: hex::encode(td.tee_tcb_svn),
                    minimum: hex::encode(minimum),
                });
            }
        }
        for (field, expected, actual) in [
            (
                "qeVendorID",
                self.qe_vendor_id.as_ref().map(|v| &v[..]),
                &quote.qe_vendor_id()[..],
            ),
            ("xfam", self.xfam.as_ref().map(|v| &v[..]), &td.xfam[..]),
        ] {
            if let Some(expected) = expected {
                if expected != actual {
                    return Err(TdxPolicyError::Mismatch {
                        field,
                        expected: hex::encode(expected),
                        actual: hex::encode(actual),
                    });
                }
            }
        }
        if let Some(accepted) = &self.mr_seams {
            if !accepted.contains(&td.mr_seam) {
                return Err(TdxPolicyError::MrSeam(hex::encode(td.mr_seam)));
            }
        }
        if let Some(accepted) = &self.mrtds {
            if !accepted.contains(&td.mr_td) {
                return Err(TdxPolicyError::Mrtd(hex::encode(td.mr_td)));
            }
        }
        let advisories = if verified.advisory_ids.is_empty() {
            "none".to_owned()
        } else {
            verified.advisory_ids.join(",")
        };
        Ok(vec![format!(
            "TCB status {} (accepted: {}), advisories {advisories}",
            verified.status,
            self.accepted_statuses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )])
    }
}

/// Which policy check refused a verified quote.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TdxPolicyError {
    #[error("the TD is a debug TD (TD attributes allow debugging)")]
    Debug,
    #[error(
        "the TD does not set SEPT_VE_DISABLE (TD attributes bit 28), so its host can inject #VE on private memory; only azure-tdx's paravisor TDs are exempt. Stricter than Constellation, which accepts it on qemu-tdx"
    )]
    SeptVeDisable,
    #[error("the TD's MRSEAM {0} (its TDX module) is not in mrSeams or mrSeam")]
    MrSeam(String),
    #[error("the TD's MRTD {0} (its firmware) is not in mrtds")]
    Mrtd(String),
    #[error(
        "the TCB status is {status} (advisories: {advisories}), not one the config accepts ({accepted})"
    )]
    Status {
        status: String,
        advisories: String,
        accepted: String,
    },
    #[error("the {which} SVN {svn} is below the configured minimum {minimum}")]
    Svn {
        which: &'static str,
        svn: u16,
        minimum: u16,
    },
    #[error("TEE_TCB_SVN {svn} is below the configured minimum {minimum} at byte {index}")]
    TeeTcbSvn {
        index: usize,
        svn: String,
        minimum: String,
    },
    #[error("{field} is {actual}, the config expects {expected}")]
    Mismatch {
        field: &'static str,
        expected: String,
        actual: String,
    },
}
