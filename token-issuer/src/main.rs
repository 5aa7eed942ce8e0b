//! `token-issuer`: parse config, init logging, serve until SIGTERM.

use clap::Parser;
use plumbing::shutdown::Shutdown;
use token_issuer::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    plumbing::telemetry::init(config.log_format);
    token_issuer::run(config, Shutdown::on_signal()).await?;
    Ok(())
}
