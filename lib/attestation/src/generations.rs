//! The bound the process-wide memos share ([`crate::signature_memo`], [`crate::parse_memo`]):
//! two generations of at most `capacity` entries each. When the current one is full it becomes
//! the previous one and the oldest is dropped; an entry found in the previous generation is
//! carried over, so entries in use stay and a flood of new ones costs at most the work again
//! later.

use std::collections::HashMap;
use std::hash::Hash;

#[derive(Debug)]
pub(crate) struct Generations<K, V> {
    capacity: usize,
    current: HashMap<K, V>,
    previous: HashMap<K, V>,
}

impl<K: Hash + Eq, V: Clone> Generations<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            current: HashMap::new(),
            previous: HashMap::new(),
        }
    }

    /// The value kept for `key`, carried over into the current generation if it was in the
    /// previous one.
    pub(crate) fn get(&mut self, key: K) -> Option<V> {
        if let Some(value) = self.current.get(&key) {
            return Some(value.clone());
        }
        let value = self.previous.remove(&key)?;
        self.current.insert(key, value.clone());
        Some(value)
    }

    /// Keeps `value` for `key`, beginning a new generation when the current one is full.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.capacity {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }
}
