//! `certifier`: parse config, init logging, open the device, serve until SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use attestation::Variant;
use certifier::Config;
use clap::Parser;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    plumbing::telemetry::init(config.log_format);
    if config.variant != Variant::QemuVtpm {
        anyhow::bail!(
            "the certifier issues qemu-vtpm documents only, not {}",
            config.variant
        );
    }
    let mut tpm = tpm_issuer::TpmIssuerConfig::new(&config.tcti);
    tpm.event_log = config.event_log.clone();
    let issuer = tpm_issuer::TpmIssuer::open(&tpm)
        .with_context(|| format!("opening the TPM at {}", config.tcti))?;
    certifier::run(config, Arc::new(issuer), Shutdown::on_signal()).await?;
    Ok(())
}
