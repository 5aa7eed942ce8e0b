//! What the storm tests of the hardware variants share (`snp_storm.rs`: AMD's KDS failing,
//! `tdx_storm.rs`: Intel's PCS failing): storms of new nodes through the real processes, and the
//! checks that a collateral service's failure costs no join once its collateral is cached, and
//! costs a retry, not a refusal, while nothing is.

#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use loadgen::collateral::CollateralUse;
use loadgen::{LoadConfig, Mode, Report, Stop, Target};
use node_client::Backoff;
use testsupport::harness::System;

/// Nodes joining at once.
pub const CONCURRENCY: usize = 16;
/// How long a join waits for collateral not cached yet.
pub const COLLATERAL_WAIT: &str = "2s";
/// How long storms go on until the collateral service is asked again: three times attest-proxy's
/// back-off between fetches of one item (10 s).
const FETCH_PATIENCE: Duration = Duration::from_secs(30);

/// Storms take turns: two at once on two cores would measure each other.
pub static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `COLLATERAL_WAIT` as attest-proxy's flag takes it.
pub fn collateral_wait() -> Duration {
    humantime::parse_duration(COLLATERAL_WAIT).unwrap()
}

/// Retries as node-client makes them, bounded for a test.
pub fn retry() -> Backoff {
    Backoff {
        initial: Duration::from_millis(200),
        max: Duration::from_secs(2),
        give_up_after: Duration::from_secs(120),
    }
}

/// How the collateral service fails while its collateral is cached.
#[derive(Clone, Copy, Debug)]
pub enum Outage {
    /// 429 Too Many Requests, with `Retry-After`.
    RateLimited,
    /// Stopped: connections refused.
    Gone,
}

/// A running system and where its simulated nodes dial.
pub struct Storm {
    pub system: System,
    pub target: Arc<Target>,
}

impl Storm {
    /// The whole system serving `variant` under the attestation config at `config`, attest-proxy
    /// fetching collateral with `proxy_args`, and nodes attesting as `attestation`.
    pub async fn start(
        variant: attestation::Variant,
        config: std::path::PathBuf,
        proxy_args: Vec<String>,
        attestation: loadgen::NodeAttestation,
    ) -> Storm {
        let system = System::start(testsupport::harness::Options {
            variant: Some(variant),
            attestation_config: Some(config),
            proxy_args,
            ..testsupport::harness::Options::default()
        })
        .await
        .unwrap();
        let target = Arc::new(Target::Atls {
            addr: system.proxy_addr,
            server_policy: None,
            attestation,
        });
        Storm { system, target }
    }

    /// `count` nodes, `CONCURRENCY` at a time; with `retry`, as node-client retries.
    pub async fn joins(&self, label: &str, count: u64, retry: Option<Backoff>) -> Report {
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
            api_server: None,
        };
        loadgen::run::run(self.target.clone(), &config, &[])
            .await
            .unwrap()
    }

    /// Storms of `batch` joins until the collateral service (`service`, for the messages) has
    /// been asked and failed at least once; each must fail no join. Returns the collateral they
    /// used, summed.
    pub async fn no_join_fails_while_fetches_fail(
        &self,
        service: &str,
        label: &str,
        batch: u64,
    ) -> CollateralUse {
        let mut failed_fetches = 0;
        let mut total = CollateralUse::between(Default::default(), Default::default(), 0);
        let mut joined = 0;
        // attest-proxy asks the source again only once the item's back-off (10 s) has passed
        // since its last fetch, however many joins come meanwhile: storm until then, however
        // fast this machine runs them, and some time more.
        let started = std::time::Instant::now();
        let mut round = 0;
        while started.elapsed() < FETCH_PATIENCE {
            round += 1;
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
        panic!(
            "{label}: the {service} stand-in was never asked in {round} storms over {:?}",
            started.elapsed()
        );
    }

    /// With the collateral cached: `outage` makes the collateral service (`service`, for the
    /// messages) answer 429, then go away; storms during either fail no join and find no
    /// collateral missing.
    pub async fn no_join_fails_while_rate_limited_or_gone(
        &self,
        service: &str,
        mut outage: impl FnMut(Outage),
    ) {
        // Each refresh is refused, each join answered from the cache.
        outage(Outage::RateLimited);
        let limited = self
            .no_join_fails_while_fetches_fail(service, "rate-limited", 48)
            .await;
        assert_eq!(limited.counts.unavailable, 0, "{limited:?}");

        // Connections refused, joins still answered from the cache.
        outage(Outage::Gone);
        let gone = self
            .no_join_fails_while_fetches_fail(service, "service-gone", 48)
            .await;
        assert_eq!(gone.counts.unavailable, 0, "{gone:?}");
    }

    /// With nothing cached and the collateral service hanging: a storm joins no node and every
    /// one is told `Unavailable` (retry), not `Unauthenticated`: those that found the fetch in
    /// flight waited `--collateral-wait` for it, not the fetch's own deadline (10 s), and the
    /// audit line says so. Once `answer` has it answer again, nodes retrying as node-client does
    /// all join.
    pub async fn told_to_retry_until_it_answers(&self, answer: impl FnOnce()) {
        let refused = self.joins("service-hangs", 32, None).await;
        assert_eq!(refused.succeeded, 0, "{refused}");
        assert!(!refused.errors.is_empty(), "{refused}");
        for error in &refused.errors {
            assert_eq!(error.code, "Unavailable", "{refused}");
            assert!(error.class.contains("retry"), "{refused}");
        }
        let log = self.system.proxy.log();
        assert!(
            log.contains(&format!("did not answer within {COLLATERAL_WAIT}")),
            "{log}"
        );
        assert_eq!(
            refused.collateral.unwrap().counts.unavailable,
            refused.joins,
            "{refused}"
        );

        answer();
        let recovered = self.joins("service-back", 32, Some(retry())).await;
        assert_eq!(recovered.failed, 0, "{recovered}\n{}", self.system.logs());
        assert!(recovered.collateral.unwrap().counts.fetches_ok >= 1);
    }
}
