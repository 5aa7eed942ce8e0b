//! The door: whether a new connection may start an attestation, decided at accept before any
//! TLS work, where refusing costs nothing.
//!
//! Three bounds apply, cheapest first:
//! - per source address, attestations in progress ([`PeerLimit`], `--max-attestations-per-peer`);
//! - globally, handshakes in progress (`--max-handshakes`): every connection between accept and
//!   the end of its attestation holds TLS state and a task, so this bounds the memory and the
//!   work a crowd of connections can pin, whatever their sources and however slowly they talk;
//! - per source address, how often it may start one ([`RateLimit`], `--per-peer-rate`).
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
            Shed::Handshakes => "handshakes",
            Shed::PeerRate => "peer_rate",
        }
    }
}

/// The limits, shared by the accept loop and every connection.
#[derive(Debug)]
pub struct Admission {
    peers: Option<Arc<PeerLimit>>,
    handshakes: Arc<Semaphore>,
    max_handshakes: usize,
    rate: Option<RateLimit>,
}

/// One admitted connection's places; dropped when its attestation ends, which frees them.
#[derive(Debug)]
pub struct Admitted {
    _peer: Option<Slot>,
    _handshake: OwnedSemaphorePermit,
}

impl Admission {
    /// `max_per_peer` and `rate` of zero turn those limits off; `max_handshakes` is at least one.
    pub fn new(max_handshakes: usize, max_per_peer: usize, rate: f64, burst: u32) -> Self {
        let max_handshakes = max_handshakes.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            peers: (max_per_peer > 0).then(|| PeerLimit::new(max_per_peer)),
            handshakes: Arc::new(Semaphore::new(max_handshakes)),
            max_handshakes,
            rate: RateLimit::new(rate, burst),
        }
    }

    /// Places for one more attestation from `ip`, or why not.
    pub fn admit(&self, ip: IpAddr) -> Result<Admitted, Shed> {
        let peer = match &self.peers {
            Some(peers) => Some(peers.try_acquire(ip).ok_or(Shed::PeerAttestations)?),
            None => None,
        };
        let handshake = self
            .handshakes
            .clone()
            .try_acquire_owned()
            .map_err(|_| Shed::Handshakes)?;
        // Last, so a connection refused by the other bounds does not use up its source's tokens.
        let limited = self
            .rate
            .as_ref()
            .is_some_and(|rate| rate.check(ip, Instant::now()) == rate_limit::Decision::Limited);
        if limited {
            return Err(Shed::PeerRate);
        }
        Ok(Admitted {
            _peer: peer,
            _handshake: handshake,
        })
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

    #[test]
    fn the_global_bound_holds_across_sources_and_frees_on_drop() {
        let door = Admission::new(2, 0, 0.0, 0);
        let first = door.admit(A.into()).unwrap();
        let _second = door.admit(B.into()).unwrap();
        assert_eq!(door.handshakes_in_progress(), 2);
        assert_eq!(
            door.admit([10, 0, 0, 3].into()).unwrap_err(),
            Shed::Handshakes
        );
        drop(first);
        assert_eq!(door.handshakes_in_progress(), 1);
        door.admit([10, 0, 0, 3].into()).unwrap();
    }

    #[test]
    fn zero_turns_the_per_source_limits_off() {
        let door = Admission::new(1000, 0, 0.0, 0);
        // One address (a load balancer) with many connections at once and in quick succession.
        let held: Vec<_> = (0..500).map(|_| door.admit(A.into()).unwrap()).collect();
        assert_eq!(held.len(), 500);
        assert_eq!(door.rate_limited_sources(), 0);
    }

    #[test]
    fn per_source_limits_bind_one_source_only() {
        let door = Admission::new(1000, 2, 0.0, 0);
        let _a1 = door.admit(A.into()).unwrap();
        let _a2 = door.admit(A.into()).unwrap();
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::PeerAttestations);
        door.admit(B.into()).unwrap();

        let door = Admission::new(1000, 0, 1.0, 3);
        for _ in 0..3 {
            drop(door.admit(A.into()).unwrap());
        }
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::PeerRate);
        door.admit(B.into()).unwrap();
        assert_eq!(door.rate_limited_sources(), 2);
    }

    #[test]
    fn refusals_by_other_bounds_keep_the_sources_tokens() {
        let door = Admission::new(1, 0, 1.0, 1);
        let held = door.admit(B.into()).unwrap();
        assert_eq!(door.admit(A.into()).unwrap_err(), Shed::Handshakes);
        drop(held);
        door.admit(A.into()).unwrap();
    }
}
