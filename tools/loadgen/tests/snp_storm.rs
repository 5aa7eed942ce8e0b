//! AMD's KDS failing during a storm of SEV-SNP joins, through the real processes.
//!
//! Nodes run on simulated AMD machines (`testsupport::snp`): azure-sev-snp nodes spread over four
//! chips whose documents leave out the VCEK and chain, so attest-proxy needs AMD's CRL, the VCEK
//! chain and every chip's VCEK from the KDS stand-in. 16 nodes join at a time, each on a new
//! connection with a full handshake, and without retries where the test counts failures.
//!
//! - With the collateral cached, the stand-in answering 429 (with `Retry-After`) and then gone
//!   altogether fails no join. The CRL is issued close to its refresh time, so every join asks
//!   the cache to refresh it: the stand-in is really asked, and really fails (its failed fetches
//!   are counted), while the joins are answered from the cache.
//! - With nothing cached and the stand-in hanging, every join is told `Unavailable` (retry), not
//!   `Unauthenticated`: it waited `--collateral-wait` for the fetch in flight, not the fetch's own
//!   deadline. When the stand-in answers again, the same nodes join.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use attestation::snp::Product;
use kds_standin::Fault;
use loadgen::collateral::CollateralUse;
use loadgen::{LoadConfig, Mode, NodeAttestation, Report, Stop, Target};
use node_client::Backoff;
use soft_issuer::snp::SimulatedAmd;
use testsupport::harness::{Options, System, Uids, own_uid};
use testsupport::snp::{SnpMachines, SnpSite};

/// Nodes joining at once.
const CONCURRENCY: usize = 16;
/// How long a join waits for collateral not cached yet.
const COLLATERAL_WAIT: &str = "2s";

/// Storms take turns: two at once on two cores would measure each other.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Storm {
    system: System,
    site: SnpSite,
    target: Arc<Target>,
    _dir: tempfile::TempDir,
}

/// The system serving azure-sev-snp with collateral from a fresh KDS stand-in whose CRL is valid
/// for `crl_valid_for` from an hour ago, and set to `fault` before attest-proxy starts.
async fn storm(crl_valid_for: Duration, fault: Fault) -> Storm {
    let dir = tempfile::Builder::new()
        .prefix("snp-storm-")
        .tempdir()
        .unwrap();
    let amd = Arc::new(SimulatedAmd::new(Product::Milan).unwrap());
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = SnpSite::start(amd.clone(), dir.path(), crl_valid_for, proxy_uid)
        .await
        .unwrap();
    let machines = SnpMachines::new(Variant::AzureSevSnp, &amd, 4)
        .unwrap()
        .leave_out_certificates();
    machines.publish_vceks(&site.kds, Product::Milan);
    site.kds.set_fault(fault);
    let wait = humantime::parse_duration(COLLATERAL_WAIT).unwrap();
    let system = System::start(Options {
        variant: Some(Variant::AzureSevSnp),
        attestation_config: Some(site.attestation_config_path()),
        proxy_args: site.proxy_args(wait),
        ..Options::default()
    })
    .await
    .unwrap();
    let target = Arc::new(Target::Atls {
        addr: system.proxy_addr,
        attestation: NodeAttestation::Snp(Arc::new(machines)),
    });
    Storm {
        system,
        site,
        target,
        _dir: dir,
    }
}

impl Storm {
    /// `count` nodes, `CONCURRENCY` at a time; with `retry`, as node-client retries.
    async fn joins(&self, label: &str, count: u64, retry: Option<Backoff>) -> Report {
        let config = LoadConfig {
            label: label.to_owned(),
            mode: Mode::Closed {
                concurrency: CONCURRENCY,
                stop: Stop::Count(count),
            },
            timeout: Duration::from_secs(30),
            retry,
            node_prefix: format!(
                "{}-{}",
                loadgen::run::random_prefix(),
                label.replace(' ', "-")
            ),
            spread_sources: true,
            pregenerate: count,
            collateral_metrics: Some(self.system.admin.proxy),
        };
        loadgen::run::run(self.target.clone(), &config, &[])
            .await
            .unwrap()
    }

    /// Storms of `batch` joins until the stand-in has been asked and failed at least once; each
    /// must fail no join. Returns the collateral they used, summed.
    async fn no_join_fails_while_fetches_fail(&self, label: &str, batch: u64) -> CollateralUse {
        let mut failed_fetches = 0;
        let mut total = CollateralUse::between(Default::default(), Default::default(), 0);
        let mut joined = 0;
        for round in 1..=20 {
            let report = self.joins(&format!("{label} {round}"), batch, None).await;
            assert_eq!(
                report.failed,
                0,
                "{label}: joins failed with the collateral cached:\n{report}\n{}",
                self.system.logs()
            );
            let used = report.collateral.unwrap();
            failed_fetches += used.counts.fetches_failed;
            joined += report.succeeded;
            total.counts.fetches_ok += used.counts.fetches_ok;
            total.counts.fetches_failed += used.counts.fetches_failed;
            total.counts.hits_fresh += used.counts.hits_fresh;
            total.counts.hits_stale += used.counts.hits_stale;
            total.counts.unavailable += used.counts.unavailable;
            if failed_fetches > 0 {
                total.fetches_per_join = Some(
                    (total.counts.fetches_ok + total.counts.fetches_failed) as f64 / joined as f64,
                );
                return total;
            }
        }
        panic!("{label}: the KDS stand-in was never asked in 20 storms");
    }
}

fn retry() -> Backoff {
    Backoff {
        initial: Duration::from_millis(200),
        max: Duration::from_secs(2),
        give_up_after: Duration::from_secs(120),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_collateral_cached_no_join_fails_while_the_kds_rate_limits_or_is_gone() {
    let _machine = MACHINE.lock().await;
    // A CRL ten minutes from its nextUpdate is past its refresh time (a quarter of its
    // lifetime before nextUpdate) and still current: every join asks for a refresh.
    let mut storm = storm(Duration::from_secs(600), Fault::None).await;

    // Warm-up: the CRL, the VCEK chain and the four chips' VCEKs are fetched.
    let warm = storm.joins("warm-up", 32, Some(retry())).await;
    assert_eq!(warm.failed, 0, "{warm}\n{}", storm.system.logs());
    let paths = storm.site.kds.paths();
    for wanted in ["/vcek/v1/Milan/crl", "/vcek/v1/Milan/cert_chain"] {
        assert!(paths.iter().any(|p| p == wanted), "{wanted}: {paths:?}");
    }
    assert!(
        paths.iter().filter(|p| p.contains("blSPL=")).count() >= 4,
        "every chip's VCEK is fetched: {paths:?}"
    );

    // KDS rate-limits: each refresh is refused, each join answered from the cache.
    storm
        .site
        .kds
        .set_fault(Fault::RateLimited { retry_after: 1 });
    let limited = storm
        .no_join_fails_while_fetches_fail("rate-limited", 48)
        .await;
    assert_eq!(limited.counts.unavailable, 0, "{limited:?}");

    // KDS gone: connections refused, joins still answered from the cache.
    storm.site.kds.stop();
    let gone = storm.no_join_fails_while_fetches_fail("kds-gone", 48).await;
    assert_eq!(gone.counts.unavailable, 0, "{gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_cached_joins_are_told_unavailable_until_the_kds_answers() {
    let _machine = MACHINE.lock().await;
    // The stand-in hangs from the start: even attest-proxy's fetches at start get no answer.
    let storm = storm(Duration::from_secs(7 * 86_400), Fault::Hang).await;

    let refused = storm.joins("kds-hangs", 32, None).await;
    assert_eq!(refused.succeeded, 0, "{refused}");
    for error in &refused.errors {
        assert_eq!(error.code, "Unavailable", "{refused}");
        assert!(error.class.contains("retry"), "{refused}");
    }
    // Those that found the fetch in flight waited --collateral-wait for it, not the fetch's own
    // deadline (10 s); the audit line says so.
    let log = storm.system.proxy.log();
    assert!(
        log.contains(&format!("did not answer within {COLLATERAL_WAIT}")),
        "{log}"
    );
    assert_eq!(
        refused.collateral.unwrap().counts.unavailable,
        refused.joins,
        "{refused}"
    );

    // The stand-in answers again: nodes retrying as node-client does all join.
    storm.site.kds.set_fault(Fault::None);
    let recovered = storm.joins("kds-back", 32, Some(retry())).await;
    assert_eq!(recovered.failed, 0, "{recovered}\n{}", storm.system.logs());
    assert!(recovered.collateral.unwrap().counts.fetches_ok >= 1);
}
