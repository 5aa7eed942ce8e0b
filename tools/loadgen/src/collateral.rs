//! How often verifying the joins of a run needed AMD's KDS: attest-proxy's collateral metrics
//! (`attest-proxy/src/collateral_metrics.rs`, on its admin endpoint's `/metrics`) read before
//! and after the run.
//!
//! Every SEV-SNP join looks up AMD's CRL, and the chain or VCEK its document lacks; each lookup is
//! a cache hit or a fetch from the KDS. Once warm, a storm should cost the KDS nothing: zero
//! fetches per join.

use std::net::SocketAddr;

use serde::Serialize;

/// attest-proxy's collateral counters at one moment (or their growth over a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CollateralCounts {
    /// Fetches from the KDS that brought collateral.
    pub fetches_ok: u64,
    /// Fetches from the KDS that failed (429, 5xx, no answer, unusable bytes).
    pub fetches_failed: u64,
    /// Lookups answered from the cache, fresh.
    pub hits_fresh: u64,
    /// Lookups answered from the cache past the item's expiry (within `--collateral-max-stale`).
    pub hits_stale: u64,
    /// Lookups that found nothing usable: the join was told `Unavailable`.
    pub unavailable: u64,
}

/// What a run cost in collateral.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CollateralUse {
    /// The counters' growth during the run.
    #[serde(flatten)]
    pub counts: CollateralCounts,
    /// Fetches (whatever their result) per successful join; `None` without successful joins.
    pub fetches_per_join: Option<f64>,
}

impl CollateralUse {
    /// The growth from `before` to `after` over a run with `succeeded` joins.
    pub fn between(before: CollateralCounts, after: CollateralCounts, succeeded: u64) -> Self {
        let counts = CollateralCounts {
            fetches_ok: after.fetches_ok.saturating_sub(before.fetches_ok),
            fetches_failed: after.fetches_failed.saturating_sub(before.fetches_failed),
            hits_fresh: after.hits_fresh.saturating_sub(before.hits_fresh),
            hits_stale: after.hits_stale.saturating_sub(before.hits_stale),
            unavailable: after.unavailable.saturating_sub(before.unavailable),
        };
        let fetches = counts.fetches_ok + counts.fetches_failed;
        CollateralUse {
            counts,
            fetches_per_join: (succeeded > 0).then(|| fetches as f64 / succeeded as f64),
        }
    }
}

/// Why the metrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("reading attest-proxy's /metrics at {addr}")]
    Read {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("attest-proxy's /metrics at {addr} answered {status}")]
    Status { addr: SocketAddr, status: u16 },
    #[error("attest-proxy at {0} exposes no collateral metrics (not an SEV-SNP variant?)")]
    Missing(SocketAddr),
}

/// The collateral counters attest-proxy's admin endpoint at `admin` exposes now.
pub async fn read(admin: SocketAddr) -> Result<CollateralCounts, MetricsError> {
    let (status, body) = plumbing::admin::get(admin, "/metrics")
        .await
        .map_err(|source| MetricsError::Read {
            addr: admin,
            source,
        })?;
    if status != 200 {
        return Err(MetricsError::Status {
            addr: admin,
            status,
        });
    }
    parse(&body).ok_or(MetricsError::Missing(admin))
}

/// The collateral counters in a Prometheus text exposition; `None` if it has none.
pub fn parse(exposition: &str) -> Option<CollateralCounts> {
    let mut counts = CollateralCounts::default();
    let mut found = false;
    for line in exposition.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let slot = match series {
            r#"attest_proxy_collateral_fetches_total{result="ok"}"# => &mut counts.fetches_ok,
            r#"attest_proxy_collateral_fetches_total{result="failed"}"# => {
                &mut counts.fetches_failed
            }
            r#"attest_proxy_collateral_hits_total{freshness="fresh"}"# => &mut counts.hits_fresh,
            r#"attest_proxy_collateral_hits_total{freshness="stale"}"# => &mut counts.hits_stale,
            "attest_proxy_collateral_unavailable_total" => &mut counts.unavailable,
            _ => continue,
        };
        if let Ok(value) = value.trim().parse::<f64>() {
            // Counters are whole numbers, exposed as such.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let whole = value as u64;
            *slot = whole;
            found = true;
        }
    }
    found.then_some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_the_exposition_and_subtracted() {
        let text = "# HELP attest_proxy_collateral_fetches Fetches\n\
            # TYPE attest_proxy_collateral_fetches counter\n\
            attest_proxy_collateral_fetches_total{result=\"ok\"} 3\n\
            attest_proxy_collateral_fetches_total{result=\"failed\"} 6\n\
            attest_proxy_collateral_hits_total{freshness=\"fresh\"} 1200\n\
            attest_proxy_collateral_hits_total{freshness=\"stale\"} 0\n\
            attest_proxy_collateral_unavailable_total 2\n\
            attest_proxy_connections_total 99\n";
        let after = parse(text).unwrap();
        assert_eq!(
            after,
            CollateralCounts {
                fetches_ok: 3,
                fetches_failed: 6,
                hits_fresh: 1200,
                hits_stale: 0,
                unavailable: 2,
            }
        );
        let before = CollateralCounts {
            fetches_ok: 1,
            fetches_failed: 6,
            hits_fresh: 200,
            ..CollateralCounts::default()
        };
        let used = CollateralUse::between(before, after, 500);
        assert_eq!(used.counts.fetches_ok, 2);
        assert_eq!(used.counts.hits_fresh, 1000);
        assert_eq!(used.fetches_per_join, Some(2.0 / 500.0));
        assert_eq!(
            CollateralUse::between(after, after, 0).fetches_per_join,
            None
        );
        assert_eq!(parse("attest_proxy_connections_total 99\n"), None);
    }
}
