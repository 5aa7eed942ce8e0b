//! Node-side AMD SEV-SNP: the attestation report and AMD's certificates, from the guest kernel.
//!
//! A node of an SNP variant proves that its vTPM's attestation key lives in a genuine SNP guest
//! by sending, beside the vTPM quotes, a report whose REPORT_DATA binds that key. This crate gets
//! such a report for given REPORT_DATA, from one of the kernel's two interfaces
//! ([`ReportSource`]):
//!
//! - [`configfs::ConfigfsTsm`], Linux's configfs-tsm (`/sys/kernel/config/tsm/report`), the
//!   interface of current kernels;
//! - [`sev_guest::SevGuest`], the SEV guest driver's ioctls on `/dev/sev-guest`, for older ones.
//!
//! Both return the host's certificate table too ([`certtable`]), from which
//! [`aws_instance_info`] builds the `InstanceInfo` an aws-sev-snp document carries, as
//! Constellation's AWS issuer does. The TPM half of the document stays with `tpm-issuer`;
//! `join-client` puts the two together. This crate knows nothing of TPMs, so the simulated
//! kernel of the tests (`soft-issuer`) can stand behind the same traits without one.
//!
//! Nothing here is trusted by anyone: the verifier checks the report and the certificates
//! against AMD's root. The checks here only turn a broken or misconfigured interface into a
//! clear error on the node instead of a refusal at the verifier.

pub mod certtable;
pub mod configfs;
pub mod sev_guest;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Serialize;

use certtable::{CertTable, CertTableError, Guid};

/// The length of REPORT_DATA, the guest's input to its report.
pub const REPORT_DATA_LEN: usize = 64;
/// The report's REPORT_DATA field.
const REPORT_DATA_OFFSET: usize = 0x50;
/// The report's VMPL field.
const VMPL_OFFSET: usize = 0x30;

/// Why no usable report could be had.
#[derive(Debug, thiserror::Error)]
pub enum SnpSourceError {
    #[error(
        "configfs-tsm is not available at {0} (no such directory: configfs not mounted, or a kernel before 6.7)"
    )]
    NoConfigfs(PathBuf),
    #[error("cannot {action} {path}")]
    Attribute {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("configfs-tsm's provider is {0:?}, not \"sev_guest\": this is no SEV-SNP guest")]
    WrongProvider(String),
    #[error("configfs-tsm's generation is {0:?}, not a number")]
    BadGeneration(String),
    #[error(
        "another writer kept changing the configfs-tsm report entry ({attempts} attempts; last: {last})"
    )]
    Raced { attempts: usize, last: String },
    #[error("the report has {0} bytes, an SNP report has 1184")]
    ReportLength(usize),
    #[error("the report's REPORT_DATA is not what was asked for (another request's report?)")]
    ReportDataMismatch,
    #[error("the report is for VMPL {got}, VMPL {asked} was asked for")]
    VmplMismatch { asked: u32, got: u32 },
    #[error("cannot use the SEV guest device {path}")]
    Device {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the SEV-SNP firmware refused the guest request: status {status:#x} ({name})")]
    Firmware { status: u32, name: &'static str },
    #[error("the firmware's report response has status {status:#x} ({name})")]
    ReportStatus { status: u32, name: &'static str },
    #[error("the firmware's report response claims {0} bytes, more than the response holds")]
    ReportSize(usize),
    #[error("the hypervisor is throttling guest requests (SNP_GUEST_VMM_ERR_BUSY); retry later")]
    HostBusy,
    #[error("the hypervisor failed the guest request with error {code}")]
    Host { code: u32 },
    #[error(
        "the hypervisor's certificates do not fit: {offered} bytes offered, {needed} asked for"
    )]
    CertBuffer { offered: usize, needed: usize },
}

/// A report and the host's certificate table, as the kernel returned them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawReport {
    pub report: Vec<u8>,
    /// The certificate table; `None` where the interface gave none.
    pub certs: Option<Vec<u8>>,
}

impl RawReport {
    /// The report is one, and the answer to this request.
    fn check(
        &self,
        report_data: &[u8; REPORT_DATA_LEN],
        vmpl: Option<u32>,
    ) -> Result<(), SnpSourceError> {
        if self.report.len() != configfs::REPORT_LEN {
            return Err(SnpSourceError::ReportLength(self.report.len()));
        }
        if &self.report[REPORT_DATA_OFFSET..REPORT_DATA_OFFSET + REPORT_DATA_LEN] != report_data {
            return Err(SnpSourceError::ReportDataMismatch);
        }
        if let Some(asked) = vmpl {
            let mut word = [0u8; 4];
            word.copy_from_slice(&self.report[VMPL_OFFSET..VMPL_OFFSET + 4]);
            let got = u32::from_le_bytes(word);
            if got != asked {
                return Err(SnpSourceError::VmplMismatch { asked, got });
            }
        }
        Ok(())
    }
}

/// Where reports come from.
pub trait ReportSource: Send + Sync + std::fmt::Debug {
    /// A fresh report over `report_data`, with the host's certificates.
    fn get_report(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<RawReport, SnpSourceError>;
    /// The interface, for messages.
    fn describe(&self) -> String;
}

/// The kernel's interface: configfs-tsm if `tsm_root` exists, else the SEV guest driver at
/// `device`.
pub fn open_kernel_source(
    tsm_root: &Path,
    device: &Path,
) -> Result<Box<dyn ReportSource>, SnpSourceError> {
    if tsm_root.is_dir() {
        return Ok(Box::new(configfs::ConfigfsTsm::new(tsm_root)));
    }
    tracing::info!(
        tsm = %tsm_root.display(),
        device = %device.display(),
        "no configfs-tsm; using the SEV guest device"
    );
    Ok(Box::new(sev_guest::SevGuest::open(device)?))
}

/// Why an InstanceInfo could not be built.
#[derive(Debug, thiserror::Error)]
pub enum InstanceInfoError {
    #[error("getting the SEV-SNP report from {source_name}")]
    Source {
        source_name: String,
        #[source]
        source: SnpSourceError,
    },
    #[error("{0} returned no certificate table; aws-sev-snp needs the VLEK from it")]
    NoCertificates(String),
    #[error("the host's certificate table")]
    CertTable(#[from] CertTableError),
    #[error(
        "the host's certificate table has no VLEK (it lists {0}); aws-sev-snp reports are VLEK-signed"
    )]
    NoVlek(String),
    #[error("the certificate table's {which} is not an AMD certificate")]
    BadCertificate {
        which: &'static str,
        #[source]
        source: attestation::snp::SnpError,
    },
    #[error("encoding the InstanceInfo")]
    Encode(#[from] serde_json::Error),
}

/// Constellation's `snp.InstanceInfo`, as Go's `encoding/json` writes it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct InstanceInfoJson {
    report_signer: Option<String>,
    cert_chain: Option<String>,
    attestation_report: String,
    azure: Option<()>,
    #[serde(rename = "GCP")]
    gcp: Option<()>,
}

fn pem(der: &[u8]) -> String {
    pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, der).unwrap_or_default()
}

/// `der` as PEM, if it is a certificate whose common name `expected` accepts.
fn checked_cert(
    der: &[u8],
    which: &'static str,
    expected: impl Fn(&str) -> bool,
) -> Result<String, InstanceInfoError> {
    let cert = attestation::snp::Cert::from_der(der.to_vec())
        .map_err(|source| InstanceInfoError::BadCertificate { which, source })?;
    let cn = cert.common_name();
    if !expected(cn) {
        return Err(InstanceInfoError::BadCertificate {
            which,
            source: attestation::snp::SnpError::Certificate(format!("its common name is {cn:?}")),
        });
    }
    Ok(pem(der))
}

/// The aws-sev-snp `InstanceInfo` for an attestation key whose DER SubjectPublicKeyInfo is
/// `ak_spki`: a report over SHA-512(`ak_spki`) from `source`, signed by the VLEK the host's
/// certificate table carries (`ReportSigner`, PEM). Constellation's AWS issuer sends only those
/// two; where the table also holds the ASVK (and the ARK), they go in `CertChain`, which
/// spares the verifier a fetch from AMD (it uses the ASVK and ignores any ARK a node sends).
pub fn aws_instance_info(
    source: &dyn ReportSource,
    ak_spki: &[u8],
) -> Result<Vec<u8>, InstanceInfoError> {
    let mut report_data = [0u8; REPORT_DATA_LEN];
    report_data
        .copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, ak_spki).as_ref());
    let raw = source
        .get_report(&report_data)
        .map_err(|e| InstanceInfoError::Source {
            source_name: source.describe(),
            source: e,
        })?;
    let certs = raw
        .certs
        .ok_or_else(|| InstanceInfoError::NoCertificates(source.describe()))?;
    let table = CertTable::parse(&certs)?;
    let vlek = table.get(Guid::VLEK).ok_or_else(|| {
        let listed: Vec<String> = table
            .entries()
            .iter()
            .map(|(g, _)| format!("{g:?}"))
            .collect();
        InstanceInfoError::NoVlek(if listed.is_empty() {
            "nothing".to_owned()
        } else {
            listed.join(", ")
        })
    })?;
    let signer = checked_cert(vlek, "VLEK", |cn| cn == "SEV-VLEK")?;
    // The ASK slot holds the ASVK where the host serves VLEKs; a VCEK's ASK there would be no
    // use to the verifier, which then fetches the ASVK itself.
    let chain = match table.get(Guid::ASK) {
        Some(asvk) => match checked_cert(asvk, "ASVK", |cn| cn.starts_with("SEV-VLEK-")) {
            Ok(mut chain) => {
                if let Some(ark) = table.get(Guid::ARK) {
                    chain += &checked_cert(ark, "ARK", |cn| cn.starts_with("ARK-"))?;
                }
                Some(chain)
            }
            Err(e) => {
                tracing::info!(error = %e, "not sending the host's ASK slot");
                None
            }
        },
        None => None,
    };
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(serde_json::to_vec(&InstanceInfoJson {
        report_signer: Some(b64(signer.as_bytes())),
        cert_chain: chain.map(|c| b64(c.as_bytes())),
        attestation_report: b64(&raw.report),
        azure: None,
        gcp: None,
    })?)
}
