//! `ec2-identity`: parse config, init logging, serve until SIGTERM.

use clap::Parser;
use ec2_identity::Config;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    plumbing::telemetry::init(config.log_format);
    ec2_identity::run(config, Shutdown::on_signal()).await?;
    Ok(())
}
