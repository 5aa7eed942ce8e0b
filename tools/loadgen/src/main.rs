//! `loadgen`: simulated nodes joining a running join service, the benchmark's trivial upstream,
//! and the A/B/C benchmark itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use attestation::Variant;
use attestation::snp::Product;
use clap::{Args, Parser, Subcommand, ValueEnum};
use loadgen::bench::{self, BenchConfig, Setup, Vendor};
use loadgen::mtls::{self, ClientCa};
use loadgen::procstat::Watched;
use loadgen::{LoadConfig, Mode, SoftAttestation, Stop, Target};
use node_client::{Backoff, ServicePolicy};
use soft_issuer::KeyType;
use soft_issuer::snp::SimulatedAmd;
use testsupport::snp::GceRegistry;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "Simulated nodes joining the join service (real aTLS, real CSRs, software attestation \
             or simulated SEV-SNP and TDX hardware), and the A/B/C benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate nodes joining a running system and report throughput, latency, errors and the
    /// CPU and memory of the service's processes. Exits 2 if any join failed.
    Run(Box<RunArgs>),
    /// The benchmark's trivial join.API upstream (fixed answers), over mutual TLS or a Unix socket.
    ServeTrivial(ServeArgs),
    /// The benchmark: A (mutual TLS floor), B (aTLS through attest-proxy), C (full joins) and
    /// C-mutual (C, the service attesting itself and every node verifying it), side by side at
    /// several concurrencies; writes results.json and results.svg.
    Bench(BenchArgs),
    /// Storms: for each variant, local-cluster's C rate at --rate-concurrency, then --count new
    /// nodes joining at once; reports the storm's time against count ÷ that rate, the retries by
    /// code, the collateral fetched per item, the cloud lookups and peak RSS; writes storm.json.
    Storm(StormArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Ak {
    /// ECDSA P-256, a fresh key per simulated node.
    EcdsaP256,
    /// RSA-2048 (soft-issuer's one shipped key, shared by all nodes), as go-tpm-tools' RSA AK.
    Rsa2048,
}

impl From<Ak> for KeyType {
    fn from(ak: Ak) -> Self {
        match ak {
            Ak::EcdsaP256 => KeyType::EcdsaP256,
            Ak::Rsa2048 => KeyType::Rsa2048,
        }
    }
}

/// Retries follow node-client's policy (ResourceExhausted, Unavailable, Aborted; full-jitter
/// exponential backoff); these flags change its bounds.
#[derive(Debug, Args)]
struct RetryArgs {
    /// Upper bound of the first pause [node-client: 100ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    retry_initial: Option<Duration>,
    /// Upper bound of every pause [node-client: 10s; bench: 2s].
    #[arg(long, value_parser = humantime::parse_duration)]
    retry_max: Option<Duration>,
    /// No new attempt after this long since a node's first [node-client: 5m; bench: 30s].
    #[arg(long, value_parser = humantime::parse_duration)]
    retry_give_up_after: Option<Duration>,
}

impl RetryArgs {
    fn backoff(&self, defaults: Backoff) -> Backoff {
        Backoff {
            initial: self.retry_initial.unwrap_or(defaults.initial),
            max: self.retry_max.unwrap_or(defaults.max),
            give_up_after: self.retry_give_up_after.unwrap_or(defaults.give_up_after),
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The join service (attest-proxy) address; with --mtls-ca-cert, a mutual-TLS server's.
    #[arg(long)]
    addr: SocketAddr,
    /// Nodes joining at once (closed loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Stop after this many nodes.
    #[arg(long, conflicts_with = "duration")]
    count: Option<u64>,
    /// Stop starting nodes after this long (e.g. 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Open loop instead: nodes start at this rate per second (for --duration), whatever the
    /// answers.
    #[arg(long, requires = "duration", conflicts_with = "count")]
    rate: Option<f64>,
    /// With --rate: at most this many nodes in flight; later ones wait (and their latency shows it).
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
    /// Deadline of one attempt (connect, handshake, call).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Retry as a node does: ResourceExhausted, Unavailable and Aborted, with jittered backoff
    /// (retries are counted apart).
    #[arg(long)]
    retry: bool,
    #[command(flatten)]
    retry_args: RetryArgs,
    /// The simulated nodes' attestation key (qemu-vtpm).
    #[arg(long, value_enum, default_value_t = Ak::EcdsaP256)]
    ak: Ak,
    /// The nodes' attestation variant: qemu-vtpm (software keys), aws-sev-snp / azure-sev-snp /
    /// gcp-sev-snp on simulated AMD hardware (needs --simulated-amd; gcp-sev-snp also
    /// --gce-standin), qemu-tdx / azure-tdx in TDs on simulated Intel hardware (needs
    /// --simulated-intel), or on software keys: gcp-sev-es (simulated GCE confidential VMs;
    /// needs --gce-standin), azure-trustedlaunch (AK certificates of a simulated Azure vTPM CA
    /// with the fixed keys local-cluster's shares) or aws-nitro-tpm (identity documents of the
    /// image local-cluster's EC2 stand-in serves; start it with --trust-any-ak).
    #[arg(long, default_value = "qemu-vtpm", value_parser = parse_variant)]
    variant: Variant,
    /// With an SNP variant: the simulated AMD whose ARK the service trusts, as `local-cluster
    /// --variant ...` wrote it (`<snp-dir>/simulated-amd.pem`).
    #[arg(long)]
    simulated_amd: Option<PathBuf>,
    /// With a TDX variant: the simulated Intel whose root the service trusts, its CAs and keys
    /// as `local-cluster --variant ...` wrote them (`<tdx-dir>/simulated-intel.pem`); the nodes'
    /// TDs run on hosts it certifies, spread over the platform models local-cluster's PCS
    /// stand-in serves.
    #[arg(long)]
    simulated_intel: Option<PathBuf>,
    /// gcp-sev-snp and gcp-sev-es: the control address of the GCE stand-in local-cluster runs
    /// (it prints it as "instances registered at", and writes it to
    /// `<snp-dir or gce-dir>/gce-standin-control`), where each node's instance is registered
    /// with its attestation key before the node joins.
    #[arg(long)]
    gce_standin: Option<SocketAddr>,
    /// attest-proxy's admin endpoint (local-cluster prints it): report the SEV-SNP or TDX
    /// collateral it fetched and the cloud API lookups (GCE keys, EC2 images) it made per join.
    #[arg(long)]
    proxy_admin: Option<SocketAddr>,
    /// A PCR value the nodes quote, INDEX=HEX (repeatable). Default: the test harness's boot
    /// measurements (PCRs 4, 9, 11, 12), which local-cluster's default policy enforces (start
    /// it with `--trust-any-ak`: these nodes' keys are software keys, not its swtpm's).
    #[arg(long = "pcr", value_parser = parse_pcr)]
    pcrs: Vec<(u32, [u8; 32])>,
    /// Every node verifies the service before it sends anything, as `join-client
    /// --service-policy` does: the control-plane node's attestation config (qemu-vtpm) that the
    /// evidence in attest-proxy's certificate must satisfy, e.g. the one `local-cluster
    /// --attested-service` writes (it prints where). Nodes refuse a server that fails it.
    #[arg(long, conflicts_with = "mtls_ca_cert")]
    service_policy: Option<PathBuf>,
    /// Dial plain mutual TLS instead of aTLS: the client CA certificate (PEM) the server trusts...
    #[arg(long, requires = "mtls_ca_key")]
    mtls_ca_cert: Option<PathBuf>,
    /// ... and its key (PEM), to issue each node's client certificate.
    #[arg(long, requires = "mtls_ca_cert")]
    mtls_ca_key: Option<PathBuf>,
    /// A service process to measure, NAME=PID (repeatable).
    #[arg(long = "pid", value_parser = parse_pid)]
    pids: Vec<(String, u32)>,
    /// A running local-cluster's pid: measure its service processes (and the stand-in in it).
    #[arg(long)]
    harness_pid: Option<u32>,
    /// Also write the report as JSON to this file ("-": JSON on stdout instead of text).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Node name prefix (default: random, so runs against one cluster never reuse names).
    #[arg(long)]
    node_prefix: Option<String>,
    /// Make this many nodes' identities (kubelet key and CSR, SSH host key, attestation key)
    /// before the clock starts, as real nodes make their keys at boot; later nodes make theirs
    /// inside the measured time [default: with --count, all of them; else none].
    #[arg(long)]
    pregenerate: Option<u64>,
    /// Against a loopback address, connect every node from 127.0.0.1 instead of from its own
    /// 127.x.y.z (per-source limits then see all nodes as one source).
    #[arg(long)]
    same_source: bool,
    /// Run the load three times: without a crowd, beside a crowd of this many connections that
    /// connect and never finish their first TLS record (half silent, half stalled inside a
    /// ClientHello, each from its own address, reconnecting when closed), and without again;
    /// prints the three reports and the throughput ratio.
    #[arg(long, conflicts_with = "rate")]
    hold_silent: Option<usize>,
    /// With --count: a rate (joins/s) to judge the run's time by, e.g. C's at concurrency 64
    /// from an earlier run against the same cluster: prints count ÷ rate and the run's time
    /// over it (`loadgen storm` measures the rate itself, in the same run).
    #[arg(long, requires = "count")]
    reference_rate: Option<f64>,
}

#[derive(Debug, Args)]
struct StormArgs {
    /// The variants to storm, one local-cluster each.
    #[arg(long = "variant", value_delimiter = ',', value_parser = parse_variant,
          default_values = ["aws-sev-snp", "azure-sev-snp", "gcp-sev-snp", "qemu-tdx", "azure-tdx",
                            "gcp-sev-es", "azure-trustedlaunch", "aws-nitro-tpm"])]
    variants: Vec<Variant>,
    /// New nodes per storm.
    #[arg(long, default_value_t = 5000)]
    count: u64,
    /// Nodes joining at once in the storm [default: all of --count].
    #[arg(long)]
    concurrency: Option<usize>,
    /// The reference: C at this concurrency ...
    #[arg(long, default_value_t = 64)]
    rate_concurrency: usize,
    /// ... for this long, just before the storm.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    rate_step: Duration,
    /// Unmeasured load before the reference.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Deadline of one attempt.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    retry_args: RetryArgs,
    /// The simulated nodes' attestation key (qemu-vtpm).
    #[arg(long, value_enum, default_value_t = Ak::EcdsaP256)]
    ak: Ak,
    /// Where storm.json and the processes' logs go.
    #[arg(long, default_value = "target/storm")]
    out: PathBuf,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct ServeMode {
    /// Serve mutual TLS on this TCP address (setup A).
    #[arg(long, requires = "client_ca_cert")]
    tls_listen: Option<SocketAddr>,
    /// Serve on this Unix socket (setup B, behind attest-proxy).
    #[arg(long)]
    unix_socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    mode: ServeMode,
    /// With --tls-listen: the CA whose client certificates are accepted (PEM).
    #[arg(long)]
    client_ca_cert: Option<PathBuf>,
    /// With --unix-socket: the uid allowed to connect (default: this process's, which is
    /// attest-proxy's in the benchmark).
    #[arg(long)]
    peer_uid: Option<u32>,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Setups to run (c-mutual: C with the service attesting itself and every node verifying
    /// it; qemu-vtpm only).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Setup::A, Setup::B, Setup::C, Setup::CMutual])]
    setups: Vec<Setup>,
    /// Concurrencies to run each setup at.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 64, 256])]
    concurrency: Vec<usize>,
    /// Measured time per setup and concurrency.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    step: Duration,
    /// Unmeasured load when a setup starts.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Deadline of one attempt.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Do not retry (by default nodes retry ResourceExhausted, Unavailable and Aborted, as
    /// node-client does).
    #[arg(long)]
    no_retry: bool,
    #[command(flatten)]
    retry_args: RetryArgs,
    /// The simulated nodes' attestation key (qemu-vtpm).
    #[arg(long, value_enum, default_value_t = Ak::EcdsaP256)]
    ak: Ak,
    /// The attestation variants B and C run for (A attests nothing and runs once).
    #[arg(long = "variant", value_delimiter = ',', value_parser = parse_variant,
          default_values = ["qemu-vtpm", "aws-sev-snp", "azure-sev-snp", "gcp-sev-snp", "qemu-tdx",
                            "azure-tdx", "gcp-sev-es", "azure-trustedlaunch", "aws-nitro-tpm"])]
    variants: Vec<Variant>,
    /// Where results.json, results.svg and the processes' logs go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

fn parse_variant(text: &str) -> Result<Variant, String> {
    text.parse::<Variant>().map_err(|e| e.to_string())
}

fn parse_pcr(text: &str) -> Result<(u32, [u8; 32]), String> {
    let (index, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not INDEX=HEX"))?;
    let index = index
        .parse()
        .map_err(|_| format!("PCR index {index:?} is not a number"))?;
    let bytes = hex::decode(value).map_err(|e| format!("PCR {index} value: {e}"))?;
    let value = bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("PCR {index} value has {} bytes, not 32", b.len()))?;
    Ok((index, value))
}

fn parse_pid(text: &str) -> Result<(String, u32), String> {
    let (name, pid) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=PID"))?;
    let pid = pid
        .parse()
        .map_err(|_| format!("pid {pid:?} is not a number"))?;
    Ok((name.to_owned(), pid))
}

async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let server_policy = match &args.service_policy {
        Some(path) => Some(
            ServicePolicy::load(Variant::QemuVtpm, path)
                .with_context(|| format!("loading the service policy {}", path.display()))?
                .server_policy()
                .clone(),
        ),
        None => None,
    };
    let target = match (&args.mtls_ca_cert, &args.mtls_ca_key) {
        (Some(cert), Some(key)) => Target::Mtls {
            addr: args.addr,
            ca: Arc::new(ClientCa::load(cert, key)?),
        },
        _ if bench::is_tdx(args.variant) => {
            let path = args
                .simulated_intel
                .as_ref()
                .with_context(|| format!("{} nodes need --simulated-intel", args.variant))?;
            let intel = bench::simulated_intel(path)?;
            Target::Atls {
                addr: args.addr,
                attestation: bench::node_attestation(
                    args.variant,
                    args.ak.into(),
                    Some(Vendor::Intel(&intel)),
                    None,
                )?,
                server_policy,
            }
        }
        _ if matches!(
            args.variant,
            Variant::GcpSevEs | Variant::AzureTrustedLaunch | Variant::AwsNitroTpm
        ) =>
        {
            Target::Atls {
                addr: args.addr,
                attestation: bench::node_attestation(
                    args.variant,
                    args.ak.into(),
                    None,
                    args.gce_standin.map(GceRegistry::Control),
                )?,
                server_policy,
            }
        }
        _ if args.variant != Variant::QemuVtpm => {
            let path = args
                .simulated_amd
                .as_ref()
                .with_context(|| format!("{} nodes need --simulated-amd", args.variant))?;
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let amd = SimulatedAmd::from_certificates_pem(Product::Milan, &pem)?;
            Target::Atls {
                addr: args.addr,
                attestation: bench::node_attestation(
                    args.variant,
                    args.ak.into(),
                    Some(Vendor::Amd(&amd)),
                    args.gce_standin.map(GceRegistry::Control),
                )?,
                server_policy,
            }
        }
        _ => Target::Atls {
            addr: args.addr,
            attestation: if args.pcrs.is_empty() {
                SoftAttestation::matching_harness_policy(args.ak.into())?
            } else {
                SoftAttestation::new(args.ak.into(), args.pcrs.clone())?
            }
            .into(),
            server_policy,
        },
    };
    let mode = match (args.rate, args.count, args.duration) {
        (Some(per_second), _, Some(duration)) => Mode::Open {
            per_second,
            duration,
            max_in_flight: args.max_in_flight,
        },
        (None, Some(n), _) => Mode::Closed {
            concurrency: args.concurrency,
            stop: Stop::Count(n),
        },
        (None, None, Some(d)) => Mode::Closed {
            concurrency: args.concurrency,
            stop: Stop::Duration(d),
        },
        _ => bail!("say how much load: --count N or --duration D (with --rate R for an open loop)"),
    };
    let mut watched: Vec<Watched> = args
        .pids
        .iter()
        .map(|(name, pid)| Watched {
            name: name.clone(),
            pid: *pid,
            server_side: true,
        })
        .collect();
    if let Some(pid) = args.harness_pid {
        watched.extend(bench::local_cluster_processes(pid)?);
    }
    watched.push(Watched {
        name: "loadgen".to_owned(),
        pid: std::process::id(),
        server_side: false,
    });
    let label = match &target {
        Target::Atls {
            addr,
            attestation,
            server_policy,
        } => format!(
            "{} joins via aTLS at {addr}{}",
            attestation.variant(),
            if server_policy.is_some() {
                ", each node verifying the service"
            } else {
                ""
            }
        ),
        Target::Mtls { addr, .. } => format!("mutual TLS calls at {addr}"),
    };
    let config = LoadConfig {
        label,
        mode,
        timeout: args.timeout,
        retry: args
            .retry
            .then(|| args.retry_args.backoff(Backoff::default())),
        node_prefix: args
            .node_prefix
            .clone()
            .unwrap_or_else(loadgen::run::random_prefix),
        spread_sources: !args.same_source,
        pregenerate: args.pregenerate.unwrap_or(if args.rate.is_none() {
            args.count.unwrap_or(0)
        } else {
            0
        }),
        collateral_metrics: args.proxy_admin,
        api_server: None,
    };
    let target = Arc::new(target);
    if let Some(size) = args.hold_silent {
        let beside = beside_crowd(&target, &config, &watched, args.addr, size).await?;
        let failed = beside.before.failed + beside.with_crowd.failed + beside.after.failed;
        write_report(args.json.as_deref(), &beside)?;
        return Ok(failed == 0);
    }
    let report = loadgen::run::run(target, &config, &watched).await?;
    if let (Some(rate), Some(count)) = (args.reference_rate, args.count) {
        // Judged as a storm is; the reference has no report of its own here.
        let over = count as f64 / rate;
        println!(
            "against {rate:.1} joins/s: count ÷ rate {over:.1}s, this run {:.1}s, ratio {:.2}",
            report.elapsed_seconds,
            report.elapsed_seconds / over
        );
    }
    write_report(args.json.as_deref(), &report)?;
    Ok(report.failed == 0)
}

/// Runs `config` without a crowd, beside a crowd of `size` held against `addr`, and without
/// again; each run's nodes get names of their own.
async fn beside_crowd(
    target: &Arc<Target>,
    config: &LoadConfig,
    watched: &[Watched],
    addr: SocketAddr,
    size: usize,
) -> anyhow::Result<loadgen::crowd::Beside> {
    let named = |suffix: &str| LoadConfig {
        node_prefix: format!("{}{suffix}", config.node_prefix),
        ..config.clone()
    };
    let before = loadgen::run::run(target.clone(), &named("a"), watched).await?;
    let crowd = loadgen::crowd::Crowd::hold(addr, size)
        .await
        .context("holding the crowd")?;
    let with_crowd = loadgen::run::run(target.clone(), &named("b"), watched).await;
    let held_at_end = crowd.open();
    let crowd = crowd.stop().await;
    let with_crowd = with_crowd?;
    let after = loadgen::run::run(target.clone(), &named("c"), watched).await?;
    Ok(loadgen::crowd::Beside {
        before,
        with_crowd,
        after,
        crowd,
        held_at_end,
    })
}

/// Prints `report`, and writes it as JSON where `json` says ("-": JSON on stdout instead).
fn write_report<R: serde::Serialize + std::fmt::Display>(
    json: Option<&std::path::Path>,
    report: &R,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    match json {
        Some(path) if path.as_os_str() == "-" => println!("{text}"),
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
            print!("{report}");
        }
        None => print!("{report}"),
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let shutdown = plumbing::shutdown::Shutdown::on_signal();
    match (args.mode.tls_listen, args.mode.unix_socket) {
        (Some(addr), _) => {
            let ca = args
                .client_ca_cert
                .context("--tls-listen needs --client-ca-cert")?;
            let tls = mtls::server_config(&ca)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            loadgen::trivial::serve_mtls(listener, tls, shutdown).await?;
        }
        (None, Some(path)) => {
            let uid = match args.peer_uid {
                Some(uid) => uid,
                None => testsupport::harness::own_uid()?,
            };
            loadgen::trivial::serve_unix(&path, uid, shutdown).await?;
        }
        (None, None) => bail!("say where to serve: --tls-listen or --unix-socket"),
    }
    Ok(())
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let config = BenchConfig {
        setups: args.setups,
        concurrencies: args.concurrency,
        step: args.step,
        warmup: args.warmup,
        timeout: args.timeout,
        retry: (!args.no_retry).then(|| args.retry_args.backoff(bench::RETRY)),
        key_type: args.ak.into(),
        variants: args.variants,
        out_dir: args.out,
    };
    let out = config.out_dir.clone();
    let results = bench::run(config).await?;
    println!("== side by side (CPU: the setup's server-side processes, per successful operation)");
    print!("{}", bench::summary(&results));
    let json = out.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let svg = out.join("results.svg");
    std::fs::write(&svg, loadgen::plot::svg(&results))
        .with_context(|| format!("writing {}", svg.display()))?;
    let tables = out.join("results.md");
    std::fs::write(&tables, loadgen::tables::markdown(&results))
        .with_context(|| format!("writing {}", tables.display()))?;
    println!(
        "results: {}, {} and {}",
        json.display(),
        svg.display(),
        tables.display()
    );
    Ok(())
}

async fn storm(args: StormArgs) -> anyhow::Result<bool> {
    let config = loadgen::storm::StormConfig {
        concurrency: args.concurrency.unwrap_or(usize::try_from(args.count)?),
        variants: args.variants,
        count: args.count,
        rate_concurrency: args.rate_concurrency,
        rate_step: args.rate_step,
        warmup: args.warmup,
        timeout: args.timeout,
        retry: args.retry_args.backoff(Backoff::default()),
        key_type: args.ak.into(),
        out_dir: args.out,
    };
    let results = loadgen::storm::run(&config).await?;
    Ok(results.iter().all(|r| r.storm.failed == 0))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::ServeTrivial(_) => plumbing::telemetry::init(plumbing::telemetry::LogFormat::Text),
        // The report is the output; per-node log lines (a retry each, or a node refusing the
        // server, which the report counts by check) would drown it.
        Command::Run(_) | Command::Bench(_) | Command::Storm(_) => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,atls::client=error"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(plumbing::telemetry::colour())
                .with_writer(std::io::stderr)
                .init();
        }
    }
    match cli.command {
        Command::Run(args) => {
            if !run(*args).await? {
                std::process::exit(2);
            }
        }
        Command::ServeTrivial(args) => serve(args).await?,
        Command::Bench(args) => bench(args).await?,
        Command::Storm(args) => {
            if !storm(args).await? {
                std::process::exit(2);
            }
        }
    }
    Ok(())
}
