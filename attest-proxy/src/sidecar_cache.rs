//! What gce_identity and ec2_identity share: a small bounded cache in front of a sidecar that
//! asks a cloud API (nothing kept on disk, nothing served stale), and its counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use collateral::{Cache, Source};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

/// The cache in front of `source`: a join waits at most `wait` for an answer, a failed call
/// backs off for `backoff`, at most `max_entries` answers are kept.
pub fn build(
    source: Arc<dyn Source>,
    wait: Duration,
    backoff: Duration,
    max_entries: usize,
) -> Result<Cache, String> {
    Cache::new(
        source,
        collateral::CacheConfig {
            dir: None,
            max_stale: Duration::ZERO,
            wait,
            backoff,
            max_entries: Some(max_entries),
            ..collateral::CacheConfig::default()
        },
        tokio::runtime::Handle::current(),
    )
    .map_err(|e| e.to_string())
}

/// A sidecar cache's counters, read from the cache at each scrape:
/// `{prefix}_lookups_total{result}`, `{prefix}_hits_total`, `{prefix}_unavailable_total`.
#[derive(Debug)]
pub struct Counters {
    pub cache: Cache,
    pub prefix: &'static str,
    pub lookups_help: &'static str,
    pub hits_help: &'static str,
    pub unavailable_help: &'static str,
}

impl Collector for Counters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::collateral_metrics::{counter, labelled_counters};
        let stats = self.cache.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        labelled_counters(
            &mut encoder,
            &format!("{}_lookups", self.prefix),
            self.lookups_help,
            "result",
            &[
                ("ok", load(&stats.fetch_ok)),
                ("failed", load(&stats.fetch_failed)),
            ],
        )?;
        // An answer served while its refresh is due counts too: the node did not wait for it.
        counter(
            &mut encoder,
            &format!("{}_hits", self.prefix),
            self.hits_help,
            load(&stats.hits) + load(&stats.stale_hits),
        )?;
        counter(
            &mut encoder,
            &format!("{}_unavailable", self.prefix),
            self.unavailable_help,
            load(&stats.unavailable),
        )
    }
}
