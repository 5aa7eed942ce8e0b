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
//! - **Bounded.** With [`CacheConfig::max_entries`], a new item first pushes out items no longer
//!   servable, then the one fetched longest ago (for keys a node names, such as GCE instances).
//! - **Polite.** A failed fetch is not retried for a back-off (the source's `Retry-After` when it
//!   gives one).
//!
//! What the bytes mean is the caller's business: the source parses what it fetched far enough
//! to say when it expires, and the verifier checks it as it checks everything else.
//!
//! The sources: [`kds`], AMD's key distribution service, for SEV-SNP (CRLs, chains, VCEKs);
//! [`pcs`], Intel's Provisioning Certification Service v4, for TDX (TCB info per FMSPC, QE
//! identity, PCK and root CRLs, each with its issuer chain). Both fetch over the same HTTPS
//! client: the system's roots plus an operator's CA, ring, bounded bodies and timeouts.

mod http;
pub mod kds;
pub mod pcs;

pub use http::SetupError;

use std::collections::HashMap;
use std::future::Future;
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

/// Where collateral comes from.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// Fetches `key`. Called with the cache's lock held, so it must return at once: the work
    /// happens when the future runs, on the cache's runtime, and should carry its own timeout.
    fn fetch(&self, key: &str) -> FetchFuture;
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
    /// How long a failed fetch is not retried when the source gave no `Retry-After`.
    pub backoff: Duration,
    /// At most this many items (and as many keys backing off) are kept; `None`: no bound (a
    /// source whose keys the cache's owner names, such as AMD's products and chips).
    pub max_entries: Option<usize>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            max_stale: Duration::from_secs(24 * 3600),
            wait: Duration::from_secs(2),
            backoff: Duration::from_secs(10),
            max_entries: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    bytes: Arc<Vec<u8>>,
    fetched_at: SystemTime,
    refresh_after: SystemTime,
    stale_after: SystemTime,
}

/// The outcome of the one fetch in flight for a key, for everyone waiting on it.
#[derive(Default)]
struct Flight {
    done: Mutex<Option<Result<(), String>>>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    flights: HashMap<String, Arc<Flight>>,
    /// Keys whose last fetch failed: not before this time again.
    not_before: HashMap<String, (SystemTime, String)>,
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
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn file_stem(key: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, key.as_bytes()))
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
            state.entries = load(dir);
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
                let usable_until = entry.stale_after + self.inner.config.max_stale;
                if now < usable_until {
                    // Due for a refresh (or stale within the bound): serve it and refresh.
                    if now < entry.stale_after {
                        self.inner.stats.hits.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.inner.stats.stale_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    self.start_fetch(&mut state, key, now);
                    return Ok(entry.bytes);
                }
            }
            self.inner.stats.misses.fetch_add(1, Ordering::Relaxed);
            match self.start_fetch(&mut state, key, now) {
                Some(flight) => flight,
                None => {
                    let reason = state
                        .not_before
                        .get(key)
                        .map(|(_, reason)| format!("the last fetch failed ({reason}); backing off"))
                        .unwrap_or_else(|| "no fetch possible".to_owned());
                    return Err(self.unavailable(key, reason));
                }
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
            self.start_fetch(&mut state, key, now);
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

    /// Starts the fetch of `key` unless one is in flight (then returns that one) or the key is
    /// backing off (then `None`).
    fn start_fetch(&self, state: &mut State, key: &str, now: SystemTime) -> Option<Arc<Flight>> {
        if let Some(flight) = state.flights.get(key) {
            return Some(flight.clone());
        }
        if let Some((not_before, _)) = state.not_before.get(key) {
            if now < *not_before {
                return None;
            }
        }
        let flight = Arc::new(Flight::default());
        state.flights.insert(key.to_owned(), flight.clone());
        let cache = self.clone();
        let key = key.to_owned();
        let fetch = self.inner.source.fetch(&key);
        self.inner.runtime.spawn(async move {
            let result = fetch.await;
            cache.finish(&key, result);
        });
        Some(flight)
    }

    fn finish(&self, key: &str, result: Result<Fetched, FetchError>) {
        let now = SystemTime::now();
        let outcome = match result {
            Ok(fetched) => {
                self.inner.stats.fetch_ok.fetch_add(1, Ordering::Relaxed);
                let entry = Entry {
                    bytes: Arc::new(fetched.bytes),
                    fetched_at: now,
                    refresh_after: fetched.refresh_after,
                    stale_after: fetched.stale_after,
                };
                if let Some(dir) = &self.inner.config.dir {
                    if let Err(error) = persist(dir, key, &entry) {
                        tracing::warn!(%key, %error, "cannot persist collateral");
                    }
                }
                let mut state = self.lock();
                if let Some(max) = self.inner.config.max_entries {
                    self.make_room(&mut state, key, max, now);
                }
                state.entries.insert(key.to_owned(), entry);
                state.not_before.remove(key);
                Ok(())
            }
            Err(error) => {
                self.inner
                    .stats
                    .fetch_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%key, reason = %error.reason, "collateral fetch failed");
                let backoff = error.retry_after.unwrap_or(self.inner.config.backoff);
                let mut state = self.lock();
                if let Some(max) = self.inner.config.max_entries {
                    if state.not_before.len() >= max {
                        state.not_before.retain(|_, (until, _)| now < *until);
                    }
                    if state.not_before.len() >= max {
                        // Still full of live back-offs: forget the one ending soonest.
                        if let Some(first) = state
                            .not_before
                            .iter()
                            .min_by_key(|(_, (until, _))| *until)
                            .map(|(k, _)| k.clone())
                        {
                            state.not_before.remove(&first);
                        }
                    }
                }
                state
                    .not_before
                    .insert(key.to_owned(), (now + backoff, error.reason.clone()));
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
    /// Makes room for `key` among at most `max` entries: first drop what can no longer be
    /// served, then the item fetched longest ago.
    fn make_room(&self, state: &mut State, key: &str, max: usize, now: SystemTime) {
        if state.entries.contains_key(key) || state.entries.len() < max {
            return;
        }
        let max_stale = self.inner.config.max_stale;
        state.entries.retain(|_, e| now < e.stale_after + max_stale);
        while state.entries.len() >= max.max(1) {
            let Some(oldest) = state
                .entries
                .iter()
                .min_by_key(|(_, e)| e.fetched_at)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            state.entries.remove(&oldest);
        }
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

fn load(dir: &Path) -> HashMap<String, Entry> {
    let mut entries = HashMap::new();
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
                meta.key,
                Entry {
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
