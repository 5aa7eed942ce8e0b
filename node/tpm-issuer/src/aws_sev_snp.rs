//! aws-sev-snp documents: the vTPM document of [`TpmIssuer`] with, as its InstanceInfo, an SNP
//! report from `snp-issuer` that binds the vTPM's attestation key, as Constellation's AWS issuer
//! builds them. `join-client` issues them for a node and the `certifier` for the service's own
//! evidence.
//!
//! The binding: REPORT_DATA = SHA-512 of the AK's DER SubjectPublicKeyInfo. The AK is a primary
//! key, the same for the TPM's lifetime, so its SPKI is computed once; the report is fetched
//! fresh for every document (as Constellation does), and the quotes bind the InstanceInfo with
//! the nonce, so a report cannot be lifted into another node's document.

use attestation::{IssueError, Issuer, Variant};
use snp_issuer::{InstanceInfoError, ReportSource, aws_instance_info};

use crate::{TpmIssuer, TpmIssuerError};

/// Why an aws-sev-snp document could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SnpIssuerError {
    #[error("reading the attestation key")]
    Tpm(#[source] TpmIssuerError),
    #[error("the attestation key's public area")]
    AkPublic(#[source] attestation::tpm::ParseError),
    #[error("the attestation key has no SubjectPublicKeyInfo")]
    AkSpki(#[source] attestation::tpm::SpkiError),
    #[error("the SEV-SNP evidence")]
    InstanceInfo(#[source] InstanceInfoError),
    #[error("quoting the TPM")]
    Quote(#[source] TpmIssuerError),
}

/// Issues aws-sev-snp documents from a TPM and the guest's SNP report interface.
#[derive(Debug)]
pub struct AwsSnpIssuer {
    tpm: TpmIssuer,
    source: Box<dyn ReportSource>,
    ak_spki: Vec<u8>,
}

impl AwsSnpIssuer {
    pub fn new(tpm: TpmIssuer, source: Box<dyn ReportSource>) -> Result<Self, SnpIssuerError> {
        let ak_pub = tpm.ak_public().map_err(SnpIssuerError::Tpm)?;
        let ak = attestation::tpm::Public::parse(&ak_pub).map_err(SnpIssuerError::AkPublic)?;
        let ak_spki = ak.spki_der().map_err(SnpIssuerError::AkSpki)?;
        Ok(AwsSnpIssuer {
            tpm,
            source,
            ak_spki,
        })
    }

    /// A document binding `user_data` to `nonce`.
    pub fn issue_document(
        &self,
        user_data: &[u8],
        nonce: &[u8],
    ) -> Result<Vec<u8>, SnpIssuerError> {
        let info = aws_instance_info(self.source.as_ref(), &self.ak_spki)
            .map_err(SnpIssuerError::InstanceInfo)?;
        self.tpm
            .issue_document_with_instance_info(user_data, nonce, Some(&info))
            .map_err(SnpIssuerError::Quote)
    }
}

impl Issuer for AwsSnpIssuer {
    fn variant(&self) -> Variant {
        Variant::AwsSevSnp
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.issue_document(user_data, nonce)
            .map_err(|e| crate::issue_error(Variant::AwsSevSnp, e))
    }
}
