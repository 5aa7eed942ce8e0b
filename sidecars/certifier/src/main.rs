//! `certifier`: parse config, init logging, open the device, serve until SIGTERM.

use certifier::Config;
use clap::Parser;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    plumbing::telemetry::init(config.log_format);
    let issuer = certifier::device::open(&config)?;
    certifier::run(config, issuer, Shutdown::on_signal()).await?;
    Ok(())
}
