//! At most a few attestations in progress per source address.
//!
//! The verify pool's bounded queue keeps a flood from exhausting memory, but on its own it is
//! first come, first served: one source opening connections in a loop would fill the queue and
//! every other node would be told to retry for as long as the flood lasts. Capping what one IP
//! address may have in progress (handshake plus verification) leaves the rest of the capacity to
//! other nodes. Nodes of a cluster connect from their own addresses, so the cap never binds an
//! honest node, which makes one attestation at a time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Counts attestations in progress per source address.
#[derive(Debug)]
pub struct PeerLimit {
    max: usize,
    in_progress: Mutex<HashMap<IpAddr, usize>>,
}

/// One attestation in progress; releases its place when dropped.
#[derive(Debug)]
pub struct Slot {
    limit: Arc<PeerLimit>,
    ip: IpAddr,
}

impl PeerLimit {
    /// Allows `max` attestations in progress per address (at least one).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            in_progress: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more attestation from `ip`, or `None` if it already has `max`.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut map = self
            .in_progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = map.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Slot {
            limit: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self
            .limit
            .in_progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Remove the entry at zero so the map holds only addresses with work in progress.
        if let Some(count) = map.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_each_address_separately() {
        let limit = PeerLimit::new(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let first = limit.try_acquire(a).unwrap();
        let _second = limit.try_acquire(a).unwrap();
        assert!(limit.try_acquire(a).is_none());
        let _other = limit.try_acquire(b).unwrap();
        drop(first);
        let _third = limit.try_acquire(a).unwrap();
        assert!(limit.try_acquire(a).is_none());
    }

    #[test]
    fn forgets_idle_addresses() {
        let limit = PeerLimit::new(1);
        drop(limit.try_acquire([10, 0, 0, 1].into()).unwrap());
        assert!(limit.in_progress.lock().unwrap().is_empty());
    }
}
