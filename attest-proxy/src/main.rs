use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = attest_proxy::Config::parse();
    plumbing::telemetry::init(config.log_format);
    attest_proxy::run(config, plumbing::shutdown::Shutdown::on_signal()).await?;
    Ok(())
}
