//! A token bucket per source address: how often one address may start an attestation.
//!
//! The per-source cap on attestations in progress ([`crate::peer_limit`]) bounds what one address
//! holds at a time, but not how fast it cycles: a client that aborts each handshake after the
//! ClientHello and reconnects costs the proxy a TLS setup every round. A node makes one join and,
//! refused, retries with backoff, so a few attempts per second per address is generous for it.
//!
//! The table must stay bounded whatever the sources: a bucket that has been idle long enough to
//! fill up again is indistinguishable from a new one and is dropped by the next sweep, which
//! runs when the table has doubled since the last one (amortised O(1) per connection). If even
//! after a sweep [`MAX_SOURCES`] addresses are active, further new addresses are admitted without
//! a bucket (counted as `untracked`): refusing them would let whoever controls many addresses
//! lock out every new node, and they still meet the global handshake bound and the per-source
//! concurrency cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Most addresses with a bucket at once (a few MiB of memory).
pub const MAX_SOURCES: usize = 65_536;

/// The table is not swept below this many entries.
const MIN_SWEEP: usize = 1024;

/// The answer for one new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted; a token was taken from the source's bucket.
    Allowed,
    /// Admitted without a bucket because the table is full of active sources.
    Untracked,
    /// The source's bucket is empty.
    Limited,
}

/// Per-source token buckets.
#[derive(Debug)]
pub struct RateLimit {
    /// Tokens per second.
    rate: f64,
    /// Bucket size: attempts a source may make at once after being idle.
    burst: f64,
    max_sources: usize,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Table {
    buckets: HashMap<IpAddr, Bucket>,
    next_sweep: usize,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl Bucket {
    /// The tokens at `now`, refilled since the last update.
    fn level(&self, now: Instant, rate: f64, burst: f64) -> f64 {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        (self.tokens + elapsed * rate).min(burst)
    }
}

impl RateLimit {
    /// `rate` attempts per second per source with bursts of `burst` (at least one); `None` if
    /// `rate` is zero (turned off).
    pub fn new(rate: f64, burst: u32) -> Option<Self> {
        Self::with_max_sources(rate, burst, MAX_SOURCES)
    }

    fn with_max_sources(rate: f64, burst: u32, max_sources: usize) -> Option<Self> {
        if rate <= 0.0 || !rate.is_finite() {
            return None;
        }
        Some(Self {
            rate,
            burst: f64::from(burst.max(1)),
            max_sources,
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                next_sweep: MIN_SWEEP.min(max_sources),
            }),
        })
    }

    /// Takes a token for one connection from `ip` at `now`.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Decision {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = table.buckets.get_mut(&ip) {
            let level = bucket.level(now, self.rate, self.burst);
            if level < 1.0 {
                return Decision::Limited;
            }
            *bucket = Bucket {
                tokens: level - 1.0,
                updated: now,
            };
            return Decision::Allowed;
        }
        if table.buckets.len() >= table.next_sweep {
            self.sweep(&mut table, now);
        }
        if table.buckets.len() >= self.max_sources {
            return Decision::Untracked;
        }
        table.buckets.insert(
            ip,
            Bucket {
                tokens: self.burst - 1.0,
                updated: now,
            },
        );
        Decision::Allowed
    }

    /// Sources with a bucket now (full buckets not yet swept included).
    pub fn tracked(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .buckets
            .len()
    }

    /// Drops the buckets that have filled up again, and schedules the next sweep for when the
    /// table has doubled.
    fn sweep(&self, table: &mut Table, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        table
            .buckets
            .retain(|_, bucket| bucket.level(now, rate, burst) < burst);
        table.next_sweep = (table.buckets.len() * 2)
            .max(MIN_SWEEP)
            .min(self.max_sources);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    #[test]
    fn zero_rate_turns_it_off() {
        assert!(RateLimit::new(0.0, 10).is_none());
        assert!(RateLimit::new(1.0, 0).is_some());
    }

    #[test]
    fn allows_a_burst_then_the_rate() {
        let limit = RateLimit::new(2.0, 3).unwrap();
        let t0 = Instant::now();
        let a = ip(1);
        for _ in 0..3 {
            assert_eq!(limit.check(a, t0), Decision::Allowed);
        }
        assert_eq!(limit.check(a, t0), Decision::Limited);
        // Another source has its own bucket.
        assert_eq!(limit.check(ip(2), t0), Decision::Allowed);
        // Half a second at 2/s refills one token.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(limit.check(a, t1), Decision::Allowed);
        assert_eq!(limit.check(a, t1), Decision::Limited);
        // Refused attempts take nothing: after a long pause the burst is back, not more.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(limit.check(a, t2), Decision::Allowed);
        }
        assert_eq!(limit.check(a, t2), Decision::Limited);
    }

    #[test]
    fn idle_sources_are_evicted_and_the_table_stays_bounded() {
        let limit = RateLimit::new(10.0, 2).unwrap();
        let t0 = Instant::now();
        // Many sources, each seen once, one a millisecond: a bucket fills again 0.1 s after its
        // only use (one token at 10/s), so about 100 are active at any time and the rest go.
        for n in 0..100_000u32 {
            let now = t0 + Duration::from_millis(u64::from(n));
            assert_eq!(limit.check(ip(n), now), Decision::Allowed);
        }
        assert!(limit.tracked() <= MIN_SWEEP, "{}", limit.tracked());
    }

    #[test]
    fn a_full_table_of_active_sources_admits_new_ones_untracked() {
        let limit = RateLimit::with_max_sources(1.0, 1, 4).unwrap();
        let t0 = Instant::now();
        for n in 0..4 {
            assert_eq!(limit.check(ip(n), t0), Decision::Allowed);
        }
        assert_eq!(limit.check(ip(9), t0), Decision::Untracked);
        assert_eq!(limit.check(ip(0), t0), Decision::Limited);
        // Once the tracked sources are idle long enough, new ones get buckets again.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(limit.check(ip(9), later), Decision::Allowed);
        assert_eq!(limit.tracked(), 1);
    }
}
