//! `local-cluster`: the whole join system on this machine, and a node joining through it.
//!
//! Starts swtpm, the key service, the Kubernetes API stand-in, token-issuer, join-core and
//! attest-proxy, then joins and rejoins a node attesting with the swtpm. With `--serve` it keeps
//! serving in the foreground, so any aTLS client (a Constellation node, say) can join.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, ensure};
use clap::Parser;
use node_client::{keys, ticket};
use testsupport::harness::{Options, System};

#[derive(Debug, Parser)]
#[command(
    name = "local-cluster",
    about = "Run the join service locally and join a node through it"
)]
struct Args {
    /// Keep serving after the demo join, until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// attest-proxy's address (e.g. 0.0.0.0:9090 for external nodes); a free loopback port if unset.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The measurement policy (Constellation attestation config JSON); one matching the local
    /// swtpm's measurements if unset.
    #[arg(long)]
    attestation_config: Option<PathBuf>,
    /// Skip the demo join (with --serve, for a policy the local swtpm does not satisfy).
    #[arg(long)]
    no_demo: bool,
    /// Trust any attestation key in the policy written when --attestation-config is unset,
    /// instead of only the local swtpm's: for `loadgen run`, whose nodes attest with software
    /// keys. Development only: anyone who reaches the proxy can then forge a quote.
    #[arg(long)]
    trust_any_ak: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    plumbing::telemetry::init(plumbing::telemetry::LogFormat::Text);
    let options = Options {
        proxy_listen: args.listen,
        attestation_config: args.attestation_config,
        keep_dir: args.serve,
        trust_any_ak: args.trust_any_ak,
        ..Options::default()
    };
    let system = System::start(options).await?;
    println!(
        "join service up: attest-proxy on {} (files and logs in {})",
        system.proxy_addr,
        system.paths.root.display()
    );

    if !args.no_demo {
        if let Err(error) = demo(&system).await {
            eprintln!("{}", system.logs());
            return Err(error);
        }
    }

    if args.serve {
        println!(
            "serving on {} with the policy in {}; Ctrl-C to stop",
            system.proxy_addr,
            system.paths.attestation_config.display()
        );
        plumbing::shutdown::signal().await;
    }
    Ok(())
}

async fn demo(system: &System) -> anyhow::Result<()> {
    let out = system.paths.root.join("node");
    let disk_uuid = "7c6a1b0e-5b1f-4d2e-9a3c-2f8d4e6b1a90";
    let kubelet = keys::kubelet_request("worker-local", &["10.0.0.7".parse()?])?;
    let ssh = keys::SshHostKey::generate()?;
    let client = system.client(system.issuer()?)?;
    let joined = client
        .join(proto::join::IssueJoinTicketRequest {
            disk_uuid: disk_uuid.to_owned(),
            certificate_request: kubelet.csr_der.clone(),
            is_control_plane: false,
            host_public_key: ssh.public_wire.clone(),
            host_certificate_principals: vec![],
        })
        .await
        .context("joining")?;
    let node_keys = ticket::NodeKeys {
        kubelet_key_pem: &kubelet.key_pem,
        ssh_host_key_pkcs8: &ssh.pkcs8,
        ssh_host_public_line: &ssh.public_line(),
    };
    ticket::write_join(&out, &joined, &node_keys)?;
    println!("node worker-local joined (attested with swtpm, qemu-vtpm):");
    println!("{}", ticket::summary(&joined));
    println!("  ticket written to   {}", out.display());

    let rejoined = client.rejoin(disk_uuid).await.context("rejoining")?;
    ensure!(
        rejoined.state_disk_key == joined.state_disk_key,
        "rejoin returned a different disk key"
    );
    println!(
        "node worker-local rejoined: same state disk key {}",
        ticket::fingerprint(&rejoined.state_disk_key)
    );

    let secrets: Vec<String> = system
        .kube
        .secrets("kube-system")
        .into_iter()
        .map(|s| s.name)
        .collect();
    println!("bootstrap token Secrets in kube-system: {secrets:?}");
    let joining: Vec<String> = system
        .kube
        .joining_nodes()
        .into_iter()
        .map(|n| {
            let spec = &n.object["spec"];
            format!(
                "{} (node {}, deadline {})",
                n.name,
                spec["name"].as_str().unwrap_or_default(),
                spec["deadline"].as_str().unwrap_or_default()
            )
        })
        .collect();
    println!("JoiningNodes: {joining:?}");
    Ok(())
}
