//! attest-proxy's configuration: flags with environment fallbacks, every key named once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use attestation::Variant;
use plumbing::telemetry::LogFormat;

/// How attest-proxy listens, verifies and forwards.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "attest-proxy",
    about = "Terminates aTLS, verifies node attestation, forwards the join API to join-core"
)]
pub struct Config {
    /// TCP address nodes connect to.
    #[arg(long, env = "ATTEST_PROXY_LISTEN", default_value = "0.0.0.0:9090")]
    pub listen: SocketAddr,

    /// join-core's Unix socket, in a directory only join-core can write.
    #[arg(
        long,
        env = "ATTEST_PROXY_UPSTREAM_SOCKET",
        default_value = "/run/joinservice/join-core/join-core.sock"
    )]
    pub upstream_socket: PathBuf,

    /// The uid join-core runs as. Before a request is sent, the process listening on the
    /// upstream socket must run as it (`SO_PEERCRED`), so a replaced socket gets nothing.
    #[arg(long, env = "ATTEST_PROXY_UPSTREAM_UID")]
    pub upstream_uid: u32,

    /// The attestation variant nodes must present.
    #[arg(long, env = "ATTEST_PROXY_VARIANT", default_value = "qemu-vtpm")]
    pub variant: Variant,

    /// Constellation's attestation config for the variant (the measurement policy), JSON.
    #[arg(
        long,
        env = "ATTEST_PROXY_ATTESTATION_CONFIG",
        default_value = "/var/config/attestationConfig"
    )]
    pub attestation_config: PathBuf,

    /// AMD's key distribution service, where SEV-SNP collateral a node's document lacks comes
    /// from (VCEKs, the ASK/ASVK, AMD's CRLs), or an operator's caching proxy in front of it.
    /// Used only by the SNP variants.
    #[arg(long, env = "ATTEST_PROXY_KDS_URL", default_value = collateral::kds::AMD_KDS)]
    pub kds_url: String,

    /// Extra CA certificates (PEM) to trust for `--kds-url`, beside the system's roots (an
    /// operator's proxy with a private CA).
    #[arg(long, env = "ATTEST_PROXY_KDS_CA_FILE")]
    pub kds_ca_file: Option<PathBuf>,

    /// Intel's Provisioning Certification Service (API v4), where TDX collateral comes from (TCB
    /// info per FMSPC, the TD QE identity, the PCK CRLs), or an operator's caching proxy (a PCCS)
    /// at the same paths. Used only by the TDX variants.
    #[arg(long, env = "ATTEST_PROXY_PCS_URL", default_value = collateral::pcs::INTEL_PCS)]
    pub pcs_url: String,

    /// Extra CA certificates (PEM) to trust for `--pcs-url` and `--intel-root-crl-url`, beside
    /// the system's roots.
    #[arg(long, env = "ATTEST_PROXY_PCS_CA_FILE")]
    pub pcs_ca_file: Option<PathBuf>,

    /// Where the Intel SGX Root CA's CRL is fetched (Intel serves it apart from the PCS). Used
    /// only by the TDX variants.
    #[arg(long, env = "ATTEST_PROXY_INTEL_ROOT_CRL_URL", default_value = collateral::pcs::INTEL_ROOT_CA_CRL)]
    pub intel_root_crl_url: String,

    /// TDX: a platform model (FMSPC, 12 hex digits) whose TCB info is fetched at start, so its
    /// first nodes find it cached; repeatable. Others are fetched at their first join.
    #[arg(long = "tdx-fmspc", env = "ATTEST_PROXY_TDX_FMSPCS", value_delimiter = ',', value_parser = fmspc)]
    pub tdx_fmspcs: Vec<String>,

    /// Where fetched collateral is kept (a volume), so a restarted proxy verifies without asking
    /// AMD or Intel; in memory only when unset.
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_DIR")]
    pub collateral_dir: Option<PathBuf>,

    /// Where the evidence of the nodes decided on lately is kept, for dry runs of a new policy
    /// (`attest-tool dry-run --evidence`, `POST /dry-run`) and the reload guard. Created 0700,
    /// records 0600, and refused when owned by another uid. Default: `evidence` beside
    /// `--collateral-dir`; none is kept when neither is set.
    #[arg(long, env = "ATTEST_PROXY_EVIDENCE_DIR")]
    pub evidence_dir: Option<PathBuf>,

    /// At most this many decisions' evidence is kept; the oldest go first.
    #[arg(long, env = "ATTEST_PROXY_EVIDENCE_MAX_RECORDS", default_value_t = 1024,
          value_parser = at_least_one)]
    pub evidence_max_records: usize,

    /// At most this many bytes of evidence records are kept (a number, or with a Ki, Mi or Gi
    /// suffix); the oldest go first. Keep the volume's size limit above it.
    #[arg(long, env = "ATTEST_PROXY_EVIDENCE_MAX_BYTES", default_value = "32Mi",
          value_parser = byte_size)]
    pub evidence_max_bytes: u64,

    /// Evidence older than this is removed.
    #[arg(long, env = "ATTEST_PROXY_EVIDENCE_MAX_AGE", default_value = "7d", value_parser = humantime::parse_duration)]
    pub evidence_max_age: Duration,

    /// Decisions waiting to be written; beyond it their evidence is dropped (and counted in
    /// `evidence_dropped_total{reason="queue_full"}`), never the join delayed.
    #[arg(long, env = "ATTEST_PROXY_EVIDENCE_QUEUE", default_value_t = 256,
          value_parser = at_least_one)]
    pub evidence_queue: usize,

    /// A changed attestation config that would refuse more than this share (0 to 1) of the
    /// node connections accepted within `--reload-guard-window`, as the kept evidence shows, is
    /// held back: logged, `policy_held` 1, a `/readyz` note, and the policy in force stays.
    /// `"forceReload": "<the new policy's digest>"` in the config applies it anyway. 1 turns
    /// the guard off; so does keeping no evidence.
    #[arg(long, env = "ATTEST_PROXY_RELOAD_MAX_REFUSED_SHARE", default_value_t = 0.1,
          value_parser = share)]
    pub reload_max_refused_share: f64,

    /// How far back the reload guard looks for accepted nodes.
    #[arg(long, env = "ATTEST_PROXY_RELOAD_GUARD_WINDOW", default_value = "24h", value_parser = humantime::parse_duration)]
    pub reload_guard_window: Duration,

    /// How long collateral is still used past its expiry (a CRL's nextUpdate) while the KDS or
    /// PCS cannot be reached; beyond it, joins are answered `Unavailable`.
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_MAX_STALE", default_value = "24h", value_parser = humantime::parse_duration)]
    pub collateral_max_stale: Duration,

    /// How long a join waits for collateral that is not cached yet before it is answered
    /// `Unavailable` (the node retries; the fetch goes on).
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_WAIT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub collateral_wait: Duration,

    /// At most this many items named by what a node sent (a VCEK for the chip and TCB its SNP
    /// report claims, TDX TCB info for its FMSPC) one peer address (an IPv6 /64) makes
    /// attest-proxy fetch per `--collateral-peer-window`; beyond it, its joins needing one not
    /// cached are answered `Unavailable` without a fetch. A node needs one per chip and TCB;
    /// raise it when many new nodes join from behind one address (a NAT).
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_PEER_FETCHES", default_value_t = 16,
          value_parser = at_least_one)]
    pub collateral_peer_fetches: usize,

    /// The window `--collateral-peer-fetches` counts over, from a peer's first fetch in it.
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_PEER_WINDOW", default_value = "10m", value_parser = humantime::parse_duration)]
    pub collateral_peer_window: Duration,

    /// While the KDS or PCS has asked for a pause (`Retry-After`, honoured for at most an hour),
    /// one fetch for a node's chip or platform still goes out this often, from a peer within its
    /// share; an answer ends the pause at once, so new nodes join again once the vendor answers.
    #[arg(long, env = "ATTEST_PROXY_COLLATERAL_PROBE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub collateral_probe_interval: Duration,

    /// gcp-sev-snp and gcp-sev-es: gce-identity's Unix socket, where the key the GCE API vouches
    /// for an instance (and, for gcp-sev-es, whether it is a confidential VM) is asked
    /// (attest-proxy holds no cloud credential).
    #[arg(
        long,
        env = "ATTEST_PROXY_GCE_IDENTITY_SOCKET",
        default_value = "/run/joinservice/gce-identity/gce-identity.sock"
    )]
    pub gce_identity_socket: PathBuf,

    /// gcp-sev-snp and gcp-sev-es: the uid gce-identity runs as; the process on its socket must
    /// run as it. Required for both.
    #[arg(long, env = "ATTEST_PROXY_GCE_IDENTITY_UID")]
    pub gce_identity_uid: Option<u32>,

    /// gcp-sev-snp and gcp-sev-es: how long GCE's answer for an instance (its key, its
    /// confidential computing) is reused before it is asked again (an instance keeps its vTPM
    /// key, but may be deleted and its name reused).
    #[arg(long, env = "ATTEST_PROXY_GCE_IDENTITY_TTL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub gce_identity_ttl: Duration,

    /// gcp-sev-snp and gcp-sev-es: how long a join waits for an instance's answer that is not
    /// cached before it is answered `Unavailable` (the node retries; the call goes on).
    #[arg(long, env = "ATTEST_PROXY_GCE_IDENTITY_WAIT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub gce_identity_wait: Duration,

    /// gcp-sev-snp and gcp-sev-es: after a failed call for an instance (403, 429, 5xx, timeout), how long
    /// its joins are answered `Unavailable` at once, unless Google's Retry-After says otherwise.
    #[arg(long, env = "ATTEST_PROXY_GCE_IDENTITY_BACKOFF", default_value = "5s", value_parser = humantime::parse_duration)]
    pub gce_identity_backoff: Duration,

    /// gcp-sev-snp and gcp-sev-es: at most this many answers are cached (gcp-sev-snp keeps one
    /// per instance, its key; gcp-sev-es two, its key and its confidential-computing config).
    #[arg(long, env = "ATTEST_PROXY_GCE_IDENTITY_MAX_INSTANCES", default_value_t = 10_000,
          value_parser = at_least_one)]
    pub gce_identity_max_instances: usize,

    /// aws-nitro-tpm: ec2-identity's Unix socket, where EC2 is asked whether an image supports
    /// TPM 2.0 (attest-proxy holds no AWS credential).
    #[arg(
        long,
        env = "ATTEST_PROXY_EC2_IDENTITY_SOCKET",
        default_value = "/run/joinservice/ec2-identity/ec2-identity.sock"
    )]
    pub ec2_identity_socket: PathBuf,

    /// aws-nitro-tpm: the uid ec2-identity runs as; the process on its socket must run as it.
    /// Required for aws-nitro-tpm.
    #[arg(long, env = "ATTEST_PROXY_EC2_IDENTITY_UID")]
    pub ec2_identity_uid: Option<u32>,

    /// aws-nitro-tpm: how long EC2's answer about an image is reused (an image's tpmSupport
    /// never changes; the image can be deregistered).
    #[arg(long, env = "ATTEST_PROXY_EC2_IDENTITY_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub ec2_identity_ttl: Duration,

    /// aws-nitro-tpm: how long a join waits for an image's answer that is not cached before it
    /// is answered `Unavailable` (the node retries; the call goes on).
    #[arg(long, env = "ATTEST_PROXY_EC2_IDENTITY_WAIT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub ec2_identity_wait: Duration,

    /// aws-nitro-tpm: after a failed call for an image (403, throttling, 5xx, timeout), how
    /// long joins naming it are answered `Unavailable` at once.
    #[arg(long, env = "ATTEST_PROXY_EC2_IDENTITY_BACKOFF", default_value = "5s", value_parser = humantime::parse_duration)]
    pub ec2_identity_backoff: Duration,

    /// aws-nitro-tpm: at most this many images' answers are cached.
    #[arg(long, env = "ATTEST_PROXY_EC2_IDENTITY_MAX_IMAGES", default_value_t = 1_000,
          value_parser = at_least_one)]
    pub ec2_identity_max_images: usize,

    /// The service's own attestation: the uid the certifier runs as. When set, attest-proxy
    /// presents nodes a server key certified by the certifier on `--certifier-socket` (the
    /// process there must run as this uid), so nodes with a service policy can verify the
    /// service; unset, it presents an uncertified key, as Constellation's service does.
    #[arg(long, env = "ATTEST_PROXY_CERTIFIER_UID")]
    pub certifier_uid: Option<u32>,

    /// The certifier's Unix socket.
    #[arg(
        long,
        env = "ATTEST_PROXY_CERTIFIER_SOCKET",
        default_value = "/run/joinservice/certifier/certifier.sock"
    )]
    pub certifier_socket: PathBuf,

    /// How long a certified server key serves before the next is certified. Its certificate
    /// reaches three hours ahead, so keep this well below that.
    #[arg(long, env = "ATTEST_PROXY_SERVER_KEY_ROTATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub server_key_rotation: Duration,

    /// gRPC methods forwarded to join-core (full paths); everything else is refused.
    #[arg(long = "allowed-method", env = "ATTEST_PROXY_ALLOWED_METHODS", value_delimiter = ',',
          default_values_t = proto::JOIN_API_METHODS.iter().map(|m| (*m).to_owned()))]
    pub allowed_methods: Vec<String>,

    /// Time a node has to complete the TLS handshake and pass attestation, from accept; a
    /// connection that has not (a stalled or byte-a-second client) is closed.
    #[arg(long, env = "ATTEST_PROXY_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,

    /// Time an attested (or refused) connection may stay without a request before it is
    /// closed. A node sends its one call at once; a client that stays silent after its handshake
    /// holds TLS and HTTP/2 state and is closed at this deadline.
    #[arg(long, env = "ATTEST_PROXY_IDLE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// The longest any connection lives, from accept, whatever it is doing: a client that reads
    /// its answer a byte at a time cannot hold a connection beyond it.
    #[arg(long, env = "ATTEST_PROXY_MAX_CONNECTION_AGE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,

    /// Time join-core has to answer one forwarded call; beyond it the node is answered
    /// `DeadlineExceeded` (and `Unavailable` when join-core cannot be reached at all).
    #[arg(long, env = "ATTEST_PROXY_UPSTREAM_TIMEOUT", default_value = "15s", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,

    /// Connections accepted whose first TLS record has not fully arrived, from all sources
    /// together; beyond that new connections are closed at accept. Each costs a socket and a
    /// small task until its bytes arrive or the handshake deadline passes, so a crowd that
    /// connects and stays silent is held here, apart from the handshakes of the nodes that talk.
    /// The process raises its open-file limit to the hard limit at start to fit them.
    #[arg(long, env = "ATTEST_PROXY_MAX_WAITING", default_value_t = 16384,
          value_parser = at_least_one)]
    pub max_waiting: usize,

    /// Connections between their first TLS record and the end of their attestation, from all
    /// sources together; beyond that a connection whose first record arrives queues for a place
    /// (`--handshake-queue-wait`) before any TLS work. Bounds the memory and the work a crowd of
    /// slow clients can pin (each holds TLS state until the handshake deadline).
    #[arg(long, env = "ATTEST_PROXY_MAX_HANDSHAKES", default_value_t = 512,
          value_parser = at_least_one)]
    pub max_handshakes: usize,

    /// How long a connection whose first record has arrived may queue, first come first served,
    /// for one of the `--max-handshakes` places (never past its handshake deadline); then it is
    /// closed and the node retries. A storm's nodes are served as places free instead of being
    /// closed and reconnecting after a back-off. Queued connections keep their `--max-waiting`
    /// place. `0s` closes at once when no place is free.
    #[arg(long, env = "ATTEST_PROXY_HANDSHAKE_QUEUE_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub handshake_queue_wait: Duration,

    /// Threads verifying attestation documents (CPU-bound work kept off the async runtime).
    #[arg(long, env = "ATTEST_PROXY_VERIFY_THREADS", default_value_t = default_verify_threads())]
    pub verify_threads: usize,

    /// Verifications that may wait for a thread; beyond that a node is answered
    /// `ResourceExhausted` on its first call and retries with backoff. As large as
    /// `--max-handshakes` by default: each handshake in progress has at most one verification
    /// queued, so the queue fills only with the verifications of connections that reached their
    /// deadline and left (each stays queued until a thread skips it), not with those of the
    /// nodes still attesting.
    #[arg(long, env = "ATTEST_PROXY_VERIFY_QUEUE", default_value_t = 512)]
    pub verify_queue: usize,

    /// Attestations (handshake plus verification) one source address may have in progress at
    /// once; further connections from it are closed at once. A node makes one at a time. `0`
    /// turns the cap off (when a load balancer puts every node behind one address).
    #[arg(
        long,
        env = "ATTEST_PROXY_MAX_ATTESTATIONS_PER_PEER",
        default_value_t = 4
    )]
    pub max_attestations_per_peer: usize,

    /// Attestations one source address may start per second (a token bucket per address,
    /// refilled at this rate); connections beyond it are closed at accept. `0` turns the rate
    /// limit off (when a load balancer puts every node behind one address). A node joins once
    /// and retries with backoff, far below the default.
    #[arg(long, env = "ATTEST_PROXY_PER_PEER_RATE", default_value_t = 10.0,
          value_parser = non_negative_rate)]
    pub per_peer_rate: f64,

    /// How many attestations a source address that has been idle may start at once before
    /// `--per-peer-rate` applies (the token bucket's size).
    #[arg(long, env = "ATTEST_PROXY_PER_PEER_BURST", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub per_peer_burst: u32,

    /// How often the attestation config file is re-read; a change applies to the next
    /// handshake, an invalid file keeps the previous policy.
    #[arg(long, env = "ATTEST_PROXY_POLICY_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub policy_poll_interval: Duration,

    /// Address of the admin endpoint (/livez, /readyz, /metrics); none is served if unset.
    /// Readiness requires join-core's socket to accept connections (the policy is loaded before
    /// the endpoint exists).
    #[arg(long, env = "ATTEST_PROXY_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,

    /// On SIGTERM, how long in-flight joins may take to finish. Keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "ATTEST_PROXY_GRACE_PERIOD", default_value = "20s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,

    /// Log line format.
    #[arg(long, env = "ATTEST_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{text:?} is not a count of 1 or more")),
    }
}

/// Bytes: a number, or one with a `Ki`, `Mi` or `Gi` suffix.
fn byte_size(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let multiplier: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{text:?} is not a size (a number of bytes, or with Ki, Mi or Gi)"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a size of 1 byte or more"))
}

fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{text:?} is not a share from 0 to 1")),
    }
}

fn fmspc(text: &str) -> Result<String, String> {
    collateral::pcs::tcb_info_key(text)
        .map(|_| text.to_ascii_lowercase())
        .map_err(|e| e.to_string())
}

fn non_negative_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!("{text:?} is not a rate per second (0 or more)")),
    }
}

impl Config {
    /// Where evidence is kept: `--evidence-dir`, else `evidence` beside `--collateral-dir`.
    pub fn evidence_dir(&self) -> Option<PathBuf> {
        self.evidence_dir.clone().or_else(|| {
            let collateral = self.collateral_dir.as_ref()?;
            Some(
                collateral
                    .parent()
                    .map_or_else(|| PathBuf::from("evidence"), |p| p.join("evidence")),
            )
        })
    }
}

fn default_verify_threads() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(
            ["attest-proxy", "--upstream-uid", "1"]
                .iter()
                .chain(args)
                .copied(),
        )
    }

    #[test]
    fn the_evidence_directory_defaults_to_beside_the_collateral_directory() {
        assert_eq!(parse(&[]).unwrap().evidence_dir(), None);
        let config = parse(&["--collateral-dir", "/var/cache/joinservice/collateral"]).unwrap();
        assert_eq!(
            config.evidence_dir(),
            Some(PathBuf::from("/var/cache/joinservice/evidence"))
        );
        let config = parse(&["--collateral-dir", "/c", "--evidence-dir", "/e"]).unwrap();
        assert_eq!(config.evidence_dir(), Some(PathBuf::from("/e")));
    }

    #[test]
    fn evidence_bounds_and_the_share_are_checked() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.evidence_max_bytes, 32 << 20);
        assert_eq!(config.evidence_max_age, Duration::from_secs(7 * 86_400));
        assert!((config.reload_max_refused_share - 0.1).abs() < f64::EPSILON);
        assert_eq!(
            parse(&["--evidence-max-bytes", "512Ki"])
                .unwrap()
                .evidence_max_bytes,
            512 << 10
        );
        assert_eq!(
            parse(&["--evidence-max-bytes", "1000"])
                .unwrap()
                .evidence_max_bytes,
            1000
        );
        for bad in [
            &["--evidence-max-bytes", "12MB"][..],
            &["--evidence-max-bytes", "0"],
            &["--reload-max-refused-share", "1.5"],
            &["--reload-max-refused-share", "-0.1"],
            &["--evidence-max-records", "0"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
