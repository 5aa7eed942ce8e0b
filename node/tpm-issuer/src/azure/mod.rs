//! azure-sev-snp and azure-tdx documents: the vTPM document of [`TpmIssuer`], attested with the
//! key Azure's paravisor (the HCL) persisted at [`HCL_AK_HANDLE`], whose InstanceInfo carries
//! the hardware report the HCL made at boot and the runtime data that report binds.
//!
//! The HCL leaves its report in vTPM NV index [`HCL_REPORT_NV_INDEX`]: a 32-byte header
//! (signature `HCLA`, version, size, request type, status), a 1184-byte hardware report area
//! (the SEV-SNP report, or a 1024-byte TDX TD report), then IGVM request data whose report type
//! says which of the two it is and whose variable data is the runtime data: JSON whose
//! `keys[0]` is the AK. The hardware report's REPORT_DATA[0:32] is SHA-256 of that runtime
//! data, so the report vouches for the AK and the quotes (which bind the InstanceInfo and the
//! nonce) for everything else.
//!
//! As Constellation's issuers, these read the report the HCL made at boot and do not ask it
//! for a fresh one (by writing user data to NV index 0x01400002): the binding is to the AK,
//! and freshness comes from the quotes.
//!
//! azure-trustedlaunch (a Trusted Launch VM: a vTPM, no HCL report) attests with the same key
//! handle; Azure's certificate for it, not a hardware report, vouches for it ([`trustedlaunch`]).

mod http;
pub mod sev_snp;
pub mod tdx;
pub mod trustedlaunch;

use attestation::{IssueError, Variant};

use crate::{TpmIssuer, TpmIssuerError};

/// The NV index where Azure's HCL leaves its report.
pub const HCL_REPORT_NV_INDEX: u32 = 0x0140_0001;
/// The persistent handle of the HCL's attestation key, the one the runtime data names.
pub const HCL_AK_HANDLE: u32 = 0x8100_0003;
/// The largest NV index read as an HCL report: Azure's are under 3 KiB.
pub const MAX_HCL_REPORT: usize = 16 * 1024;

/// `HCLA`, little-endian: the header's signature.
pub const HCL_SIGNATURE: u32 = 0x414c_4348;
/// The header before the hardware report.
pub const HCL_HEADER_LEN: usize = 32;
/// The hardware report area: an SEV-SNP report fills it, a TD report is padded in it.
pub const HW_REPORT_AREA: usize = 1184;
/// An SEV-SNP attestation report.
pub const SNP_REPORT_LEN: usize = 1184;
/// A TDX TD report (TDREPORT_STRUCT).
pub const TD_REPORT_LEN: usize = 1024;
/// Where the IGVM request data starts: its report type at +8, the variable data's size at +16
/// and the variable data (the runtime data) at +20.
pub const REQUEST_DATA_OFFSET: usize = HCL_HEADER_LEN + HW_REPORT_AREA;
const REPORT_TYPE_OFFSET: usize = REQUEST_DATA_OFFSET + 8;
const RUNTIME_DATA_SIZE_OFFSET: usize = REQUEST_DATA_OFFSET + 16;
/// Where the runtime data starts.
pub const RUNTIME_DATA_OFFSET: usize = REQUEST_DATA_OFFSET + 20;

/// The hardware an HCL report comes from (the IGVM request data's report type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HclReportType {
    /// 2: an AMD SEV-SNP report.
    Snp,
    /// 4: an Intel TDX TD report.
    Tdx,
}

impl HclReportType {
    /// The value of the report type field.
    pub fn id(self) -> u32 {
        match self {
            HclReportType::Snp => 2,
            HclReportType::Tdx => 4,
        }
    }

    fn report_len(self) -> usize {
        match self {
            HclReportType::Snp => SNP_REPORT_LEN,
            HclReportType::Tdx => TD_REPORT_LEN,
        }
    }
}

impl std::fmt::Display for HclReportType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HclReportType::Snp => "SEV-SNP",
            HclReportType::Tdx => "TDX",
        })
    }
}

/// Why an HCL report is unusable.
#[derive(Debug, thiserror::Error)]
pub enum HclError {
    #[error("{len} bytes end before {what} (which needs {need})")]
    Truncated {
        what: &'static str,
        need: usize,
        len: usize,
    },
    #[error("the header's signature is {0:#010x}, not HCLA (0x414c4348)")]
    Signature(u32),
    #[error("its report type is {found}, not {expected} ({})", expected.id())]
    ReportType { expected: HclReportType, found: u32 },
    #[error("it has no runtime data")]
    NoRuntimeData,
}

/// The parts of an HCL report a document carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HclReport {
    /// The SEV-SNP report or the TD report, without the area's padding.
    pub hw_report: Vec<u8>,
    /// The runtime data (JSON) the hardware report binds.
    pub runtime_data: Vec<u8>,
}

fn u32_at(bytes: &[u8], offset: usize, what: &'static str) -> Result<u32, HclError> {
    bytes
        .get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(HclError::Truncated {
            what,
            need: offset + 4,
            len: bytes.len(),
        })
}

/// Parses an HCL report that must hold an `expected` hardware report. Anything after the
/// runtime data (the NV index is larger than the report) is ignored.
pub fn parse_hcl_report(bytes: &[u8], expected: HclReportType) -> Result<HclReport, HclError> {
    let signature = u32_at(bytes, 0, "the header's signature")?;
    if signature != HCL_SIGNATURE {
        return Err(HclError::Signature(signature));
    }
    let found = u32_at(bytes, REPORT_TYPE_OFFSET, "the report type")?;
    if found != expected.id() {
        return Err(HclError::ReportType { expected, found });
    }
    let hw_report = bytes
        .get(HCL_HEADER_LEN..HCL_HEADER_LEN + expected.report_len())
        .ok_or(HclError::Truncated {
            what: "the end of the hardware report",
            need: HCL_HEADER_LEN + expected.report_len(),
            len: bytes.len(),
        })?;
    let size = u32_at(bytes, RUNTIME_DATA_SIZE_OFFSET, "the runtime data's size")?;
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size == 0 {
        return Err(HclError::NoRuntimeData);
    }
    let end = RUNTIME_DATA_OFFSET.saturating_add(size);
    let runtime_data = bytes
        .get(RUNTIME_DATA_OFFSET..end)
        .ok_or(HclError::Truncated {
            what: "the end of the runtime data",
            need: end,
            len: bytes.len(),
        })?;
    Ok(HclReport {
        hw_report: hw_report.to_vec(),
        runtime_data: runtime_data.to_vec(),
    })
}

/// Why an Azure document could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AzureIssuerError {
    #[error("opening the HCL's attestation key")]
    Ak(#[source] TpmIssuerError),
    #[error(
        "reading Azure's HCL report from the vTPM (NV index {HCL_REPORT_NV_INDEX:#010x}); is this an Azure confidential VM?"
    )]
    ReadHcl(#[source] TpmIssuerError),
    #[error("Azure's HCL report is unusable")]
    Hcl(#[source] HclError),
    #[error("getting a TD quote for the HCL's TD report")]
    Quote(#[source] tdx::QuoteError),
    #[error("quoting the TPM")]
    TpmQuote(#[source] TpmIssuerError),
    #[error("getting Azure's AK certificate and its CA")]
    TrustedLaunch(#[source] trustedlaunch::TrustedLaunchError),
}

/// The TPM configuration the Azure variants attest with: the TPM at `tcti` and the key Azure
/// persisted at [`HCL_AK_HANDLE`] (the caller may add an event log).
pub fn tpm_config(tcti: &str) -> crate::TpmIssuerConfig {
    let mut config = crate::TpmIssuerConfig::new(tcti);
    config.persistent_ak = Some(HCL_AK_HANDLE);
    config
}

/// Opens the TPM at `tcti` with the HCL's attestation key.
pub fn open_tpm(tcti: &str) -> Result<TpmIssuer, AzureIssuerError> {
    TpmIssuer::open(&tpm_config(tcti)).map_err(AzureIssuerError::Ak)
}

/// Reads and parses the HCL report in `tpm`, which must hold an `expected` hardware report.
pub fn read_hcl_report(
    tpm: &TpmIssuer,
    expected: HclReportType,
) -> Result<HclReport, AzureIssuerError> {
    let bytes = tpm
        .read_nv(HCL_REPORT_NV_INDEX, MAX_HCL_REPORT)
        .map_err(AzureIssuerError::ReadHcl)?;
    parse_hcl_report(&bytes, expected).map_err(AzureIssuerError::Hcl)
}

/// What the Azure issuers issue: a vTPM document from `tpm` binding `user_data` to `nonce`,
/// carrying `instance_info` (made from the HCL report the vTPM holds now); a failure at either
/// step is `variant`'s.
fn issue_document(
    tpm: &TpmIssuer,
    variant: Variant,
    instance_info: Result<Vec<u8>, AzureIssuerError>,
    user_data: &[u8],
    nonce: &[u8],
) -> Result<Vec<u8>, IssueError> {
    instance_info
        .and_then(|info| {
            tpm.issue_document_with_instance_info(user_data, nonce, Some(&info))
                .map_err(AzureIssuerError::TpmQuote)
        })
        .map_err(|e| crate::issue_error(variant, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn blob(report_type: u32, hw: &[u8], runtime: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; RUNTIME_DATA_OFFSET];
        b[..4].copy_from_slice(&HCL_SIGNATURE.to_le_bytes());
        b[HCL_HEADER_LEN..HCL_HEADER_LEN + hw.len()].copy_from_slice(hw);
        b[REPORT_TYPE_OFFSET..REPORT_TYPE_OFFSET + 4].copy_from_slice(&report_type.to_le_bytes());
        b[RUNTIME_DATA_SIZE_OFFSET..RUNTIME_DATA_SIZE_OFFSET + 4]
            .copy_from_slice(&u32::try_from(runtime.len()).unwrap().to_le_bytes());
        b.extend_from_slice(runtime);
        b
    }

    #[test]
    fn the_report_and_runtime_data_are_cut_where_the_hcl_puts_them() {
        let hw = [7u8; SNP_REPORT_LEN];
        let mut bytes = blob(2, &hw, b"{\"keys\":[]}");
        bytes.extend_from_slice(&[0; 300]); // the rest of the NV index
        let report = parse_hcl_report(&bytes, HclReportType::Snp).unwrap();
        assert_eq!(report.hw_report, hw);
        assert_eq!(report.runtime_data, b"{\"keys\":[]}");

        let td = [9u8; TD_REPORT_LEN];
        let report = parse_hcl_report(&blob(4, &td, b"{}"), HclReportType::Tdx).unwrap();
        assert_eq!(report.hw_report, td);
        assert_eq!(report.runtime_data, b"{}");
    }

    #[test]
    fn bad_reports_are_refused_by_what_is_wrong() {
        let good = blob(2, &[1; SNP_REPORT_LEN], b"{\"keys\":[]}");
        for cut in [0, 3, 100, REPORT_TYPE_OFFSET + 2, good.len() - 1] {
            let err = parse_hcl_report(&good[..cut], HclReportType::Snp).unwrap_err();
            assert!(
                matches!(err, HclError::Truncated { len, .. } if len == cut),
                "{cut}: {err}"
            );
        }
        assert_eq!(
            parse_hcl_report(&good[..good.len() - 1], HclReportType::Snp)
                .unwrap_err()
                .to_string(),
            format!(
                "{} bytes end before the end of the runtime data (which needs {})",
                good.len() - 1,
                good.len()
            )
        );
        let mut unsigned = good.clone();
        unsigned[0] = b'X';
        assert!(matches!(
            parse_hcl_report(&unsigned, HclReportType::Snp),
            Err(HclError::Signature(_))
        ));
        assert_eq!(
            parse_hcl_report(&good, HclReportType::Tdx)
                .unwrap_err()
                .to_string(),
            "its report type is 2, not TDX (4)"
        );
        assert!(matches!(
            parse_hcl_report(&blob(2, &[1; SNP_REPORT_LEN], b""), HclReportType::Snp),
            Err(HclError::NoRuntimeData)
        ));
        let mut huge = good.clone();
        huge[RUNTIME_DATA_SIZE_OFFSET..RUNTIME_DATA_SIZE_OFFSET + 4]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_hcl_report(&huge, HclReportType::Snp),
            Err(HclError::Truncated { .. })
        ));
    }

    fn testdata(path: &str) -> Vec<u8> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lib/attestation/testdata");
        std::fs::read(dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Azure's own HCL reports (testdata README): the cut gives the report whose REPORT_DATA
    /// binds the runtime data, and runtime data naming HCLAkPub first.
    #[test]
    fn real_hcl_reports_from_azure_parse() {
        for (path, report_type, report_data_at, runtime_len) in [
            (
                "snp/azure-milan-vtpm/hcl-report.bin",
                HclReportType::Snp,
                0x50,
                1110,
            ),
            (
                "tdx/azure-tdx-vtpm/hcl-report.bin",
                HclReportType::Tdx,
                128,
                1201,
            ),
        ] {
            let bytes = testdata(path);
            let report = parse_hcl_report(&bytes, report_type).unwrap();
            assert_eq!(report.runtime_data.len(), runtime_len, "{path}");
            let digest =
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &report.runtime_data);
            assert_eq!(
                &report.hw_report[report_data_at..report_data_at + 32],
                digest.as_ref(),
                "{path}"
            );
            let json: serde_json::Value = serde_json::from_slice(&report.runtime_data).unwrap();
            assert_eq!(json["keys"][0]["kid"], "HCLAkPub", "{path}");
            let other = match report_type {
                HclReportType::Snp => HclReportType::Tdx,
                HclReportType::Tdx => HclReportType::Snp,
            };
            assert!(matches!(
                parse_hcl_report(&bytes, other),
                Err(HclError::ReportType { .. })
            ));
        }
    }
}
