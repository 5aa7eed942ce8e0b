//! How often verifying the joins of a run needed AMD's KDS or Intel's PCS: attest-proxy's
//! collateral metrics (`attest-proxy/src/collateral_metrics.rs`, on its admin endpoint's
//! `/metrics`) read before and after the run.
//!
//! Every SEV-SNP join looks up AMD's CRL, and the chain or VCEK its document lacks; every TDX join
//! its platform's TCB info, the QE identity and Intel's CRLs. Each lookup is a cache hit or a
//! fetch from the KDS or PCS. Once warm, a storm should cost them nothing: zero fetches per
//! join.
//!
//! A gcp-sev-snp join also needs the key the GCE API vouches for its instance, which attest-proxy
//! asks gce-identity for once per instance and caches (`attest-proxy/src/gce_identity.rs`): a
//! storm of new nodes costs one GCE lookup per node, their rejoins none.

use std::net::SocketAddr;

use serde::Serialize;

/// attest-proxy's collateral counters at one moment (or their growth over a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CollateralCounts {
    /// Fetches from the KDS or PCS that brought collateral.
    pub fetches_ok: u64,
    /// Fetches from the KDS or PCS that failed (429, 5xx, no answer, unusable bytes).
    pub fetches_failed: u64,
    /// Lookups answered from the cache, fresh.
    pub hits_fresh: u64,
    /// Lookups answered from the cache past the item's expiry (within `--collateral-max-stale`).
    pub hits_stale: u64,
    /// Lookups that found nothing usable: the join was told `Unavailable`.
    pub unavailable: u64,
    /// gcp-sev-snp: attest-proxy's GCE key cache; `None` where attest-proxy has none.
    pub gce: Option<GceLookups>,
}

/// attest-proxy's GCE key cache counters (`attest_proxy_gce_identity_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GceLookups {
    /// Instances' keys asked of gce-identity that it answered (a key, or "no such instance").
    pub ok: u64,
    /// Asks that failed (the API's 429 or 5xx, no answer).
    pub failed: u64,
    /// Keys answered from the cache.
    pub hits: u64,
    /// Joins told `Unavailable` for want of their instance's key.
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
    /// gcp-sev-snp: GCE lookups (whatever their result) per successful join; `None` without
    /// successful joins or without a GCE key cache.
    pub gce_lookups_per_join: Option<f64>,
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
            gce: after.gce.map(|a| {
                let b = before.gce.unwrap_or_default();
                GceLookups {
                    ok: a.ok.saturating_sub(b.ok),
                    failed: a.failed.saturating_sub(b.failed),
                    hits: a.hits.saturating_sub(b.hits),
                    unavailable: a.unavailable.saturating_sub(b.unavailable),
                }
            }),
        };
        let per_join = |n: u64| (succeeded > 0).then(|| n as f64 / succeeded as f64);
        CollateralUse {
            counts,
            fetches_per_join: per_join(counts.fetches_ok + counts.fetches_failed),
            gce_lookups_per_join: counts.gce.and_then(|g| per_join(g.ok + g.failed)),
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
    #[error("attest-proxy at {0} exposes no collateral metrics (not an SEV-SNP or TDX variant?)")]
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
    let mut gce = GceLookups::default();
    let (mut found, mut found_gce) = (false, false);
    for line in exposition.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let gce_slot = match series {
            r#"attest_proxy_gce_identity_lookups_total{result="ok"}"# => Some(&mut gce.ok),
            r#"attest_proxy_gce_identity_lookups_total{result="failed"}"# => Some(&mut gce.failed),
            "attest_proxy_gce_identity_hits_total" => Some(&mut gce.hits),
            "attest_proxy_gce_identity_unavailable_total" => Some(&mut gce.unavailable),
            _ => None,
        };
        if let Some(slot) = gce_slot {
            if let Some(value) = whole(value) {
                *slot = value;
                found_gce = true;
            }
            continue;
        }
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
        if let Some(value) = whole(value) {
            *slot = value;
            found = true;
        }
    }
    counts.gce = found_gce.then_some(gce);
    found.then_some(counts)
}

/// A counter's value: a whole number, exposed as such.
fn whole(value: &str) -> Option<u64> {
    let value = value.trim().parse::<f64>().ok()?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = value as u64;
    Some(whole)
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
                gce: None,
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
        assert_eq!(used.gce_lookups_per_join, None);
        assert_eq!(parse("attest_proxy_connections_total 99\n"), None);
    }

    #[test]
    fn gce_lookups_are_read_beside_the_collateral_and_counted_per_join() {
        let text = "attest_proxy_collateral_fetches_total{result=\"ok\"} 2\n\
            attest_proxy_gce_identity_lookups_total{result=\"ok\"} 40\n\
            attest_proxy_gce_identity_lookups_total{result=\"failed\"} 1\n\
            attest_proxy_gce_identity_hits_total 7\n\
            attest_proxy_gce_identity_unavailable_total 1\n";
        let after = parse(text).unwrap();
        assert_eq!(
            after.gce,
            Some(GceLookups {
                ok: 40,
                failed: 1,
                hits: 7,
                unavailable: 1
            })
        );
        let before = CollateralCounts {
            fetches_ok: 2,
            gce: Some(GceLookups {
                ok: 10,
                ..GceLookups::default()
            }),
            ..CollateralCounts::default()
        };
        let used = CollateralUse::between(before, after, 30);
        assert_eq!(
            used.counts.gce.map(|g| (g.ok, g.failed, g.hits)),
            Some((30, 1, 7))
        );
        assert_eq!(used.gce_lookups_per_join, Some(31.0 / 30.0));
        assert_eq!(used.fetches_per_join, Some(0.0));
        let json = serde_json::to_value(used).unwrap();
        assert_eq!(json["gce"]["ok"], 30);
        assert_eq!(json["gce_lookups_per_join"], 31.0 / 30.0);
    }
}
