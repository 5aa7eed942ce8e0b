//! The key service binary: parse config, log, serve kms.API until SIGTERM.

use clap::Parser;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = keyservice::Config::parse();
    plumbing::telemetry::init(config.log_format);
    keyservice::run(config, Shutdown::on_signal()).await?;
    Ok(())
}
