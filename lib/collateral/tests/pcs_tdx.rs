//! The TDX verifier over [`PcsCollateral`]: Intel's real collateral for a real quote, served by
//! the PCS stand-in as Intel's PCS serves it (bodies, issuer-chain headers, DER CRLs), fetched
//! through the cache over TLS, and the quote verified at a time inside the collateral's window.
//!
//! The real collateral expired in 2025, so the cache here serves items up to ten years stale
//! (`--collateral-max-stale`): what is tested is where the bytes come from and when the node is
//! told to retry or refused; whether they are current is the verifier's, at its clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use attestation::tdx::{Collateral, PckCa as TdxPckCa, TcbStatus, TdQuote, TdxCollateral};
use attestation::variants::tdx::{TdxKind, TdxValidator};
use collateral::pcs::{PcsCollateral, PcsSource};
use collateral::{Cache, CacheConfig};
use pcs_standin::{Fault, PckCa, PcsStandin, SimulatedIntel};

const FMSPC: &str = "b0c06f000000";
/// The collateral's window: the latest issueDate/thisUpdate, the earliest nextUpdate.
const WINDOW: (i64, i64) = (1_750_329_147, 1_752_919_235);
const MRTD: &str = "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7";
/// The real quote's TDX module.
const MRSEAM: &str = "5b38e33a6487958b72c3c12a938eaa5e3fd4510c51aeeab58c7d5ecee41d7c436489d6c8e4f92f160b7cad34207b00c1";
const TEN_YEARS: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const WAIT: Duration = Duration::from_millis(1500);

fn testdata(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/testdata/tdx/dcap-qvl-uptodate/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn quote() -> TdQuote {
    TdQuote::parse(&testdata("quote.bin")).unwrap()
}

/// Puts the real collateral on the stand-in as Intel's PCS serves it: the TCB info and QE
/// identity wrapped around the exact bytes Intel signed, each with its real issuer chain.
fn serve_real(pcs: &PcsStandin) {
    let fmspc = pcs
        .put_dcap_collateral(&testdata("collateral.json"), PckCa::Platform)
        .unwrap();
    assert_eq!(fmspc, FMSPC);
}

struct World {
    pcs: PcsStandin,
    ca: tempfile::NamedTempFile,
}

impl World {
    async fn start(serve: bool) -> World {
        let pcs = PcsStandin::start().await.unwrap();
        if serve {
            serve_real(&pcs);
        }
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca.path(), pcs.ca_pem()).unwrap();
        World { pcs, ca }
    }

    /// A new cache in front of the stand-in, persisting in `dir` when given.
    fn collateral(&self, dir: Option<&std::path::Path>) -> PcsCollateral {
        self.collateral_backing_off(dir, Duration::from_secs(30))
    }

    /// As [`World::collateral`], with the cache's back-off (also the shortest time between two
    /// fetches of one item) given.
    fn collateral_backing_off(
        &self,
        dir: Option<&std::path::Path>,
        backoff: Duration,
    ) -> PcsCollateral {
        let source = PcsSource::new(
            self.pcs.url(),
            &self.pcs.root_crl_url(),
            Some(self.ca.path()),
            Duration::from_secs(5),
        )
        .unwrap();
        let config = CacheConfig {
            dir: dir.map(ToOwned::to_owned),
            max_stale: TEN_YEARS,
            wait: WAIT,
            backoff,
            max_entries: Some(64),
            ..CacheConfig::default()
        };
        let cache =
            Cache::new(Arc::new(source), config, tokio::runtime::Handle::current()).unwrap();
        PcsCollateral::new(cache, TEN_YEARS)
    }

    fn tcb_requests(&self) -> usize {
        self.pcs
            .paths()
            .iter()
            .filter(|p| p.starts_with("/tdx/certification/v4/tcb?"))
            .count()
    }
}

/// The validator attest-proxy builds for qemu-tdx, over `collateral`, at a time inside the window.
fn validator(collateral: &PcsCollateral) -> TdxValidator {
    let config = serde_json::json!({
        "measurements": { "0": { "expected": MRTD } },
        "mrSeams": [MRSEAM],
    });
    let (validator, _) = TdxValidator::from_attestation_config(
        TdxKind::Qemu,
        config.to_string().as_bytes(),
        Arc::new(collateral.clone()),
    )
    .unwrap();
    validator.with_clock(Arc::new(|| WINDOW.0 + 3600))
}

/// Verifies the real quote on a blocking thread, as attest-proxy's verify pool does.
async fn verify(collateral: &PcsCollateral) -> Result<TcbStatus, attestation::Error> {
    let validator = validator(collateral);
    tokio::task::spawn_blocking(move || validator.verify_hardware(&quote()).map(|(v, _)| v.status))
        .await
        .unwrap()
}

async fn lookup(
    collateral: &PcsCollateral,
) -> Result<Arc<Collateral>, attestation::tdx::TdxCollateralError> {
    let collateral = collateral.clone();
    let fmspc = quote().fmspc();
    tokio::task::spawn_blocking(move || collateral.collateral(fmspc, TdxPckCa::Platform))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_quote_verifies_with_collateral_fetched_from_the_pcs() {
    let w = World::start(true).await;
    let collateral = w.collateral(None);
    assert_eq!(verify(&collateral).await.unwrap(), TcbStatus::UpToDate);
    let assembled = lookup(&collateral).await.unwrap();
    assert_eq!((assembled.issued(), assembled.next_update()), WINDOW);
    assert_eq!(hex::encode(assembled.fmspc()), FMSPC);
    // What was asked (each item again, maybe, as the real ones are long due for a refresh).
    let mut paths = w.pcs.paths();
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths,
        [
            pcs_standin::ROOT_CRL_PATH,
            "/sgx/certification/v4/pckcrl?ca=platform&encoding=der",
            "/tdx/certification/v4/qe/identity",
            "/tdx/certification/v4/tcb?fmspc=b0c06f000000",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_cached_a_failing_pcs_is_unavailable_within_the_wait() {
    let w = World::start(true).await;
    for fault in [
        Fault::RateLimited { retry_after: 60 },
        Fault::ServerError,
        Fault::Hang,
    ] {
        w.pcs.set_fault(fault);
        let collateral = w.collateral(None);
        let started = Instant::now();
        let error = verify(&collateral).await.unwrap_err();
        let took = started.elapsed();
        assert!(error.is_unavailable(), "{fault:?}: {error}");
        assert!(
            took < WAIT + Duration::from_millis(500),
            "{fault:?}: {took:?}"
        );
        // Asked again at once (the node's retry): still a retry, answered without waiting.
        let started = Instant::now();
        assert!(verify(&collateral).await.unwrap_err().is_unavailable());
        if fault != Fault::Hang {
            assert!(started.elapsed() < Duration::from_millis(300), "{fault:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_cached_a_failing_pcs_does_not_stop_verification() {
    let w = World::start(true).await;
    let collateral = w.collateral(None);
    assert_eq!(verify(&collateral).await.unwrap(), TcbStatus::UpToDate);
    for fault in [
        Fault::RateLimited { retry_after: 60 },
        Fault::ServerError,
        Fault::Hang,
    ] {
        w.pcs.set_fault(fault);
        let started = Instant::now();
        assert_eq!(verify(&collateral).await.unwrap(), TcbStatus::UpToDate);
        assert!(
            started.elapsed() < WAIT,
            "{fault:?}: answered from the cache"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_verifies_from_disk_with_the_pcs_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::start(true).await;
    assert_eq!(
        verify(&w.collateral(Some(dir.path()))).await.unwrap(),
        TcbStatus::UpToDate
    );
    w.pcs.stop();
    // A new cache over the same directory: what a restarted attest-proxy builds.
    let restarted = w.collateral(Some(dir.path()));
    assert_eq!(verify(&restarted).await.unwrap(), TcbStatus::UpToDate);
    // Without the directory, the same stopped PCS gives nothing.
    assert!(
        verify(&w.collateral(None))
            .await
            .unwrap_err()
            .is_unavailable()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fmspc_unknown_to_intel_is_refused_and_asked_once() {
    let w = World::start(true).await;
    w.pcs.remove_tcb_info(FMSPC);
    let collateral = w.collateral(None);
    for _ in 0..20 {
        let error = verify(&collateral).await.unwrap_err();
        assert!(!error.is_unavailable(), "{error}");
        assert!(
            matches!(
                &error,
                attestation::Error::Tdx(attestation::tdx::TdxError::UnknownPlatform(m))
                    if m.contains(FMSPC) && m.contains("404")
            ),
            "{error}"
        );
    }
    assert_eq!(w.tcb_requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pcs_without_the_shared_items_is_unavailable_not_a_refusal() {
    // A wrong --pcs-url answers 404 to everything: no node is refused for it.
    let w = World::start(false).await;
    let error = verify(&w.collateral(None)).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

/// The assembled collateral is kept while its items are, and rebuilt once one is refreshed.
/// Simulated Intel's collateral, whose dates are the test's to set, so the cache refreshes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_assembled_collateral_is_reused_until_an_item_is_refreshed() {
    let w = World::start(false).await;
    let intel = SimulatedIntel::new().unwrap();
    let now = SystemTime::now();
    // Refreshed a quarter of the window (2 s) before nextUpdate: in 2 s.
    w.pcs
        .serve_intel(
            &intel,
            &["00806f050000"],
            now - Duration::from_secs(4),
            now + Duration::from_secs(4),
        )
        .unwrap();
    let collateral = w.collateral_backing_off(None, Duration::from_secs(1));
    let fmspc = [0x00, 0x80, 0x6f, 0x05, 0x00, 0x00];
    let get = |collateral: &PcsCollateral| {
        let collateral = collateral.clone();
        async move {
            tokio::task::spawn_blocking(move || collateral.collateral(fmspc, TdxPckCa::Platform))
                .await
                .unwrap()
                .unwrap()
        }
    };
    let first = get(&collateral).await;
    for _ in 0..100 {
        assert!(Arc::ptr_eq(&first, &get(&collateral).await));
    }
    assert_eq!(w.tcb_requests(), 1);

    // Intel issues new collateral; the cache fetches it once the old is due for a refresh.
    let next = now + Duration::from_secs(3600);
    w.pcs
        .serve_intel(&intel, &["00806f050000"], now, next)
        .unwrap();
    let next = i64::try_from(
        next.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let renewed = loop {
        let got = get(&collateral).await;
        if got.next_update() == next {
            break got;
        }
        assert!(Instant::now() < deadline, "never rebuilt");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!Arc::ptr_eq(&first, &renewed));
    assert_eq!(w.tcb_requests(), 2);
    // Fresh again: kept, and Intel is not asked.
    for _ in 0..100 {
        assert!(Arc::ptr_eq(&renewed, &get(&collateral).await));
    }
    assert_eq!(w.tcb_requests(), 2);
}

/// Past the collateral's nextUpdate (Intel unreachable, the cache serving what it has), the
/// verifier accepts it for the staleness the cache was given, and notes it in the audit; without
/// that allowance the same quote is refused as not current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collateral_past_its_next_update_is_accepted_for_the_caches_staleness() {
    let w = World::start(true).await;
    let at_the_end =
        |collateral: &PcsCollateral| validator(collateral).with_clock(Arc::new(|| WINDOW.1 + 60));
    let stale_ok = w.collateral(None);
    let validator = at_the_end(&stale_ok);
    let (verified, notes) =
        tokio::task::spawn_blocking(move || validator.verify_hardware(&quote()))
            .await
            .unwrap()
            .unwrap();
    assert!(verified.stale);
    assert!(
        notes.iter().any(|n| n.contains("past its nextUpdate")),
        "{notes:?}"
    );

    let strict = PcsCollateral::new(stale_ok.cache().clone(), Duration::ZERO);
    let validator = at_the_end(&strict);
    let error = tokio::task::spawn_blocking(move || validator.verify_hardware(&quote()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(error.to_string().contains("not current"), "{error}");
}
