//! The benchmark: its setups on this machine, side by side, at several concurrencies.
//!
//! - **A, the floor**: plain mutual TLS (ECDSA P-256 client certificates signed by a CA, the
//!   server's self-signed P-256 certificate as attest-proxy's) and one unary `join.API` call to
//!   the trivial upstream, which terminates TLS itself, in a process of its own.
//! - **B**: aTLS with attestation verification through the real attest-proxy binary to the same
//!   trivial upstream on a Unix socket.
//! - **C**: full joins through the whole system (`local-cluster`: attest-proxy, join-core,
//!   token-issuer, the key service, etcd and kube-apiserver as processes).
//! - **C-mutual**: C with mutual attestation (qemu-vtpm only). `local-cluster --attested-service`
//!   also runs the certifier on a control-plane swtpm, which certifies attest-proxy's server key
//!   at start (and hourly), and every node checks that key's evidence with the service policy
//!   local-cluster wrote, through the real qemu-vtpm validator inside its handshake, as
//!   `join-client --service-policy` does. The service does no more per join than in C (its
//!   certificate is larger, the evidence is per key, not per connection); the nodes do one more
//!   document verification each. The load generator's CPU, where that verification runs, is
//!   reported apart, and C-mutual is started right after qemu-vtpm's C so their steps run
//!   seconds apart.
//!
//! B and C run for each attestation variant asked for: qemu-vtpm (soft-issuer documents), and
//! aws-sev-snp, azure-sev-snp and gcp-sev-snp on simulated AMD hardware (`testsupport::snp`),
//! trusted through the config's `amdRootKey`, with attest-proxy fetching AMD's CRL and chains from
//! a KDS stand-in into a collateral directory. For those, each step also reports the collateral
//! attest-proxy fetched per join ([`crate::collateral`]), read from its metrics before and after
//! the step; the warm-up's is kept too, since that is where the fetches belong.
//!
//! qemu-tdx and azure-tdx nodes are TDs on simulated Intel TDX hosts (`testsupport::tdx`), spread
//! over a few platform models (FMSPCs) as a real cluster's hosts are, trusted through the config's
//! `intelRootKey`, with attest-proxy fetching TCB info, QE identity and CRLs from a PCS stand-in;
//! their steps report the collateral fetched per join the same way.
//!
//! gcp-sev-snp also runs the gce-identity process (one of the setup's server processes) against a
//! GCE stand-in (B: in this process; C: in local-cluster's). Every benchmark node is a new
//! instance, registered with the stand-in as the node is made, so every join costs attest-proxy
//! one GCE lookup through gce-identity, as a storm of new nodes does; each step reports the
//! lookups per join beside the collateral fetches.
//!
//! The variants whose trust comes from the cloud run on software AKs (`testsupport::{gce,
//! trustedlaunch,nitro}`): gcp-sev-es nodes are simulated GCE confidential VMs, each a new
//! instance registered with the GCE stand-in as for gcp-sev-snp, so each join costs one GCE
//! lookup; azure-trustedlaunch nodes each carry an AK certificate of a simulated Azure vTPM CA
//! whose root the config trusts, and cost no cloud lookup (attest-proxy has no cloud cache for
//! it); aws-nitro-tpm nodes each send an identity document of one image, trusted under
//! `trustAnyAk` (B: the benchmark's config; C: `local-cluster --trust-any-ak`), and ec2-identity
//! runs against an EC2 stand-in (B: in this process; C: in local-cluster's): attest-proxy asks
//! it once per image, so after the warm-up a join costs no EC2 lookup. Every step of these
//! reports the cloud lookups per join as gcp-sev-snp's do.
//!
//! All setups are started first; each concurrency's steps then run for A, B and C back to back.
//!
//! The load generator runs in this process. CPU per operation is the `utime + stime` the setup's
//! server-side processes spent during a step, divided by the step's successful operations; the
//! load generator's own CPU is reported apart and is not in the ratios.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use attestation::Variant;
use pcs_standin::SimulatedIntel;
use serde::Serialize;
use soft_issuer::KeyType;
use soft_issuer::snp::SimulatedAmd;
use testsupport::gce::EsMachines;
use testsupport::harness::{
    ec2_identity_command, ec2_proxy_args, gce_identity_command, gce_proxy_args, own_uid,
};
use testsupport::nitro::{NitroSite, SoftInstances};
use testsupport::process::{Process, bin, free_port};
use testsupport::snp::{AMD_CERTIFICATES, GceRegistry, GceSite, SnpMachines, SnpSite};
use testsupport::tdx::{FLEET_FMSPCS, INTEL_KEYS, TdxMachines, TdxSite};
use testsupport::trustedlaunch::SoftVms;

use crate::collateral::CollateralCounts;
use crate::mtls::ClientCa;
use crate::node::{NodeAttestation, SoftAttestation, Target};
use crate::procstat::{self, Watched};
use crate::report::Report;
use crate::run::{self, LoadConfig, Mode, Stop};
use node_client::Backoff;

/// One of the setups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Setup {
    A,
    B,
    C,
    /// C with mutual attestation: the service attests itself (the certifier on a control-plane
    /// swtpm certifies attest-proxy's key) and every node verifies that evidence with a real
    /// `atls::ServerPolicy` in its handshake. qemu-vtpm only: the certifier attests with a TPM.
    #[serde(rename = "C-mutual")]
    CMutual,
}

impl Setup {
    /// What the setup measures, for the report.
    pub fn description(self) -> &'static str {
        match self {
            Setup::A => "plain mutual TLS (P-256) + one unary gRPC call to a trivial upstream",
            Setup::B => {
                "aTLS + attestation verification through attest-proxy to the trivial upstream"
            }
            Setup::C => "full joins through the whole system",
            Setup::CMutual => {
                "full joins through the whole system, the service attesting itself and every node \
                 verifying it"
            }
        }
    }

    /// A legend's worth of the description.
    pub fn short(self) -> &'static str {
        match self {
            Setup::A => "A: mutual TLS + trivial gRPC",
            Setup::B => "B: aTLS + attestation, attest-proxy, trivial gRPC",
            Setup::C => "C: full joins, whole system",
            Setup::CMutual => "C-mutual: full joins, nodes verify the service",
        }
    }

    /// What reports call the setup.
    pub fn name(self) -> &'static str {
        match self {
            Setup::A => "A",
            Setup::B => "B",
            Setup::C => "C",
            Setup::CMutual => "C-mutual",
        }
    }
}

/// How to run the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct BenchConfig {
    pub setups: Vec<Setup>,
    pub concurrencies: Vec<usize>,
    /// Measured time per (setup, concurrency).
    #[serde(serialize_with = "crate::run::seconds")]
    pub step: Duration,
    /// Unmeasured load at each setup's start (connections, thread pools, caches warm up).
    #[serde(serialize_with = "crate::run::seconds")]
    pub warmup: Duration,
    /// Deadline of one attempt.
    #[serde(serialize_with = "crate::run::seconds")]
    pub timeout: Duration,
    #[serde(serialize_with = "backoff_json")]
    pub retry: Option<Backoff>,
    /// The simulated nodes' attestation key type (qemu-vtpm; the SNP and TDX variants' keys are
    /// fixed by how their machines are simulated).
    #[serde(serialize_with = "key_type_name")]
    pub key_type: KeyType,
    /// The attestation variants B and C run for.
    #[serde(serialize_with = "variant_names")]
    pub variants: Vec<Variant>,
    /// Where results.json, results.svg and the processes' logs go.
    pub out_dir: PathBuf,
}

/// Simulated hosts the nodes of a variant with one chip per host are spread over (azure-sev-snp:
/// each host's VCEK is verified once, then found in the verifier's memo).
pub const SNP_HOSTS: usize = 64;

/// Simulated TDX hosts the nodes of a TDX variant are spread over (and those over the platform
/// models of `testsupport::tdx::FLEET_FMSPCS`): a few machines, many TDs.
pub const TDX_HOSTS: usize = 16;

/// The simulated vendor whose root the service trusts and which certifies the nodes' machines.
#[derive(Clone, Copy, Debug)]
pub enum Vendor<'a> {
    /// The SEV-SNP variants'.
    Amd(&'a SimulatedAmd),
    /// The TDX variants'.
    Intel(&'a SimulatedIntel),
}

/// How a variant's nodes attest. The SNP variants' machines are made by
/// `testsupport::snp::SnpMachines::new`, the TDX variants' by `testsupport::tdx::TdxMachines::
/// fleet`, the cloud-trusted variants' VMs by `testsupport::{gce,trustedlaunch,nitro}`, the
/// places that say how each variant is simulated; gcp-sev-snp and gcp-sev-es nodes' instances
/// are registered with `gce`.
pub fn node_attestation(
    variant: Variant,
    key_type: KeyType,
    vendor: Option<Vendor<'_>>,
    gce: Option<GceRegistry>,
) -> anyhow::Result<NodeAttestation> {
    match variant {
        Variant::QemuVtpm => {
            return Ok(SoftAttestation::matching_harness_policy(key_type)?.into());
        }
        Variant::GcpSevEs => {
            let gce =
                gce.context("gcp-sev-es nodes need a GCE stand-in to register instances with")?;
            return Ok(NodeAttestation::GcpSevEs(Arc::new(EsMachines::new(gce))));
        }
        Variant::AzureTrustedLaunch => {
            return Ok(NodeAttestation::AzureTrustedLaunch(Arc::new(
                SoftVms::new()?
            )));
        }
        Variant::AwsNitroTpm => {
            return Ok(NodeAttestation::AwsNitroTpm(Arc::new(
                SoftInstances::default(),
            )));
        }
        _ => {}
    }
    if is_tdx(variant) {
        let Some(Vendor::Intel(intel)) = vendor else {
            bail!("{variant} nodes need a simulated Intel");
        };
        let machines = TdxMachines::fleet(variant, intel, TDX_HOSTS)?;
        return Ok(NodeAttestation::Tdx(Arc::new(machines)));
    }
    let Some(Vendor::Amd(amd)) = vendor else {
        bail!("{variant} nodes need a simulated AMD");
    };
    let mut machines = SnpMachines::new(variant, amd, SNP_HOSTS)?;
    if variant == Variant::GcpSevSnp {
        let gce =
            gce.context("gcp-sev-snp nodes need a GCE stand-in to register instances with")?;
        machines = machines.register_instances_with(gce);
    }
    Ok(NodeAttestation::Snp(Arc::new(machines)))
}

/// Whether `variant`'s nodes run on simulated Intel TDX hosts.
pub fn is_tdx(variant: Variant) -> bool {
    matches!(variant, Variant::QemuTdx | Variant::AzureTdx)
}

/// Whether `variant`'s nodes run on simulated AMD SEV-SNP machines.
pub fn is_snp(variant: Variant) -> bool {
    matches!(
        variant,
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp
    )
}

/// Whether `variant`'s attest-proxy asks gce-identity for each instance's key.
fn asks_gce(variant: Variant) -> bool {
    matches!(variant, Variant::GcpSevSnp | Variant::GcpSevEs)
}

/// The FMSPCs of [`FLEET_FMSPCS`] as PCS is asked for them.
fn fleet_fmspcs() -> Vec<String> {
    FLEET_FMSPCS.iter().map(hex::encode).collect()
}

/// The simulated Intel whose CAs and keys are in `path`, as `local-cluster` writes them
/// (`<tdx-dir>/simulated-intel.pem`, `testsupport::tdx::INTEL_KEYS`).
pub fn simulated_intel(path: &Path) -> anyhow::Result<SimulatedIntel> {
    let pem =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    SimulatedIntel::from_keys_pem(&pem).with_context(|| format!("reading {}", path.display()))
}

fn variant_names<S: serde::Serializer>(variants: &[Variant], s: S) -> Result<S::Ok, S::Error> {
    variants
        .iter()
        .map(|v| v.name())
        .collect::<Vec<_>>()
        .serialize(s)
}

fn variant_name<S: serde::Serializer>(variant: &Option<Variant>, s: S) -> Result<S::Ok, S::Error> {
    variant.map(Variant::name).serialize(s)
}

/// node-client's retry policy with bounds that keep a step short: a node still retries with
/// jittered backoff, but gives up after 30 s instead of 5 minutes.
pub const RETRY: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
    give_up_after: Duration::from_secs(30),
};

fn backoff_json<S: serde::Serializer>(backoff: &Option<Backoff>, s: S) -> Result<S::Ok, S::Error> {
    backoff
        .map(|b| {
            serde_json::json!({
                "initial": b.initial.as_secs_f64(),
                "max": b.max.as_secs_f64(),
                "give_up_after": b.give_up_after.as_secs_f64(),
            })
        })
        .serialize(s)
}

fn key_type_name<S: serde::Serializer>(key_type: &KeyType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match key_type {
        KeyType::EcdsaP256 => "ecdsa-p256",
        KeyType::Rsa2048 => "rsa2048",
    })
}

/// The figures of one setup (for one variant: B and C run for each).
#[derive(Clone, Debug, Serialize)]
pub struct SetupResults {
    pub setup: Setup,
    /// The nodes' attestation variant; `None` for A, which attests nothing.
    #[serde(serialize_with = "variant_name")]
    pub variant: Option<Variant>,
    pub description: &'static str,
    /// The unmeasured warm-up's report, if there was one.
    pub warmup: Option<Report>,
    /// attest-proxy's collateral and cloud lookup counters at the end, since it started (every
    /// variant but qemu-vtpm): it fetches AMD's CRLs and chains, or Intel's TCB info, QE identity
    /// and CRLs, at start, before any join.
    pub collateral_since_start: Option<crate::collateral::CollateralCounts>,
    /// The processes whose CPU counts as the setup's.
    pub server_processes: Vec<String>,
    pub steps: Vec<Report>,
}

/// B or C of one variant against A at one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    pub concurrency: usize,
    #[serde(serialize_with = "variant_name")]
    pub variant: Option<Variant>,
    /// Server CPU per operation of B over A's.
    pub b_over_a_cpu: Option<f64>,
    /// Throughput of B over A's.
    pub b_over_a_throughput: Option<f64>,
    /// attest-proxy's CPU alone (without the trivial upstream behind it) over A's.
    pub b_proxy_over_a_cpu: Option<f64>,
    pub c_over_a_cpu: Option<f64>,
    pub c_over_a_throughput: Option<f64>,
    /// C-mutual against C (qemu-vtpm only): the service's CPU per join, both setups' server-side
    /// processes (C-mutual's certifier included) ...
    pub c_mutual_over_c_cpu: Option<f64>,
    /// ... throughput, with the load generator on the same cores, so its extra work per join
    /// (each node verifying the service) competes with the service's ...
    pub c_mutual_over_c_throughput: Option<f64>,
    /// ... and p99 latency.
    pub c_mutual_over_c_p99: Option<f64>,
    /// The load generator's own CPU per join in C-mutual minus in C, in milliseconds: what the
    /// nodes' verification of the service costs, on the nodes' side (apart from every ratio).
    pub c_mutual_loadgen_extra_cpu_ms: Option<f64>,
}

/// Everything one benchmark run found.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResults {
    pub machine: Machine,
    pub config: BenchConfig,
    pub setups: Vec<SetupResults>,
    pub ratios: Vec<Ratio>,
}

/// Where it ran.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// Seconds since the Unix epoch when the benchmark started.
    pub started_unix: u64,
    /// The 1-, 5- and 15-minute load averages when the benchmark started (`/proc/loadavg`):
    /// other work on the machine shows in every figure.
    pub load_average: Vec<f64>,
}

impl Machine {
    fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .filter_map(|v| v.parse().ok())
                .collect(),
        }
    }
}

/// A started setup: its processes (stopped when dropped), where nodes dial, what to watch.
pub(crate) struct Running {
    pub(crate) target: Arc<Target>,
    pub(crate) watched: Vec<Watched>,
    /// attest-proxy's admin endpoint, for its collateral and cloud lookup metrics (every variant
    /// but qemu-vtpm).
    pub(crate) collateral_metrics: Option<std::net::SocketAddr>,
    /// C: local-cluster's kube-apiserver, for the requests each step makes of it.
    pub(crate) api_server: Option<crate::apiserver::ApiServer>,
    processes: Vec<Process>,
    /// Stopped (SIGTERM) when the setup is dropped.
    cluster: Option<Cluster>,
    /// B's KDS stand-in (in this process) for an SNP variant, stopped when dropped.
    _site: Option<SnpSite>,
    /// B's PCS stand-in (in this process) for a TDX variant, stopped when dropped.
    _tdx_site: Option<TdxSite>,
    /// B's GCE stand-in (in this process) for gcp-sev-snp and gcp-sev-es, stopped when dropped.
    _gce: Option<GceSite>,
    /// B's EC2 stand-in (in this process) for aws-nitro-tpm, stopped when dropped.
    _ec2: Option<NitroSite>,
    /// The simulated vendor's files (the KDS or PCS stand-in's CA, the simulated AMD or Intel,
    /// config, collateral), removed after the processes stop (fields drop in order).
    _site_dir: Option<tempfile::TempDir>,
}

impl Running {
    /// The end of every log of the setup, for an error.
    pub(crate) fn log_tails(&self) -> String {
        const LINES: usize = 40;
        self.processes
            .iter()
            .map(|p| format!("----- {} -----\n{}", p.name(), tail(&p.log(), LINES)))
            .chain(self.cluster.iter().map(|c| c.log_tails(LINES)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for p in &mut self.processes {
            p.kill();
        }
    }
}

/// A `local-cluster` process, stopped with SIGTERM so that it stops its services itself (were it
/// or this process killed instead, its services would end with it: it starts them with a
/// parent-death signal). It keeps its files with `--serve`; they are removed after it stops.
struct Cluster(Process);

/// What local-cluster prints once every service it started serves (attest-proxy's port accepts
/// before that).
const PROXY_ADMIN_ANNOUNCED: &str = "attest-proxy admin endpoint on ";

/// What local-cluster prints before [`PROXY_ADMIN_ANNOUNCED`], and then the path of its API
/// server's admin kubeconfig.
const ADMIN_KUBECONFIG_ANNOUNCED: &str = "kube-apiserver admin kubeconfig in ";

/// What local-cluster prints (`--attested-service`) after [`PROXY_ADMIN_ANNOUNCED`].
const SERVICE_POLICY_ANNOUNCED: &str = "nodes' service policy in ";

/// How long local-cluster may take to start swtpm, its stand-ins and every service.
const CLUSTER_START: Duration = Duration::from_secs(60);

impl Cluster {
    /// The directory local-cluster announced (`files and logs in <dir>`).
    fn dir(&self) -> Option<PathBuf> {
        self.0
            .log()
            .lines()
            .find_map(|l| {
                l.split_once("(files and logs in ")
                    .map(|(_, d)| d.to_owned())
            })
            .map(|d| PathBuf::from(d.trim_end_matches(')')))
    }

    /// What follows `announcement` on the line local-cluster prints it on, parsed, once it has
    /// printed that line; fails when local-cluster exits first or after `timeout`, with its
    /// log.
    fn wait_for_announcement<T: std::str::FromStr>(
        &mut self,
        announcement: &str,
        timeout: Duration,
    ) -> anyhow::Result<T> {
        self.0.wait_for_line(
            &format!("saying \"{}...\"", announcement.trim_end()),
            timeout,
            |line| line.split_once(announcement)?.1.trim().parse().ok(),
        )
    }

    /// The last `lines` lines of local-cluster's log and of each of its services' logs.
    fn log_tails(&self, lines: usize) -> String {
        let mut tails = vec![(self.0.name().to_owned(), self.0.log())];
        if let Some(Ok(entries)) = self.dir().map(|dir| std::fs::read_dir(dir.join("logs"))) {
            let mut logs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            logs.sort();
            for path in logs {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                tails.push((name.unwrap_or_default(), text));
            }
        }
        tails
            .iter()
            .map(|(name, log)| format!("----- {name} -----\n{}", tail(log, lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> &str {
    match text
        .trim_end()
        .rmatch_indices('\n')
        .nth(lines.saturating_sub(1))
    {
        Some((at, _)) => &text[at + 1..],
        None => text,
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.0.terminate(Duration::from_secs(15)).is_err() {
            self.0.kill();
        }
        // Read once it has stopped: a setup that failed early may stop it before it had
        // announced its directory in the log.
        if let Some(dir) = self.dir() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn rust_log() -> String {
    std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned())
}

fn watch(name: &str, process: &Process) -> Watched {
    Watched {
        name: name.to_owned(),
        pid: process.id(),
        server_side: true,
    }
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// A directory for a simulated variant's files that attest-proxy (and a sidecar) can reach
/// under its own uid (a setup's working directory is the caller's alone).
fn site_dir(variant: Variant) -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::Builder::new()
        .prefix(&format!("loadgen-{variant}-"))
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// Starts `setup` for `variant` (its processes' logs under `config.out_dir`, its files in `work`).
pub(crate) async fn start(
    setup: Setup,
    variant: Variant,
    config: &BenchConfig,
    work: &Path,
) -> anyhow::Result<Running> {
    let logs = config.out_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    // Every variant but qemu-vtpm: simulated hardware or cloud, and attest-proxy's metrics of
    // what it fetched and asked.
    let simulated = variant != Variant::QemuVtpm;
    let snp = is_snp(variant);
    let tag = if simulated {
        format!("{}-{variant}", setup.name())
    } else {
        setup.name().to_owned()
    };
    let policy = work.join("attestationConfig");
    std::fs::write(
        &policy,
        testsupport::harness::attestation_config(
            // Every simulated node has its own software key.
            &attestation::AkTrust::AnyKey,
            &[],
        ),
    )?;
    let me = std::env::current_exe().context("locating the loadgen binary")?;
    match setup {
        Setup::A => {
            let ca = ClientCa::generate()?;
            let (ca_cert, ca_key) = (work.join("client-ca.pem"), work.join("client-ca.key"));
            ca.write(&ca_cert, &ca_key)?;
            let addr = loopback(free_port()?);
            let mut server = Process::spawn(
                "A-trivial-mtls",
                Command::new(&me)
                    .env("RUST_LOG", rust_log())
                    .args(["serve-trivial", "--tls-listen", &addr.to_string()])
                    .arg("--client-ca-cert")
                    .arg(&ca_cert),
                &logs,
            )?;
            server.wait_for_tcp(addr)?;
            Ok(Running {
                target: Arc::new(Target::Mtls {
                    addr,
                    ca: Arc::new(ca),
                }),
                watched: vec![watch("trivial upstream (mTLS)", &server)],
                collateral_metrics: None,
                api_server: None,
                processes: vec![server],
                cluster: None,
                _site: None,
                _tdx_site: None,
                _gce: None,
                _ec2: None,
                _site_dir: None,
            })
        }
        Setup::B => {
            let socket = work.join("trivial.sock");
            let mut upstream = Process::spawn(
                &format!("{tag}-trivial-unix"),
                Command::new(&me)
                    .env("RUST_LOG", rust_log())
                    .args(["serve-trivial", "--unix-socket"])
                    .arg(&socket),
                &logs,
            )?;
            upstream.wait_for_socket(&socket)?;
            // An SNP variant: a simulated AMD, and its KDS stand-in in this process.
            let dir = simulated.then(|| site_dir(variant)).transpose()?;
            let site = match &dir {
                Some(dir) if snp => {
                    let amd = Arc::new(SimulatedAmd::new(attestation::snp::Product::Milan)?);
                    Some(SnpSite::start(amd, dir.path(), SNP_CRL_VALIDITY, None).await?)
                }
                _ => None,
            };
            // A TDX variant: a simulated Intel, and its PCS stand-in in this process serving the
            // TCB info of every platform model the nodes' hosts are spread over.
            let tdx_site = match &dir {
                Some(dir) if is_tdx(variant) => {
                    let intel = Arc::new(SimulatedIntel::new()?);
                    Some(
                        TdxSite::start(
                            variant,
                            intel,
                            &fleet_fmspcs(),
                            dir.path(),
                            SNP_CRL_VALIDITY,
                            None,
                        )
                        .await?,
                    )
                }
                _ => None,
            };
            // gcp-sev-snp and gcp-sev-es: Google's stand-in here, and gce-identity asking it for
            // attest-proxy.
            let (gce, gce_identity) = match &dir {
                Some(dir) if asks_gce(variant) => {
                    let gce = GceSite::start(dir.path()).await?;
                    let socket = dir.path().join("gce-identity").join("gce-identity.sock");
                    let endpoints = gce.endpoints(Vec::new());
                    let mut process = Process::spawn(
                        &format!("{tag}-gce-identity"),
                        &gce_identity_command(&socket, own_uid()?, &endpoints)?,
                        &logs,
                    )?;
                    process.wait_for_socket(&socket)?;
                    let args = gce_proxy_args(&socket, own_uid()?, &endpoints);
                    (Some(gce), Some((process, args)))
                }
                _ => (None, None),
            };
            // aws-nitro-tpm: the EC2 stand-in here, and ec2-identity asking it for attest-proxy.
            let (ec2, ec2_identity) = match &dir {
                Some(dir) if variant == Variant::AwsNitroTpm => {
                    let ec2 = NitroSite::start(dir.path()).await?;
                    let socket = dir.path().join("ec2-identity").join("ec2-identity.sock");
                    let endpoints = ec2.endpoints(Vec::new());
                    let mut process = Process::spawn(
                        &format!("{tag}-ec2-identity"),
                        &ec2_identity_command(&socket, own_uid()?, &endpoints)?,
                        &logs,
                    )?;
                    process.wait_for_socket(&socket)?;
                    let args = ec2_proxy_args(&socket, own_uid()?, &endpoints);
                    (Some(ec2), Some((process, args)))
                }
                _ => (None, None),
            };
            // The config: the site's (SNP, TDX), the one the simulated cloud's VMs satisfy
            // (gcp-sev-es, azure-trustedlaunch), else the harness's trusting any key (qemu-vtpm,
            // aws-nitro-tpm: software keys).
            let attestation_config = match (&site, &tdx_site, &dir) {
                (Some(site), _, _) => site.attestation_config_path(),
                (None, Some(site), _) => site.attestation_config_path(),
                (None, None, Some(dir)) if variant == Variant::GcpSevEs => {
                    let path = dir.path().join("attestationConfig");
                    std::fs::write(&path, testsupport::gce::es_attestation_config()?)?;
                    path
                }
                (None, None, Some(dir)) if variant == Variant::AzureTrustedLaunch => {
                    let path = dir.path().join("attestationConfig");
                    let azure = soft_issuer::azure_vtpm::SimulatedAzureVtpmCa::new()?;
                    std::fs::write(
                        &path,
                        testsupport::trustedlaunch::attestation_config(&azure),
                    )?;
                    path
                }
                _ => policy.clone(),
            };
            let addr = loopback(free_port()?);
            let admin = loopback(free_port()?);
            let mut command = Command::new(bin("attest-proxy")?);
            command
                .env("RUST_LOG", rust_log())
                .args(["--listen", &addr.to_string(), "--variant", variant.name()])
                .args(["--admin-listen", &admin.to_string()])
                .arg("--upstream-socket")
                .arg(&socket)
                .args(["--upstream-uid", &own_uid()?.to_string()])
                .arg("--attestation-config")
                .arg(&attestation_config);
            if let Some(site) = &site {
                command.args(site.proxy_args(COLLATERAL_WAIT));
            }
            if let Some(site) = &tdx_site {
                command.args(site.proxy_args(COLLATERAL_WAIT));
            }
            for (_, args) in gce_identity.iter().chain(&ec2_identity) {
                command.args(args);
            }
            let mut proxy = Process::spawn(&format!("{tag}-attest-proxy"), &command, &logs)?;
            proxy.wait_for_tcp(addr)?;
            let vendor = match (&site, &tdx_site) {
                (Some(site), _) => Some(Vendor::Amd(site.amd.as_ref())),
                (None, Some(site)) => Some(Vendor::Intel(site.intel.as_ref())),
                (None, None) => None,
            };
            let attestation = node_attestation(
                variant,
                config.key_type,
                vendor,
                gce.as_ref().map(GceSite::registry),
            )?;
            if let (Some(site), NodeAttestation::Snp(machines)) = (&site, &attestation) {
                machines.publish_vceks(&site.kds, site.amd.product());
            }
            let mut watched = vec![
                watch("attest-proxy", &proxy),
                watch("trivial upstream (unix)", &upstream),
            ];
            let mut processes = vec![proxy, upstream];
            for (name, sidecar) in [
                ("gce-identity", gce_identity),
                ("ec2-identity", ec2_identity),
            ] {
                if let Some((process, _)) = sidecar {
                    watched.push(watch(name, &process));
                    processes.push(process);
                }
            }
            Ok(Running {
                target: Arc::new(Target::Atls {
                    addr,
                    attestation,
                    server_policy: None,
                }),
                watched,
                collateral_metrics: simulated.then_some(admin),
                api_server: None,
                processes,
                cluster: None,
                _site: site,
                _tdx_site: tdx_site,
                _gce: gce,
                _ec2: ec2,
                _site_dir: dir,
            })
        }
        Setup::C | Setup::CMutual => {
            let mutual = setup == Setup::CMutual;
            let addr = loopback(free_port()?);
            let mut command = Command::new(bin("local-cluster")?);
            command
                .env("RUST_LOG", rust_log())
                .args(["--serve", "--no-demo", "--listen", &addr.to_string()])
                .args(["--variant", variant.name()]);
            if mutual {
                command.arg("--attested-service");
            }
            // An SNP (TDX) variant: local-cluster simulates AMD (Intel) and runs the KDS (PCS)
            // stand-in; its config trusts that simulated root, which the nodes made here take up
            // from its files. gcp-sev-es: its GCE stand-in's control address is in its files.
            // azure-trustedlaunch: its config trusts the simulated Azure vTPM root, whose fixed
            // keys the nodes' CA here shares. aws-nitro-tpm: the nodes' keys are software keys,
            // which its config trusts with --trust-any-ak, as for `loadgen run`.
            let dir_flag = match variant {
                v if snp || is_tdx(v) => Some(if snp { "--snp-dir" } else { "--tdx-dir" }),
                Variant::GcpSevEs => Some("--gce-dir"),
                _ => None,
            };
            let dir = match dir_flag {
                Some(flag) => {
                    let dir = site_dir(variant)?;
                    command.arg(flag).arg(dir.path());
                    if flag != "--gce-dir" {
                        command.args(["--collateral-wait", "2s"]);
                    }
                    Some(dir)
                }
                None => None,
            };
            match variant {
                Variant::QemuVtpm => {
                    command.arg("--attestation-config").arg(&policy);
                }
                Variant::AwsNitroTpm => {
                    command.arg("--trust-any-ak");
                }
                _ => {}
            }
            // Wrapped at once, so that any failure below still stops it with SIGTERM.
            let mut cluster = Cluster(Process::spawn(
                &format!("{tag}-local-cluster"),
                &command,
                &logs,
            )?);
            // local-cluster announces attest-proxy's admin endpoint once it has started swtpm,
            // its stand-ins and every service, and attest-proxy listens.
            let admin: std::net::SocketAddr =
                cluster.wait_for_announcement(PROXY_ADMIN_ANNOUNCED, CLUSTER_START)?;
            let kubeconfig: PathBuf = cluster
                .wait_for_announcement(ADMIN_KUBECONFIG_ANNOUNCED, Duration::from_secs(1))?;
            let api_server = crate::apiserver::ApiServer::connect(&kubeconfig).await?;
            let watched = local_cluster_processes(cluster.0.id()).with_context(|| {
                format!(
                    "finding local-cluster's processes; its log:\n{}",
                    cluster.0.log()
                )
            })?;
            // gcp-sev-snp and gcp-sev-es: nodes' instances go to local-cluster's GCE stand-in.
            let gce = match &dir {
                Some(dir) if asks_gce(variant) => Some(GceRegistry::from_dir(dir.path())?),
                _ => None,
            };
            let amd = match &dir {
                Some(dir) if snp => {
                    let path = dir.path().join(AMD_CERTIFICATES);
                    let pem = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    Some(SimulatedAmd::from_certificates_pem(
                        attestation::snp::Product::Milan,
                        &pem,
                    )?)
                }
                _ => None,
            };
            let intel = match &dir {
                Some(dir) if is_tdx(variant) => {
                    Some(simulated_intel(&dir.path().join(INTEL_KEYS))?)
                }
                _ => None,
            };
            let vendor = match (&amd, &intel) {
                (Some(amd), _) => Some(Vendor::Amd(amd)),
                (None, Some(intel)) => Some(Vendor::Intel(intel)),
                (None, None) => None,
            };
            let collateral_metrics = simulated.then_some(admin);
            // C-mutual: each node checks the service's evidence with the policy local-cluster
            // wrote (the control-plane swtpm's measurements and keys), in its own handshake.
            let server_policy = match mutual {
                true => {
                    let path: PathBuf = cluster
                        .wait_for_announcement(SERVICE_POLICY_ANNOUNCED, Duration::from_secs(10))?;
                    Some(
                        node_client::ServicePolicy::load(Variant::QemuVtpm, &path)?
                            .server_policy()
                            .clone(),
                    )
                }
                false => None,
            };
            Ok(Running {
                target: Arc::new(Target::Atls {
                    addr,
                    attestation: node_attestation(variant, config.key_type, vendor, gce)?,
                    server_policy,
                }),
                watched,
                collateral_metrics,
                api_server: Some(api_server),
                processes: vec![],
                cluster: Some(cluster),
                _site: None,
                _tdx_site: None,
                _gce: None,
                _ec2: None,
                _site_dir: dir,
            })
        }
    }
}

/// How long the simulated AMD's CRL (and the simulated Intel's collateral) is valid: far beyond
/// any run, so that no refresh falls due and every fetch a step makes is one the cache could not
/// avoid.
const SNP_CRL_VALIDITY: Duration = Duration::from_secs(7 * 86_400);

/// How long a join waits for collateral not cached yet (attest-proxy's default).
const COLLATERAL_WAIT: Duration = Duration::from_secs(2);

/// How many nodes to make before a step at `concurrency` for `step`, when the setup has run at
/// up to `rate` joins/s so far: enough for a step up to three times as fast (a step at higher
/// concurrency is faster, and the warm-up runs at 4), bounded so memory and the time spent
/// making them stay small. Nodes beyond these make their identities inside the step.
pub(crate) fn pregenerate(rate: f64, concurrency: usize, step: Duration) -> u64 {
    const MIN_RATE: f64 = 500.0;
    const MAX_NODES: f64 = 40_000.0;
    let expected = rate.max(MIN_RATE) * 3.0 * step.as_secs_f64() + 2.0 * concurrency as f64;
    // Truncation is intended: a count of nodes, bounded above.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = expected.min(MAX_NODES) as u64;
    count
}

/// The service's processes of a running `local-cluster` (pid `cluster`): its children
/// attest-proxy, join-core, token-issuer and keyservice (and gce-identity for gcp-sev-snp and
/// gcp-sev-es, ec2-identity for aws-nitro-tpm), the control plane's etcd and kube-apiserver, and
/// local-cluster itself, which hosts the fault proxy in front of the API server (and the KDS and
/// GCE stand-ins of the SNP variants, the PCS stand-in of the TDX variants).
pub fn local_cluster_processes(cluster: u32) -> anyhow::Result<Vec<Watched>> {
    let mut watched = Vec::new();
    for (pid, comm) in procstat::children(cluster)? {
        // swtpm only serves local-cluster's own demo node; the load attests in software.
        if comm != "swtpm" {
            watched.push(Watched {
                name: comm,
                pid,
                server_side: true,
            });
        }
    }
    for name in ["attest-proxy", "join-core", "token-issuer", "keyservice"] {
        if !watched.iter().any(|w| w.name == name) {
            bail!("process {cluster} has no {name} child");
        }
    }
    watched.push(Watched {
        name: "local-cluster".to_owned(),
        pid: cluster,
        server_side: true,
    });
    Ok(watched)
}

/// A setup started for the benchmark, and its steps so far.
struct Started {
    setup: Setup,
    variant: Option<Variant>,
    running: Running,
    watched: Vec<Watched>,
    /// The fastest rate seen so far, to size the nodes made ahead of a step.
    rate: f64,
    warmup: Option<Report>,
    steps: Vec<Report>,
    /// The setup's working directory, removed after its processes stop (fields drop in order).
    _work: tempfile::TempDir,
}

/// What a report and a node name call a setup of a variant: `B`, `B aws-sev-snp`, `C-mutual`.
fn series_label(setup: Setup, variant: Option<Variant>) -> String {
    match variant {
        Some(v) if v != Variant::QemuVtpm => format!("{} {v}", setup.name()),
        _ => setup.name().to_owned(),
    }
}

/// The setups to start, in order: A once; B and C for each variant; C-mutual (qemu-vtpm only)
/// right after qemu-vtpm's C, so the steps its ratio compares run seconds apart.
fn series(setups: &[Setup], variants: &[Variant]) -> Vec<(Setup, Option<Variant>)> {
    let mutual = setups.contains(&Setup::CMutual) && variants.contains(&Variant::QemuVtpm);
    let mut series = Vec::new();
    for &setup in setups {
        match setup {
            Setup::A => series.push((setup, None)),
            Setup::B => series.extend(variants.iter().map(|&v| (setup, Some(v)))),
            Setup::C => {
                for &v in variants {
                    series.push((setup, Some(v)));
                    if mutual && v == Variant::QemuVtpm {
                        series.push((Setup::CMutual, Some(v)));
                    }
                }
            }
            Setup::CMutual if mutual && !setups.contains(&Setup::C) => {
                series.push((setup, Some(Variant::QemuVtpm)));
            }
            Setup::CMutual => {}
        }
    }
    series
}

/// One step's load: `concurrency` nodes at a time for `duration`.
#[allow(clippy::too_many_arguments)]
fn load(
    config: &BenchConfig,
    prefix: &str,
    started: &Started,
    step: &str,
    concurrency: usize,
    duration: Duration,
    pregenerate: u64,
) -> LoadConfig {
    let series = series_label(started.setup, started.variant);
    let label = if step == "w" {
        format!("{series} warm-up")
    } else {
        series.clone()
    };
    LoadConfig {
        label,
        mode: Mode::Closed {
            concurrency,
            stop: Stop::Duration(duration),
        },
        timeout: config.timeout,
        retry: config.retry,
        // Each run numbers its nodes from 0, so each gets its own name prefix: a name joins once.
        node_prefix: format!("{prefix}-{}{step}", series.to_lowercase().replace(' ', "-")),
        // Nodes come from distinct addresses, as in a real cluster.
        spread_sources: true,
        pregenerate,
        collateral_metrics: started.running.collateral_metrics,
        api_server: started.running.api_server.clone(),
    }
}

/// Runs every setup at every concurrency, printing each report as it comes.
pub async fn run(config: BenchConfig) -> anyhow::Result<BenchResults> {
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("creating {}", config.out_dir.display()))?;
    let machine = Machine::current();
    println!(
        "machine: {} CPUs ({}), load average {:?} at the start",
        machine.cpus, machine.cpu_model, machine.load_average
    );
    let prefix = run::random_prefix();
    // A attests nothing, so it runs once; B and C run for every variant.
    if config.setups.contains(&Setup::CMutual) && !config.variants.contains(&Variant::QemuVtpm) {
        println!(
            "C-mutual not run: the service attests itself with a TPM, as qemu-vtpm only, and \
             qemu-vtpm is not among the variants"
        );
    }
    let series = series(&config.setups, &config.variants);
    // Every setup is started (and warmed up) first, then each concurrency's steps run for A, B
    // and C back to back. Idle setups cost nothing, and the steps a ratio compares are then
    // seconds apart instead of a whole setup's run apart: other work on the machine drifts,
    // and it moved the ratios by more than the differences they measure.
    let mut started = Vec::new();
    for (setup, variant) in series {
        let work = tempfile::Builder::new()
            .prefix("loadgen-bench-")
            .tempdir()?;
        let label = series_label(setup, variant);
        println!("== {label}: {}", setup.description());
        let running = start(
            setup,
            variant.unwrap_or(Variant::QemuVtpm),
            &config,
            work.path(),
        )
        .await
        .with_context(|| format!("starting setup {label}"))?;
        let mut watched = running.watched.clone();
        watched.push(Watched {
            name: "loadgen".to_owned(),
            pid: std::process::id(),
            server_side: false,
        });
        let mut s = Started {
            setup,
            variant,
            running,
            watched,
            rate: 0.0,
            warmup: None,
            steps: Vec::new(),
            _work: work,
        };
        if !config.warmup.is_zero() {
            let warm = load(&config, &prefix, &s, "w", 4, config.warmup, 0);
            let report = run::run(s.running.target.clone(), &warm, &s.watched)
                .await
                .with_context(|| {
                    format!(
                        "warming up setup {label}; the end of its logs:\n{}",
                        s.running.log_tails()
                    )
                })?;
            if report.succeeded == 0 {
                bail!(
                    "setup {label} answers no join during the warm-up:\n{report}\nthe end of its logs:\n{}",
                    s.running.log_tails()
                );
            }
            if report.collateral.is_some() {
                println!("{report}");
            }
            s.rate = report.joins_per_second;
            s.warmup = Some(report);
        }
        started.push(s);
    }
    for &concurrency in &config.concurrencies {
        for s in &mut started {
            let step = load(
                &config,
                &prefix,
                s,
                &concurrency.to_string(),
                concurrency,
                config.step,
                pregenerate(s.rate, concurrency, config.step),
            );
            let report = run::run(s.running.target.clone(), &step, &s.watched)
                .await
                .with_context(|| {
                    format!(
                        "setup {} at concurrency {concurrency}; the end of its logs:\n{}",
                        series_label(s.setup, s.variant),
                        s.running.log_tails()
                    )
                })?;
            println!("{report}");
            s.rate = s.rate.max(report.joins_per_second);
            s.steps.push(report);
        }
    }
    let mut setups = Vec::new();
    for s in started {
        let collateral_since_start = match s.running.collateral_metrics {
            Some(admin) => Some(crate::collateral::read(admin).await?),
            None => None,
        };
        setups.push(SetupResults {
            setup: s.setup,
            variant: s.variant,
            description: s.setup.description(),
            warmup: s.warmup,
            collateral_since_start,
            server_processes: s.running.watched.iter().map(|w| w.name.clone()).collect(),
            steps: s.steps,
        });
    }
    let ratios = ratios(&setups, &config.concurrencies, &config.variants);
    Ok(BenchResults {
        machine,
        config,
        setups,
        ratios,
    })
}

/// The step of `setup` for `variant` (ignored for A) at `concurrency`.
fn step(
    setups: &[SetupResults],
    setup: Setup,
    variant: Variant,
    concurrency: usize,
) -> Option<&Report> {
    setups
        .iter()
        .find(|s| s.setup == setup && (setup == Setup::A || s.variant == Some(variant)))?
        .steps
        .iter()
        .find(|r| r.concurrency == Some(concurrency))
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn throughput(r: Option<&Report>) -> Option<f64> {
    r.map(|r| r.joins_per_second)
}

fn cpu(r: Option<&Report>) -> Option<f64> {
    r.and_then(|r| r.server_cpu_ms_per_join)
}

fn proxy_cpu(r: Option<&Report>) -> Option<f64> {
    r?.processes
        .iter()
        .find(|p| p.name == "attest-proxy")?
        .cpu_ms_per_join
}

fn p99(r: Option<&Report>) -> Option<f64> {
    r.map(|r| r.latency.p99_ms)
}

/// The load generator's own CPU per successful operation: the simulated nodes' work.
fn loadgen_cpu(r: Option<&Report>) -> Option<f64> {
    r?.processes
        .iter()
        .find(|p| !p.server_side)?
        .cpu_ms_per_join
}

fn fetches_per_join(r: Option<&Report>) -> Option<f64> {
    r?.collateral?.fetches_per_join
}

fn cloud_lookups_per_join(r: Option<&Report>) -> Option<f64> {
    r?.collateral?.cloud_lookups_per_join
}

/// B/A, C/A and C-mutual/C for each variant at each concurrency, where both figures exist.
pub fn ratios(
    setups: &[SetupResults],
    concurrencies: &[usize],
    variants: &[Variant],
) -> Vec<Ratio> {
    let mut out = Vec::new();
    for &c in concurrencies {
        for &v in variants {
            let (a, b, cc, mutual) = (
                step(setups, Setup::A, v, c),
                step(setups, Setup::B, v, c),
                step(setups, Setup::C, v, c),
                step(setups, Setup::CMutual, v, c),
            );
            out.push(Ratio {
                concurrency: c,
                variant: Some(v),
                b_over_a_cpu: div(cpu(b), cpu(a)),
                b_over_a_throughput: div(throughput(b), throughput(a)),
                b_proxy_over_a_cpu: div(proxy_cpu(b), cpu(a)),
                c_over_a_cpu: div(cpu(cc), cpu(a)),
                c_over_a_throughput: div(throughput(cc), throughput(a)),
                c_mutual_over_c_cpu: div(cpu(mutual), cpu(cc)),
                c_mutual_over_c_throughput: div(throughput(mutual), throughput(cc)),
                c_mutual_over_c_p99: div(p99(mutual), p99(cc)),
                c_mutual_loadgen_extra_cpu_ms: match (loadgen_cpu(mutual), loadgen_cpu(cc)) {
                    (Some(m), Some(c)) => Some(m - c),
                    _ => None,
                },
            });
        }
    }
    out
}

fn cell(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.precision$}"))
}

/// The side-by-side table: one row per concurrency and variant (A, which attests nothing,
/// repeated in each), with the collateral fetched and the cloud API (GCE, EC2) lookups per join
/// in B and C.
pub fn summary(results: &BenchResults) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} | {:<13} | {:>27} | {:>24} | {:>24} | {:>13} | {:>13} | {:>15} | {:>15} | {:>6}",
        "conc",
        "variant",
        "ops/s       A      B      C",
        "cpu ms/op   A    B    C",
        "p99 ms      A    B    C",
        "B/A cpu  tput",
        "C/A cpu  tput",
        "fetch/join B C",
        "cloud/join B C",
        "errors"
    );
    for ratio in &results.ratios {
        let c = ratio.concurrency;
        let v = ratio.variant.unwrap_or(Variant::QemuVtpm);
        let r = |s| step(&results.setups, s, v, c);
        let errors: u64 = [Setup::A, Setup::B, Setup::C]
            .into_iter()
            .filter_map(r)
            .map(|r| r.failed)
            .sum();
        let _ = writeln!(
            out,
            "{:>5} | {:<13} | {:>9} {:>8} {:>8} | {:>8} {:>7} {:>7} | {:>8} {:>7} {:>7} | {:>6} {:>6} | {:>6} {:>6} | {:>7} {:>7} | {:>7} {:>7} | {:>6}",
            c,
            v.name(),
            cell(throughput(r(Setup::A)), 0),
            cell(throughput(r(Setup::B)), 0),
            cell(throughput(r(Setup::C)), 0),
            cell(cpu(r(Setup::A)), 3),
            cell(cpu(r(Setup::B)), 3),
            cell(cpu(r(Setup::C)), 3),
            cell(r(Setup::A).map(|r| r.latency.p99_ms), 1),
            cell(r(Setup::B).map(|r| r.latency.p99_ms), 1),
            cell(r(Setup::C).map(|r| r.latency.p99_ms), 1),
            cell(ratio.b_over_a_cpu, 2),
            cell(ratio.b_over_a_throughput, 2),
            cell(ratio.c_over_a_cpu, 2),
            cell(ratio.c_over_a_throughput, 2),
            cell(fetches_per_join(r(Setup::B)), 3),
            cell(fetches_per_join(r(Setup::C)), 3),
            cell(cloud_lookups_per_join(r(Setup::B)), 3),
            cell(cloud_lookups_per_join(r(Setup::C)), 3),
            errors
        );
    }
    out.push_str(&mutual_summary(results));
    out.push_str(&control_plane_summary(results));
    // Where the collateral was fetched and the cloud asked: at start and in the warm-up.
    for s in &results.setups {
        let Some(total) = s.collateral_since_start else {
            continue;
        };
        let warm = s
            .warmup
            .as_ref()
            .and_then(|w| w.collateral.map(|c| (c.counts, w.succeeded)));
        let steps: Vec<CollateralCounts> = s
            .steps
            .iter()
            .filter_map(|r| r.collateral.map(|c| c.counts))
            .collect();
        let label = series_label(s.setup, s.variant);
        if total.collateral_cache {
            let fetches = |c: &CollateralCounts| c.fetches_ok + c.fetches_failed;
            let _ = writeln!(
                out,
                "{label}: attest-proxy fetched collateral {} times ({} failed) since it started; the warm-up: {} fetches for {} joins; every step after: {}",
                fetches(&total),
                total.fetches_failed,
                warm.map_or(0, |(c, _)| fetches(&c)),
                warm.map_or(0, |(_, n)| n),
                steps.iter().map(fetches).sum::<u64>()
            );
        }
        for (api, of) in [
            (
                "GCE",
                (|c: &CollateralCounts| c.gce) as fn(&CollateralCounts) -> _,
            ),
            ("EC2", |c: &CollateralCounts| c.ec2),
        ] {
            let lookups = |c: &CollateralCounts| of(c).map_or(0, |l| l.ok + l.failed);
            if of(&total).is_some() {
                let _ = writeln!(
                    out,
                    "{label}: attest-proxy asked the {api} API {} times since it started; the warm-up: {} for {} joins; every step after: {}",
                    lookups(&total),
                    warm.map_or(0, |(c, _)| lookups(&c)),
                    warm.map_or(0, |(_, n)| n),
                    steps.iter().map(lookups).sum::<u64>()
                );
            }
        }
        if !total.collateral_cache && total.gce.is_none() && total.ec2.is_none() {
            let _ = writeln!(
                out,
                "{label}: attest-proxy fetches no collateral and asks no cloud API for this variant"
            );
        }
    }
    out
}

/// What each C step cost the Kubernetes control plane: the API requests per join (by verb and
/// resource, from the API server's own counters) and kube-apiserver's and etcd's CPU per join,
/// beside the service's.
fn control_plane_summary(results: &BenchResults) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let process_ms = |r: &Report, name: &str| {
        r.processes
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.cpu_ms_per_join)
    };
    for s in results.setups.iter().filter(|s| s.setup == Setup::C) {
        let label = series_label(s.setup, s.variant);
        for r in &s.steps {
            let Some(api) = &r.api else {
                continue;
            };
            if out.is_empty() {
                let _ = writeln!(
                    out,
                    "{:<18} | {:>5} | {:>22} | {:>9} | {:>7} | {:>7} | requests per join by verb and resource",
                    "control plane", "conc", "cpu ms/join apiserver", "etcd", "service", "req/join"
                );
            }
            let _ = writeln!(
                out,
                "{:<18} | {:>5} | {:>22} | {:>9} | {:>7} | {:>8} | {}",
                label,
                r.concurrency.unwrap_or(0),
                cell(process_ms(r, "kube-apiserver"), 3),
                cell(process_ms(r, "etcd"), 3),
                cell(r.server_cpu_ms_per_join, 3),
                cell(api.per_join, 2),
                api.requests
                    .iter()
                    .map(|q| format!("{} {} {}", q.verb, q.resource, cell(q.per_join, 2)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    out
}

/// C against C-mutual, one row per concurrency where C-mutual ran: throughput, the service's
/// CPU per join, p99, their ratios, and the load generator's own CPU per join apart (the
/// simulated nodes' share, which in C-mutual includes each node verifying the service).
fn mutual_summary(results: &BenchResults) -> String {
    use std::fmt::Write as _;
    let rows: Vec<&Ratio> = results
        .ratios
        .iter()
        .filter(|r| {
            let v = r.variant.unwrap_or(Variant::QemuVtpm);
            step(&results.setups, Setup::CMutual, v, r.concurrency).is_some()
        })
        .collect();
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "== C with mutual attestation (C-mutual: the service attests itself, every node verifies it) against C"
    );
    let _ = writeln!(
        out,
        "{:>5} | {:>20} | {:>22} | {:>22} | {:>17} | {:>22} | {:>6}",
        "conc",
        "ops/s  C   C-mut",
        "server cpu ms/op C Cm",
        "p99 ms    C    C-mut",
        "Cm/C cpu tput p99",
        "loadgen ms/op C Cm +",
        "errors"
    );
    for ratio in rows {
        let c = ratio.concurrency;
        let v = ratio.variant.unwrap_or(Variant::QemuVtpm);
        let (plain, mutual) = (
            step(&results.setups, Setup::C, v, c),
            step(&results.setups, Setup::CMutual, v, c),
        );
        let errors: u64 = [plain, mutual]
            .into_iter()
            .flatten()
            .map(|r| r.failed)
            .sum();
        let _ = writeln!(
            out,
            "{:>5} | {:>9} {:>10} | {:>10} {:>11} | {:>10} {:>11} | {:>5} {:>5} {:>5} | {:>6} {:>6} {:>8} | {:>6}",
            c,
            cell(throughput(plain), 0),
            cell(throughput(mutual), 0),
            cell(cpu(plain), 3),
            cell(cpu(mutual), 3),
            cell(p99(plain), 1),
            cell(p99(mutual), 1),
            cell(ratio.c_mutual_over_c_cpu, 2),
            cell(ratio.c_mutual_over_c_throughput, 2),
            cell(ratio.c_mutual_over_c_p99, 2),
            cell(loadgen_cpu(plain), 3),
            cell(loadgen_cpu(mutual), 3),
            cell(ratio.c_mutual_loadgen_extra_cpu_ms, 3),
            errors
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procstat::{Memory, Sample};
    use crate::report::{Outcome, ProcessReadings};

    /// A one-second step of `joins`, the slowest tenth taking `slowest_ms` (so p99 is that) and
    /// the rest 2 ms, with each of `processes` (name, server-side, CPU ticks) watched.
    fn timed_step(
        concurrency: usize,
        joins: usize,
        slowest_ms: u64,
        processes: &[(&str, bool, u64)],
    ) -> Report {
        let outcomes: Vec<Outcome> = (0..joins)
            .map(|i| Outcome {
                latency: Duration::from_millis(if i < joins / 10 { slowest_ms } else { 2 }),
                result: Ok(()),
                retried: vec![],
            })
            .collect();
        let sample = |t| Sample {
            cpu_ticks: t,
            memory: Memory::default(),
        };
        let readings = ProcessReadings {
            watched: processes
                .iter()
                .zip(1..)
                .map(|(&(name, server_side, _), pid)| Watched {
                    name: name.into(),
                    pid,
                    server_side,
                })
                .collect(),
            before: processes.iter().map(|_| sample(0)).collect(),
            after: processes.iter().map(|&(_, _, t)| sample(t)).collect(),
            ticks_per_second: 100,
        };
        Report::new(
            "x",
            "y",
            Some(concurrency),
            Duration::from_secs(1),
            &outcomes,
            &readings,
        )
    }

    /// A stand-in for local-cluster printing `script`'s lines, with its logs in `dir`.
    fn announcing(dir: &Path, script: &str) -> Cluster {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        Cluster(Process::spawn("local-cluster", &command, dir).unwrap())
    }

    /// local-cluster prints attest-proxy's admin endpoint after its services are up, which may
    /// be well after attest-proxy's port accepts: the line itself is waited for.
    #[test]
    fn the_admin_endpoint_announced_late_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        let mut cluster = announcing(
            dir.path(),
            &format!(
                "echo 'join service up: attest-proxy on 127.0.0.1:9 (files and logs in {})'; \
                 sleep 1; echo 'attest-proxy admin endpoint on 127.0.0.1:4567'; \
                 echo \"the service attests itself: ...; nodes' service policy in /p/servicePolicy\"; \
                 exec sleep 30",
                files.path().display()
            ),
        );
        let admin: std::net::SocketAddr = cluster
            .wait_for_announcement(PROXY_ADMIN_ANNOUNCED, Duration::from_secs(10))
            .unwrap();
        assert_eq!(admin, loopback(4567));
        let policy: PathBuf = cluster
            .wait_for_announcement(SERVICE_POLICY_ANNOUNCED, Duration::from_secs(10))
            .unwrap();
        assert_eq!(policy, Path::new("/p/servicePolicy"));
    }

    /// A local-cluster that never announces (or exits first) fails the wait at its deadline, and
    /// the error carries what it said.
    #[test]
    fn a_missing_announcement_fails_at_the_deadline_with_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut silent = announcing(dir.path(), "echo starting swtpm; exec sleep 30");
        let started = std::time::Instant::now();
        let error = silent
            .wait_for_announcement::<std::net::SocketAddr>(
                PROXY_ADMIN_ANNOUNCED,
                Duration::from_millis(500),
            )
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        let text = format!("{error:#}");
        assert!(text.contains("attest-proxy admin endpoint on"), "{text}");
        assert!(text.contains("after 500ms"), "{text}");
        assert!(text.contains("starting swtpm"), "{text}");

        let mut failing = announcing(dir.path(), "echo 'kds stand-in: address in use'; exit 1");
        let text = format!(
            "{:#}",
            failing
                .wait_for_announcement::<std::net::SocketAddr>(PROXY_ADMIN_ANNOUNCED, CLUSTER_START)
                .unwrap_err()
        );
        assert!(text.contains("exited"), "{text}");
        assert!(text.contains("address in use"), "{text}");
    }

    #[test]
    fn a_tail_is_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a\nb", 5), "a\nb");
        assert_eq!(tail("", 5), "");
    }

    fn report(concurrency: usize, joins: usize, proxy_ticks: u64, other_ticks: u64) -> Report {
        timed_step(
            concurrency,
            joins,
            2,
            &[
                ("attest-proxy", true, proxy_ticks),
                ("other", true, other_ticks),
            ],
        )
    }

    fn setup(setup: Setup, variant: Option<Variant>, steps: Vec<Report>) -> SetupResults {
        SetupResults {
            setup,
            variant,
            description: setup.description(),
            warmup: None,
            collateral_since_start: None,
            server_processes: vec![],
            steps,
        }
    }

    #[test]
    fn c_mutual_runs_right_after_qemu_vtpm_c_and_only_for_it() {
        let all = [Setup::A, Setup::B, Setup::C, Setup::CMutual];
        let variants = [Variant::QemuVtpm, Variant::AwsSevSnp];
        assert_eq!(
            series(&all, &variants),
            vec![
                (Setup::A, None),
                (Setup::B, Some(Variant::QemuVtpm)),
                (Setup::B, Some(Variant::AwsSevSnp)),
                (Setup::C, Some(Variant::QemuVtpm)),
                (Setup::CMutual, Some(Variant::QemuVtpm)),
                (Setup::C, Some(Variant::AwsSevSnp)),
            ]
        );
        assert_eq!(
            series(&[Setup::CMutual], &variants),
            vec![(Setup::CMutual, Some(Variant::QemuVtpm))]
        );
        assert!(series(&[Setup::CMutual], &[Variant::AwsSevSnp]).is_empty());
    }

    #[test]
    fn c_mutual_is_compared_with_c_and_the_load_generators_cpu_stays_apart() {
        // C: 100 joins on 50 server ticks (5 ms each) and 40 load generator ticks; C-mutual: 90
        // joins on 45 server ticks (the same 5 ms) and 45 load generator ticks (5 ms, 1 more).
        let setups = vec![
            setup(
                Setup::C,
                Some(Variant::QemuVtpm),
                vec![timed_step(
                    16,
                    100,
                    20,
                    &[("attest-proxy", true, 50), ("loadgen", false, 40)],
                )],
            ),
            setup(
                Setup::CMutual,
                Some(Variant::QemuVtpm),
                vec![timed_step(
                    16,
                    90,
                    22,
                    &[("attest-proxy", true, 45), ("loadgen", false, 45)],
                )],
            ),
        ];
        let ratios = ratios(&setups, &[16], &[Variant::QemuVtpm]);
        let r = &ratios[0];
        assert!((r.c_mutual_over_c_cpu.unwrap() - 1.0).abs() < 1e-9);
        assert!((r.c_mutual_over_c_throughput.unwrap() - 0.9).abs() < 1e-9);
        assert!((r.c_mutual_over_c_p99.unwrap() - 1.1).abs() < 1e-9);
        assert!((r.c_mutual_loadgen_extra_cpu_ms.unwrap() - 1.0).abs() < 1e-9);
        let results = BenchResults {
            machine: Machine::current(),
            config: BenchConfig {
                setups: vec![Setup::C, Setup::CMutual],
                concurrencies: vec![16],
                step: Duration::from_secs(1),
                warmup: Duration::ZERO,
                timeout: Duration::from_secs(1),
                retry: None,
                key_type: KeyType::EcdsaP256,
                variants: vec![Variant::QemuVtpm],
                out_dir: PathBuf::from("x"),
            },
            setups,
            ratios,
        };
        let table = summary(&results);
        let row = table
            .lines()
            .skip_while(|l| !l.starts_with("== C with mutual attestation"))
            .nth(2)
            .unwrap();
        for figure in [
            "100", "90", "5.000", "20.0", "22.0", "1.00", "0.90", "1.10", "4.000",
        ] {
            assert!(row.contains(figure), "{figure} in {row}\n{table}");
        }
        let json = serde_json::to_value(&results).unwrap();
        assert_eq!(json["setups"][1]["setup"], "C-mutual");
        assert_eq!(json["ratios"][0]["c_mutual_over_c_throughput"], 0.9);
        // Without C-mutual steps the table has no such section.
        let mut without = results.clone();
        without.setups.truncate(1);
        assert!(
            !summary(&without).contains("mutual"),
            "{}",
            summary(&without)
        );
    }

    #[test]
    fn nodes_made_ahead_cover_a_faster_step_and_stay_bounded() {
        let step = Duration::from_secs(5);
        // Nothing seen yet: at least 500/s is assumed.
        assert_eq!(pregenerate(0.0, 1, step), 7_502);
        // Three times the fastest rate so far, plus two nodes per slot.
        assert_eq!(pregenerate(1_000.0, 64, step), 15_128);
        assert_eq!(pregenerate(1e9, 64, step), 40_000);
    }

    #[test]
    fn ratios_compare_with_a_at_the_same_concurrency() {
        // A: 100 ops/s at 1 tick each (10 ms); B: 50 ops/s at 3 ticks (2 of them the proxy).
        let setups = vec![
            setup(Setup::A, None, vec![report(16, 100, 0, 100)]),
            setup(
                Setup::B,
                Some(Variant::QemuVtpm),
                vec![report(16, 50, 100, 50)],
            ),
            // The SNP variant's B: 4 ticks, and 5 collateral fetches for its 50 joins.
            setup(Setup::B, Some(Variant::AwsSevSnp), {
                let mut r = report(16, 50, 100, 100);
                r.collateral = Some(crate::collateral::CollateralUse::between(
                    crate::collateral::CollateralCounts::default(),
                    crate::collateral::CollateralCounts {
                        fetches_ok: 5,
                        ..Default::default()
                    },
                    50,
                ));
                vec![r]
            }),
        ];
        let variants = [Variant::QemuVtpm, Variant::AwsSevSnp];
        let ratios = ratios(&setups, &[16, 64], &variants);
        // One ratio per concurrency and variant, each against the one A.
        assert_eq!(ratios.len(), 4);
        assert_eq!(ratios[1].variant, Some(Variant::AwsSevSnp));
        assert!((ratios[1].b_over_a_cpu.unwrap() - 4.0).abs() < 1e-9);
        let r = &ratios[0];
        assert!((r.b_over_a_cpu.unwrap() - 3.0).abs() < 1e-9);
        assert!((r.b_proxy_over_a_cpu.unwrap() - 2.0).abs() < 1e-9);
        assert!((r.b_over_a_throughput.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(r.c_over_a_cpu, None);
        // No step at 64: no ratio, and the table still prints.
        assert_eq!(ratios[2].b_over_a_cpu, None);
        let results = BenchResults {
            machine: Machine::current(),
            config: BenchConfig {
                setups: vec![Setup::A, Setup::B],
                concurrencies: vec![16, 64],
                step: Duration::from_secs(1),
                warmup: Duration::ZERO,
                timeout: Duration::from_secs(1),
                retry: None,
                key_type: KeyType::EcdsaP256,
                variants: variants.to_vec(),
                out_dir: PathBuf::from("x"),
            },
            setups,
            ratios,
        };
        let table = summary(&results);
        assert!(table.contains("3.00"), "{table}");
        let snp_row = table.lines().find(|l| l.contains("aws-sev-snp")).unwrap();
        assert!(
            snp_row.contains("4.00") && snp_row.contains("0.100"),
            "{table}"
        );
        let json = serde_json::to_value(&results).unwrap();
        assert_eq!(json["ratios"][0]["b_over_a_cpu"], 3.0);
        assert_eq!(json["config"]["step"], 1.0);
        assert_eq!(json["config"]["key_type"], "ecdsa-p256");
        assert_eq!(json["config"]["variants"][1], "aws-sev-snp");
        assert_eq!(json["setups"][2]["variant"], "aws-sev-snp");
        assert_eq!(json["setups"][0]["variant"], serde_json::Value::Null);
        assert_eq!(
            json["setups"][2]["steps"][0]["collateral"]["fetches_per_join"],
            0.1
        );
        assert_eq!(json["machine"]["load_average"].as_array().unwrap().len(), 3);

        // The plot: A and both Bs at concurrency 16 in each of the three panels, nothing at 64.
        let svg = crate::plot::svg(&results);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<title>").count(), 9, "{svg}");
        assert_eq!(svg.matches("<title>A: mutual TLS").count(), 3);
        assert_eq!(svg.matches("(aws-sev-snp) at concurrency 16").count(), 3);
        assert!(!svg.contains("concurrency 64:"));
        // Three series fit side by side with their values; A is grey and each variant's B has
        // its own hue.
        assert!(svg.contains(r#"font-size="8""#), "{svg}");
        let fill_of = |svg: &str, title: &str| {
            let at = svg.find(title).unwrap_or_else(|| panic!("{title}"));
            let rect = &svg[svg[..at].rfind("<rect").unwrap()..at];
            rect.split("fill=\"").nth(1).unwrap()[..7].to_owned()
        };
        assert_eq!(fill_of(&svg, "<title>A: mutual TLS"), "#7f7f7f");
        assert_ne!(
            fill_of(&svg, "(qemu-vtpm) at concurrency 16"),
            fill_of(&svg, "(aws-sev-snp) at concurrency 16")
        );
        // Many series (nine variants' B and C make twenty, at four concurrencies): the panels
        // stack at full width, and bars too narrow for a label carry their value in the
        // tooltip only.
        let mut many = results.clone();
        while many.setups.len() < 40 {
            many.setups.push(many.setups[1].clone());
        }
        let stacked = crate::plot::svg(&many);
        assert!(stacked.starts_with(r#"<svg xmlns="http://www.w3.org/2000/svg" width="1200""#));
        assert_eq!(stacked.matches("<title>").count(), 120);
        assert!(!stacked.contains(r#"font-size="8""#));
        // Its legend names each series by setup letter and variant, under a key to the setups.
        assert!(stacked.contains(">B qemu-vtpm</text>"), "{stacked}");
        assert!(
            stacked.contains("A: mutual TLS + one gRPC call"),
            "{stacked}"
        );

        // The README's tables: one per variant, a row per concurrency that has B or C.
        let md = crate::tables::markdown(&results);
        assert_eq!(md.matches("\n### ").count(), 2, "{md}");
        let (qemu, snp) = md
            .split_once("### aws-sev-snp")
            .unwrap_or_else(|| panic!("{md}"));
        for (table, b_over_a) in [(qemu, "| 3.00 | - |"), (snp, "| 4.00 | - |")] {
            let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| 16 ")).collect();
            assert_eq!(rows.len(), 1, "{md}");
            assert!(rows[0].contains(b_over_a), "{b_over_a} in {}", rows[0]);
            assert!(!table.contains("| 64 "), "{md}");
        }
    }
}
