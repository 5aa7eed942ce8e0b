//! The collateral cache's metrics (AMD's KDS for the SEV-SNP variants, Intel's PCS for TDX),
//! read from the cache at each scrape: `collateral_fetches_total{result}`,
//! `collateral_hits_total{freshness}`, `collateral_unavailable_total` (joins told to retry) and
//! `collateral_oldest_crl_age_seconds`. The names are the same for both vendors (a proxy serves
//! one variant), so one dashboard and one alert fit every cluster.

use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

#[derive(Debug)]
struct CacheCollector {
    cache: collateral::Cache,
    /// "AMD KDS" or "Intel PCS", for the help texts.
    vendor: &'static str,
}

/// Registers the metrics of `cache`, which fetches from `vendor`.
pub fn register(registry: &mut Registry, cache: collateral::Cache, vendor: &'static str) {
    registry.register_collector(Box::new(CacheCollector { cache, vendor }));
}

/// Where each vendor's CRLs sit in its cache (`crl/{product}`; `pckcrl/{ca}` and `rootcrl`).
fn crl_prefixes(vendor: &str) -> &'static [&'static str] {
    if vendor == "Intel PCS" {
        &["pckcrl/", "rootcrl"]
    } else {
        &["crl/"]
    }
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.cache.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        labelled_counters(
            &mut encoder,
            "collateral_fetches",
            &format!(
                "Fetches of attestation collateral from the {}, by result",
                self.vendor
            ),
            "result",
            &[
                ("ok", load(&stats.fetch_ok)),
                ("failed", load(&stats.fetch_failed)),
            ],
        )?;
        labelled_counters(
            &mut encoder,
            "collateral_hits",
            "Collateral answered from the cache, fresh or stale (within --collateral-max-stale)",
            "freshness",
            &[
                ("fresh", load(&stats.hits)),
                ("stale", load(&stats.stale_hits)),
            ],
        )?;
        counter(
            &mut encoder,
            "collateral_unavailable",
            "Lookups that found no usable collateral: the join was answered Unavailable",
            load(&stats.unavailable),
        )?;
        let oldest = crl_prefixes(self.vendor)
            .iter()
            .filter_map(|prefix| self.cache.oldest(prefix))
            .max()
            .map(|age| i64::try_from(age.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        ConstGauge::new(oldest).encode(encoder.encode_descriptor(
            "collateral_oldest_crl_age_seconds",
            &format!(
                "Age of the oldest cached CRL from the {} (0 while none is cached)",
                self.vendor
            ),
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

/// The counter family `name` with one series per (value of `label`, count).
pub(crate) fn labelled_counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    series: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for &(value, count) in series {
        ConstCounter::new(count).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// The unlabelled counter `name`.
pub(crate) fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    count: u64,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(count).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}
