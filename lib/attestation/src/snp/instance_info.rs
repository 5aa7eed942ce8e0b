//! Constellation's SNP `InstanceInfo`: the hardware evidence a vTPM document of an SNP variant
//! carries, JSON as Go's `encoding/json` writes it (byte fields standard base64, nil `null`):
//! `{"ReportSigner", "CertChain", "AttestationReport", "Azure": {"RuntimeData", "MAAToken"},
//! "GCP": {...}}`.
//!
//! Only the intermediate (ASK or ASVK) is taken from `CertChain`: an ARK a node sends is
//! ignored, the configured one is used. At most two certificates are accepted there, as
//! Constellation does.

use base64::Engine as _;
use serde::Deserialize;

use super::certs::{Cert, certs_from_pem};
use super::{Report, SnpError};

/// The largest InstanceInfo accepted: a report, three certificates and Azure's runtime data
/// are a few kilobytes.
pub const MAX_INSTANCE_INFO: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Raw {
    #[serde(default, with = "crate::vtpm::document::b64")]
    report_signer: Vec<u8>,
    #[serde(default, with = "crate::vtpm::document::b64")]
    cert_chain: Vec<u8>,
    #[serde(default, with = "crate::vtpm::document::b64")]
    attestation_report: Vec<u8>,
    #[serde(default)]
    azure: Option<RawAzure>,
    #[serde(default, rename = "GCP")]
    gcp: Option<GceInstance>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAzure {
    #[serde(default, with = "crate::vtpm::document::b64")]
    runtime_data: Vec<u8>,
    #[serde(default, rename = "MAAToken")]
    _maa_token: Option<String>,
}

pub use crate::gce::GceInstance;

/// The parsed InstanceInfo.
#[derive(Clone, Debug)]
pub struct InstanceInfo {
    pub report: Report,
    /// The VCEK or VLEK, if the node sent one.
    pub signer: Option<Cert>,
    /// The ASK or ASVK, if the node sent one.
    pub intermediate: Option<Cert>,
    /// Azure's HCL runtime data (JSON), for azure-sev-snp.
    pub azure_runtime_data: Option<Vec<u8>>,
    /// The instance, for gcp-sev-snp.
    pub gce: Option<GceInstance>,
}

fn bad(reason: impl Into<String>) -> SnpError {
    SnpError::InstanceInfo(reason.into())
}

impl InstanceInfo {
    pub fn parse(bytes: &[u8]) -> Result<InstanceInfo, SnpError> {
        if bytes.len() > MAX_INSTANCE_INFO {
            return Err(bad(format!(
                "{} bytes, more than the limit of {MAX_INSTANCE_INFO}",
                bytes.len()
            )));
        }
        let raw: Raw = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not JSON of the SNP shape: {e}")))?;
        if raw.attestation_report.is_empty() {
            return Err(bad("no AttestationReport"));
        }
        let report = Report::parse(&raw.attestation_report)?;
        let signer = if raw.report_signer.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            let mut certs = certs_from_pem(&raw.report_signer)?;
            if certs.len() != 1 {
                return Err(bad(format!(
                    "ReportSigner holds {} certificates, not one",
                    certs.len()
                )));
            }
            certs.pop()
        };
        let intermediate = if raw.cert_chain.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            let certs = certs_from_pem(&raw.cert_chain)?;
            if certs.len() > 2 {
                return Err(bad(format!(
                    "CertChain holds {} certificates, at most two (ASK, ARK)",
                    certs.len()
                )));
            }
            let mut intermediate = None;
            for cert in certs {
                let cn = cert.common_name();
                if cn.starts_with("ARK-") {
                    continue; // the configured ARK is used, never the node's
                }
                if !cn.starts_with("SEV-") || intermediate.is_some() {
                    return Err(bad(format!(
                        "CertChain holds {cn:?}, not one ASK or ASVK and an ARK"
                    )));
                }
                intermediate = Some(cert);
            }
            intermediate
        };
        Ok(InstanceInfo {
            report,
            signer,
            intermediate,
            azure_runtime_data: raw.azure.map(|a| a.runtime_data),
            gce: raw.gcp,
        })
    }
}

/// One key of Azure's HCL runtime data (a JWK).
#[derive(Clone, Debug, Deserialize)]
pub struct RuntimeKey {
    #[serde(default)]
    pub kid: String,
    #[serde(default)]
    pub kty: String,
    #[serde(default)]
    pub n: String,
    #[serde(default)]
    pub e: String,
}

#[derive(Deserialize)]
struct RuntimeData {
    #[serde(default)]
    keys: Vec<RuntimeKey>,
}

/// The RSA key (modulus, exponent; big-endian, no leading zeros) Azure's runtime data names
/// first: the HCL attestation key.
pub fn azure_runtime_ak(runtime_data: &[u8]) -> Result<(Vec<u8>, Vec<u8>), SnpError> {
    let data: RuntimeData = serde_json::from_slice(runtime_data)
        .map_err(|e| bad(format!("Azure RuntimeData is not JSON with keys: {e}")))?;
    let key = data
        .keys
        .first()
        .ok_or_else(|| bad("Azure RuntimeData has no keys"))?;
    if key.kty != "RSA" {
        return Err(bad(format!(
            "Azure RuntimeData keys[0] is {:?}, not RSA",
            key.kty
        )));
    }
    let decode = |field: &str, value: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(value.trim_end_matches('='))
            .map(|v| {
                let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
                v[first..].to_vec()
            })
            .map_err(|e| bad(format!("Azure RuntimeData keys[0].{field}: {e}")))
    };
    Ok((decode("n", &key.n)?, decode("e", &key.e)?))
}

/// Checks Azure's HCL binding (azure-sev-snp and azure-tdx alike): the hardware report's
/// REPORT_DATA[0:32] is SHA-256 of the runtime data, and the runtime data's `keys[0]` is `ak`.
pub fn check_azure_binding(
    report_data: &[u8],
    runtime_data: &[u8],
    ak: &crate::tpm::Public,
) -> Result<(), crate::Error> {
    use crate::Error;
    use subtle::ConstantTimeEq;
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, runtime_data);
    let head = report_data.get(..32).unwrap_or_default();
    if !bool::from(digest.as_ref().ct_eq(head)) {
        return Err(Error::Binding(
            "REPORT_DATA[0:32] is not SHA-256 of the HCL runtime data".to_owned(),
        ));
    }
    let (n, e) = azure_runtime_ak(runtime_data)?;
    let crate::tpm::PublicKey::Rsa {
        exponent, modulus, ..
    } = &ak.key
    else {
        return Err(Error::Binding(
            "the runtime data's key is RSA, the attestation key is not".to_owned(),
        ));
    };
    let exponent = if *exponent == 0 { 65537 } else { *exponent };
    let ak_e = exponent.to_be_bytes();
    let first = ak_e.iter().position(|&b| b != 0).unwrap_or(ak_e.len());
    let ak_n = &modulus[modulus
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(modulus.len())..];
    if n != ak_n || e != ak_e[first..] {
        return Err(Error::Binding(
            "the runtime data's keys[0] is not the attestation key".to_owned(),
        ));
    }
    Ok(())
}
