//! The attestation collateral cache.
//!
//! Hardware attestation needs collateral from the vendor: AMD's certificate chains, CRLs and
//! VCEKs, Intel's PCK CRLs, TCB info and QE identity. Vendors rate-limit and have outages, and a
//! join storm asks for the same few items thousands of times. This cache sits between every
//! verification and the [`Source`] (AMD's KDS, Intel's PCS, or an operator's caching proxy):
//!
//! - **Shared, single-flight.** One entry per key for all joins; concurrent misses of one key
//!   cause one fetch.
//! - **Never stalls a join on the network for long.** [`Cache::get`] is synchronous (verifiers
//!   run on blocking threads), answers from memory when it can, and otherwise waits at most
//!   [`CacheConfig::wait`] for the one fetch in flight. No lock is held across a fetch.
//! - **Refreshed ahead of expiry.** Each item says when it should be refreshed (a CRL: some time
//!   before its `nextUpdate`) and when it goes stale. An item past its refresh time is still
//!   served, and a refresh starts in the background.
//! - **Stale, but bounded.** While the source fails, an item is served until `stale_after +
//!   max_stale`, never past it; then [`Unavailable`], which the service turns into a gRPC
//!   `Unavailable` (the node retries) rather than a refusal.
//! - **Persisted.** With a directory (a volume), every fetched item is written there and read
//!   back at start, so a restarted service verifies without asking the vendor.
//! - **Bounded where a node chooses.** The source sorts its keys ([`Source::class`]): the few
//!   every join needs and the service names itself ([`KeyClass::Shared`]: AMD's CRLs and chains,
//!   Intel's QE identity and CRLs), and those a connecting node names before anything it sent is
//!   verified ([`KeyClass::NodeNamed`]: a VCEK's chip ID and TCB, a TDX platform's FMSPC, a GCE
//!   instance). Shared keys are few by construction and never counted, evicted or held back.
//!   With [`CacheConfig::max_entries`], at most that many node-named items are kept, in memory
//!   and in the directory (a new one first pushes out those no longer servable, then the one
//!   fetched longest ago, and its files go with it), at most that many node-named keys back off,
//!   and at most that many node-named fetches are in flight. So a node inventing names costs
//!   bounded memory and disk and can never push out what every join needs.
//! - **Bounded per peer.** With [`CacheConfig::per_peer`], each peer (the address a node connects
//!   from, named by [`for_peer`] around its verification) makes the cache fetch at most so many
//!   distinct node-named keys per window; beyond that its lookups of other keys not cached are
//!   [`Unavailable`] at once, and the source is not asked. Lookups answered from memory, a fetch
//!   already in flight that a lookup joins, and a key fetched for the peer earlier in its window
//!   (a node retrying its own VCEK) cost nothing more. So one peer inventing names spends a
//!   bounded share of the vendor's rate limit, whatever else holds.
//! - **Polite.** A failed fetch is not retried for a back-off (the source's `Retry-After` when it
//!   gives one, at most [`MAX_RETRY_AFTER`]; a node-named key, whose source-wide hold below
//!   carries the `Retry-After`, backs off for [`CacheConfig::backoff`]). A `Retry-After` from the
//!   source also holds back the node-named fetches that source would start, for that long: a
//!   node inventing names cannot turn one vendor's 429 into one more request per name. While the
//!   hold is on, one node-named fetch per [`CacheConfig::probe_interval`] still goes out (the
//!   first asked for by a peer within its own bound): the probe. A probe, or any fetch, that the
//!   source answers lifts the hold at once, so a genuine new node joins once the vendor answers
//!   again rather than when the longest `Retry-After` ends; one that is refused with a new
//!   `Retry-After` extends it. Shared keys are still refreshed when due, each with its own
//!   back-off, so the vendor's rate limit is not spent on names a node made up while the items
//!   every join needs fall stale.
//!
//! - **Bounded by the service, not the source.** Every time taken from a source's answer is
//!   clamped: `Retry-After` to [`MAX_RETRY_AFTER`], an item's refresh and staleness times (a
//!   CRL's or TCB info's `nextUpdate`) to [`MAX_ITEM_LIFETIME`] from now, and sums that would
//!   overflow saturate, so no answer can panic the cache or pause it past a bound.
//!
//! What the bytes mean is the caller's business: the source parses what it fetched far enough
//! to say when it expires, and the verifier checks it as it checks everything else.
//!
//! The sources: [`kds`], AMD's key distribution service, for SEV-SNP (CRLs, chains, VCEKs);
//! [`pcs`], Intel's Provisioning Certification Service v4, for TDX (TCB info per FMSPC, QE
//! identity, PCK and root CRLs, each with its issuer chain). Both fetch over the same HTTPS
//! client: the system's roots plus an operator's CA, aws-lc-rs, bounded bodies and timeouts.

mod http;
pub mod kds;
pub mod pcs;

pub use http::SetupError;

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

/// What a source fetched for a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub bytes: Vec<u8>,
    /// From then on, a refresh is started whenever the item is served.
    pub refresh_after: SystemTime,
    /// From then on the item is stale: served only within [`CacheConfig::max_stale`].
    pub stale_after: SystemTime,
}

/// Why a fetch failed.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{reason}")]
pub struct FetchError {
    pub reason: String,
    /// How long the source asked not to be asked again (HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl FetchError {
    pub fn new(reason: impl Into<String>) -> Self {
        FetchError {
            reason: reason.into(),
            retry_after: None,
        }
    }
}

/// A fetch in progress.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send>>;

/// Who chooses a key, and so how far the cache trusts the number of such keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyClass {
    /// Named by the service itself and needed by every join (a CRL, a chain): a handful, never
    /// evicted, counted against no bound, refreshed whatever node-named keys cost.
    Shared,
    /// Named by what a connecting node sent, before it is verified (a chip ID, an FMSPC, an
    /// instance): as many as nodes care to invent, so bounded and held back source-wide when
    /// the source asks for it.
    NodeNamed,
}

/// Where collateral comes from.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// Fetches `key`. Called with the cache's lock held, so it must return at once: the work
    /// happens when the future runs, on the cache's runtime, and should carry its own timeout.
    fn fetch(&self, key: &str) -> FetchFuture;

    /// Who names `key`. Anything the source does not know as one of its shared keys is
    /// node-named: the safe side, as only such keys are bounded.
    fn class(&self, key: &str) -> KeyClass {
        let _ = key;
        KeyClass::NodeNamed
    }
}

/// The item cannot be had now: none cached (or only one stale past the bound) and the source
/// did not deliver in time.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("collateral {key} is unavailable: {reason}")]
pub struct Unavailable {
    pub key: String,
    pub reason: String,
}

/// How the cache behaves.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Where items are persisted; `None` keeps them in memory only.
    pub dir: Option<PathBuf>,
    /// How long past `stale_after` an item is still served while the source fails.
    pub max_stale: Duration,
    /// How long [`Cache::get`] waits for a fetch when nothing usable is cached.
    pub wait: Duration,
    /// How long a failed fetch is not retried when the source gave no `Retry-After`; also the
    /// shortest time before an item is fetched again (an item served already due for refresh
    /// is not asked for again by every lookup).
    pub backoff: Duration,
    /// At most this many node-named items are kept (and as many node-named keys back off, and
    /// as many node-named fetches are in flight); shared keys are not counted. `None`: no bound,
    /// only for tests and sources whose keys no node names.
    pub max_entries: Option<usize>,
    /// How many node-named keys one peer may make the cache fetch per window; `None`: no bound
    /// per peer (a source whose keys cost the vendor nothing). Lookups made outside [`for_peer`]
    /// are counted against no peer either way.
    pub per_peer: Option<PeerBound>,
    /// While the source's `Retry-After` holds node-named fetches back, one of them still goes
    /// out this often, to learn whether the source answers again.
    pub probe_interval: Duration,
}

/// At most `fetches` distinct node-named keys fetched for one peer within a `window` that begins
/// with its first; fetching again a key it had fetched in the window costs nothing more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerBound {
    pub fetches: usize,
    pub window: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            max_stale: Duration::from_secs(24 * 3600),
            wait: Duration::from_secs(2),
            backoff: Duration::from_secs(10),
            max_entries: None,
            per_peer: None,
            probe_interval: Duration::from_secs(30),
        }
    }
}

thread_local! {
    /// The peer whose verification runs on this thread, as [`for_peer`] set it.
    static PEER: Cell<Option<IpAddr>> = const { Cell::new(None) };
}

/// Runs `f` (a verification, on the thread that calls this) on behalf of `peer`: every node-named
/// fetch a [`Cache::get`] in it starts counts against that peer's [`CacheConfig::per_peer`].
///
/// The peer is carried in a scope on the calling thread rather than as a parameter, because
/// the lookup sits below interfaces that know nothing of connections (a `Validator` validates a
/// document; an `SnpCollateral` or `TdxCollateral` answers for a chip or a platform), and
/// every verifier looks collateral up synchronously on the thread that verifies: the scope
/// covers exactly the lookups of one verification and nothing else, no state is shared across
/// threads, and it ends with `f` (also when `f` panics). A lookup outside any scope (warming at
/// start, the service's own collateral, offline tools) counts against no peer.
pub fn for_peer<T>(peer: IpAddr, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<IpAddr>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PEER.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PEER.with(|p| p.replace(Some(peer))));
    f()
}

/// Whom a peer's fetches are counted for: its IPv4 address, or its IPv6 /64 (the smallest
/// prefix a site is given, so one host cannot make itself many peers).
fn peer_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::from(octets)
            }
        },
    }
}

/// The most peers whose windows are tracked at once; a new peer beyond them, with every
/// tracked window still open, is refused its fetch (it retries once windows end).
const MAX_PEERS: usize = 16_384;

/// A key as a peer's window remembers it: 16 bytes of its SHA-256, so a window costs the same
/// whatever the length of the names, and no name can be made to collide with another.
type KeyDigest = [u8; 16];

fn key_digest(key: &str) -> KeyDigest {
    let mut digest = [0; 16];
    digest.copy_from_slice(
        &aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.as_bytes()).as_ref()[..16],
    );
    digest
}

#[derive(Clone, Debug)]
struct Entry {
    class: KeyClass,
    bytes: Arc<Vec<u8>>,
    fetched_at: SystemTime,
    refresh_after: SystemTime,
    stale_after: SystemTime,
}

/// The outcome of the one fetch in flight for a key, for everyone waiting on it.
struct Flight {
    class: KeyClass,
    done: Mutex<Option<Result<(), String>>>,
    cv: Condvar,
}

/// A key whose last fetch failed.
struct Backoff {
    class: KeyClass,
    /// Not fetched again before then.
    until: SystemTime,
    reason: String,
}

/// The cached items. The node-named ones are also indexed by when they were fetched and by when
/// they stop being servable, so that keeping within [`CacheConfig::max_entries`] costs a few
/// index lookups per insert, not a pass over every item under the lock (a GCE instance is a
/// node-named key, and a cache at its bound would otherwise scan all of them for every new node).
#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    named_by_fetched: BTreeSet<(SystemTime, String)>,
    named_by_stale: BTreeSet<(SystemTime, String)>,
}

impl Entries {
    fn get(&self, key: &str) -> Option<&Entry> {
        self.map.get(key)
    }

    fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.map.iter()
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn node_named(&self) -> usize {
        self.named_by_fetched.len()
    }

    fn insert(&mut self, key: String, entry: Entry) {
        self.remove(&key);
        if entry.class == KeyClass::NodeNamed {
            self.named_by_fetched
                .insert((entry.fetched_at, key.clone()));
            self.named_by_stale.insert((entry.stale_after, key.clone()));
        }
        self.map.insert(key, entry);
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        if entry.class == KeyClass::NodeNamed {
            self.named_by_fetched
                .remove(&(entry.fetched_at, key.to_owned()));
            self.named_by_stale
                .remove(&(entry.stale_after, key.to_owned()));
        }
        Some(entry)
    }

    /// Removes the node-named item fetched longest ago; its key.
    fn pop_oldest_named(&mut self) -> Option<String> {
        let key = self.named_by_fetched.first()?.1.clone();
        self.remove(&key);
        Some(key)
    }

    /// Removes a node-named item no longer servable at `now` (past `stale_after + max_stale`),
    /// if there is one; its key.
    fn pop_unservable_named(&mut self, now: SystemTime, max_stale: Duration) -> Option<String> {
        let (stale_after, key) = self.named_by_stale.first()?;
        if now < later(*stale_after, max_stale) {
            return None;
        }
        let key = key.clone();
        self.remove(&key);
        Some(key)
    }
}

#[derive(Default)]
struct State {
    entries: Entries,
    flights: HashMap<String, Arc<Flight>>,
    not_before: HashMap<String, Backoff>,
    /// The source's last `Retry-After`: until then node-named fetches start only as probes.
    hold: Option<(SystemTime, String)>,
    /// When the last probe started during a hold.
    last_probe: Option<SystemTime>,
    /// Per peer: when its window began and the node-named keys (SHA-256, truncated) it made
    /// the cache fetch in it.
    peers: HashMap<IpAddr, (SystemTime, Vec<KeyDigest>)>,
}

impl State {
    fn node_named_flights(&self) -> usize {
        self.flights
            .values()
            .filter(|f| f.class == KeyClass::NodeNamed)
            .count()
    }
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub hits: AtomicU64,
    pub stale_hits: AtomicU64,
    pub misses: AtomicU64,
    pub fetch_ok: AtomicU64,
    pub fetch_failed: AtomicU64,
    pub unavailable: AtomicU64,
}

/// How much the cache holds now, by [`KeyClass`]: what the bounds are about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub shared: usize,
    pub node_named: usize,
    /// Node-named keys backing off after a failed fetch.
    pub node_named_backing_off: usize,
    /// Node-named fetches in flight.
    pub node_named_in_flight: usize,
}

/// The cache. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    source: Arc<dyn Source>,
    config: CacheConfig,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    stats: Stats,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("source", &self.inner.source)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    key: String,
    fetched_at: u64,
    refresh_after: u64,
    stale_after: u64,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn time(secs: u64) -> SystemTime {
    later(SystemTime::UNIX_EPOCH, Duration::from_secs(secs))
}

/// The longest a source's `Retry-After` is honoured: a vendor (or whoever answers in its name)
/// cannot pause the cache for longer than this, nor make `now + retry_after` overflow.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The furthest ahead an item's refresh or staleness time is taken from a source: a CRL or TCB
/// info whose `nextUpdate` lies decades ahead is still fetched again within this.
pub const MAX_ITEM_LIFETIME: Duration = Duration::from_secs(366 * 24 * 3600);

/// `at + by`, never panicking: when that overflows, `at` plus [`MAX_ITEM_LIFETIME`] (times taken
/// from what a source sent must never panic the cache, which may hold its lock).
fn later(at: SystemTime, by: Duration) -> SystemTime {
    at.checked_add(by)
        .or_else(|| at.checked_add(MAX_ITEM_LIFETIME))
        .unwrap_or(at)
}

/// `t`, but no further than `max` past `now`.
fn at_most(t: SystemTime, now: SystemTime, max: Duration) -> SystemTime {
    t.min(later(now, max))
}

fn file_stem(key: &str) -> String {
    hex::encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        key.as_bytes(),
    ))
}

impl Cache {
    /// A cache over `source` whose fetches run on `runtime`. Items persisted in `config.dir`
    /// are loaded now; unreadable ones are skipped with a warning.
    pub fn new(
        source: Arc<dyn Source>,
        config: CacheConfig,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<Cache> {
        let mut state = State::default();
        if let Some(dir) = &config.dir {
            std::fs::create_dir_all(dir)?;
            state.entries = load(dir, source.as_ref());
            if let Some(max) = config.max_entries {
                // A directory written before the bound (or under a larger one) is cut to it.
                while state.entries.node_named() > max {
                    let Some(oldest) = state.entries.pop_oldest_named() else {
                        break;
                    };
                    forget(dir, &oldest);
                }
            }
        }
        Ok(Cache {
            inner: Arc::new(Inner {
                source,
                config,
                runtime,
                state: Mutex::new(state),
                stats: Stats::default(),
            }),
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The item for `key`: from memory if usable (starting a refresh when it is due), otherwise
    /// from the one fetch in flight, waited for at most [`CacheConfig::wait`].
    pub fn get(&self, key: &str) -> Result<Arc<Vec<u8>>, Unavailable> {
        let now = SystemTime::now();
        let flight = {
            let mut state = self.lock();
            if let Some(entry) = state.entries.get(key).cloned() {
                if now < entry.refresh_after {
                    self.inner.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(entry.bytes);
                }
                let usable_until = later(entry.stale_after, self.inner.config.max_stale);
                if now < usable_until {
                    // Due for a refresh (or stale within the bound): serve it and refresh.
                    if now < entry.stale_after {
                        self.inner.stats.hits.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.inner.stats.stale_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    // Backing off or held: the item is served as it is meanwhile. A refresh
                    // of what is cached is no new name, so it counts against no peer.
                    let _ = self.start_fetch(&mut state, key, now, None);
                    return Ok(entry.bytes);
                }
            }
            self.inner.stats.misses.fetch_add(1, Ordering::Relaxed);
            let peer = PEER.with(Cell::get);
            match self.start_fetch(&mut state, key, now, peer) {
                Ok(flight) => flight,
                Err(reason) => return Err(self.unavailable(key, reason)),
            }
        };
        // Wait for the fetch without holding the state lock.
        let outcome = {
            let done = flight.done.lock().unwrap_or_else(|e| e.into_inner());
            let (done, _) = flight
                .cv
                .wait_timeout_while(done, self.inner.config.wait, |d| d.is_none())
                .unwrap_or_else(|e| e.into_inner());
            done.clone()
        };
        match outcome {
            Some(Ok(())) => {
                let state = self.lock();
                state
                    .entries
                    .get(key)
                    .map(|e| e.bytes.clone())
                    .ok_or_else(|| self.unavailable(key, "fetched but not stored".to_owned()))
            }
            Some(Err(reason)) => Err(self.unavailable(key, reason)),
            None => Err(self.unavailable(
                key,
                format!(
                    "the source did not answer within {:?}; the fetch goes on",
                    self.inner.config.wait
                ),
            )),
        }
    }

    /// Fetches `key` now if it is not cached fresh (for warming at start); does not wait.
    pub fn prefetch(&self, key: &str) {
        let now = SystemTime::now();
        let mut state = self.lock();
        let fresh = state
            .entries
            .get(key)
            .is_some_and(|e| now < e.refresh_after);
        if !fresh {
            let _ = self.start_fetch(&mut state, key, now, None);
        }
    }

    /// How old the oldest cached item whose key starts with `prefix` is (e.g. every CRL).
    pub fn oldest(&self, prefix: &str) -> Option<Duration> {
        let now = SystemTime::now();
        self.lock()
            .entries
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, e)| now.duration_since(e.fetched_at).ok())
            .max()
    }

    /// How many items, back-offs and fetches the cache holds now.
    pub fn counts(&self) -> Counts {
        let state = self.lock();
        let named = |class: &KeyClass| *class == KeyClass::NodeNamed;
        let node_named = state.entries.node_named();
        Counts {
            shared: state.entries.len() - node_named,
            node_named,
            node_named_backing_off: state
                .not_before
                .values()
                .filter(|b| named(&b.class))
                .count(),
            node_named_in_flight: state.node_named_flights(),
        }
    }

    /// How long from now no node-named fetch starts, as the source's last `Retry-After` asked
    /// (at most [`MAX_RETRY_AFTER`]); `None` when nothing is held.
    pub fn held_for(&self) -> Option<Duration> {
        let now = SystemTime::now();
        let state = self.lock();
        let (until, _) = state.hold.as_ref()?;
        until.duration_since(now).ok()
    }

    /// Keys whose items are served stale (past `stale_after`), for a readiness note.
    pub fn stale_keys(&self) -> Vec<String> {
        let now = SystemTime::now();
        let mut keys: Vec<String> = self
            .lock()
            .entries
            .iter()
            .filter(|(_, e)| now >= e.stale_after)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    fn unavailable(&self, key: &str, reason: String) -> Unavailable {
        self.inner.stats.unavailable.fetch_add(1, Ordering::Relaxed);
        Unavailable {
            key: key.to_owned(),
            reason,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the fetch of `key` unless one is in flight (then returns that one); says why not
    /// when the key backs off, or it is node-named and `peer` has had its share of keys fetched,
    /// the node-named fetches in flight are at the bound, or the source asked for a pause and
    /// this is no time for a probe.
    fn start_fetch(
        &self,
        state: &mut State,
        key: &str,
        now: SystemTime,
        peer: Option<IpAddr>,
    ) -> Result<Arc<Flight>, String> {
        if let Some(flight) = state.flights.get(key) {
            return Ok(flight.clone());
        }
        if let Some(backoff) = state.not_before.get(key) {
            if now < backoff.until {
                return Err(format!(
                    "the last fetch failed ({}); backing off",
                    backoff.reason
                ));
            }
        }
        let class = self.inner.source.class(key);
        if class == KeyClass::NodeNamed {
            let counted = match (peer, self.inner.config.per_peer) {
                (Some(peer), Some(bound)) => Some((peer_key(peer), bound)),
                _ => None,
            };
            let counted = match counted {
                Some((peer, bound)) => self
                    .within_peer_bound(state, peer, key, bound, now)?
                    .map(|digest| (peer, digest)),
                None => None,
            };
            if let Some(max) = self.inner.config.max_entries {
                if state.node_named_flights() >= max {
                    return Err(format!(
                        "{max} fetches of keys nodes name are in flight already"
                    ));
                }
            }
            if let Some((until, reason)) = &state.hold {
                if now < *until {
                    let next_probe = state
                        .last_probe
                        .map(|at| later(at, self.inner.config.probe_interval));
                    if let Some(next) = next_probe.filter(|next| now < *next) {
                        let wait = next.duration_since(now).unwrap_or_default();
                        return Err(format!(
                            "the source asked for a pause ({reason}); keys nodes name are fetched only as a probe of whether it answers again, the next in {}s",
                            wait.as_secs().max(1)
                        ));
                    }
                    // This fetch is the probe.
                    state.last_probe = Some(now);
                }
            }
            if let Some((peer, digest)) = counted {
                if let Some((_, keys)) = state.peers.get_mut(&peer) {
                    keys.push(digest);
                }
            }
        }
        let flight = Arc::new(Flight {
            class,
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        state.flights.insert(key.to_owned(), flight.clone());
        let cache = self.clone();
        let key = key.to_owned();
        let fetch = self.inner.source.fetch(&key);
        self.inner.runtime.spawn(async move {
            let result = fetch.await;
            cache.finish(&key, class, result);
        });
        Ok(flight)
    }

    fn finish(&self, key: &str, class: KeyClass, result: Result<Fetched, FetchError>) {
        let now = SystemTime::now();
        let bounded = match class {
            KeyClass::Shared => None,
            KeyClass::NodeNamed => self.inner.config.max_entries,
        };
        let outcome = match result {
            Ok(fetched) => {
                self.inner.stats.fetch_ok.fetch_add(1, Ordering::Relaxed);
                let entry = Entry {
                    class,
                    bytes: Arc::new(fetched.bytes),
                    fetched_at: now,
                    // An item the source serves already due (its issuer has not published the
                    // next one yet, or a clock differs) would otherwise be fetched again by every
                    // lookup, back to back: it is asked for again after a back-off instead.
                    refresh_after: at_most(fetched.refresh_after, now, MAX_ITEM_LIFETIME)
                        .max(later(now, self.inner.config.backoff)),
                    stale_after: at_most(fetched.stale_after, now, MAX_ITEM_LIFETIME),
                };
                if let Some(dir) = &self.inner.config.dir {
                    if let Err(error) = persist(dir, key, &entry) {
                        tracing::warn!(%key, %error, "cannot persist collateral");
                    }
                }
                let mut state = self.lock();
                let evicted = match bounded {
                    Some(max) => self.make_room(&mut state, key, max, now),
                    None => Vec::new(),
                };
                state.entries.insert(key.to_owned(), entry);
                state.not_before.remove(key);
                // The source answers: whatever pause it asked for is over.
                state.hold = None;
                state.last_probe = None;
                drop(state);
                // Outside the lock. Should a pushed-out key's own refresh land in between, it is
                // kept in memory without its files: only its persistence is lost.
                if let Some(dir) = &self.inner.config.dir {
                    for key in &evicted {
                        forget(dir, key);
                    }
                }
                Ok(())
            }
            Err(error) => {
                self.inner
                    .stats
                    .fetch_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%key, reason = %error.reason, "collateral fetch failed");
                let retry_after = error.retry_after.map(|r| r.min(MAX_RETRY_AFTER));
                // A node-named key waits out the source's pause with the hold, probed; its own
                // back-off must not keep it from the probe that finds the source answering.
                let backoff = match (class, retry_after) {
                    (KeyClass::Shared, Some(retry_after)) => retry_after,
                    _ => self.inner.config.backoff,
                };
                let mut state = self.lock();
                if let Some(retry_after) = retry_after {
                    // The source asked to be left alone: whatever key it answered, the keys
                    // nodes name wait with it (shared keys keep their own back-off).
                    let until = later(now, retry_after);
                    if state.hold.as_ref().is_none_or(|(held, _)| *held < until) {
                        state.hold = Some((until, error.reason.clone()));
                    }
                    // The source was just asked: the next probe is an interval from now.
                    state.last_probe = Some(now);
                }
                if let Some(max) = bounded {
                    let named = |b: &Backoff| b.class == KeyClass::NodeNamed;
                    if state.not_before.values().filter(|b| named(b)).count() >= max {
                        state.not_before.retain(|_, b| !named(b) || now < b.until);
                    }
                    while state.not_before.values().filter(|b| named(b)).count() >= max.max(1) {
                        // Still full of live back-offs: forget the one ending soonest.
                        let Some(first) = state
                            .not_before
                            .iter()
                            .filter(|(_, b)| named(b))
                            .min_by_key(|(_, b)| b.until)
                            .map(|(k, _)| k.clone())
                        else {
                            break;
                        };
                        state.not_before.remove(&first);
                    }
                }
                state.not_before.insert(
                    key.to_owned(),
                    Backoff {
                        class,
                        until: later(now, backoff),
                        reason: error.reason.clone(),
                    },
                );
                drop(state);
                Err(error.reason)
            }
        };
        let flight = self.lock().flights.remove(key);
        if let Some(flight) = flight {
            *flight.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            flight.cv.notify_all();
        }
    }
}

impl Cache {
    /// Whether `peer` may make the cache fetch the node-named `key` under `bound`: a key it
    /// had fetched in its current window costs nothing more (a node retrying its own VCEK);
    /// another needs room left in the window (a new one begins once the last has passed).
    /// Returns the key's digest when it is new to the window, to be counted if the fetch starts.
    fn within_peer_bound(
        &self,
        state: &mut State,
        peer: IpAddr,
        key: &str,
        bound: PeerBound,
        now: SystemTime,
    ) -> Result<Option<KeyDigest>, String> {
        let open = |(began, _): &(SystemTime, Vec<KeyDigest>)| now < later(*began, bound.window);
        if state.peers.get(&peer).is_some_and(|w| !open(w)) {
            state.peers.remove(&peer);
        }
        if !state.peers.contains_key(&peer) {
            if state.peers.len() >= MAX_PEERS {
                state.peers.retain(|_, w| open(w));
            }
            if state.peers.len() >= MAX_PEERS {
                return Err(format!(
                    "{MAX_PEERS} peers have fetched keys nodes name within {}s; no new peer fetches until a window ends",
                    bound.window.as_secs()
                ));
            }
            state.peers.insert(peer, (now, Vec::new()));
        }
        let digest = key_digest(key);
        let (began, keys) = &state.peers[&peer];
        if keys.contains(&digest) {
            return Ok(None);
        }
        let (began, started) = (*began, keys.len());
        if started >= bound.fetches {
            let ends = later(began, bound.window)
                .duration_since(now)
                .unwrap_or_default();
            return Err(format!(
                "{peer} has made the cache fetch {started} keys nodes name within {}s, its share; no other for {}s",
                bound.window.as_secs(),
                ends.as_secs().max(1)
            ));
        }
        Ok(Some(digest))
    }

    /// Makes room for the node-named `key` among at most `max` node-named entries: first drop
    /// those that can no longer be served, then the one fetched longest ago. Shared entries
    /// are never touched. Returns the keys dropped, whose files are to go too.
    fn make_room(&self, state: &mut State, key: &str, max: usize, now: SystemTime) -> Vec<String> {
        let mut evicted = Vec::new();
        if state.entries.contains_key(key) || state.entries.node_named() < max {
            return evicted;
        }
        let max_stale = self.inner.config.max_stale;
        while let Some(unservable) = state.entries.pop_unservable_named(now, max_stale) {
            evicted.push(unservable);
        }
        while state.entries.node_named() >= max.max(1) {
            let Some(oldest) = state.entries.pop_oldest_named() else {
                break;
            };
            evicted.push(oldest);
        }
        evicted
    }
}

fn persist(dir: &Path, key: &str, entry: &Entry) -> std::io::Result<()> {
    let stem = file_stem(key);
    let meta = Meta {
        key: key.to_owned(),
        fetched_at: secs(entry.fetched_at),
        refresh_after: secs(entry.refresh_after),
        stale_after: secs(entry.stale_after),
    };
    // Bytes first, then the metadata that makes them count, each through a rename.
    for (name, bytes) in [
        (format!("{stem}.bin"), entry.bytes.as_slice().to_vec()),
        (format!("{stem}.json"), serde_json::to_vec(&meta)?),
    ] {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}

/// Removes `key`'s files: pushed out of a bounded cache, it must not come back at the next start
/// nor hold disk space a node could multiply.
fn forget(dir: &Path, key: &str) {
    let stem = file_stem(key);
    for name in [format!("{stem}.json"), format!("{stem}.bin")] {
        match std::fs::remove_file(dir.join(&name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(%key, %error, "cannot remove evicted collateral"),
        }
    }
}

/// The items a cache persisted in `dir`, by key, as they were fetched (bytes exactly as the
/// source served them): for tools that verify offline with what attest-proxy had
/// (`attest-tool dry-run --collateral-dir`). Files that are not a cache's are skipped.
pub fn persisted(dir: &Path) -> std::io::Result<HashMap<String, Vec<u8>>> {
    let mut items = HashMap::new();
    for file in std::fs::read_dir(dir)?.flatten() {
        let path = file.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(meta) = std::fs::read(&path)
            .ok()
            .and_then(|raw| serde_json::from_slice::<Meta>(&raw).ok())
        else {
            continue;
        };
        if path.file_stem().and_then(|s| s.to_str()) != Some(file_stem(&meta.key).as_str()) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(path.with_extension("bin")) {
            items.insert(meta.key, bytes);
        }
    }
    Ok(items)
}

fn load(dir: &Path, source: &dyn Source) -> Entries {
    let mut entries = Entries::default();
    let Ok(listing) = std::fs::read_dir(dir) else {
        return entries;
    };
    for file in listing.flatten() {
        let path = file.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let loaded = (|| -> Result<(String, Entry), String> {
            let meta: Meta =
                serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            if path.file_stem().and_then(|s| s.to_str()) != Some(file_stem(&meta.key).as_str()) {
                return Err("file name does not match its key".to_owned());
            }
            let bytes = std::fs::read(path.with_extension("bin")).map_err(|e| e.to_string())?;
            Ok((
                meta.key.clone(),
                Entry {
                    class: source.class(&meta.key),
                    bytes: Arc::new(bytes),
                    fetched_at: time(meta.fetched_at),
                    refresh_after: time(meta.refresh_after),
                    stale_after: time(meta.stale_after),
                },
            ))
        })();
        match loaded {
            Ok((key, entry)) => {
                entries.insert(key, entry);
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "skipping persisted collateral")
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(class: KeyClass, fetched_secs: u64, stale_secs: u64) -> Entry {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        Entry {
            class,
            bytes: Arc::new(Vec::new()),
            fetched_at: at(fetched_secs),
            refresh_after: at(stale_secs),
            stale_after: at(stale_secs),
        }
    }

    #[test]
    fn the_indexes_follow_every_insert_replace_and_remove() {
        let mut entries = Entries::default();
        entries.insert("shared".into(), entry(KeyClass::Shared, 1, 10));
        entries.insert("a".into(), entry(KeyClass::NodeNamed, 2, 100));
        entries.insert("b".into(), entry(KeyClass::NodeNamed, 3, 50));
        entries.insert("c".into(), entry(KeyClass::NodeNamed, 5, 300));
        assert_eq!((entries.len(), entries.node_named()), (4, 3));

        // A refresh replaces a's place in both orders: b is now the oldest.
        entries.insert("a".into(), entry(KeyClass::NodeNamed, 4, 200));
        assert_eq!((entries.len(), entries.node_named()), (4, 3));

        // Servability is by stale_after + max_stale; shared items are never offered.
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let max_stale = Duration::from_secs(10);
        assert_eq!(entries.pop_unservable_named(at(59), max_stale), None);
        assert_eq!(
            entries.pop_unservable_named(at(60), max_stale).as_deref(),
            Some("b")
        );
        assert!(entries.get("b").is_none());
        assert_eq!(entries.pop_unservable_named(at(60), max_stale), None);
        assert_eq!((entries.len(), entries.node_named()), (3, 2));

        assert_eq!(entries.pop_oldest_named().as_deref(), Some("a"));
        assert!(entries.remove("a").is_none());
        assert_eq!(
            entries.pop_unservable_named(at(1000), max_stale).as_deref(),
            Some("c")
        );
        assert_eq!((entries.len(), entries.node_named()), (1, 0));
        assert_eq!(entries.pop_oldest_named(), None);
        assert_eq!(entries.pop_unservable_named(at(1000), max_stale), None);
        assert!(entries.remove("shared").is_some());
    }
}
