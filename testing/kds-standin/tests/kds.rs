//! The SNP verifier's collateral through the cache from the KDS stand-in, over real TLS: what
//! nodes leave out is fetched once, and the stand-in's faults never fail a join the cache can
//! serve.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::snp::{Product, SigningKey, SnpCollateral, SnpConfig, Tcb};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Issuer, Measurement, Policy, Validator, Variant};
use collateral::kds::{KdsCollateral, KdsSource, vcek_key};
use collateral::{Cache, CacheConfig};
use kds_standin::{Fault, KdsStandin};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = &[3; 32];
const MIN: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
const CHIP: [u8; 64] = [0x5c; 64];

struct World {
    kds: KdsStandin,
    _ca: tempfile::NamedTempFile,
    collateral: KdsCollateral,
    validator: SevSnpValidator,
    /// An Azure node whose document carries only the report and runtime data.
    node: SnpDocumentIssuer,
}

fn ak() -> SoftIssuer {
    SoftIssuer::new(KeyType::Rsa2048)
        .unwrap()
        .with_pcrs([(4, [0x44; 32])])
        .unwrap()
}

async fn world(cache_dir: Option<&std::path::Path>) -> World {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip(CHIP, MIN, 0).unwrap();
    let kds = KdsStandin::start().await.unwrap();
    kds.put_vcek_chain("Milan", &amd.vcek_chain_pem());
    kds.put_vlek_chain("Milan", &amd.vlek_chain_pem());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    kds.put_vcek_crl("Milan", amd.crl(&[], now - 3600, now + 7 * 86_400).unwrap());
    kds.put_vlek_crl("Milan", amd.crl(&[], now - 3600, now + 7 * 86_400).unwrap());

    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), kds.ca_pem()).unwrap();
    let source = KdsSource::new(kds.url(), Some(ca.path()), Duration::from_secs(2)).unwrap();
    let vcek_url = source.url(&vcek_key(Product::Milan, &CHIP, &MIN)).unwrap();
    kds.put_vcek(
        vcek_url.trim_start_matches(kds.url()),
        vcek.cert_der().to_vec(),
    );

    let config = CacheConfig {
        dir: cache_dir.map(ToOwned::to_owned),
        max_stale: Duration::from_secs(3600),
        wait: Duration::from_millis(1500),
        backoff: Duration::from_millis(300),
        max_entries: None,
        ..CacheConfig::default()
    };
    let cache = Cache::new(Arc::new(source), config, tokio::runtime::Handle::current()).unwrap();
    let collateral = KdsCollateral::new(cache, Duration::from_secs(3600));

    let full =
        SnpDocumentIssuer::azure(ak(), &vcek, &amd.vcek_chain_pem(), ReportFields::default())
            .unwrap();
    let bare = full.instance_info_without_certificates().unwrap();
    let node = SnpDocumentIssuer::from_parts(Variant::AzureSevSnp, ak(), bare);

    let policy = Policy::new(
        [(
            4,
            Measurement {
                expected: vec![0x44; 32],
                warn_only: false,
            },
        )]
        .into_iter()
        .collect(),
    )
    .unwrap();
    let snp = SnpConfig::from_attestation_config(
        serde_json::json!({
            "bootloaderVersion": 3, "teeVersion": 0, "snpVersion": 8, "microcodeVersion": 115,
            "amdRootKey": amd.ark_pem(),
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let validator = SevSnpValidator::new(Binding::Azure, policy, snp, Arc::new(collateral.clone()));
    World {
        kds,
        _ca: ca,
        collateral,
        validator,
        node,
    }
}

/// Validates on a blocking thread, as attest-proxy's verify pool does.
async fn join(w: &World) -> Result<attestation::Verified, attestation::Error> {
    let doc = w.node.issue(&[1; 32], NONCE).unwrap();
    let validator = w.validator.clone();
    tokio::task::spawn_blocking(move || validator.validate(&doc, NONCE))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_node_left_out_is_fetched_once_and_faults_do_not_fail_cached_joins() {
    let mut w = world(None).await;
    join(&w).await.unwrap();
    let fetched = w.kds.requests();
    assert_eq!(
        fetched,
        3,
        "VCEK, chain and CRL, once each: {:?}",
        w.kds.paths()
    );
    for _ in 0..20 {
        join(&w).await.unwrap();
    }
    assert_eq!(w.kds.requests(), fetched, "warm joins fetch nothing");

    // The KDS rate-limits, errs, hangs, goes away: every join is answered from the cache.
    for fault in [
        Fault::RateLimited { retry_after: 60 },
        Fault::ServerError,
        Fault::Hang,
    ] {
        w.kds.set_fault(fault);
        for _ in 0..5 {
            join(&w).await.unwrap();
        }
    }
    w.kds.stop();
    for _ in 0..5 {
        join(&w).await.unwrap();
    }
    assert!(
        w.collateral
            .cache()
            .stats()
            .hits
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 60
    );
}

/// `Retry-After: 18446744073709551615`: clamped, not a panic in the fetch task that left the CRL
/// in flight, so that every join answered Unavailable until restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_from_the_kds_is_clamped() {
    let w = world(None).await;
    w.kds.set_fault(Fault::RateLimited {
        retry_after: u64::MAX,
    });
    let error = join(&w).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("429"), "{error}");
    let held = w.collateral.cache().held_for().unwrap();
    assert!(held <= collateral::MAX_RETRY_AFTER, "held {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_cached_a_rate_limited_kds_is_unavailable_fast_and_joins_recover() {
    let w = world(None).await;
    w.kds.set_fault(Fault::RateLimited { retry_after: 1 });
    let started = Instant::now();
    let error = join(&w).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(error.to_string().contains("429"), "{error}");
    // Within Retry-After the KDS is not asked again.
    let asked = w.kds.requests();
    for _ in 0..5 {
        assert!(join(&w).await.unwrap_err().is_unavailable());
    }
    assert_eq!(w.kds.requests(), asked);

    w.kds.set_fault(Fault::None);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut joined = false;
    for _ in 0..10 {
        if join(&w).await.is_ok() {
            joined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(joined, "joins recover once the KDS answers again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_kds_is_unavailable_within_the_wait() {
    let w = world(None).await;
    w.kds.set_fault(Fault::Hang);
    let started = Instant::now();
    let error = join(&w).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_service_verifies_from_its_persisted_cache_without_the_kds() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = world(Some(dir.path())).await;
    join(&w).await.unwrap();
    w.kds.stop();
    // A restart: a fresh cache over the same directory, and no KDS to be reached at all.
    let unreachable =
        KdsSource::new("https://127.0.0.1:9", None, Duration::from_millis(500)).unwrap();
    let config = CacheConfig {
        dir: Some(dir.path().to_owned()),
        ..CacheConfig::default()
    };
    let cache = Cache::new(
        Arc::new(unreachable),
        config,
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    w.validator = w
        .validator
        .clone()
        .with_collateral(Arc::new(KdsCollateral::new(
            cache,
            Duration::from_secs(3600),
        )));
    join(&w).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warming_fetches_crls_and_chains_ahead_of_the_first_join() {
    let w = world(None).await;
    w.collateral.warm(&[Product::Milan]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let paths = w.kds.paths();
    for path in [
        "/vcek/v1/Milan/crl",
        "/vlek/v1/Milan/crl",
        "/vcek/v1/Milan/cert_chain",
        "/vlek/v1/Milan/cert_chain",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} in {paths:?}");
    }
    for key in [SigningKey::Vcek, SigningKey::Vlek] {
        assert!(w.collateral.crl(Product::Milan, key).is_ok());
    }
}
