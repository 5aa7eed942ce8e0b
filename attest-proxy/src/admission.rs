//! The door: whether a new connection may start an attestation, decided at accept before any
//! TLS work, where refusing costs nothing, and again when the client starts talking.
//!
//! Four bounds apply, cheapest first:
//! - per source address, attestations in progress ([`PeerLimit`], `--max-attestations-per-peer`);
//! - globally, connections that have not yet sent their first TLS record (`--max-waiting`): each
//!   holds a socket and a small task, nothing more, until its bytes arrive or the handshake
//!   deadline passes;
//! - per source address, how often it may start one ([`RateLimit`], `--per-peer-rate`);
//! - globally, handshakes in progress (`--max-handshakes`), taken only once the client's first
//!   record has arrived in full: from there a connection holds TLS state and verification work,
//!   so this bounds the memory and the work a crowd can pin, while a crowd that connects and
//!   stays silent (or stalls inside its first record) takes none of these places from the nodes
//!   that talk. A connection that finds them all taken queues for one, first come first served,
//!   for at most `--handshake-queue-wait` (and never past its handshake deadline).
//!
//! A refused connection is closed at once; the node sees its handshake fail and retries with
//! backoff. Behind the door, the verify queue answers `ResourceExhausted` when full, and the
//! handshake deadline sheds whoever does not finish in time.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::peer_limit::{PeerLimit, Slot};
use crate::rate_limit::{self, RateLimit};

/// Why a connection was refused at accept (the `reason` label of `connections_shed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// Its source already has its share of attestations in progress.
    PeerAttestations,
    /// The proxy holds its maximum of connections that have not sent their first record.
    Waiting,
    /// The proxy has its maximum of handshakes in progress.
    Handshakes,
    /// Its source started attestations faster than its rate allows.
    PeerRate,
}

impl Shed {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Shed::PeerAttestations => "peer_attestations",
            Shed::Waiting => "waiting",
            Shed::Handshakes => "handshakes",
            Shed::PeerRate => "peer_rate",
        }
    }
}

/// The limits, shared by the accept loop and every connection.
#[derive(Debug)]
pub struct Admission {
    peers: Option<Arc<PeerLimit>>,
    waiting: Arc<Semaphore>,
    max_waiting: usize,
    handshakes: Arc<Semaphore>,
    max_handshakes: usize,
    rate: Option<RateLimit>,
}

/// An accepted connection's places until its first record has arrived.
#[derive(Debug)]
pub struct Waiting {
    peer: Option<Slot>,
    _waiting: OwnedSemaphorePermit,
}

/// One attesting connection's places; dropped when its attestation ends, which frees them.
#[derive(Debug)]
pub struct Admitted {
    _peer: Option<Slot>,
    _handshake: OwnedSemaphorePermit,
}

impl Admission {
    /// `max_per_peer` and `rate` of zero turn those limits off; `max_waiting` and
    /// `max_handshakes` are at least one.
    pub fn new(
        max_waiting: usize,
        max_handshakes: usize,
        max_per_peer: usize,
        rate: f64,
        burst: u32,
    ) -> Self {
        let max_waiting = max_waiting.clamp(1, Semaphore::MAX_PERMITS);
        let max_handshakes = max_handshakes.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            peers: (max_per_peer > 0).then(|| PeerLimit::new(max_per_peer)),
            waiting: Arc::new(Semaphore::new(max_waiting)),
            max_waiting,
            handshakes: Arc::new(Semaphore::new(max_handshakes)),
            max_handshakes,
            rate: RateLimit::new(rate, burst),
        }
    }

    /// At accept: places for a connection from `ip` to wait for its first record, or why not.
    pub fn admit(&self, ip: IpAddr) -> Result<Waiting, Shed> {
        let peer = match &self.peers {
            Some(peers) => Some(peers.try_acquire(ip).ok_or(Shed::PeerAttestations)?),
            None => None,
        };
        let waiting = self
            .waiting
            .clone()
            .try_acquire_owned()
            .map_err(|_| Shed::Waiting)?;
        // Last, so a connection refused by the other bounds does not use up its source's tokens.
        let limited = self
            .rate
            .as_ref()
            .is_some_and(|rate| rate.check(ip, Instant::now()) == rate_limit::Decision::Limited);
        if limited {
            return Err(Shed::PeerRate);
        }
        Ok(Waiting {
            peer,
            _waiting: waiting,
        })
    }

    /// Once the first record has arrived: a place for the handshake and attestation (the
    /// waiting place is freed, the source's place kept), or why not. When every place is taken,
    /// the connection queues for one in arrival order until `until`, keeping its waiting place
    /// meanwhile (so `--max-waiting` bounds the queue too): a storm's nodes are served as places
    /// free instead of being closed, each to reconnect after a back-off the proxy spends idle.
    pub async fn start(
        &self,
        waiting: Waiting,
        until: tokio::time::Instant,
    ) -> Result<Admitted, Shed> {
        let handshake = match self.handshakes.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => tokio::time::timeout_at(until, self.handshakes.clone().acquire_owned())
                .await
                .map_err(|_| Shed::Handshakes)?
                .map_err(|_| Shed::Handshakes)?,
        };
        Ok(Admitted {
            _peer: waiting.peer,
            _handshake: handshake,
        })
    }

    /// Connections waiting for their first record now.
    pub fn waiting(&self) -> usize {
        self.max_waiting - self.waiting.available_permits()
    }

    /// Handshakes (with their attestations) in progress now.
    pub fn handshakes_in_progress(&self) -> usize {
        self.max_handshakes - self.handshakes.available_permits()
    }

    /// Source addresses the rate limit keeps a bucket for.
    pub fn rate_limited_sources(&self) -> usize {
        self.rate.as_ref().map_or(0, RateLimit::tracked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [10, 0, 0, 2];

    /// Admits and starts one connection from `ip`, refused at once if no place is free.
    async fn attest(door: &Admission, ip: [u8; 4]) -> Result<Admitted, Shed> {
        door.start(door.admit(ip.into())?, tokio::time::Instant::now())
            .await
    }

    #[tokio::test]
    async fn the_global_bound_holds_across_sources_and_frees_on_drop() {
        let door = Admission::new(100, 2, 0, 0.0, 0);
        let first = attest(&door, A).await.unwrap();
        let _second = attest(&door, B).await.unwrap();
        assert_eq!(door.handshakes_in_progress(), 2);
        assert_eq!(
            attest(&door, [10, 0, 0, 3]).await.unwrap_err(),
            Shed::Handshakes
        );
        drop(first);
        assert_eq!(door.handshakes_in_progress(), 1);
        attest(&door, [10, 0, 0, 3]).await.unwrap();
    }

    #[tokio::test]
    async fn connections_waiting_for_their_first_record_take_no_handshake_place() {
        let door = Admission::new(3, 1, 0, 0.0, 0);
        let silent: Vec<_> = [[10, 0, 0, 3], [10, 0, 0, 4]]
            .into_iter()
            .map(|ip| door.admit(ip.into()).unwrap())
            .collect();
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (2, 0));
        // A node that talks still gets the one handshake place.
        let node = attest(&door, A).await.unwrap();
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (2, 1));
        // The waiting bound is its own: full, it refuses at accept.
        let _third = door.admit(B.into()).unwrap();
        assert_eq!(door.admit([10, 0, 0, 5].into()).unwrap_err(), Shed::Waiting);
        drop(silent);
        assert_eq!(door.waiting(), 1);
        // Starting frees the waiting place even when the handshake bound refuses.
        let waiting = door.admit([10, 0, 0, 6].into()).unwrap();
        assert_eq!(
            door.start(waiting, tokio::time::Instant::now())
                .await
                .unwrap_err(),
            Shed::Handshakes
        );
        assert_eq!(door.waiting(), 1);
        drop(node);
        assert_eq!(door.handshakes_in_progress(), 0);
    }

    #[tokio::test]
    async fn a_connection_finding_every_place_taken_queues_for_one_in_arrival_order() {
        let door = Arc::new(Admission::new(100, 1, 0, 0.0, 0));
        let holder = attest(&door, A).await.unwrap();
        let queued = |ip: [u8; 4], wait_ms: u64| {
            let door = door.clone();
            let waiting = door.admit(ip.into()).unwrap();
            let until = tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
            tokio::spawn(async move { door.start(waiting, until).await })
        };
        let first = queued([10, 0, 0, 3], 60_000);
        tokio::task::yield_now().await;
        let second = queued([10, 0, 0, 4], 60_000);
        tokio::task::yield_now().await;
        // Both queue, each keeping its waiting place.
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (2, 1));
        drop(holder);
        let first = first.await.unwrap().unwrap();
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (1, 1));
        assert!(!second.is_finished());
        drop(first);
        let second = second.await.unwrap().unwrap();
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (0, 1));

        // No place frees before the bound: refused then, its waiting place freed.
        let third = queued([10, 0, 0, 5], 100);
        assert_eq!(third.await.unwrap().unwrap_err(), Shed::Handshakes);
        assert_eq!((door.waiting(), door.handshakes_in_progress()), (0, 1));
        drop(second);
    }

    #[tokio::test]
    async fn a_started_connection_keeps_its_sources_place() {
        let door = Admission::new(100, 100, 1, 0.0, 0);
        let started = attest(&door, A).await.unwrap();
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::PeerAttestations);
        drop(started);
        door.admit(A.into()).unwrap();
    }

    #[test]
    fn zero_turns_the_per_source_limits_off() {
        let door = Admission::new(1000, 1000, 0, 0.0, 0);
        // One address (a load balancer) with many connections at once and in quick succession.
        let held: Vec<_> = (0..500).map(|_| door.admit(A.into()).unwrap()).collect();
        assert_eq!(held.len(), 500);
        assert_eq!(door.rate_limited_sources(), 0);
    }

    #[test]
    fn per_source_limits_bind_one_source_only() {
        let door = Admission::new(1000, 1000, 2, 0.0, 0);
        let _a1 = door.admit(A.into()).unwrap();
        let _a2 = door.admit(A.into()).unwrap();
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::PeerAttestations);
        door.admit(B.into()).unwrap();

        let door = Admission::new(1000, 1000, 0, 1.0, 3);
        for _ in 0..3 {
            drop(door.admit(A.into()).unwrap());
        }
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::PeerRate);
        door.admit(B.into()).unwrap();
        assert_eq!(door.rate_limited_sources(), 2);
    }

    #[test]
    fn refusals_by_other_bounds_keep_the_sources_tokens() {
        let door = Admission::new(1, 1000, 0, 1.0, 1);
        let held = door.admit(B.into()).unwrap();
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::Waiting);
        drop(held);
        door.admit(A.into()).unwrap();
    }
}
