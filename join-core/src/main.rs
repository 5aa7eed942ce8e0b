//! The join-core binary: parse config, log, serve join.API until SIGTERM, drain.

use clap::Parser;
use plumbing::shutdown::Shutdown;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = join_core::Config::parse();
    plumbing::telemetry::init(config.log_format);
    join_core::run(config, Shutdown::on_signal()).await?;
    Ok(())
}
