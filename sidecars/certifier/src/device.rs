//! Opens the attestation device of the configured variant, as join-client opens it for a node:
//! one arm per variant, each naming the devices it holds.

use std::sync::Arc;

use attestation::{Issuer, Variant};
use tpm_issuer::aws_sev_snp::{AwsSnpIssuer, SnpIssuerError};
use tpm_issuer::azure::sev_snp::AzureSnpIssuer;
use tpm_issuer::azure::tdx::{AzureTdxIssuer, DEFAULT_QUOTE_TIMEOUT, ImdsQuoteClient, QuoteError};
use tpm_issuer::{TpmIssuer, TpmIssuerConfig, TpmIssuerError};

use crate::Config;

/// Why the device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The certifier does not issue this variant's documents.
    #[error(
        "the certifier issues qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx and azure-tdx documents only, not {0}"
    )]
    Unsupported(Variant),
    #[error("opening the TPM at {tcti}")]
    Tpm {
        tcti: String,
        #[source]
        source: TpmIssuerError,
    },
    #[error("opening the SEV-SNP report interface")]
    SnpSource(#[source] snp_issuer::SnpSourceError),
    #[error("reading the TPM's attestation key for aws-sev-snp")]
    AwsSnp(#[source] SnpIssuerError),
    #[error("opening the TDX quote interface")]
    Tdx(#[source] tdx_issuer::TdxQuoteError),
    #[error("Azure's quote service")]
    AzureQuotes(#[source] QuoteError),
}

/// The issuer for `config.variant`, on the devices `config` names. Refuses a variant it cannot
/// issue before touching any device.
pub fn open(config: &Config) -> Result<Arc<dyn Issuer>, DeviceError> {
    match config.variant {
        Variant::QemuVtpm => Ok(Arc::new(tpm(config)?)),
        Variant::AwsSevSnp => {
            let tpm = tpm(config)?;
            let source =
                snp_issuer::open_kernel_source(&config.tsm_report_dir, &config.sev_guest_device)
                    .map_err(DeviceError::SnpSource)?;
            Ok(Arc::new(
                AwsSnpIssuer::new(tpm, source).map_err(DeviceError::AwsSnp)?,
            ))
        }
        Variant::AzureSevSnp => Ok(Arc::new(AzureSnpIssuer::new(azure_tpm(config)?))),
        Variant::AzureTdx => {
            let quotes = ImdsQuoteClient::new(&config.azure_quote_url, DEFAULT_QUOTE_TIMEOUT)
                .map_err(DeviceError::AzureQuotes)?;
            Ok(Arc::new(AzureTdxIssuer::new(
                azure_tpm(config)?,
                Box::new(quotes),
            )))
        }
        Variant::QemuTdx => Ok(Arc::new(
            tdx_issuer::QemuTdxIssuer::open(&config.tsm_report_dir).map_err(DeviceError::Tdx)?,
        )),
        other => Err(DeviceError::Unsupported(other)),
    }
}

fn tpm(config: &Config) -> Result<TpmIssuer, DeviceError> {
    let mut tpm = TpmIssuerConfig::new(&config.tcti);
    tpm.event_log = config.event_log.clone();
    TpmIssuer::open(&tpm).map_err(|source| DeviceError::Tpm {
        tcti: config.tcti.clone(),
        source,
    })
}

/// The vTPM with the attestation key Azure's paravisor persisted.
fn azure_tpm(config: &Config) -> Result<TpmIssuer, DeviceError> {
    let mut tpm = tpm_issuer::azure::tpm_config(&config.tcti);
    tpm.event_log = config.event_log.clone();
    TpmIssuer::open(&tpm).map_err(|source| DeviceError::Tpm {
        tcti: config.tcti.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    fn config(variant: &str) -> Config {
        Config::try_parse_from([
            "certifier",
            "--peer-uid",
            "10001",
            "--variant",
            variant,
            "--tcti",
            "device:/nonexistent/tpm",
        ])
        .unwrap()
    }

    #[test]
    fn variants_it_cannot_issue_are_refused_by_name_before_any_device_is_opened() {
        let err = open(&config("gcp-sev-snp")).unwrap_err().to_string();
        assert_eq!(
            err,
            "the certifier issues qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx and azure-tdx documents only, not gcp-sev-snp"
        );
        // The ones it issues get as far as the TPM.
        for variant in ["qemu-vtpm", "aws-sev-snp", "azure-sev-snp", "azure-tdx"] {
            let err = open(&config(variant)).unwrap_err();
            assert!(
                matches!(&err, DeviceError::Tpm { tcti, .. } if tcti == "device:/nonexistent/tpm"),
                "{variant}: {err}"
            );
        }
    }
}
