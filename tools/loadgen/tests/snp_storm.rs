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

mod common;

use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use attestation::snp::Product;
use common::{MACHINE, Outage, Storm, collateral_wait, retry};
use kds_standin::Fault;
use loadgen::NodeAttestation;
use soft_issuer::snp::SimulatedAmd;
use testsupport::harness::{Uids, own_uid};
use testsupport::snp::{SnpMachines, SnpSite};

struct SnpStorm {
    storm: Storm,
    site: SnpSite,
    _dir: tempfile::TempDir,
}

/// The system serving azure-sev-snp with collateral from a fresh KDS stand-in whose CRL is valid
/// for `crl_valid_for` from an hour ago, and set to `fault` before attest-proxy starts.
async fn storm(crl_valid_for: Duration, fault: Fault) -> SnpStorm {
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
    let storm = Storm::start(
        Variant::AzureSevSnp,
        site.attestation_config_path(),
        site.proxy_args(collateral_wait()),
        NodeAttestation::Snp(Arc::new(machines)),
    )
    .await;
    SnpStorm {
        storm,
        site,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_collateral_cached_no_join_fails_while_the_kds_rate_limits_or_is_gone() {
    let _machine = MACHINE.lock().await;
    // A CRL ten minutes from its nextUpdate is past its refresh time (a quarter of its
    // lifetime before nextUpdate) and still current: every join asks for a refresh.
    let mut snp = storm(Duration::from_secs(600), Fault::None).await;
    let storm = &snp.storm;

    // Warm-up: the CRL, the VCEK chain and the four chips' VCEKs are fetched.
    let warm = storm.joins("warm-up", 32, Some(retry())).await;
    assert_eq!(warm.failed, 0, "{warm}\n{}", storm.system.logs());
    let paths = snp.site.kds.paths();
    for wanted in ["/vcek/v1/Milan/crl", "/vcek/v1/Milan/cert_chain"] {
        assert!(paths.iter().any(|p| p == wanted), "{wanted}: {paths:?}");
    }
    assert!(
        paths.iter().filter(|p| p.contains("blSPL=")).count() >= 4,
        "every chip's VCEK is fetched: {paths:?}"
    );

    // KDS rate-limits, then is gone.
    let SnpStorm { storm, site, .. } = &mut snp;
    storm
        .no_join_fails_while_rate_limited_or_gone("KDS", |outage| match outage {
            Outage::RateLimited => site.kds.set_fault(Fault::RateLimited { retry_after: 1 }),
            Outage::Gone => site.kds.stop(),
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_cached_joins_are_told_unavailable_until_the_kds_answers() {
    let _machine = MACHINE.lock().await;
    // The stand-in hangs from the start: even attest-proxy's fetches at start get no answer.
    let snp = storm(Duration::from_secs(7 * 86_400), Fault::Hang).await;
    snp.storm
        .told_to_retry_until_it_answers(|| snp.site.kds.set_fault(Fault::None))
        .await;
}
