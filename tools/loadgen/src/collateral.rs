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
//! storm of new nodes costs one GCE lookup per node, their rejoins none; gcp-sev-es the same.
//! An aws-nitro-tpm join needs EC2's word that its image supports TPM 2.0, which attest-proxy
//! asks ec2-identity once per image and caches (`attest-proxy/src/ec2_identity.rs`): a storm of
//! one image's nodes costs one EC2 lookup, then none. azure-trustedlaunch asks no cloud API (the
//! node sends its AK certificate and CA; the root is in the config) and fetches no collateral:
//! its attest-proxy has neither cache, so its counts stay zero.

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
    /// Items the collateral cache holds now (`collateral_items`, shared and node-named): a gauge,
    /// not a counter, so a run's value is the one at its end.
    pub items: u64,
    /// Whether attest-proxy has a collateral cache at all (the SEV-SNP and TDX variants): without
    /// one, the counts above are zero because nothing is fetched.
    pub collateral_cache: bool,
    /// gcp-sev-snp and gcp-sev-es: attest-proxy's GCE key cache; `None` where it has none.
    pub gce: Option<CloudLookups>,
    /// aws-nitro-tpm: attest-proxy's EC2 image cache; `None` where it has none.
    pub ec2: Option<CloudLookups>,
}

/// The counters of attest-proxy's cache in front of a cloud API sidecar
/// (`attest_proxy_gce_identity_*`, `attest_proxy_ec2_identity_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CloudLookups {
    /// Questions the sidecar answered (an instance's key, an image's TPM support, or "no such
    /// instance/image").
    pub ok: u64,
    /// Questions that failed (the API's 429 or 5xx, no answer).
    pub failed: u64,
    /// Answers from the cache.
    pub hits: u64,
    /// Joins told `Unavailable` for want of an answer.
    pub unavailable: u64,
}

impl CloudLookups {
    fn since(self, before: Option<CloudLookups>) -> CloudLookups {
        let b = before.unwrap_or_default();
        CloudLookups {
            ok: self.ok.saturating_sub(b.ok),
            failed: self.failed.saturating_sub(b.failed),
            hits: self.hits.saturating_sub(b.hits),
            unavailable: self.unavailable.saturating_sub(b.unavailable),
        }
    }
}

/// What a run cost in collateral.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CollateralUse {
    /// The counters' growth during the run.
    #[serde(flatten)]
    pub counts: CollateralCounts,
    /// Fetches (whatever their result) per successful join; `None` without successful joins.
    pub fetches_per_join: Option<f64>,
    /// Cloud API lookups (GCE or EC2, whatever their result) per successful join; `None`
    /// without successful joins. Zero where attest-proxy asks no cloud API for the variant.
    pub cloud_lookups_per_join: Option<f64>,
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
            items: after.items,
            collateral_cache: after.collateral_cache,
            gce: after.gce.map(|a| a.since(before.gce)),
            ec2: after.ec2.map(|a| a.since(before.ec2)),
        };
        let per_join = |n: u64| (succeeded > 0).then(|| n as f64 / succeeded as f64);
        let cloud: u64 = [counts.gce, counts.ec2]
            .iter()
            .flatten()
            .map(|c| c.ok + c.failed)
            .sum();
        CollateralUse {
            counts,
            fetches_per_join: per_join(counts.fetches_ok + counts.fetches_failed),
            cloud_lookups_per_join: per_join(cloud),
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
    #[error("{0} exposes no attest-proxy metrics (not attest-proxy's admin endpoint?)")]
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

/// The collateral and cloud lookup counters in attest-proxy's Prometheus text exposition (zero
/// where attest-proxy has no such cache); `None` if it is not attest-proxy's.
pub fn parse(exposition: &str) -> Option<CollateralCounts> {
    let mut counts = CollateralCounts::default();
    let (mut gce, mut ec2) = (CloudLookups::default(), CloudLookups::default());
    let (mut found_gce, mut found_ec2, mut attest_proxy) = (false, false, false);
    for line in exposition.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        attest_proxy |= series.starts_with("attest_proxy_");
        let Some(value) = whole(value) else {
            continue;
        };
        let cloud = [
            ("attest_proxy_gce_identity_", &mut gce, &mut found_gce),
            ("attest_proxy_ec2_identity_", &mut ec2, &mut found_ec2),
        ]
        .into_iter()
        .find_map(|(prefix, lookups, found)| {
            let slot = match series.strip_prefix(prefix)? {
                r#"lookups_total{result="ok"}"# => &mut lookups.ok,
                r#"lookups_total{result="failed"}"# => &mut lookups.failed,
                "hits_total" => &mut lookups.hits,
                "unavailable_total" => &mut lookups.unavailable,
                _ => return None,
            };
            *found = true;
            Some(slot)
        });
        if let Some(slot) = cloud {
            *slot = value;
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
            r#"attest_proxy_collateral_items{class="shared"}"# => {
                counts.items += value;
                continue;
            }
            r#"attest_proxy_collateral_items{class="node_named"}"# => {
                counts.items += value;
                continue;
            }
            _ => continue,
        };
        *slot = value;
        counts.collateral_cache = true;
    }
    counts.gce = found_gce.then_some(gce);
    counts.ec2 = found_ec2.then_some(ec2);
    attest_proxy.then_some(counts)
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
            attest_proxy_collateral_items{class=\"shared\"} 4\n\
            attest_proxy_collateral_items{class=\"node_named\"} 3\n\
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
                items: 7,
                collateral_cache: true,
                gce: None,
                ec2: None,
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
        assert_eq!(used.cloud_lookups_per_join, Some(0.0));
        // attest-proxy without a collateral or cloud cache (azure-trustedlaunch, qemu-vtpm):
        // nothing looked up.
        let bare = parse("attest_proxy_connections_total 99\n").unwrap();
        assert_eq!(
            bare,
            CollateralCounts {
                collateral_cache: false,
                ..CollateralCounts::default()
            }
        );
        let used = CollateralUse::between(bare, bare, 10);
        assert_eq!(
            (used.fetches_per_join, used.cloud_lookups_per_join),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(parse("process_cpu_seconds_total 1\n"), None);
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
            Some(CloudLookups {
                ok: 40,
                failed: 1,
                hits: 7,
                unavailable: 1
            })
        );
        assert_eq!(after.ec2, None);
        let before = CollateralCounts {
            fetches_ok: 2,
            gce: Some(CloudLookups {
                ok: 10,
                ..CloudLookups::default()
            }),
            ..CollateralCounts::default()
        };
        let used = CollateralUse::between(before, after, 30);
        assert_eq!(
            used.counts.gce.map(|g| (g.ok, g.failed, g.hits)),
            Some((30, 1, 7))
        );
        assert_eq!(used.cloud_lookups_per_join, Some(31.0 / 30.0));
        assert_eq!(used.fetches_per_join, Some(0.0));
        let json = serde_json::to_value(used).unwrap();
        assert_eq!(json["gce"]["ok"], 30);
        assert_eq!(json["cloud_lookups_per_join"], 31.0 / 30.0);
    }

    #[test]
    fn ec2_lookups_are_read_without_collateral_and_counted_per_join() {
        let text = "attest_proxy_connections_total 12\n\
            attest_proxy_ec2_identity_lookups_total{result=\"ok\"} 1\n\
            attest_proxy_ec2_identity_lookups_total{result=\"failed\"} 0\n\
            attest_proxy_ec2_identity_hits_total 99\n\
            attest_proxy_ec2_identity_unavailable_total 0\n";
        let after = parse(text).unwrap();
        assert!(!after.collateral_cache);
        assert_eq!(after.gce, None);
        assert_eq!(
            after.ec2,
            Some(CloudLookups {
                ok: 1,
                failed: 0,
                hits: 99,
                unavailable: 0
            })
        );
        // Warm: one image's answer cached, a hundred more joins cost no lookup.
        let warm = CollateralCounts {
            ec2: Some(CloudLookups {
                ok: 1,
                ..CloudLookups::default()
            }),
            ..CollateralCounts::default()
        };
        let used = CollateralUse::between(warm, after, 100);
        assert_eq!(used.cloud_lookups_per_join, Some(0.0));
        assert_eq!(used.counts.ec2.map(|e| e.hits), Some(99));
    }
}
