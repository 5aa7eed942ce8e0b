//! `certifier`: parse config, init logging, open the device, serve until SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use attestation::{Issuer, Variant};
use certifier::Config;
use clap::Parser;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    plumbing::telemetry::init(config.log_format);
    let issuer: Arc<dyn Issuer> = match config.variant {
        Variant::QemuVtpm => {
            let mut tpm = tpm_issuer::TpmIssuerConfig::new(&config.tcti);
            tpm.event_log = config.event_log.clone();
            Arc::new(
                tpm_issuer::TpmIssuer::open(&tpm)
                    .with_context(|| format!("opening the TPM at {}", config.tcti))?,
            )
        }
        Variant::QemuTdx => Arc::new(
            tdx_issuer::QemuTdxIssuer::open(&config.tsm_report_dir)
                .context("opening the TDX quote interface")?,
        ),
        other => {
            anyhow::bail!("the certifier issues qemu-vtpm and qemu-tdx documents only, not {other}")
        }
    };
    certifier::run(config, issuer, Shutdown::on_signal()).await?;
    Ok(())
}
