//! The TDX collateral through the cache from the PCS stand-in, over real TLS: each item fetched
//! once with its issuer chain, refreshed before `nextUpdate`, served stale within the bound
//! while the PCS fails, persisted across a restart; an unknown FMSPC refused once and
//! remembered; a rate-limited PCS left alone for its `Retry-After`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use collateral::pcs::{PckCa as Ca, PcsCollateral, PcsError, PcsSource};
use collateral::{Cache, CacheConfig};
use pcs_standin::{Fault, PckCa, PcsStandin, SimulatedIntel};

const FMSPC: &str = "00806f050000";
const HOUR: Duration = Duration::from_secs(3600);

struct World {
    pcs: PcsStandin,
    intel: SimulatedIntel,
    ca: tempfile::NamedTempFile,
    collateral: PcsCollateral,
}

fn source(pcs: &PcsStandin, ca: &tempfile::NamedTempFile) -> PcsSource {
    PcsSource::new(
        pcs.url(),
        &pcs.root_crl_url(),
        Some(ca.path()),
        Duration::from_secs(2),
    )
    .unwrap()
}

fn cache(source: PcsSource, dir: Option<&std::path::Path>, max_stale: Duration) -> PcsCollateral {
    let config = CacheConfig {
        dir: dir.map(ToOwned::to_owned),
        max_stale,
        wait: Duration::from_millis(1500),
        backoff: Duration::from_millis(300),
        max_entries: None,
        ..CacheConfig::default()
    };
    let cache = Cache::new(Arc::new(source), config, tokio::runtime::Handle::current()).unwrap();
    PcsCollateral::new(cache, max_stale)
}

/// The stand-in serving a simulated Intel's collateral valid from `issued` to `next`.
async fn world(
    issued: SystemTime,
    next: SystemTime,
    dir: Option<&std::path::Path>,
    max_stale: Duration,
) -> World {
    let pcs = PcsStandin::start().await.unwrap();
    let intel = SimulatedIntel::new().unwrap();
    pcs.serve_intel(&intel, &[FMSPC], issued, next).unwrap();
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), pcs.ca_pem()).unwrap();
    let collateral = cache(source(&pcs, &ca), dir, max_stale);
    World {
        pcs,
        intel,
        ca,
        collateral,
    }
}

async fn fresh_world(dir: Option<&std::path::Path>) -> World {
    let now = SystemTime::now();
    world(now - HOUR, now + 30 * 24 * HOUR, dir, HOUR).await
}

/// Runs `f` on a blocking thread, as attest-proxy's verify pool calls the verifier.
async fn blocking<T: Send + 'static>(
    collateral: &PcsCollateral,
    f: impl FnOnce(&PcsCollateral) -> T + Send + 'static,
) -> T {
    let collateral = collateral.clone();
    tokio::task::spawn_blocking(move || f(&collateral))
        .await
        .unwrap()
}

fn tcb_requests(pcs: &PcsStandin) -> usize {
    pcs.paths()
        .iter()
        .filter(|p| p.starts_with("/tdx/certification/v4/tcb?"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_is_fetched_once_with_the_issuer_chain_from_its_header() {
    let w = fresh_world(None).await;
    let (tcb, qe, platform, processor, root) = blocking(&w.collateral, |c| {
        (
            c.tcb_info("00806F050000").unwrap(),
            c.qe_identity().unwrap(),
            c.pck_crl(Ca::Platform).unwrap(),
            c.pck_crl(Ca::Processor).unwrap(),
            c.root_ca_crl().unwrap(),
        )
    })
    .await;
    let tcb_body: serde_json::Value = serde_json::from_slice(&tcb.body).unwrap();
    assert_eq!(tcb_body["tcbInfo"]["fmspc"], FMSPC);
    assert_eq!(tcb.issuer_chain, w.intel.tcb_issuer_chain_pem());
    assert!(std::str::from_utf8(&qe.body).unwrap().contains("\"TD_QE\""));
    assert_eq!(qe.issuer_chain, w.intel.tcb_issuer_chain_pem());
    assert_eq!(
        platform.issuer_chain,
        w.intel.pck_issuer_chain_pem(PckCa::Platform)
    );
    assert_eq!(
        processor.issuer_chain,
        w.intel.pck_issuer_chain_pem(PckCa::Processor)
    );
    // CRLs asked for as DER, kept as DER.
    assert_eq!(platform.body.first(), Some(&0x30));
    assert_eq!(root.first(), Some(&0x30));

    let mut paths = w.pcs.paths();
    paths.sort();
    let root_crl = pcs_standin::ROOT_CRL_PATH.to_owned();
    assert_eq!(
        paths,
        [
            root_crl.as_str(),
            "/sgx/certification/v4/pckcrl?ca=platform&encoding=der",
            "/sgx/certification/v4/pckcrl?ca=processor&encoding=der",
            "/tdx/certification/v4/qe/identity",
            "/tdx/certification/v4/tcb?fmspc=00806f050000",
        ]
    );
    // Warm: nothing more is asked.
    blocking(&w.collateral, |c| {
        for _ in 0..50 {
            c.tcb_info(FMSPC).unwrap();
            c.qe_identity().unwrap();
        }
    })
    .await;
    assert_eq!(w.pcs.requests(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_fmspc_is_not_found_once_and_remembered_until_the_recheck() {
    let w = fresh_world(None).await;
    let collateral = cache(
        source(&w.pcs, &w.ca).with_not_found_recheck(Duration::from_millis(400)),
        None,
        HOUR,
    );
    let errors = blocking(&collateral, |c| {
        (0..20)
            .map(|_| c.tcb_info("b0c06f000000").unwrap_err())
            .collect::<Vec<_>>()
    })
    .await;
    for error in &errors {
        let PcsError::NotFound { key, reason } = error else {
            panic!("{error}");
        };
        assert_eq!(key, "tcb/b0c06f000000");
        assert!(reason.contains("HTTP 404"), "{reason}");
        assert!(reason.contains("Request-ID"), "{reason}");
        assert!(!error.is_unavailable());
    }
    assert_eq!(tcb_requests(&w.pcs), 1, "one 404 answers the storm");

    // Intel learns of the FMSPC; after the recheck the next ask finds it.
    let now = SystemTime::now();
    let tcb = w
        .intel
        .signed_tcb_info("b0c06f000000", now - HOUR, now + HOUR)
        .unwrap();
    w.pcs
        .put_tcb_info("b0c06f000000", tcb.clone(), &w.intel.tcb_issuer_chain_pem());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Past the recheck the 404 is still served while the refresh runs behind it.
    let _ = blocking(&collateral, |c| c.tcb_info("b0c06f000000")).await;
    let mut found = None;
    for _ in 0..20 {
        if let Ok(item) = blocking(&collateral, |c| c.tcb_info("b0c06f000000")).await {
            found = Some(item);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(found.unwrap().body, tcb.as_bytes());

    // A malformed FMSPC is refused before anything is asked.
    let asked = w.pcs.requests();
    let error = blocking(&collateral, |c| c.tcb_info("../qe/identity")).await;
    assert_eq!(error.unwrap_err(), PcsError::Fmspc("../qe/identity".into()));
    assert_eq!(w.pcs.requests(), asked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_pcs_is_not_asked_again_within_retry_after() {
    let w = fresh_world(None).await;
    w.pcs.set_fault(Fault::RateLimited { retry_after: 1 });
    let error = blocking(&w.collateral, |c| c.qe_identity().unwrap_err()).await;
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("429"), "{error}");
    let asked = w.pcs.requests();
    for _ in 0..5 {
        let error = blocking(&w.collateral, |c| c.qe_identity().unwrap_err()).await;
        assert!(error.to_string().contains("backing off"), "{error}");
    }
    assert_eq!(w.pcs.requests(), asked, "no request within Retry-After");

    w.pcs.set_fault(Fault::None);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut ok = false;
    for _ in 0..10 {
        if blocking(&w.collateral, |c| c.qe_identity()).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "the QE identity is had once Retry-After has passed");
}

/// `Retry-After: 18446744073709551615` (u64::MAX seconds): clamped, not a panic in the fetch task
/// that left the key in flight (Unavailable until restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_from_the_pcs_is_clamped() {
    let w = fresh_world(None).await;
    w.pcs.set_fault(Fault::RateLimited {
        retry_after: u64::MAX,
    });
    let error = blocking(&w.collateral, |c| c.qe_identity().unwrap_err()).await;
    assert!(error.to_string().contains("429"), "{error}");
    let held = w.collateral.cache().held_for().unwrap();
    assert!(held <= collateral::MAX_RETRY_AFTER, "held {held:?}");
    let error = blocking(&w.collateral, |c| c.qe_identity().unwrap_err()).await;
    assert!(error.to_string().contains("backing off"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_within_the_last_quarter_of_its_window_is_refreshed_before_next_update() {
    // Issued 60 s ago, next update in 20 s: the refresh point (a quarter of 80 s before
    // nextUpdate) is now, and the item is not stale.
    let now = SystemTime::now();
    let w = world(
        now - Duration::from_secs(60),
        now + Duration::from_secs(20),
        None,
        HOUR,
    )
    .await;
    let first = blocking(&w.collateral, |c| c.tcb_info(FMSPC).unwrap()).await;
    assert_eq!(tcb_requests(&w.pcs), 1);
    assert!(w.collateral.cache().stale_keys().is_empty());

    let newer = w
        .intel
        .signed_tcb_info(FMSPC, now, now + 30 * 24 * HOUR)
        .unwrap();
    w.pcs
        .put_tcb_info(FMSPC, newer.clone(), &w.intel.tcb_issuer_chain_pem());
    // Served at once from the cache, the refresh behind it.
    let served = blocking(&w.collateral, |c| c.tcb_info(FMSPC).unwrap()).await;
    assert_eq!(served.body, first.body);
    let mut refreshed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if blocking(&w.collateral, |c| c.tcb_info(FMSPC).unwrap())
            .await
            .body
            == newer.as_bytes()
        {
            refreshed = true;
            break;
        }
    }
    assert!(refreshed, "the newer TCB info replaces the old one");
    assert_eq!(tcb_requests(&w.pcs), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_an_outage_stale_items_are_served_within_the_bound_and_not_past_it() {
    // Valid for two to three more seconds (Intel's dates are whole seconds); served at most
    // three seconds past that.
    let now = SystemTime::now();
    let mut w = world(
        now - Duration::from_secs(60),
        now + Duration::from_secs(3),
        None,
        Duration::from_secs(3),
    )
    .await;
    let before = blocking(&w.collateral, |c| {
        (c.tcb_info(FMSPC).unwrap(), c.pck_crl(Ca::Platform).unwrap())
    })
    .await;
    w.pcs.set_fault(Fault::ServerError);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let during = blocking(&w.collateral, |c| {
        (c.tcb_info(FMSPC).unwrap(), c.pck_crl(Ca::Platform).unwrap())
    })
    .await;
    assert_eq!(during, before);
    assert_eq!(
        w.collateral.cache().stale_keys(),
        ["pckcrl/platform", "tcb/00806f050000"]
    );

    w.pcs.stop();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let error = blocking(&w.collateral, |c| c.tcb_info(FMSPC).unwrap_err()).await;
    assert!(error.is_unavailable(), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_service_has_its_collateral_from_disk_without_the_pcs() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = fresh_world(Some(dir.path())).await;
    let before = blocking(&w.collateral, |c| {
        (
            c.tcb_info(FMSPC).unwrap(),
            c.qe_identity().unwrap(),
            c.pck_crl(Ca::Processor).unwrap(),
            c.root_ca_crl().unwrap(),
        )
    })
    .await;
    w.pcs.stop();
    let unreachable = PcsSource::new(
        "https://127.0.0.1:9",
        "https://127.0.0.1:9/IntelSGXRootCA.der",
        None,
        Duration::from_millis(300),
    )
    .unwrap();
    let restarted = cache(unreachable, Some(dir.path()), HOUR);
    let after = blocking(&restarted, |c| {
        (
            c.tcb_info(FMSPC).unwrap(),
            c.qe_identity().unwrap(),
            c.pck_crl(Ca::Processor).unwrap(),
            c.root_ca_crl().unwrap(),
        )
    })
    .await;
    assert_eq!(after, before);
    assert_eq!(
        restarted
            .cache()
            .stats()
            .fetch_failed
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warming_fetches_everything_ahead_of_the_first_join() {
    let w = fresh_world(None).await;
    w.collateral.warm(&[FMSPC]).unwrap();
    assert_eq!(
        w.collateral.warm(&["nothex"]).unwrap_err(),
        PcsError::Fmspc("nothex".into())
    );
    let mut fetched = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if w.pcs.requests() == 5 {
            fetched = true;
            break;
        }
    }
    assert!(fetched, "{:?}", w.pcs.paths());
    blocking(&w.collateral, |c| c.tcb_info(FMSPC).unwrap()).await;
    assert_eq!(w.pcs.requests(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_pcs_is_unavailable_within_the_wait_and_bad_answers_are_named() {
    let w = fresh_world(None).await;
    w.pcs.set_fault(Fault::Hang);
    let error = blocking(&w.collateral, |c| c.qe_identity().unwrap_err()).await;
    assert!(error.to_string().contains("did not answer"), "{error}");

    // TCB info for another FMSPC than asked: refused, the reason named.
    w.pcs.set_fault(Fault::None);
    let now = SystemTime::now();
    let other = w
        .intel
        .signed_tcb_info("00906ed50000", now - HOUR, now + HOUR)
        .unwrap();
    w.pcs
        .put_tcb_info("00a06d080000", other, &w.intel.tcb_issuer_chain_pem());
    let error = blocking(&w.collateral, |c| c.tcb_info("00a06d080000").unwrap_err()).await;
    assert!(error.is_unavailable(), "{error}");
    assert!(
        error
            .to_string()
            .contains("tcbInfo.fmspc is \"00906ed50000\", asked for \"00a06d080000\""),
        "{error}"
    );
    // No issuer chain: refused, the reason named.
    w.pcs.put_tcb_info(
        "00a06d080001",
        w.intel
            .signed_tcb_info("00a06d080001", now - HOUR, now + HOUR)
            .unwrap(),
        "",
    );
    let error = blocking(&w.collateral, |c| c.tcb_info("00a06d080001").unwrap_err()).await;
    assert!(
        error
            .to_string()
            .contains("the issuer chain holds no certificate"),
        "{error}"
    );
}
