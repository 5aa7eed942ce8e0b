//! `kube-standin`: run the Kubernetes API stand-in as a process (local runs, out-of-process tests).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use kube_standin::{KubeStandin, StandinConfig, User};
use plumbing::shutdown::Shutdown;
use plumbing::telemetry::{self, LogFormat};

/// A stand-in for the Kubernetes API server (tests and local runs only).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "KUBE_STANDIN_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Bearer token of a cluster-admin (system:masters) user.
    #[arg(long, env = "KUBE_STANDIN_TOKEN")]
    token: String,
    /// Write a kubeconfig using `--token` here.
    #[arg(long, env = "KUBE_STANDIN_KUBECONFIG_OUT")]
    kubeconfig_out: Option<PathBuf>,
    /// Write the stand-in CA certificate (PEM) here.
    #[arg(long, env = "KUBE_STANDIN_CA_OUT")]
    ca_out: Option<PathBuf>,
    /// Serve the test-only control endpoints under /__standin/.
    #[arg(long, env = "KUBE_STANDIN_ADMIN_API")]
    admin_api: bool,
    /// Log format.
    #[arg(long, env = "KUBE_STANDIN_LOG_FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    let mut config = StandinConfig::new(vec![User::admin(&args.token)]);
    config.listen = args.listen;
    config.admin_api = args.admin_api;
    let running = KubeStandin::start(config)
        .await
        .context("starting kube-standin")?;
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, running.kubeconfig(&args.token))
            .with_context(|| format!("writing kubeconfig to {}", path.display()))?;
    }
    if let Some(path) = &args.ca_out {
        std::fs::write(path, &running.ca_pem)
            .with_context(|| format!("writing CA to {}", path.display()))?;
    }
    // The one line a parent process reads to learn the address.
    println!("{}", running.url);
    tracing::info!(url = %running.url, "kube-standin serving");
    Shutdown::on_signal().wait().await;
    running.shutdown().await;
    Ok(())
}
