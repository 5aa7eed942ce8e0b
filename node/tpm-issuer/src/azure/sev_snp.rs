//! azure-sev-snp: the HCL's SEV-SNP report and runtime data as the SNP InstanceInfo
//! (`{"ReportSigner", "CertChain", "AttestationReport", "Azure": {"RuntimeData", "MAAToken"}}`,
//! bytes standard base64 as Go's `encoding/json` writes them).
//!
//! The VCEK and its chain are left to the verifier, which fetches the VCEK the report's chip ID
//! and reported TCB name from AMD (attest-proxy's KDS cache), so `ReportSigner` and `CertChain`
//! are `null`; no MAA token is asked for (`MAAToken` is empty, which Constellation's validators
//! accept).

use attestation::{IssueError, Issuer, Variant};
use base64::Engine as _;

use super::{AzureIssuerError, HclReportType, read_hcl_report};
use crate::TpmIssuer;

/// Issues azure-sev-snp documents from an Azure CVM's vTPM.
#[derive(Debug)]
pub struct AzureSnpIssuer {
    tpm: TpmIssuer,
}

impl AzureSnpIssuer {
    /// An issuer over `tpm`, which must attest with the HCL's key ([`super::open_tpm`]).
    pub fn new(tpm: TpmIssuer) -> Self {
        AzureSnpIssuer { tpm }
    }

    /// Opens the vTPM at `tcti` with the HCL's attestation key.
    pub fn open(tcti: &str) -> Result<Self, AzureIssuerError> {
        Ok(AzureSnpIssuer::new(super::open_tpm(tcti)?))
    }

    /// The InstanceInfo of the HCL report the vTPM holds now.
    pub fn instance_info(&self) -> Result<Vec<u8>, AzureIssuerError> {
        let hcl = read_hcl_report(&self.tpm, HclReportType::Snp)?;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let info = serde_json::json!({
            "ReportSigner": null,
            "CertChain": null,
            "AttestationReport": b64(&hcl.hw_report),
            "Azure": { "RuntimeData": b64(&hcl.runtime_data), "MAAToken": "" },
            "GCP": null,
        });
        Ok(info.to_string().into_bytes())
    }
}

impl Issuer for AzureSnpIssuer {
    fn variant(&self) -> Variant {
        Variant::AzureSevSnp
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        super::issue_document(
            &self.tpm,
            self.variant(),
            self.instance_info(),
            user_data,
            nonce,
        )
    }
}
