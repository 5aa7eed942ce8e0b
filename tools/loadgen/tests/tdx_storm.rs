//! Intel's PCS failing during a storm of TDX joins, through the real processes.
//!
//! Nodes are qemu-tdx TDs on simulated Intel hosts (`testsupport::tdx`), four hosts spread over
//! the fleet's three platform models, so attest-proxy needs the TCB info of each FMSPC, the QE
//! identity, the PCK Platform CA's CRL and the root CA's CRL from the PCS stand-in. 16 nodes join
//! at a time, each on a new connection with a full handshake (each a new TD quoting the
//! connection's nonce), and without retries where the test counts failures.
//!
//! - With the collateral cached, the stand-in answering 429 (with `Retry-After`) and then gone
//!   altogether fails no join. The collateral is issued close to its refresh time, so every join
//!   asks the cache to refresh it: the stand-in is really asked, and really fails (its failed
//!   fetches are counted), while the joins are answered from the cache.
//! - With nothing cached and the stand-in hanging, every join is told `Unavailable` (retry), not
//!   `Unauthenticated`: it waited `--collateral-wait` for the fetch in flight, not the fetch's own
//!   deadline. When the stand-in answers again, the same nodes join.
//!
//! The storms and their checks are shared with the KDS's (`snp_storm.rs`, `common/mod.rs`).
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use common::{MACHINE, Outage, Storm, collateral_wait, retry};
use loadgen::NodeAttestation;
use pcs_standin::{Fault, SimulatedIntel};
use testsupport::harness::{Uids, own_uid};
use testsupport::tdx::{TdxMachines, TdxSite};

struct TdxStorm {
    storm: Storm,
    site: TdxSite,
    _dir: tempfile::TempDir,
}

/// The system serving qemu-tdx with collateral from a fresh PCS stand-in whose collateral is
/// valid for `valid_for` from an hour ago, and set to `fault` before attest-proxy starts.
async fn storm(valid_for: Duration, fault: Fault) -> TdxStorm {
    let dir = tempfile::Builder::new()
        .prefix("tdx-storm-")
        .tempdir()
        .unwrap();
    let intel = Arc::new(SimulatedIntel::new().unwrap());
    let machines = TdxMachines::fleet(Variant::QemuTdx, &intel, 4).unwrap();
    assert_eq!(machines.fmspcs().len(), 3);
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = TdxSite::start(
        Variant::QemuTdx,
        intel,
        &machines.fmspcs(),
        dir.path(),
        valid_for,
        proxy_uid,
    )
    .await
    .unwrap();
    site.pcs.set_fault(fault);
    let storm = Storm::start(
        Variant::QemuTdx,
        site.attestation_config_path(),
        site.proxy_args(collateral_wait()),
        NodeAttestation::Tdx(Arc::new(machines)),
    )
    .await;
    TdxStorm {
        storm,
        site,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_collateral_cached_no_join_fails_while_the_pcs_rate_limits_or_is_gone() {
    let _machine = MACHINE.lock().await;
    // Collateral ten minutes from its nextUpdate is past its refresh time (a quarter of its
    // lifetime before nextUpdate) and still current: every join asks for a refresh.
    let mut tdx = storm(Duration::from_secs(600), Fault::None).await;

    // Warm-up: every FMSPC's TCB info, the QE identity and the CRLs are fetched.
    let warm = tdx.storm.joins("warm-up", 32, Some(retry())).await;
    assert_eq!(warm.failed, 0, "{warm}\n{}", tdx.storm.system.logs());
    let paths = tdx.site.pcs.paths();
    for wanted in [
        "/tdx/certification/v4/qe/identity",
        "/sgx/certification/v4/pckcrl?ca=platform",
        pcs_standin::ROOT_CRL_PATH,
    ] {
        assert!(
            paths.iter().any(|p| p.starts_with(wanted)),
            "{wanted}: {paths:?}"
        );
    }
    for fmspc in ["00806f050000", "00806f050001", "00c06f000000"] {
        assert!(
            paths.iter().any(|p| p.contains(&format!("fmspc={fmspc}"))),
            "{fmspc}'s TCB info is fetched: {paths:?}"
        );
    }

    // PCS rate-limits, then is gone.
    let TdxStorm { storm, site, .. } = &mut tdx;
    storm
        .no_join_fails_while_rate_limited_or_gone("PCS", |outage| match outage {
            Outage::RateLimited => site.pcs.set_fault(Fault::RateLimited { retry_after: 1 }),
            Outage::Gone => site.pcs.stop(),
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_cached_joins_are_told_unavailable_until_the_pcs_answers() {
    let _machine = MACHINE.lock().await;
    // The stand-in hangs from the start: even attest-proxy's fetches at start get no answer.
    let tdx = storm(Duration::from_secs(7 * 86_400), Fault::Hang).await;
    tdx.storm
        .told_to_retry_until_it_answers(|| tdx.site.pcs.set_fault(Fault::None))
        .await;
}
