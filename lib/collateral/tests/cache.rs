//! The cache against a source that answers, fails, rate-limits and hangs as told.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use collateral::{
    Cache, CacheConfig, Counts, FetchError, FetchFuture, Fetched, KeyClass, PeerBound, Source,
};

#[derive(Clone, Debug)]
enum Mode {
    /// Answer with these bytes after a delay; refresh after / stale after, from now.
    Answer(&'static [u8], Duration, Duration, Duration),
    Fail(Option<Duration>),
    Hang,
}

#[derive(Debug)]
struct Fake {
    mode: Mutex<Mode>,
    fetches: AtomicUsize,
}

impl Fake {
    fn new(mode: Mode) -> Arc<Fake> {
        Arc::new(Fake {
            mode: Mutex::new(mode),
            fetches: AtomicUsize::new(0),
        })
    }
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Source for Fake {
    fn fetch(&self, _key: &str) -> FetchFuture {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let mode = self.mode.lock().unwrap().clone();
        Box::pin(async move {
            match mode {
                Mode::Answer(bytes, delay, refresh, stale) => {
                    tokio::time::sleep(delay).await;
                    let now = SystemTime::now();
                    // Past what the clock holds: some 35,000 years from the epoch.
                    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 40);
                    Ok(Fetched {
                        bytes: bytes.to_vec(),
                        refresh_after: now.checked_add(refresh).unwrap_or(far),
                        stale_after: now.checked_add(stale).unwrap_or(far),
                    })
                }
                Mode::Fail(retry_after) => Err(FetchError {
                    reason: "HTTP 429".into(),
                    retry_after,
                }),
                Mode::Hang => futures::future::pending().await,
            }
        })
    }

    /// As a vendor source sorts its keys: `shared/...` is what every join needs.
    fn class(&self, key: &str) -> KeyClass {
        if key.starts_with("shared/") {
            KeyClass::Shared
        } else {
            KeyClass::NodeNamed
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);
const ZERO: Duration = Duration::ZERO;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config() -> CacheConfig {
    CacheConfig {
        dir: None,
        max_stale: HOUR,
        wait: Duration::from_millis(500),
        backoff: Duration::from_millis(200),
        max_entries: None,
        ..CacheConfig::default()
    }
}

#[test]
fn concurrent_misses_cause_one_fetch_and_hits_none() {
    let rt = runtime();
    let source = Fake::new(Mode::Answer(
        b"crl",
        Duration::from_millis(100),
        HOUR,
        2 * HOUR,
    ));
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let cache = cache.clone();
            std::thread::spawn(move || cache.get("crl/Milan").unwrap())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().as_slice(), b"crl");
    }
    assert_eq!(source.fetches(), 1);
    for _ in 0..100 {
        cache.get("crl/Milan").unwrap();
    }
    assert_eq!(source.fetches(), 1);
    assert!(cache.stats().hits.load(Ordering::Relaxed) >= 100);
}

#[test]
fn an_item_due_for_refresh_is_served_and_refreshed_in_the_background() {
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"old", ZERO, ZERO, HOUR));
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    assert_eq!(cache.get("k").unwrap().as_slice(), b"old");
    source.set(Mode::Answer(b"new", Duration::from_millis(50), HOUR, HOUR));
    // Served already due, it is asked for again only after the back-off.
    std::thread::sleep(config().backoff + Duration::from_millis(50));
    // Due for refresh: served at once, the refresh runs behind it.
    assert_eq!(cache.get("k").unwrap().as_slice(), b"old");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(cache.get("k").unwrap().as_slice(), b"new");
    assert_eq!(source.fetches(), 2);
}

/// A source that serves an item already due for refresh (the vendor has not published the next
/// one yet) must not be asked again by every lookup: once per back-off.
#[test]
fn an_item_served_already_due_is_not_fetched_again_by_every_lookup() {
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"crl", ZERO, ZERO, HOUR));
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    let started = Instant::now();
    let mut lookups = 0;
    while started.elapsed() < Duration::from_millis(500) {
        assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"crl");
        lookups += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // 500 ms with a 200 ms back-off: the first fetch and at most two refreshes, not one per
    // lookup.
    assert!(lookups > 50, "{lookups}");
    assert!(source.fetches() <= 3, "{} fetches", source.fetches());
    assert!(source.fetches() >= 2, "refreshed after the back-off");
}

#[test]
fn stale_items_are_served_within_the_bound_while_the_source_fails_and_never_past_it() {
    let rt = runtime();
    // Stale at once; the bound is 300 ms past that.
    let source = Fake::new(Mode::Answer(b"crl", ZERO, ZERO, ZERO));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_stale: Duration::from_millis(300),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    cache.get("k").unwrap();
    source.set(Mode::Fail(None));
    assert_eq!(cache.get("k").unwrap().as_slice(), b"crl");
    assert_eq!(cache.stale_keys(), ["k"]);
    std::thread::sleep(Duration::from_millis(400));
    let error = cache.get("k").unwrap_err();
    assert_eq!(error.key, "k");
}

#[test]
fn nothing_cached_and_a_hanging_source_is_unavailable_within_the_wait() {
    let rt = runtime();
    let source = Fake::new(Mode::Hang);
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    let started = Instant::now();
    let error = cache.get("k").unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert!(error.reason.contains("did not answer"), "{error}");
    // The fetch in flight is joined, not repeated.
    let _ = cache.get("k");
    assert_eq!(source.fetches(), 1);
}

/// A source's `Retry-After` or item lifetime beyond what `SystemTime` holds: the cache clamps it
/// rather than overflowing `now + retry_after` in its fetch task (which left the key in flight,
/// answering Unavailable until restart).
#[test]
fn a_huge_retry_after_or_lifetime_is_clamped_not_a_panic() {
    let rt = runtime();
    for key in ["node/chip", "shared/crl/Milan"] {
        let source = Fake::new(Mode::Fail(Some(Duration::MAX)));
        let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
        let err = cache.get(key).unwrap_err();
        assert!(err.reason.contains("429"), "{key}: {err}");
        let held = cache.held_for().expect("the source's pause is honoured");
        assert!(held <= collateral::MAX_RETRY_AFTER, "{key}: held {held:?}");
        assert!(cache.get(key).unwrap_err().reason.contains("backing off"));
        assert_eq!(source.fetches(), 1);
    }
    // An item whose refresh and staleness lie past what the clock holds is served, and due
    // again within the bound.
    let source = Fake::new(Mode::Answer(b"ok", ZERO, Duration::MAX, Duration::MAX));
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"ok");
    assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"ok");
    assert_eq!(source.fetches(), 1);
}

#[test]
fn a_failed_fetch_backs_off_for_the_sources_retry_after_then_recovers() {
    let rt = runtime();
    let source = Fake::new(Mode::Fail(Some(Duration::from_millis(300))));
    let cache = Cache::new(source.clone(), config(), rt.handle().clone()).unwrap();
    assert!(cache.get("k").unwrap_err().reason.contains("429"));
    // Within Retry-After: no new request to the source.
    for _ in 0..10 {
        assert!(cache.get("k").unwrap_err().reason.contains("backing off"));
    }
    assert_eq!(source.fetches(), 1);
    source.set(Mode::Answer(b"ok", ZERO, HOUR, HOUR));
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(cache.get("k").unwrap().as_slice(), b"ok");
    assert_eq!(source.fetches(), 2);
}

#[test]
fn items_persist_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let persisted = CacheConfig {
        dir: Some(dir.path().to_owned()),
        ..config()
    };
    {
        let rt = runtime();
        let source = Fake::new(Mode::Answer(b"vcek", ZERO, HOUR, HOUR));
        let cache = Cache::new(source, persisted.clone(), rt.handle().clone()).unwrap();
        cache.get("vcek/Milan/abc").unwrap();
    }
    let rt = runtime();
    let down = Fake::new(Mode::Fail(None));
    let cache = Cache::new(down.clone(), persisted, rt.handle().clone()).unwrap();
    assert_eq!(cache.get("vcek/Milan/abc").unwrap().as_slice(), b"vcek");
    assert_eq!(down.fetches(), 0);
    assert!(cache.oldest("vcek/").is_some());
    assert!(cache.oldest("crl/").is_none());
}

#[test]
fn a_corrupt_persisted_item_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("00.json"), b"{not json").unwrap();
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"x", ZERO, HOUR, HOUR));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            dir: Some(dir.path().to_owned()),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    assert_eq!(cache.get("k").unwrap().as_slice(), b"x");
    assert_eq!(source.fetches(), 1);
}

#[test]
fn a_bounded_cache_pushes_out_the_oldest_item() {
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"key", ZERO, HOUR, HOUR));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(2),
            backoff: HOUR,
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    cache.get("a").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    cache.get("b").unwrap();
    cache.get("c").unwrap();
    assert_eq!(source.fetches(), 3);
    // b and c are held; a was pushed out and is fetched again.
    cache.get("b").unwrap();
    cache.get("c").unwrap();
    assert_eq!(source.fetches(), 3);
    cache.get("a").unwrap();
    assert_eq!(source.fetches(), 4);

    // Failed keys back off, and their number is bounded too (no Retry-After: that would hold
    // every key nodes name, see below).
    source.set(Mode::Fail(None));
    for key in ["x", "y", "z"] {
        assert!(cache.get(key).is_err());
    }
    assert_eq!(source.fetches(), 7);
    // "x" backed off first and was forgotten: it is asked again, "z" is not.
    assert!(cache.get("z").is_err());
    assert_eq!(source.fetches(), 7);
    assert!(cache.get("x").is_err());
    assert_eq!(source.fetches(), 8);
}

/// Every join's items, fetched first; then a node invents chip IDs or FMSPCs.
const SHARED: [&str; 3] = [
    "shared/crl/Milan",
    "shared/chain/vcek/Milan",
    "shared/qe/identity",
];

fn files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn invented_keys_never_push_out_the_shared_items_and_stay_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"item", ZERO, HOUR, 2 * HOUR));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            dir: Some(dir.path().to_owned()),
            max_entries: Some(4),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    for key in SHARED {
        cache.get(key).unwrap();
    }
    for i in 0..40 {
        std::thread::sleep(Duration::from_millis(2));
        cache.get(&format!("vcek/Milan/{i:064x}")).unwrap();
    }
    assert_eq!(source.fetches(), 3 + 40);
    // The shared items are still there: served without asking the source.
    for key in SHARED {
        assert_eq!(cache.get(key).unwrap().as_slice(), b"item");
    }
    assert_eq!(source.fetches(), 3 + 40);
    let counts = cache.counts();
    assert_eq!((counts.shared, counts.node_named), (3, 4), "{counts:?}");
    // Two files per item, no more on disk than in memory.
    assert_eq!(files(dir.path()), 2 * (3 + 4));
    // The newest invented items are the ones kept.
    cache.get(&format!("vcek/Milan/{:064x}", 39)).unwrap();
    assert_eq!(source.fetches(), 3 + 40);

    // The source fails now: invented keys fail and back off, within the bound, and the shared
    // items are still served.
    source.set(Mode::Fail(None));
    for i in 100..140 {
        assert!(cache.get(&format!("vcek/Milan/{i:064x}")).is_err());
    }
    for key in SHARED {
        assert_eq!(cache.get(key).unwrap().as_slice(), b"item");
    }
    let counts = cache.counts();
    assert_eq!(
        counts,
        Counts {
            shared: 3,
            node_named: 4,
            node_named_backing_off: 4,
            node_named_in_flight: 0,
        }
    );

    // A restart reads back what the directory holds: the shared items and the bounded rest.
    drop(cache);
    let restarted = Cache::new(
        source.clone(),
        CacheConfig {
            dir: Some(dir.path().to_owned()),
            max_entries: Some(4),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    let before = source.fetches();
    for key in SHARED {
        assert_eq!(restarted.get(key).unwrap().as_slice(), b"item");
    }
    assert_eq!(source.fetches(), before);
    assert_eq!(restarted.counts().node_named, 4);
}

#[test]
fn shared_items_due_for_refresh_are_refreshed_while_invented_keys_churn() {
    let rt = runtime();
    // Due for a refresh at once, stale in an hour.
    let source = Fake::new(Mode::Answer(b"v1", ZERO, ZERO, HOUR));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(2),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    cache.get("shared/crl/Milan").unwrap();
    source.set(Mode::Answer(b"v2", ZERO, HOUR, 2 * HOUR));
    // Served already due, it is asked for again only after the back-off.
    std::thread::sleep(config().backoff + Duration::from_millis(50));
    for i in 0..20 {
        cache.get(&format!("vcek/Milan/{i}")).unwrap();
    }
    // Served the old bytes while due, refreshed behind it, then the new ones from memory.
    assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"v1");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"v2");
    assert_eq!(source.fetches(), 1 + 20 + 1);
}

#[test]
fn a_retry_after_on_an_invented_key_holds_every_invented_key_but_not_the_shared_ones() {
    let rt = runtime();
    let source = Fake::new(Mode::Fail(Some(Duration::from_millis(400))));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(64),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    assert!(
        cache
            .get("vcek/Milan/0")
            .unwrap_err()
            .reason
            .contains("429")
    );
    assert_eq!(source.fetches(), 1);
    // The vendor would answer now, but it asked for 400 ms: no invented key reaches it.
    source.set(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    for i in 1..50 {
        let error = cache.get(&format!("vcek/Milan/{i}")).unwrap_err();
        assert!(error.reason.contains("asked for a pause"), "{error}");
    }
    assert_eq!(source.fetches(), 1);
    // What every join needs is still fetched.
    assert_eq!(cache.get("shared/crl/Milan").unwrap().as_slice(), b"item");
    assert_eq!(source.fetches(), 2);
    // Once Retry-After has passed, keys nodes name are fetched again.
    std::thread::sleep(Duration::from_millis(450));
    assert_eq!(cache.get("vcek/Milan/1").unwrap().as_slice(), b"item");
    assert_eq!(source.fetches(), 3);
}

#[test]
fn node_named_fetches_in_flight_are_bounded() {
    let rt = runtime();
    let source = Fake::new(Mode::Hang);
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(3),
            wait: Duration::from_millis(10),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    for i in 0..10 {
        assert!(cache.get(&format!("vcek/Milan/{i}")).is_err());
    }
    assert_eq!(source.fetches(), 3);
    assert_eq!(cache.counts().node_named_in_flight, 3);
    // A shared key is not held up by them.
    assert!(cache.get("shared/crl/Milan").is_err());
    assert_eq!(source.fetches(), 4);
}

#[test]
fn a_directory_over_the_bound_is_cut_to_it_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    let unbounded = Cache::new(
        source.clone(),
        CacheConfig {
            dir: Some(dir.path().to_owned()),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    unbounded.get("shared/crl/Milan").unwrap();
    for i in 0..10 {
        unbounded.get(&format!("vcek/Milan/{i}")).unwrap();
    }
    assert_eq!(files(dir.path()), 2 * 11);
    drop(unbounded);
    let bounded = Cache::new(
        source.clone(),
        CacheConfig {
            dir: Some(dir.path().to_owned()),
            max_entries: Some(3),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    assert_eq!(bounded.counts().shared, 1);
    assert_eq!(bounded.counts().node_named, 3);
    assert_eq!(files(dir.path()), 2 * 4);
}

fn peer(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, last])
}

#[test]
fn each_peer_starts_at_most_its_share_of_node_named_fetches_per_window() {
    let rt = runtime();
    let source = Fake::new(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(64),
            per_peer: Some(PeerBound {
                fetches: 3,
                window: Duration::from_millis(400),
            }),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    // An inventing peer: three fetches, then refused without asking the source.
    for i in 0..10 {
        let got = collateral::for_peer(peer(2), || cache.get(&format!("vcek/Milan/{i}")));
        if i < 3 {
            assert_eq!(got.unwrap().as_slice(), b"item");
        } else {
            let error = got.unwrap_err();
            assert!(
                error
                    .reason
                    .contains("127.0.0.2 has made the cache fetch 3"),
                "{error}"
            );
        }
    }
    assert_eq!(source.fetches(), 3);
    // A key a peer had fetched is fetched again at no cost to its share (a node retrying its
    // own VCEK).
    source.set(Mode::Fail(None));
    assert!(collateral::for_peer(peer(4), || cache.get("vcek/Milan/x")).is_err());
    source.set(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    std::thread::sleep(Duration::from_millis(250));
    assert!(collateral::for_peer(peer(4), || cache.get("vcek/Milan/x")).is_ok());
    for key in ["y", "z"] {
        assert!(collateral::for_peer(peer(4), || cache.get(&format!("vcek/Milan/{key}"))).is_ok());
    }
    assert!(collateral::for_peer(peer(4), || cache.get("vcek/Milan/w")).is_err());
    assert_eq!(source.fetches(), 7);
    // What is cached is served to it at no cost, and shared keys are not counted.
    collateral::for_peer(peer(2), || {
        assert!(cache.get("vcek/Milan/0").is_ok());
        assert!(cache.get("shared/crl/Milan").is_ok());
    });
    assert_eq!(source.fetches(), 8);
    // Another peer, and lookups on behalf of none (warming, tools), have their own.
    assert!(collateral::for_peer(peer(1), || cache.get("vcek/Milan/genuine")).is_ok());
    assert!(cache.get("vcek/Milan/unattributed").is_ok());
    assert_eq!(source.fetches(), 10);
    // An IPv6 peer is counted by its /64: other addresses in it share its window.
    for i in 0..4u16 {
        let v6 = std::net::IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i + 1]);
        let got = collateral::for_peer(v6, || cache.get(&format!("vcek/Milan/v6-{i}")));
        assert_eq!(got.is_ok(), i < 3, "{i}: {got:?}");
    }
    assert_eq!(source.fetches(), 13);
    // Once its window has passed, the peer has a new share.
    std::thread::sleep(Duration::from_millis(450));
    assert!(collateral::for_peer(peer(2), || cache.get("vcek/Milan/9")).is_ok());
    assert_eq!(source.fetches(), 14);
}

#[test]
fn during_a_retry_after_a_probe_goes_out_per_interval_and_an_answer_lifts_the_hold() {
    let rt = runtime();
    let source = Fake::new(Mode::Fail(Some(HOUR)));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(64),
            per_peer: Some(PeerBound {
                fetches: 2,
                window: HOUR,
            }),
            probe_interval: Duration::from_millis(300),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    // An inventing peer spends its share; the source answers 429 with an hour's Retry-After.
    // (Its second fetch is the probe due once the interval after the first has passed.)
    for i in 0..2 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(350));
        }
        assert!(collateral::for_peer(peer(2), || cache.get(&format!("vcek/Milan/{i}"))).is_err());
    }
    assert_eq!(source.fetches(), 2);
    assert!(cache.held_for().unwrap() > Duration::from_secs(3000));
    // Within the probe interval nothing goes out, for any peer.
    let error = collateral::for_peer(peer(1), || cache.get("vcek/Milan/genuine")).unwrap_err();
    assert!(error.reason.contains("only as a probe"), "{error}");
    assert_eq!(source.fetches(), 2);
    // The source answers again. The probe due now is not the inventing peer's (it is over its
    // share) but the next peer's, and its answer lifts the hold at once.
    source.set(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    std::thread::sleep(Duration::from_millis(350));
    let error = collateral::for_peer(peer(2), || cache.get("vcek/Milan/9")).unwrap_err();
    assert!(error.reason.contains("its share"), "{error}");
    assert_eq!(source.fetches(), 2);
    let got = collateral::for_peer(peer(1), || cache.get("vcek/Milan/genuine"));
    assert_eq!(got.unwrap().as_slice(), b"item");
    assert_eq!(cache.held_for(), None);
    assert!(collateral::for_peer(peer(3), || cache.get("vcek/Milan/another")).is_ok());
    assert_eq!(source.fetches(), 4);
}

#[test]
fn a_node_named_key_refused_with_retry_after_is_not_kept_from_the_next_probe() {
    let rt = runtime();
    let source = Fake::new(Mode::Fail(Some(HOUR)));
    let cache = Cache::new(
        source.clone(),
        CacheConfig {
            max_entries: Some(64),
            probe_interval: Duration::from_millis(300),
            ..config()
        },
        rt.handle().clone(),
    )
    .unwrap();
    assert!(cache.get("vcek/Milan/genuine").is_err());
    source.set(Mode::Answer(b"item", ZERO, HOUR, HOUR));
    // Its own back-off is the cache's (200 ms here), not the source's hour.
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(cache.get("vcek/Milan/genuine").unwrap().as_slice(), b"item");
    assert_eq!(source.fetches(), 2);
}
