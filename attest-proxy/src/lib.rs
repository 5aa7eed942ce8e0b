//! attest-proxy: the only part of the join service a node talks to.
//!
//! ```text
//! node ──aTLS/TCP──▶ attest-proxy ──HTTP/2 over a Unix socket──▶ join-core
//! ```
//!
//! It terminates attested TLS (crate `atls`), verifies the node's attestation document against
//! the measurement policy on a bounded thread pool, and forwards only the allowed gRPC methods to
//! join-core, replacing any identity headers the client sent with the ones it verified. It holds
//! no key and no cluster credential: compromising it yields nothing to steal, and what it forwards
//! still goes through join-core's own checks.
//!
//! Operating it: the policy file is hot-reloaded ([`policy`]; an invalid file keeps the previous
//! policy and shows in the `policy_failing` metric); every decision is one JSON line on the
//! tracing target `audit` ([`attestation::audit`]). The evidence of each decision is kept off the
//! join path (`evidence`, bounded, `--evidence-dir`), so a new policy can be tried on the nodes
//! decided lately before it is enforced: `POST /dry-run` on the admin endpoint (`dry_run`), and
//! a changed file that would refuse more than `--reload-max-refused-share` of the nodes accepted
//! lately is held until it names its own digest in `"forceReload"` ([`policy::Guard`]).
//!
//! Overload control, so a storm of nodes (or a flood) is refused quickly and clearly instead of
//! queueing without end; every bound is a flag (see `attest-proxy --help`):
//! - at accept, before any TLS work, a connection is closed at once when the proxy already holds
//!   `--max-waiting` (16384) connections that have not sent their first TLS record, when its
//!   source address has `--max-attestations-per-peer` (4) in progress, or when its source has
//!   used up its token bucket (`--per-peer-rate` 10/s, `--per-peer-burst` 20). The per-source
//!   limits turn off with `0` for deployments where a load balancer puts every node behind one
//!   address; the buckets of idle sources are dropped, so the table stays bounded;
//! - once its first record has arrived, a connection takes one of `--max-handshakes` (512)
//!   places for its handshake and attestation, queueing for one, first come first served, for
//!   at most `--handshake-queue-wait` (5 s) when all are taken, and is closed after that. Each
//!   refusal counts in `connections_shed{reason}`;
//! - a full verify queue (`--verify-queue`, 512) answers `ResourceExhausted`;
//! - a connection that has not finished its handshake and attestation within
//!   `--handshake-timeout` (10 s) is closed, so slow or stalled clients hold at most
//!   `--max-handshakes` connections' worth of memory, and only until the deadline.
//!
//! - after its attestation is decided, a connection answers one call and closes (a node connects
//!   again per call, and each connection is held to the policy in force when it attested); it
//!   is closed when no call arrives within `--idle-timeout` (10 s), and no connection lives
//!   beyond `--max-connection-age` (60 s) from accept;
//! - join-core has `--upstream-timeout` (15 s) to answer a forwarded call; the node is then
//!   answered `DeadlineExceeded`.
//!
//! Nodes retry `ResourceExhausted`, `Unavailable` and `Aborted` with full-jitter backoff
//! (node-client); an attestation refusal (`Unauthenticated`) is final. On
//! SIGTERM the listener closes (new connections are refused), and connections in flight finish
//! within `--grace-period`.

mod collateral_metrics;
pub mod config;
pub mod ec2_identity;
pub mod gce_identity;

mod admission;
mod allowlist;
mod connection;
mod dry_run;
mod evidence;
mod first_record;
mod identity;
pub mod metrics;
mod peer_limit;
pub mod policy;
mod rate_limit;
pub mod server_identity;
mod sidecar_cache;
mod status;
mod upstream;
mod verify_pool;

use std::net::SocketAddr;
use std::sync::Arc;

use plumbing::shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

pub use config::Config;
pub use policy::{PolicyError, PolicyStatus};

/// Why the proxy could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The measurement policy could not be loaded.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The collateral source (AMD's KDS or Intel's PCS, and the cache) could not be set up.
    #[error("cannot set up the {vendor} collateral source")]
    Collateral {
        vendor: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The aws-nitro-tpm image source could not be set up.
    #[error("cannot set up the EC2 identity source: {0}")]
    Ec2Identity(String),
    /// The gcp-sev-snp key source could not be set up.
    #[error("cannot set up the GCE identity source: {0}")]
    GceIdentity(String),
    /// The aTLS server could not be set up.
    #[error("cannot set up aTLS")]
    Atls(#[source] atls::SetupError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The admin endpoint could not be bound.
    #[error("cannot listen for the admin endpoint on {addr}")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The evidence directory could not be used.
    #[error("cannot keep evidence")]
    Evidence(#[source] attestation::evidence::StoreError),
    /// The verification threads could not be started.
    #[error("cannot start verification threads")]
    Threads(#[source] std::io::Error),
}

/// A bound proxy, ready to serve.
#[derive(Debug)]
pub struct Proxy {
    listener: TcpListener,
    shared: Arc<connection::Shared>,
    grace_period: std::time::Duration,
    policy_poll_interval: std::time::Duration,
    admin: Option<plumbing::admin::AdminServer>,
    /// Keeps the server key certified, when the service attests itself.
    rotator: Option<server_identity::Rotator>,
}

impl Proxy {
    /// Loads the policy, prepares aTLS and binds the listening socket.
    pub async fn bind(config: Config) -> Result<Self, Error> {
        raise_open_file_limit(&config);
        let snp = snp_collateral(&config)?;
        let tdx = tdx_collateral(&config)?;
        let gce = gce_identity::build(&config)?;
        let ec2 = ec2_identity::build(&config)?;
        let hardware = match (&snp, &tdx, &gce) {
            (Some(snp), _, _) => Some(policy::Hardware::Amd {
                collateral: Arc::new(snp.clone()),
                gce: gce
                    .clone()
                    .map(|g| g as Arc<dyn attestation::snp::GceIdentity>),
            }),
            (None, Some(tdx), _) => Some(policy::Hardware::Intel {
                collateral: Arc::new(tdx.clone()),
            }),
            (None, None, Some(gce)) => Some(policy::Hardware::Google { gce: gce.clone() }),
            (None, None, None) => ec2.clone().map(|images| policy::Hardware::Ec2 {
                images: images as Arc<dyn attestation::variants::aws_nitro_tpm::Ec2Images>,
            }),
        };
        // The one vendor cache the variant uses, for metrics and the readiness note.
        let collateral = snp
            .as_ref()
            .map(|c| (c.cache().clone(), "AMD KDS"))
            .or_else(|| tdx.as_ref().map(|c| (c.cache().clone(), "Intel PCS")));
        let mut policy =
            policy::Current::load(config.variant, &config.attestation_config, hardware)?;
        tracing::info!(variant = %config.variant, policy = %policy.get().digest, "measurement policy loaded");
        let evidence = match config.evidence_dir() {
            Some(dir) => {
                let keeper = evidence::Keeper::start(
                    &dir,
                    attestation::evidence::Bounds {
                        max_records: config.evidence_max_records,
                        max_bytes: config.evidence_max_bytes,
                        max_age: config.evidence_max_age,
                    },
                    config.evidence_queue,
                )
                .map_err(Error::Evidence)?;
                policy = policy.with_guard(policy::Guard {
                    evidence_dir: dir,
                    max_refused_share: config.reload_max_refused_share,
                    window: config.reload_guard_window,
                });
                Some(Arc::new(keeper))
            }
            None => {
                tracing::warn!(
                    "no evidence is kept (neither --evidence-dir nor --collateral-dir is set): dry runs see no node, and a policy change is applied without being tried on the nodes accepted lately"
                );
                None
            }
        };
        let (audit, chain_start) = attestation::audit_trail::Chain::start("attest-proxy");
        plumbing::telemetry::audit(true, &attestation::audit_trail::canonical(&chain_start));
        let mut admin_endpoint = plumbing::admin::Admin::new("attest_proxy");
        let metrics = metrics::Metrics::register(admin_endpoint.registry());
        let shared = connection::Shared {
            acceptor: Arc::new(atls::Acceptor::new().map_err(Error::Atls)?),
            policy: Arc::new(policy),
            admission: admission::Admission::new(
                config.max_waiting,
                config.max_handshakes,
                config.max_attestations_per_peer,
                config.per_peer_rate,
                config.per_peer_burst,
            ),
            pool: verify_pool::VerifyPool::new(config.verify_threads, config.verify_queue)
                .map_err(Error::Threads)?,
            allowlist: allowlist::AllowlistLayer::new(config.allowed_methods.clone()),
            upstream: upstream::Upstream::new(
                &config.upstream_socket,
                config.upstream_uid,
                config.upstream_timeout,
            ),
            handshake_timeout: config.handshake_timeout,
            handshake_queue_wait: config.handshake_queue_wait,
            lifetime: connection::Lifetime {
                idle: config.idle_timeout,
                max_age: config.max_connection_age,
            },
            metrics,
            audit,
            evidence,
        };
        let mut rotator = config.certifier_uid.map(|uid| {
            let certifier =
                server_identity::GrpcCertifier::new(&config.certifier_socket, uid, CERTIFY_TIMEOUT);
            server_identity::Rotator::new(
                Arc::new(certifier),
                config.variant,
                server_identity::Schedule {
                    rotate_every: config.server_key_rotation,
                    ..server_identity::Schedule::default()
                },
            )
            .with_collateral(server_identity::OwnCollateral {
                amd: snp
                    .clone()
                    .map(|c| Arc::new(c) as Arc<dyn attestation::snp::SnpCollateral>),
                intel: tdx
                    .clone()
                    .map(|c| Arc::new(c) as Arc<dyn attestation::tdx::TdxCollateral>),
            })
        });
        // The first key is certified before the first node is served, when the certifier
        // answers; otherwise the rotator keeps trying while the uncertified key serves.
        if let Some(rotator) = rotator.as_mut() {
            rotator
                .step(&shared.acceptor, std::time::SystemTime::now())
                .await;
        }
        let listener = listen(config.listen).map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        if let Some((cache, vendor)) = &collateral {
            collateral_metrics::register(admin_endpoint.registry(), cache.clone(), vendor);
        }
        if let Some(gce) = &gce {
            gce_identity::register_metrics(admin_endpoint.registry(), gce.cache().clone());
        }
        if let Some(ec2) = &ec2 {
            ec2_identity::register_metrics(admin_endpoint.registry(), ec2.cache().clone());
        }
        if let Some(rotator) = &rotator {
            rotator.register_metrics(admin_endpoint.registry());
        }
        if let Some(keeper) = &shared.evidence {
            keeper.register_metrics(admin_endpoint.registry());
        }
        let admin = match config.admin_listen {
            Some(addr) => Some(
                admin(admin_endpoint, &shared, &config, collateral.as_ref())
                    .bind(addr)
                    .await
                    .map_err(|source| Error::Admin { addr, source })?,
            ),
            None => None,
        };
        Ok(Self {
            listener,
            admin,
            shared: Arc::new(shared),
            grace_period: config.grace_period,
            policy_poll_interval: config.policy_poll_interval,
            rotator,
        })
    }

    /// The admin endpoint's address, if one is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|a| a.local_addr().ok())
    }

    /// The measurement policy in force and its reload history, for readiness and metrics.
    pub fn policy(&self) -> Arc<policy::Current> {
        self.shared.policy.clone()
    }

    /// The address nodes connect to (tests bind port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts nodes until `shutdown`, then drains open connections for at most the drain timeout.
    pub async fn serve(mut self, shutdown: Shutdown) -> Result<(), Error> {
        let addr = self.local_addr().map_err(|source| Error::Listen {
            addr: ([0, 0, 0, 0], 0).into(),
            source,
        })?;
        tracing::info!(%addr, "attest-proxy listening");
        // Readiness turns false as soon as the drain starts, so the Service stops sending nodes
        // here before the listener closes.
        let admin = self.admin.take().map(|admin| admin.spawn(shutdown.clone()));
        let watcher = tokio::spawn(
            self.shared
                .policy
                .clone()
                .watch(self.policy_poll_interval, shutdown.clone()),
        );
        let rotator = self.rotator.take().map(|rotator| {
            tokio::spawn(rotator.run(self.shared.acceptor.clone(), shutdown.clone()))
        });
        let tracker = TaskTracker::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        // Refused before TLS, where it costs nothing (see `admission`).
                        let waiting = self.shared.admission.admit(peer.ip());
                        self.shared.metrics.admission(&self.shared.admission);
                        let waiting = match waiting {
                            Ok(waiting) => waiting,
                            Err(reason) => {
                                tracing::debug!(%peer, reason = reason.label(), "connection refused at accept");
                                self.shared.metrics.shed(reason);
                                continue;
                            }
                        };
                        let _ = tcp.set_nodelay(true);
                        tracker.spawn(connection::handle(self.shared.clone(), tcp, peer, waiting));
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                () = shutdown.clone().wait() => break,
            }
        }
        drop(self.listener);
        watcher.abort();
        if let Some(rotator) = rotator {
            rotator.abort();
        }
        tracker.close();
        tracing::info!(open = tracker.len(), "draining connections");
        if tokio::time::timeout(self.grace_period, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = tracker.len(),
                "drain timeout reached; closing remaining connections"
            );
        }
        // Probes kept answering "draining" until now.
        if let Some(admin) = admin {
            admin.abort();
        }
        Ok(())
    }
}

/// The admin endpoint: readiness needs join-core's socket to accept connections; metrics are
/// the policy's reload counts and whether the mounted file is currently refused.
///
/// A refused policy file deliberately does not fail readiness: every proxy of the cluster reads
/// the same ConfigMap, so it would take them all out of the Service at once and stop every join,
/// while the previous policy is still being enforced correctly. It shows in `policy_failing`,
/// in the log, and as a note in the `/readyz` body (`warn policy: ...`, the probe still passes).
/// A policy that trusts any attestation key is noted the same way (`warn attestation-keys:
/// ...`) and in `trust_any_ak`: it works, but must not outlive development.
///
/// A changed policy held back by the reload guard is noted as well (`warn policy-held: ...`,
/// the probe still passes, for the same reason as a refused file). `POST /dry-run` answers
/// which kept nodes a posted config would refuse ([`dry_run`]); it applies nothing.
fn admin(
    mut admin: plumbing::admin::Admin,
    shared: &connection::Shared,
    config: &Config,
    collateral: Option<&(collateral::Cache, &'static str)>,
) -> plumbing::admin::Admin {
    shared.policy.register_metrics(admin.registry());
    let policy = shared.policy.clone();
    admin
        .check(
            "join-core",
            plumbing::admin::unix_socket_check(&config.upstream_socket),
        )
        .note("policy", {
            let policy = policy.clone();
            move || {
                let status = policy.status();
                status.last_error.map(|error| {
                    format!(
                        "enforcing the last good policy {} because the file on disk is refused: {error}",
                        status.digest
                    )
                })
            }
        })
        .note("policy-held", {
            let policy = policy.clone();
            move || {
                let status = policy.status();
                status.held.map(|held| {
                    format!(
                        "enforcing policy {} and holding back {} from the file on disk: {}",
                        status.digest, held.digest, held.reason
                    )
                })
            }
        })
        .post(
            "/dry-run",
            attestation::policy::MAX_CONFIG_SIZE,
            dry_run::handler(
                policy.clone(),
                shared.evidence.as_ref().map(|k| k.dir().to_owned()),
            ),
        )
        .note("attestation-keys", move || policy.trust_any_ak_note())
        .note("server-evidence", {
            let acceptor = shared.acceptor.clone();
            let attests = config.certifier_uid.is_some();
            move || {
                (attests && acceptor.current().variant().is_none()).then(|| {
                    "serving an uncertified server key (the certifier has not certified one): \
                     nodes with a service policy refuse this service"
                        .to_owned()
                })
            }
        })
        .note("collateral", {
            let collateral = collateral.cloned();
            move || {
                let (cache, vendor) = collateral.as_ref()?;
                let stale = cache.stale_keys();
                (!stale.is_empty()).then(|| {
                    format!(
                        "serving stale collateral while the {vendor} cannot refresh it: {}",
                        stale.join(", ")
                    )
                })
            }
        })
}

/// How long one certification may take: a TPM quote takes a second or two.
const CERTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// VCEKs the KDS cache keeps (and chips it backs off for, and VCEK fetches in flight): a node
/// that leaves its VCEK out makes the proxy fetch one for whatever chip ID and TCB it claims, so
/// the bound is what a crowd of invented chips can make the cache hold. AMD's CRLs and chains
/// are not counted and never pushed out. A cluster of more chips than this that all leave their
/// VCEK out costs a refetch per join, nothing more.
const KDS_MAX_ENTRIES: usize = 4096;

/// The SEV-SNP variants' collateral: a cache in front of AMD's KDS (or `--kds-url`), started
/// fetching AMD's CRLs and chains at once so the first joins find them; `None` for the
/// variants that need none.
fn snp_collateral(config: &Config) -> Result<Option<collateral::kds::KdsCollateral>, Error> {
    use attestation::Variant;
    use attestation::snp::Product;
    use collateral::kds::{KdsCollateral, KdsSource};
    if !matches!(
        config.variant,
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp
    ) {
        return Ok(None);
    }
    let source = KdsSource::new(
        &config.kds_url,
        config.kds_ca_file.as_deref(),
        std::time::Duration::from_secs(10),
    )
    .map_err(|e| amd_setup(Box::new(e)))?;
    let cache = collateral_cache(config, Arc::new(source), Some(KDS_MAX_ENTRIES))
        .map_err(|e| amd_setup(Box::new(e)))?;
    let collateral = KdsCollateral::new(cache, config.collateral_max_stale);
    collateral.warm(&[Product::Milan, Product::Genoa, Product::Turin]);
    tracing::info!(kds = %config.kds_url, dir = ?config.collateral_dir, "SEV-SNP collateral from the KDS, cached");
    Ok(Some(collateral))
}

/// A vendor's collateral cache as the `--collateral-*` flags describe it.
fn collateral_cache(
    config: &Config,
    source: Arc<dyn collateral::Source>,
    max_entries: Option<usize>,
) -> std::io::Result<collateral::Cache> {
    collateral::Cache::new(
        source,
        collateral::CacheConfig {
            dir: config.collateral_dir.clone(),
            max_stale: config.collateral_max_stale,
            wait: config.collateral_wait,
            backoff: std::time::Duration::from_secs(10),
            max_entries,
            per_peer: Some(collateral::PeerBound {
                fetches: config.collateral_peer_fetches,
                window: config.collateral_peer_window,
            }),
            probe_interval: config.collateral_probe_interval,
        },
        tokio::runtime::Handle::current(),
    )
}

fn amd_setup(source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Collateral {
        vendor: "AMD KDS",
        source,
    }
}

/// Keys of the PCS cache a node names (the FMSPC its PCK certificate carries): bounds what a
/// crowd of platforms can make the cache hold. Intel knows a few hundred FMSPCs, and only those
/// in a PCK certificate that verifies to Intel's root are looked up; the QE identity and the
/// CRLs are not counted and never pushed out.
const PCS_MAX_ENTRIES: usize = 4096;

/// The TDX variants' collateral: a cache in front of Intel's PCS (or `--pcs-url`), started
/// fetching what every platform shares and the TCB info of each `--tdx-fmspc`, so the first
/// joins find them; `None` for the variants that need none. It shares `--collateral-dir` with
/// the SNP cache: a proxy serves one variant, and the cache's files are named by key.
fn tdx_collateral(config: &Config) -> Result<Option<collateral::pcs::PcsCollateral>, Error> {
    use attestation::Variant;
    use collateral::pcs::{PcsCollateral, PcsSource};
    if !matches!(config.variant, Variant::QemuTdx | Variant::AzureTdx) {
        return Ok(None);
    }
    let setup = |source: Box<dyn std::error::Error + Send + Sync>| Error::Collateral {
        vendor: "Intel PCS",
        source,
    };
    let source = PcsSource::new(
        &config.pcs_url,
        &config.intel_root_crl_url,
        config.pcs_ca_file.as_deref(),
        std::time::Duration::from_secs(10),
    )
    .map_err(|e| setup(Box::new(e)))?;
    let cache = collateral_cache(config, Arc::new(source), Some(PCS_MAX_ENTRIES))
        .map_err(|e| setup(Box::new(e)))?;
    let collateral = PcsCollateral::new(cache, config.collateral_max_stale);
    let fmspcs: Vec<&str> = config.tdx_fmspcs.iter().map(String::as_str).collect();
    collateral.warm(&fmspcs).map_err(|e| setup(Box::new(e)))?;
    tracing::info!(pcs = %config.pcs_url, root_crl = %config.intel_root_crl_url, fmspcs = ?config.tdx_fmspcs, dir = ?config.collateral_dir, "TDX collateral from Intel's PCS, cached");
    Ok(Some(collateral))
}

/// Connections the kernel may hold for the accept loop (capped by `net.core.somaxconn`).
///
/// In a storm, nodes connect faster than any one loop accepts for a moment. A connection that
/// finds the queue full has its handshake's last packet dropped and waits for a retransmission,
/// which takes seconds and looks to the node like a hung server; a deep queue absorbs the burst,
/// and the bounds at accept then refuse at once what the proxy cannot take.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As std and tokio do for listeners: a restarted proxy rebinds while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds and serves until `shutdown`.
/// Raises the soft open-file limit to the hard one, so that the connections the admission bounds
/// allow fit (a common default soft limit is 1024, far below `--max-waiting`); says so when they
/// still do not.
fn raise_open_file_limit(config: &Config) {
    // Beside the connections: the listeners, upstream connections, sidecar sockets, files.
    let wanted = config
        .max_waiting
        .saturating_add(config.max_handshakes)
        .saturating_add(256);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < u64::try_from(wanted).unwrap_or(u64::MAX) => tracing::warn!(
            limit,
            wanted,
            "the open-file limit is below what --max-waiting and --max-handshakes allow: beyond it, accept fails and new connections wait in the kernel's queue"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "could not raise the open-file limit"),
    }
}

pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    Proxy::bind(config).await?.serve(shutdown).await
}
