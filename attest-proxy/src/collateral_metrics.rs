//! The SEV-SNP collateral cache's metrics, read from the cache at each scrape:
//! `collateral_fetches_total{result}`, `collateral_hits_total{freshness}`,
//! `collateral_unavailable_total` (joins told to retry) and `collateral_oldest_crl_age_seconds`.

use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

#[derive(Debug)]
struct CacheCollector(collateral::Cache);

/// Registers the cache's metrics.
pub fn register(registry: &mut Registry, cache: collateral::Cache) {
    registry.register_collector(Box::new(CacheCollector(cache)));
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let mut fetches = encoder.encode_descriptor(
            "collateral_fetches",
            "Fetches of attestation collateral from the KDS, by result",
            None,
            MetricType::Counter,
        )?;
        for (result, value) in [
            ("ok", load(&stats.fetch_ok)),
            ("failed", load(&stats.fetch_failed)),
        ] {
            ConstCounter::new(value).encode(fetches.encode_family(&[("result", result)])?)?;
        }
        let mut hits = encoder.encode_descriptor(
            "collateral_hits",
            "Collateral answered from the cache, fresh or stale (within --collateral-max-stale)",
            None,
            MetricType::Counter,
        )?;
        for (freshness, value) in [
            ("fresh", load(&stats.hits)),
            ("stale", load(&stats.stale_hits)),
        ] {
            ConstCounter::new(value).encode(hits.encode_family(&[("freshness", freshness)])?)?;
        }
        ConstCounter::new(load(&stats.unavailable)).encode(encoder.encode_descriptor(
            "collateral_unavailable",
            "Lookups that found no usable collateral: the join was answered Unavailable",
            None,
            MetricType::Counter,
        )?)?;
        let oldest = self
            .0
            .oldest("crl/")
            .map(|age| i64::try_from(age.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        ConstGauge::new(oldest).encode(encoder.encode_descriptor(
            "collateral_oldest_crl_age_seconds",
            "Age of the oldest cached AMD CRL (0 while none is cached)",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}
