//! The whole join system on one machine: swtpm, the key service, a real Kubernetes control plane
//! ([`crate::cluster`]), and token-issuer, join-core and attest-proxy as real processes talking
//! over real Unix sockets.
//!
//! Tests and `local-cluster` both start it through [`System::start`]. Every process it starts
//! ends when the process that started it ends, even by SIGKILL or a crash
//! ([`crate::process::spawn_tied`]): a test or local-cluster killed midway leaves nothing serving.
//!
//! As root (CI runs the tests as root), attest-proxy, join-core and token-issuer run under three
//! distinct uids, as in the pod ([`Uids::POD`]), and each file is readable only by the process
//! that reads it in the pod: so every peer-uid check (each server's `SO_PEERCRED` on accept,
//! each client's on connect) is exercised end to end. Otherwise every process runs as the
//! caller's uid.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use attestation::AkTrust;
use node_client::Client;
use rand::Rng;
use tpm_issuer::AkSpec;

pub use crate::cluster::{
    COMPONENTS_REF, EXPECTED_CONTROL_PLANE_NODES, KUBERNETES_VERSION, Kube, TokenRefresher,
};
use crate::control_plane::Pki;
use crate::process::{Process, RunAs, bin_for_others, free_port};
use crate::swtpm::Swtpm;

/// The boot measurements the harness extends into the TPM before any node attests, standing in
/// for what firmware and the boot chain would measure: (PCR index, extended digest byte).
pub const BOOT_MEASUREMENTS: [(u32, u8); 4] = [(4, 0x44), (9, 0x99), (11, 0x11), (12, 0x12)];

/// The token-issuer's service-account name, as the deployment's RBAC names it.
pub const TOKEN_ISSUER_USER: &str = "system:serviceaccount:kube-system:join-token-issuer";

/// The API server endpoint handed out in tickets (no kubelet runs in the tests to reach it).
pub const API_SERVER_ENDPOINT: &str = "10.0.0.1:6443";

/// `apiServer.certSANs` of the kubeadm ClusterConfiguration join-core reads.
pub const API_SERVER_CERT_SANS: [&str; 2] = ["10.0.0.1", "api.cluster.example"];

/// Where each service process serves its admin endpoint (`/livez`, `/readyz`, `/metrics`).
#[derive(Clone, Copy, Debug)]
pub struct AdminAddrs {
    pub proxy: SocketAddr,
    pub join_core: SocketAddr,
    pub token_issuer: SocketAddr,
}

/// The value of the metric line `name` (with its labels as exposed, e.g.
/// `attest_proxy_connections_shed_total{reason="peer_rate"}`) on the admin endpoint at `addr`;
/// 0 if the series does not exist yet.
pub async fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let (status, body) = plumbing::admin::get(addr, "/metrics").await?;
    anyhow::ensure!(status == 200, "/metrics answered {status}: {body}");
    match body
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
    {
        Some(value) => Ok(value.trim().parse()?),
        None => Ok(0.0),
    }
}

/// A hostile node's issuer: `size` bytes of junk presented as a qemu-vtpm document, cheap to
/// send and still to be parsed before it can be refused. Beyond 64 KiB the certificate carrying
/// it exceeds the proxy's limit.
#[derive(Debug)]
pub struct JunkDocument {
    pub size: usize,
}

impl attestation::Issuer for JunkDocument {
    fn variant(&self) -> attestation::Variant {
        attestation::Variant::QemuVtpm
    }

    fn issue(&self, _user_data: &[u8], _nonce: &[u8]) -> Result<Vec<u8>, attestation::IssueError> {
        let mut doc = b"{\"Attestation\":{\"ak_pub\":\"".to_vec();
        doc.resize(self.size, b'A');
        Ok(doc)
    }
}

/// How to start the system.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// attest-proxy's listen address; loopback on a free port if unset.
    pub proxy_listen: Option<SocketAddr>,
    /// The attestation config (measurement policy) file; the harness writes one matching its
    /// swtpm's boot measurements and trusting only its swtpm's attestation keys if unset.
    pub attestation_config: Option<PathBuf>,
    /// Trust any attestation key in the config the harness writes (`"trustAnyAk": true`)
    /// instead of pinning the swtpm's: for load tests whose nodes attest with software keys
    /// (`soft-issuer`), which are new for every node.
    pub trust_any_ak: bool,
    /// Keep the working directory (sockets, logs, keys) instead of deleting it.
    pub keep_dir: bool,
    /// Further command-line arguments for attest-proxy (e.g. `--handshake-timeout 2s`).
    /// Unless they set `--per-peer-rate`, the proxy's per-source rate limit is off: test nodes
    /// connect from 127.0.0.1 one after another, one address standing for many nodes, as behind
    /// a load balancer.
    pub proxy_args: Vec<String>,
    /// The RBAC manifest applied to the API server for token-issuer's ServiceAccount;
    /// `deploy/base/rbac.yaml`, what operators deploy, if unset. Given, the system starts a
    /// control plane of its own.
    pub rbac: Option<PathBuf>,
    /// The local run: a control plane of its own instead of the test binary's shared one
    /// ([`Kube::shared`]), ending with the system, and token-issuer reaching it directly, with
    /// no fault proxy between.
    pub own_control_plane: bool,
    /// Run every process as the caller's uid even as root: for tests whose own process talks
    /// to the services' sockets (an in-process attest-proxy), which the pod's uids would refuse.
    pub same_uid: bool,
    /// The attestation variant attest-proxy serves; qemu-vtpm if unset. Another variant needs
    /// its own `attestation_config`.
    pub variant: Option<attestation::Variant>,
    /// gcp-sev-snp: the Google endpoints gce-identity calls (the test's GCE stand-in). With
    /// them the harness starts gce-identity as its own process and points attest-proxy at it.
    pub gce: Option<GceEndpoints>,
    /// aws-nitro-tpm: the AWS endpoints ec2-identity calls (the test's EC2 stand-in). With
    /// them the harness starts ec2-identity as its own process and points attest-proxy at it.
    pub ec2: Option<Ec2Endpoints>,
    /// The service attests itself: the harness starts a second swtpm (the control-plane
    /// node's TPM), the certifier on it as its own process, points attest-proxy at it
    /// (`--certifier-uid`), and writes the nodes' service policy to [`Paths::service_policy`].
    pub certifier: bool,
    /// attest-proxy keeps the evidence of the nodes it decides on in [`Paths::evidence`]
    /// (`--evidence-dir`), which turns its reload guard on.
    pub keep_evidence: bool,
    /// Serve the cluster another system started ([`System::shared_cluster`]), as the
    /// DaemonSet's instance on another control-plane node: the same API server, the same
    /// cluster CAs, measurement salt and key service secrets ([`Options::rbac`] is then the
    /// first system's); or the test binary's shared control plane taken before the system
    /// starts ([`SharedCluster::alone`]).
    pub cluster: Option<SharedCluster>,
}

/// What the instances of the join service on one cluster's control-plane nodes share: the
/// Kubernetes control plane, the cluster's CAs (each node's `/etc/kubernetes/pki`), the
/// measurement salt, and the key service's secrets (one KMS derives the same keys for all). The
/// system it came from keeps the control plane's files: keep it alive while others use it.
#[derive(Clone, Debug)]
pub struct SharedCluster {
    kube: Arc<Kube>,
    pki_dir: PathBuf,
    secrets: ClusterSecrets,
}

/// A cluster's secrets outside its PKI.
#[derive(Clone, Debug)]
struct ClusterSecrets {
    measurement_salt: [u8; 32],
    master_secret_hex: String,
    master_salt_hex: String,
}

impl SharedCluster {
    /// The test binary's shared control plane ([`Kube::shared`]), held alone from now on, with
    /// fresh secrets: for a test that must not wait for its turn after it has prepared what
    /// its system uses (a TPM opened, a certifier started); it starts the system with
    /// [`Options::cluster`].
    pub async fn alone() -> anyhow::Result<Self> {
        let kube = Kube::shared().await;
        let pki_dir = kube
            .pki()
            .and_then(|pki| pki.ca_cert.parent())
            .context("the shared control plane's PKI")?
            .to_path_buf();
        Ok(Self {
            kube: Arc::new(kube),
            pki_dir,
            secrets: ClusterSecrets::generate(),
        })
    }
}

impl ClusterSecrets {
    fn generate() -> Self {
        let mut measurement_salt = [0u8; 32];
        rand::rng().fill(&mut measurement_salt);
        Self {
            measurement_salt,
            master_secret_hex: random_hex(32),
            master_salt_hex: random_hex(32),
        }
    }
}

/// Where gce-identity finds the metadata server and the Compute API.
#[derive(Clone, Debug)]
pub struct GceEndpoints {
    pub metadata_url: String,
    pub compute_url: String,
    /// The Compute API's CA (PEM), readable by every uid.
    pub compute_ca_file: PathBuf,
    /// Further arguments for attest-proxy's gcp-sev-snp cache (e.g. `--gce-identity-backoff`).
    pub proxy_args: Vec<String>,
}

/// gce-identity serving attest-proxy (`peer_uid`) on `socket`, asking `gce`'s endpoints.
pub fn gce_identity_command(
    socket: &Path,
    peer_uid: u32,
    gce: &GceEndpoints,
) -> anyhow::Result<Command> {
    let mut gce_identity = command("gce-identity")?;
    gce_identity
        .arg("--socket")
        .arg(socket)
        .args(["--peer-uid", &peer_uid.to_string()])
        .args(["--metadata-url", &gce.metadata_url])
        .args(["--compute-url", &gce.compute_url])
        .arg("--compute-ca-file")
        .arg(&gce.compute_ca_file)
        .args(["--request-timeout", "2s"]);
    Ok(gce_identity)
}

/// attest-proxy's flags for the gce-identity on `socket` running as `uid`, and `gce`'s own.
pub fn gce_proxy_args(socket: &Path, uid: u32, gce: &GceEndpoints) -> Vec<String> {
    [
        "--gce-identity-socket".to_owned(),
        socket.display().to_string(),
        "--gce-identity-uid".to_owned(),
        uid.to_string(),
    ]
    .into_iter()
    .chain(gce.proxy_args.iter().cloned())
    .collect()
}

/// Where ec2-identity finds the instance metadata service and EC2.
#[derive(Clone, Debug)]
pub struct Ec2Endpoints {
    pub imds_url: String,
    pub ec2_url: String,
    /// EC2's CA (PEM), readable by every uid.
    pub ec2_ca_file: PathBuf,
    /// Further arguments for attest-proxy's aws-nitro-tpm cache (e.g. `--ec2-identity-backoff`).
    pub proxy_args: Vec<String>,
}

/// ec2-identity serving attest-proxy (`peer_uid`) on `socket`, asking `ec2`'s endpoints.
pub fn ec2_identity_command(
    socket: &Path,
    peer_uid: u32,
    ec2: &Ec2Endpoints,
) -> anyhow::Result<Command> {
    let mut ec2_identity = command("ec2-identity")?;
    ec2_identity
        .arg("--socket")
        .arg(socket)
        .args(["--peer-uid", &peer_uid.to_string()])
        .args(["--imds-url", &ec2.imds_url])
        .args(["--ec2-url", &ec2.ec2_url])
        .arg("--ec2-ca-file")
        .arg(&ec2.ec2_ca_file)
        .args(["--request-timeout", "2s"]);
    Ok(ec2_identity)
}

/// attest-proxy's flags for the ec2-identity on `socket` running as `uid`, and `ec2`'s own.
pub fn ec2_proxy_args(socket: &Path, uid: u32, ec2: &Ec2Endpoints) -> Vec<String> {
    [
        "--ec2-identity-socket".to_owned(),
        socket.display().to_string(),
        "--ec2-identity-uid".to_owned(),
        uid.to_string(),
    ]
    .into_iter()
    .chain(ec2.proxy_args.iter().cloned())
    .collect()
}

/// The uids the three service processes run as, and the group they share for the sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uids {
    pub proxy: u32,
    pub join_core: u32,
    pub token_issuer: u32,
    /// gce-identity's (gcp-sev-snp only).
    pub gce_identity: u32,
    /// The certifier's (when the service attests itself).
    pub certifier: u32,
    /// ec2-identity's (aws-nitro-tpm only).
    pub ec2_identity: u32,
    /// In the pod, the fsGroup every container has; here every process's primary group.
    pub gid: u32,
}

impl Uids {
    /// The uids of `deploy/base/daemonset.yaml`.
    pub const POD: Uids = Uids {
        proxy: 10001,
        join_core: 10002,
        token_issuer: 10003,
        gce_identity: 10004,
        certifier: 10005,
        ec2_identity: 10006,
        gid: 10000,
    };

    /// Every process as `uid` (and its group).
    fn same(uid: u32, gid: u32) -> Self {
        Self {
            proxy: uid,
            join_core: uid,
            token_issuer: uid,
            gce_identity: uid,
            certifier: uid,
            ec2_identity: uid,
            gid,
        }
    }

    /// Whether the processes run as uids other than the caller's.
    pub fn distinct(&self) -> bool {
        self.proxy != self.join_core
    }

    fn user(&self, uid: u32) -> Option<RunAs> {
        self.distinct().then_some(RunAs { uid, gid: self.gid })
    }
}

/// One of the system's service processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Proxy,
    JoinCore,
    TokenIssuer,
    KeyService,
    /// gce-identity; only with [`Options::gce`].
    GceIdentity,
    /// ec2-identity; only with [`Options::ec2`].
    Ec2Identity,
}

/// A running system. Dropping it stops every process; so does the end of the process that
/// started it.
#[derive(Debug)]
pub struct System {
    // Field order is drop order: the proxy goes first, swtpm and the directory last.
    pub proxy: Process,
    pub join_core: Process,
    pub token_issuer: Process,
    pub keyservice: Process,
    /// gce-identity, for gcp-sev-snp ([`Options::gce`]).
    pub gce_identity: Option<Process>,
    /// ec2-identity, for aws-nitro-tpm ([`Options::ec2`]).
    pub ec2_identity: Option<Process>,
    /// The certifier and the control-plane node's swtpm it holds ([`Options::certifier`]).
    pub certifier: Option<(Process, Swtpm)>,
    /// The Kubernetes control plane and the fault proxy token-issuer reaches it through.
    pub kube: Arc<Kube>,
    /// Renews token-issuer's ServiceAccount token.
    _token_refresher: TokenRefresher,
    secrets: ClusterSecrets,
    pub swtpm: Swtpm,
    pub proxy_addr: SocketAddr,
    /// Where the key service listens (join-core's `--kms-endpoint`).
    pub kms_addr: SocketAddr,
    /// The processes' admin endpoints.
    pub admin: AdminAddrs,
    /// The uids attest-proxy, join-core and token-issuer run as.
    pub uids: Uids,
    pub paths: Paths,
    /// The attestation keys the configs the harness writes trust: its swtpm's, or any with
    /// [`Options::trust_any_ak`] (a config file given in [`Options`] says its own).
    pub ak_trust: AkTrust,
    _dir: Option<tempfile::TempDir>,
}

/// Where the system keeps its files.
#[derive(Clone, Debug)]
pub struct Paths {
    pub root: PathBuf,
    pub join_core_socket: PathBuf,
    pub token_issuer_socket: PathBuf,
    pub gce_identity_socket: PathBuf,
    pub ec2_identity_socket: PathBuf,
    pub certifier_socket: PathBuf,
    pub attestation_config: PathBuf,
    /// The nodes' service policy ([`Options::certifier`]): the control-plane swtpm's boot
    /// measurements and attestation key.
    pub service_policy: PathBuf,
    pub pki_dir: PathBuf,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub kubeadm_config: PathBuf,
    pub measurement_salt: PathBuf,
    pub kubeconfig: PathBuf,
    /// token-issuer's ServiceAccount token, as the pod's projected volume holds it.
    pub service_account_token: PathBuf,
    pub logs: PathBuf,
    /// attest-proxy's evidence directory ([`Options::keep_evidence`]).
    pub evidence: PathBuf,
}

impl Paths {
    fn new(root: &Path) -> Self {
        let p = |name: &str| root.join(name);
        Self {
            root: root.to_owned(),
            join_core_socket: p("run/join-core/join-core.sock"),
            token_issuer_socket: p("run/token-issuer/token-issuer.sock"),
            gce_identity_socket: p("run/gce-identity/gce-identity.sock"),
            ec2_identity_socket: p("run/ec2-identity/ec2-identity.sock"),
            certifier_socket: p("run/certifier/certifier.sock"),
            attestation_config: p("config/attestationConfig"),
            service_policy: p("config/servicePolicy"),
            pki_dir: p("pki"),
            ca_cert: p("pki/ca.crt"),
            ca_key: p("pki/ca.key"),
            kubeadm_config: p("config/kubeadm/ClusterConfiguration"),
            measurement_salt: p("config/measurementSalt"),
            kubeconfig: p("config/token-issuer.kubeconfig"),
            service_account_token: p("config/token-issuer.token"),
            logs: p("logs"),
            evidence: p("cache/evidence"),
        }
    }
}

/// The uid this process runs as: every harness process runs as it, so each socket admits it.
pub fn own_uid() -> anyhow::Result<u32> {
    Ok(std::fs::metadata("/proc/self")
        .context("reading /proc/self")?
        .uid())
}

/// The SHA-256 PCR value after extending a zeroed PCR once with `digest`.
pub fn extended_once(digest: &[u8; 32]) -> [u8; 32] {
    let mut input = [0u8; 64];
    input[32..].copy_from_slice(digest);
    let mut out = [0u8; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input).as_ref());
    out
}

/// The attestation keys of `swtpm` that nodes use: tpm-issuer's default RSA and ECC keys. Both
/// are primary keys, so each is the same every time an issuer opens this TPM.
pub fn swtpm_ak_trust(swtpm: &Swtpm) -> anyhow::Result<AkTrust> {
    let mut keys = Vec::new();
    for spec in [AkSpec::RSA_DEFAULT, AkSpec::ECC_DEFAULT] {
        let mut config = tpm_issuer::TpmIssuerConfig::new(swtpm.tcti());
        config.ak = spec;
        // Dropped at once: swtpm serves one client at a time.
        let issuer = tpm_issuer::TpmIssuer::open(&config)
            .with_context(|| format!("opening swtpm for its {spec:?} attestation key"))?;
        keys.push(issuer.ak_public()?);
    }
    Ok(AkTrust::keys(keys.iter().map(Vec::as_slice)))
}

/// The harness's boot measurements, as PCR values a simulated node's vTPM quotes.
pub fn boot_pcrs() -> Vec<(u32, [u8; 32])> {
    BOOT_MEASUREMENTS
        .iter()
        .map(|&(index, byte)| (index, extended_once(&[byte; 32])))
        .collect()
}

/// The harness's boot measurements as an attestation config's `measurements`, all enforced.
pub fn boot_measurements() -> serde_json::Map<String, serde_json::Value> {
    boot_pcrs()
        .into_iter()
        .map(|(index, value)| {
            (
                index.to_string(),
                serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            )
        })
        .collect()
}

/// The directory of a simulated hardware vendor's site (SEV-SNP's, TDX's): the public files
/// attest-proxy reads (the stand-in's CA, the attestation config as `attestationConfig`) and the
/// directories it writes: `collateral/`, and `evidence/` beside it, where attest-proxy keeps
/// evidence by default when given `--collateral-dir`.
#[derive(Clone, Debug)]
pub struct SiteDir(PathBuf);

impl SiteDir {
    /// Writes `files` (name, contents) into `dir`, readable by every uid, lets every uid
    /// traverse `dir`, and makes `collateral/` and `evidence/`, owned by `proxy_uid` when
    /// attest-proxy runs as another uid (attest-proxy makes `evidence/` 0700 itself).
    pub fn prepare(
        dir: &Path,
        files: &[(&str, String)],
        proxy_uid: Option<u32>,
    ) -> anyhow::Result<SiteDir> {
        use std::os::unix::fs::PermissionsExt;
        let site = SiteDir(dir.to_owned());
        std::fs::create_dir_all(site.collateral_dir())?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        for (name, contents) in files {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
        if let Some(uid) = proxy_uid {
            std::os::unix::fs::chown(site.collateral_dir(), Some(uid), None)
                .context("giving the collateral directory to attest-proxy's uid")?;
            std::fs::create_dir_all(site.evidence_dir())?;
            std::os::unix::fs::chown(site.evidence_dir(), Some(uid), None)
                .context("giving the evidence directory to attest-proxy's uid")?;
        }
        Ok(site)
    }

    /// A file of the site.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The attestation config written at start.
    pub fn attestation_config_path(&self) -> PathBuf {
        self.file("attestationConfig")
    }

    /// Where attest-proxy keeps fetched collateral.
    pub fn collateral_dir(&self) -> PathBuf {
        self.file("collateral")
    }

    /// Where attest-proxy keeps decided evidence by default (beside `collateral/`).
    pub fn evidence_dir(&self) -> PathBuf {
        self.file("evidence")
    }
}

/// A Constellation attestation config for qemu-vtpm that trusts `ak_trust`'s keys and enforces
/// exactly the harness's boot measurements, plus `extra` entries (index, expected, warn_only).
pub fn attestation_config(ak_trust: &AkTrust, extra: &[(u32, [u8; 32], bool)]) -> String {
    let mut measurements = boot_measurements();
    for (index, expected, warn_only) in extra {
        measurements.insert(
            index.to_string(),
            serde_json::json!({"expected": hex::encode(expected), "warnOnly": warn_only}),
        );
    }
    let mut config = serde_json::json!({ "measurements": measurements });
    match ak_trust {
        AkTrust::AnyKey => config["trustAnyAk"] = true.into(),
        AkTrust::Pinned(digests) => {
            config["trustedAkDigests"] = digests.iter().map(hex::encode).collect();
        }
    }
    config.to_string()
}

fn write(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// The kubeadm ClusterConfiguration as Constellation's `kubeadm-config` ConfigMap holds it.
fn cluster_configuration() -> String {
    let sans: String = API_SERVER_CERT_SANS
        .iter()
        .map(|san| format!("  - {san}\n"))
        .collect();
    format!(
        "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nkubernetesVersion: {KUBERNETES_VERSION}\ncontrolPlaneEndpoint: {API_SERVER_ENDPOINT}\nclusterName: joinservice-local\napiServer:\n  certSANs:\n{sans}"
    )
}

fn random_hex(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    rand::rng().fill(bytes.as_mut_slice());
    hex::encode(bytes)
}

impl System {
    /// Starts everything and waits until each process serves.
    ///
    /// Ports are picked free and then bound by the processes, so another process can take one in
    /// between; such a start (a process failing with "address in use") is retried on new ports,
    /// a few times, before it is reported as the error it is.
    pub async fn start(options: Options) -> anyhow::Result<System> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(error) if attempt < ATTEMPTS && is_port_race(&error) => {
                    tracing::warn!(
                        attempt,
                        "a port was taken while starting, retrying: {error:#}"
                    );
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: &Options) -> anyhow::Result<System> {
        // The control plane first: a test waits for its turn at the shared one before it holds
        // anything that should not wait (a TPM, ports).
        let cluster = match &options.cluster {
            Some(shared) => Some(shared.clone()),
            None if options.rbac.is_some() || options.own_control_plane => None,
            None => Some(SharedCluster::alone().await?),
        };
        let dir = tempfile::Builder::new().prefix("joinservice-").tempdir()?;
        let paths = Paths::new(dir.path());
        std::fs::create_dir_all(&paths.logs)?;
        let own = own_uid()?;
        let uids = if own == 0 && !options.same_uid {
            Uids::POD
        } else {
            Uids::same(own, std::fs::metadata("/proc/self")?.gid())
        };

        // The TPM, with the boot chain measured.
        let swtpm = Swtpm::start().context("starting swtpm")?;
        for (index, byte) in BOOT_MEASUREMENTS {
            swtpm
                .extend_pcr(index, &[byte; 32])
                .with_context(|| format!("extending PCR {index}"))?;
        }

        // The control-plane node's own TPM, for the certifier: its AK goes into the nodes'
        // service policy, read now because swtpm serves one client at a time.
        let control_plane_tpm = if options.certifier {
            let tpm = Swtpm::start().context("starting the control-plane swtpm")?;
            for (index, byte) in BOOT_MEASUREMENTS {
                tpm.extend_pcr(index, &[byte; 32])
                    .with_context(|| format!("extending control-plane PCR {index}"))?;
            }
            let trust = swtpm_ak_trust(&tpm)?;
            write(
                &paths.service_policy,
                attestation_config(&trust, &[]).as_bytes(),
            )?;
            Some(tpm)
        } else {
            None
        };

        // The real Kubernetes control plane, with what a Constellation cluster holds before the
        // join service arrives (the cluster's version as its node operator records it; a fresh
        // cluster that expects EXPECTED_CONTROL_PLANE_NODES control-plane nodes and has none
        // yet, so token-issuer releases the control-plane files to control-plane joiners), then
        // the deployment's ServiceAccount, RBAC and admission policy as they are: a call the
        // manifests do not permit fails with the API server's own 403. token-issuer reaches it
        // through the fault proxy, with a token the API server issued for its ServiceAccount.
        // Tests share one per test binary, each holding it alone while it runs; other RBAC, or
        // the local run, get one of their own. The cluster's CAs come with it.
        let (kube, secrets) = match cluster {
            Some(shared) => {
                copy_tree(&shared.pki_dir, &paths.pki_dir)?;
                (shared.kube, shared.secrets)
            }
            None => {
                let pki = Pki::generate(&paths.pki_dir)?;
                let kube = Kube::start(&pki, &paths.root, options.rbac.as_deref()).await?;
                (Arc::new(kube), ClusterSecrets::generate())
            }
        };
        write(&paths.kubeadm_config, cluster_configuration().as_bytes())?;
        write(&paths.measurement_salt, &secrets.measurement_salt)?;
        let ak_trust = if options.trust_any_ak {
            AkTrust::AnyKey
        } else {
            swtpm_ak_trust(&swtpm)?
        };
        match &options.attestation_config {
            Some(path) => {
                std::fs::copy(path, &paths.attestation_config)
                    .with_context(|| format!("copying attestation config {}", path.display()))?;
            }
            None => write(
                &paths.attestation_config,
                attestation_config(&ak_trust, &[]).as_bytes(),
            )?,
        }

        write(
            &paths.service_account_token,
            kube.token_issuer_token().await?.as_bytes(),
        )?;
        // The local run has no faults to inject: token-issuer talks to the API server itself, so
        // that what a join costs is measured without the proxy's hop.
        let kubeconfig = if options.own_control_plane {
            kube.kubeconfig_direct(&paths.service_account_token)
        } else {
            kube.kubeconfig_via_proxy(&paths.service_account_token)
        };
        write(&paths.kubeconfig, kubeconfig.as_bytes())?;
        if uids.distinct() {
            hand_out_files(&paths, &uids)?;
        }
        let token_refresher = kube.keep_token_fresh(&paths.service_account_token);

        let kms_port = free_port()?;
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let admin = AdminAddrs {
            proxy: loopback(free_port()?),
            join_core: loopback(free_port()?),
            token_issuer: loopback(free_port()?),
        };
        let mut keyservice = Process::spawn(
            "keyservice",
            command("keyservice")?
                .args(["--listen", &format!("127.0.0.1:{kms_port}")])
                .args([
                    "--master-secret-hex",
                    &secrets.master_secret_hex,
                    "--master-salt-hex",
                    &secrets.master_salt_hex,
                ]),
            &paths.logs,
        )?;
        let mut token_issuer = Process::spawn_as(
            "token-issuer",
            command("token-issuer")?
                .arg("--socket")
                .arg(&paths.token_issuer_socket)
                .args(["--peer-uid", &uids.join_core.to_string()])
                .arg("--ca-cert")
                .arg(&paths.ca_cert)
                .arg("--ca-key")
                .arg(&paths.ca_key)
                .arg("--pki-dir")
                .arg(&paths.pki_dir)
                .args(["--api-server-endpoint", API_SERVER_ENDPOINT])
                .arg("--kubeconfig")
                .arg(&paths.kubeconfig)
                .args(["--admin-listen", &admin.token_issuer.to_string()]),
            &paths.logs,
            uids.user(uids.token_issuer),
        )?;
        let mut join_core = Process::spawn_as(
            "join-core",
            command("join-core")?
                .arg("--socket")
                .arg(&paths.join_core_socket)
                .args(["--proxy-uid", &uids.proxy.to_string()])
                .args(["--token-issuer-uid", &uids.token_issuer.to_string()])
                .args(["--kms-endpoint", &format!("http://127.0.0.1:{kms_port}")])
                .arg("--token-issuer-socket")
                .arg(&paths.token_issuer_socket)
                .arg("--measurement-salt-file")
                .arg(&paths.measurement_salt)
                .arg("--kubeadm-config")
                .arg(&paths.kubeadm_config)
                .args(["--admin-listen", &admin.join_core.to_string()]),
            &paths.logs,
            uids.user(uids.join_core),
        )?;
        // gcp-sev-snp: the process with the cloud credential, asked by attest-proxy only.
        let mut gce_identity = match &options.gce {
            Some(gce) => Some(Process::spawn_as(
                "gce-identity",
                &gce_identity_command(&paths.gce_identity_socket, uids.proxy, gce)?,
                &paths.logs,
                uids.user(uids.gce_identity),
            )?),
            None => None,
        };
        let gce_proxy_args: Vec<String> = match &options.gce {
            Some(gce) => gce_proxy_args(&paths.gce_identity_socket, uids.gce_identity, gce),
            None => Vec::new(),
        };
        // aws-nitro-tpm: the process with the AWS credential, asked by attest-proxy only.
        let mut ec2_identity = match &options.ec2 {
            Some(ec2) => Some(Process::spawn_as(
                "ec2-identity",
                &ec2_identity_command(&paths.ec2_identity_socket, uids.proxy, ec2)?,
                &paths.logs,
                uids.user(uids.ec2_identity),
            )?),
            None => None,
        };
        let ec2_proxy_args: Vec<String> = match &options.ec2 {
            Some(ec2) => ec2_proxy_args(&paths.ec2_identity_socket, uids.ec2_identity, ec2),
            None => Vec::new(),
        };
        // The only process with the control-plane TPM; it certifies attest-proxy's key.
        let certifier = match control_plane_tpm {
            Some(tpm) => {
                let mut process = Process::spawn_as(
                    "certifier",
                    command("certifier")?
                        .arg("--socket")
                        .arg(&paths.certifier_socket)
                        .args(["--peer-uid", &uids.proxy.to_string()])
                        .args(["--tcti", &tpm.tcti()]),
                    &paths.logs,
                    uids.user(uids.certifier),
                )?;
                process.wait_for_socket(&paths.certifier_socket)?;
                Some((process, tpm))
            }
            None => None,
        };
        let certifier_proxy_args: Vec<String> = if certifier.is_some() {
            vec![
                "--certifier-uid".to_owned(),
                uids.certifier.to_string(),
                "--certifier-socket".to_owned(),
                paths.certifier_socket.display().to_string(),
            ]
        } else {
            Vec::new()
        };
        // The evidence directory's parent, attest-proxy's as the pod's volume is; attest-proxy
        // creates the directory itself (0700).
        let evidence_proxy_args: Vec<String> = if options.keep_evidence {
            let cache = paths
                .evidence
                .parent()
                .context("evidence path without a parent")?;
            std::fs::create_dir_all(cache)?;
            if uids.distinct() {
                std::os::unix::fs::chown(cache, Some(uids.proxy), Some(uids.gid))
                    .context("giving the evidence volume to attest-proxy's uid")?;
            }
            vec![
                "--evidence-dir".to_owned(),
                paths.evidence.display().to_string(),
            ]
        } else {
            Vec::new()
        };
        let proxy_addr = match options.proxy_listen {
            Some(addr) => addr,
            None => SocketAddr::from(([127, 0, 0, 1], free_port()?)),
        };
        let mut proxy = Process::spawn_as(
            "attest-proxy",
            command("attest-proxy")?
                .args(["--listen", &proxy_addr.to_string()])
                .arg("--upstream-socket")
                .arg(&paths.join_core_socket)
                .args(["--upstream-uid", &uids.join_core.to_string()])
                .args([
                    "--variant",
                    options
                        .variant
                        .unwrap_or(attestation::Variant::QemuVtpm)
                        .name(),
                ])
                .arg("--attestation-config")
                .arg(&paths.attestation_config)
                .args(["--admin-listen", &admin.proxy.to_string()])
                .args(&options.proxy_args)
                .args(&gce_proxy_args)
                .args(&ec2_proxy_args)
                .args(&certifier_proxy_args)
                .args(&evidence_proxy_args)
                .args(per_peer_rate(&options.proxy_args)),
            &paths.logs,
            uids.user(uids.proxy),
        )?;

        keyservice.wait_for_listener(SocketAddr::from(([127, 0, 0, 1], kms_port)))?;
        token_issuer.wait_for_socket(&paths.token_issuer_socket)?;
        join_core.wait_for_socket(&paths.join_core_socket)?;
        if let Some(gce_identity) = &mut gce_identity {
            gce_identity.wait_for_socket(&paths.gce_identity_socket)?;
        }
        if let Some(ec2_identity) = &mut ec2_identity {
            ec2_identity.wait_for_socket(&paths.ec2_identity_socket)?;
        }
        let connect_addr = if proxy_addr.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], proxy_addr.port()))
        } else {
            proxy_addr
        };
        proxy.wait_for_listener(connect_addr)?;

        // Kept files outlive the system, for inspection after a local run.
        let dir = if options.keep_dir {
            let _ = dir.keep();
            None
        } else {
            Some(dir)
        };
        Ok(System {
            proxy,
            join_core,
            token_issuer,
            keyservice,
            gce_identity,
            ec2_identity,
            certifier,
            kube,
            _token_refresher: token_refresher,
            secrets,
            swtpm,
            proxy_addr: connect_addr,
            kms_addr: SocketAddr::from(([127, 0, 0, 1], kms_port)),
            admin,
            uids,
            paths,
            ak_trust,
            _dir: dir,
        })
    }

    /// This system's cluster, for another instance of the service to serve too
    /// ([`Options::cluster`]).
    pub fn shared_cluster(&self) -> SharedCluster {
        SharedCluster {
            kube: self.kube.clone(),
            pki_dir: self.paths.pki_dir.clone(),
            secrets: self.secrets.clone(),
        }
    }

    /// [`attestation_config`] with the keys this system trusts: its swtpm's, or any with
    /// [`Options::trust_any_ak`]; for tests that rewrite the policy.
    pub fn attestation_config(&self, extra: &[(u32, [u8; 32], bool)]) -> String {
        attestation_config(&self.ak_trust, extra)
    }

    /// A node's attestation issuer on the system's swtpm. swtpm serves one client at a time:
    /// drop the issuer (and the clients using it) before opening another.
    pub fn issuer(&self) -> anyhow::Result<Arc<tpm_issuer::TpmIssuer>> {
        let issuer =
            tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(self.swtpm.tcti()))?;
        Ok(Arc::new(issuer))
    }

    /// A join client for the proxy, attesting with `issuer`.
    pub fn client(&self, issuer: Arc<dyn attestation::Issuer>) -> anyhow::Result<Client> {
        Ok(Client::new(
            self.proxy_addr,
            issuer,
            Duration::from_secs(20),
        )?)
    }

    /// What joins create in Kubernetes (bootstrap token Secrets and `JoiningNode`s), by kind
    /// and name.
    pub async fn join_objects(&self) -> Vec<String> {
        self.kube.join_objects().await
    }

    /// The process running `service`.
    ///
    /// # Panics
    /// For [`Service::GceIdentity`] (or [`Service::Ec2Identity`]) in a system started without
    /// [`Options::gce`] (or [`Options::ec2`]).
    pub fn process(&mut self, service: Service) -> &mut Process {
        match service {
            Service::Proxy => &mut self.proxy,
            Service::JoinCore => &mut self.join_core,
            Service::TokenIssuer => &mut self.token_issuer,
            Service::KeyService => &mut self.keyservice,
            Service::GceIdentity => match &mut self.gce_identity {
                Some(process) => process,
                None => panic!("this system runs no gce-identity (Options::gce unset)"),
            },
            Service::Ec2Identity => match &mut self.ec2_identity {
                Some(process) => process,
                None => panic!("this system runs no ec2-identity (Options::ec2 unset)"),
            },
        }
    }

    /// Starts `service` again with the arguments it was first started with (killing it first if
    /// it still runs), and waits until it serves; no other process is touched.
    pub fn restart(&mut self, service: Service) -> anyhow::Result<()> {
        let (proxy_addr, kms_addr) = (self.proxy_addr, self.kms_addr);
        let paths = self.paths.clone();
        let process = self.process(service);
        process.restart()?;
        match service {
            Service::Proxy => process.wait_for_tcp(proxy_addr),
            Service::JoinCore => process.wait_for_socket(&paths.join_core_socket),
            Service::TokenIssuer => process.wait_for_socket(&paths.token_issuer_socket),
            Service::KeyService => process.wait_for_tcp(kms_addr),
            Service::GceIdentity => process.wait_for_socket(&paths.gce_identity_socket),
            Service::Ec2Identity => process.wait_for_socket(&paths.ec2_identity_socket),
        }
    }

    /// Every process's log, for failure messages.
    pub fn logs(&self) -> String {
        [
            Some(&self.proxy),
            Some(&self.join_core),
            Some(&self.token_issuer),
            Some(&self.keyservice),
            self.gce_identity.as_ref(),
            self.ec2_identity.as_ref(),
            self.certifier.as_ref().map(|(process, _)| process),
        ]
        .into_iter()
        .flatten()
        .map(|p| format!("----- {} -----\n{}", p.name(), p.log()))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// `--per-peer-rate 0` unless `proxy_args` set a rate (the flag may be given only once).
fn per_peer_rate(proxy_args: &[String]) -> &'static [&'static str] {
    if proxy_args.iter().any(|a| a.starts_with("--per-peer-rate")) {
        &[]
    } else {
        &["--per-peer-rate", "0"]
    }
}

/// Gives each file to the process that reads it in the pod, readable by it alone, and each
/// socket directory to its server, writable by it alone (its peer may only search it): what the
/// pod's mounts and fsGroup do (`deploy/base/daemonset.yaml`).
fn hand_out_files(paths: &Paths, uids: &Uids) -> anyhow::Result<()> {
    use std::os::unix::fs::{PermissionsExt, chown};
    let give = |path: &Path, uid: u32, mode: u32| -> anyhow::Result<()> {
        chown(path, Some(uid), Some(uids.gid))
            .with_context(|| format!("chown {uid} {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {mode:o} {}", path.display()))
    };
    // Every process must traverse the root (a temporary directory is 0700) and the config
    // directory; what lies below is guarded file by file.
    let traversable = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(&paths.root, traversable.clone())?;
    std::fs::set_permissions(paths.root.join("config"), traversable.clone())?;
    // The measurement policy is public: attest-proxy reads it, and tests rewrite it.
    std::fs::set_permissions(
        &paths.attestation_config,
        std::fs::Permissions::from_mode(0o644),
    )?;
    // token-issuer: the PKI (cluster CA key, control-plane CA keys) and its kubeconfig.
    for entry in walk(&paths.pki_dir)? {
        let mode = if entry.is_dir() { 0o700 } else { 0o600 };
        give(&entry, uids.token_issuer, mode)?;
    }
    give(&paths.kubeconfig, uids.token_issuer, 0o600)?;
    give(&paths.service_account_token, uids.token_issuer, 0o600)?;
    // join-core: the measurement salt and kubeadm's ClusterConfiguration.
    give(&paths.measurement_salt, uids.join_core, 0o600)?;
    give(&paths.kubeadm_config, uids.join_core, 0o600)?;
    if let Some(dir) = paths.kubeadm_config.parent() {
        give(dir, uids.join_core, 0o700)?;
    }
    // Each socket in a directory only its server can write.
    let run = paths.root.join("run");
    std::fs::create_dir_all(&run)?;
    std::fs::set_permissions(&run, traversable)?;
    for (socket, uid) in [
        (&paths.join_core_socket, uids.join_core),
        (&paths.token_issuer_socket, uids.token_issuer),
        (&paths.gce_identity_socket, uids.gce_identity),
        (&paths.ec2_identity_socket, uids.ec2_identity),
        (&paths.certifier_socket, uids.certifier),
    ] {
        let dir = socket.parent().context("socket path without a directory")?;
        std::fs::create_dir_all(dir)?;
        give(dir, uid, 0o755)?;
    }
    Ok(())
}

/// Copies the files below `from` to the same places below `to`.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    for entry in walk(from)? {
        let target = to.join(entry.strip_prefix(from)?);
        if entry.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else {
            std::fs::copy(&entry, &target)
                .with_context(|| format!("copying {}", entry.display()))?;
        }
    }
    Ok(())
}

/// `dir` and everything below it, directories before their contents.
fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = vec![dir.to_owned()];
    let mut i = 0;
    while i < found.len() {
        if found[i].is_dir() {
            for entry in std::fs::read_dir(&found[i])? {
                found.push(entry?.path());
            }
        }
        i += 1;
    }
    Ok(found)
}

fn command(name: &str) -> anyhow::Result<Command> {
    let mut command = Command::new(bin_for_others(name)?);
    command.env(
        "RUST_LOG",
        std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
    );
    Ok(command)
}

/// Writes `files` into `dir` the way the kubelet updates a ConfigMap volume: the new contents go
/// into a fresh `..<timestamp>` directory, a `..data_tmp` symlink to it is renamed over `..data`
/// (the one atomic step), each visible file is a symlink through `..data`, and the previous
/// timestamped directory is removed. A visible name that is still a plain file (as
/// [`System::start`] writes the attestation config) is replaced by the symlink, a remove and a
/// create as a watcher sees it.
pub fn project_config_map(dir: &Path, files: &[(&str, &[u8])]) -> anyhow::Result<()> {
    use std::os::unix::fs::symlink;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("clock before 1970")?;
    let generation = format!("..{}.{:09}", stamp.as_secs(), stamp.subsec_nanos());
    std::fs::create_dir_all(dir.join(&generation))?;
    for (name, contents) in files {
        write(&dir.join(&generation).join(name), contents)?;
    }
    let previous = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&generation, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data")).context("swapping ..data")?;
    for (name, _) in files {
        let visible = dir.join(name);
        match std::fs::symlink_metadata(&visible) {
            Ok(meta) if meta.file_type().is_symlink() => continue,
            Ok(_) => std::fs::remove_file(&visible)?,
            Err(_) => {}
        }
        symlink(Path::new("..data").join(name), &visible)?;
    }
    if let Some(previous) = previous {
        std::fs::remove_dir_all(dir.join(previous))?;
    }
    Ok(())
}

/// The gRPC status a call that should have been refused ended with: a ticket, or a transport
/// error in place of a status, fails the test.
pub fn refusal(
    result: Result<proto::join::IssueJoinTicketResponse, node_client::ClientError>,
) -> tonic::Status {
    match result {
        Err(node_client::ClientError::Status(status)) => status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

impl System {
    /// `client` joins as `node_name` and then rejoins for `disk_uuid`; if either fails, the test
    /// fails with the error and the system's logs.
    pub async fn join_and_rejoin(
        &self,
        client: &Client,
        node_name: &str,
        disk_uuid: &str,
    ) -> anyhow::Result<()> {
        client
            .join(join_request(node_name, disk_uuid)?)
            .await
            .unwrap_or_else(|e| panic!("{node_name} join: {e}\n{}", self.logs()));
        client
            .rejoin(disk_uuid)
            .await
            .unwrap_or_else(|e| panic!("{node_name} rejoin: {e}\n{}", self.logs()));
        Ok(())
    }

    /// `client` joins as `node_name` for `disk_uuid`, retrying every 300 ms (as a node told to
    /// retry does) until it succeeds; after 20 s the test fails with the last error and the
    /// system's logs.
    pub async fn joins_eventually(&self, client: &Client, node_name: &str, disk_uuid: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let request = join_request(node_name, disk_uuid)
                .unwrap_or_else(|e| panic!("{node_name}'s join request: {e}"));
            match client.join(request).await {
                Ok(_) => return,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "{node_name} never joined: {error}\n{}",
                        self.logs()
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    /// Each node in `refused` asks to join as `node_name` and must be refused `Unauthenticated`
    /// with its needle (the check that failed) in the message; `what` labels a failure.
    pub async fn assert_refused_by_name(
        &self,
        what: &str,
        node_name: &str,
        disk_uuid: &str,
        refused: Vec<(Arc<dyn attestation::Issuer>, &str)>,
    ) -> anyhow::Result<()> {
        for (i, (node, needle)) in refused.into_iter().enumerate() {
            let status = refusal(
                self.client(node)?
                    .join(join_request(node_name, disk_uuid)?)
                    .await,
            );
            assert_eq!(
                status.code(),
                tonic::Code::Unauthenticated,
                "{what} #{i}: {status:?}"
            );
            assert!(
                status.message().contains(needle),
                "{what} #{i} {needle}: {}",
                status.message()
            );
        }
        Ok(())
    }
}

impl System {
    /// The audit records attest-proxy wrote so far, in order, without its chain-start records.
    pub fn proxy_audit_records(&self) -> Vec<serde_json::Value> {
        self.proxy
            .log()
            .lines()
            .filter_map(attestation::audit_trail::record_in_line)
            .filter(|record| record.get("chain_start").is_none())
            .collect()
    }

    /// Waits (at most 15 s) until a line of attest-proxy's log contains every one of `needles`.
    pub async fn wait_for_proxy_log(&self, needles: &[&str]) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while !self
            .proxy
            .log()
            .lines()
            .any(|line| needles.iter().all(|n| line.contains(n)))
        {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no attest-proxy log line with {needles:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Waits (at most 10 s) until attest-proxy has kept the evidence of `count` decisions
    /// ([`Options::keep_evidence`]; it writes them off the join path).
    pub async fn wait_for_kept_evidence(&self, count: u32) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while metric(self.admin.proxy, "attest_proxy_evidence_kept_total").await? < f64::from(count)
        {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "attest-proxy kept fewer than {count} decisions' evidence\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// The peers a dry-run report (`attest-tool dry-run --json`, `POST /dry-run?format=json`) says
/// a policy would refuse, each with the check that would refuse it, oldest first.
pub fn dry_run_refusals(report: &serde_json::Value) -> Vec<(String, String)> {
    report["refused"]
        .as_array()
        .map(|refused| {
            refused
                .iter()
                .map(|r| {
                    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                    (text(&r["decision"]["peer"]), text(&r["decision"]["check"]))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A worker's join request as a node makes it: a fresh kubelet key and CSR for `node_name`
/// (IP 10.0.0.7) and a fresh SSH host key.
pub fn join_request(
    node_name: &str,
    disk_uuid: &str,
) -> anyhow::Result<proto::join::IssueJoinTicketRequest> {
    let kubelet = node_client::keys::kubelet_request(node_name, &[[10, 0, 0, 7].into()])?;
    let ssh = node_client::keys::SshHostKey::generate()?;
    Ok(proto::join::IssueJoinTicketRequest {
        disk_uuid: disk_uuid.to_owned(),
        certificate_request: kubelet.csr_der,
        is_control_plane: false,
        host_public_key: ssh.public_wire,
        host_certificate_principals: vec![],
    })
}

/// Whether a start failed because a port picked free was taken before its process bound it.
fn is_port_race(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    text.contains("ddress already in use") || text.contains("os error 98")
}
