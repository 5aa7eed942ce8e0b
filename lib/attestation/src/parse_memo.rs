//! Parsed forms of bytes that recur from join to join, kept so that the next join carrying the
//! same bytes does not decode and parse them again.
//!
//! The vendors' certificates in a node's evidence (AMD's VCEK or VLEK with its ASK or ASVK in an
//! SEV-SNP InstanceInfo, the PCK chain in a TDX quote) are the same for every node of a chip,
//! platform or cloud, and decoding their PEM and parsing their DER is a few percent of a join.
//! A parse is a function of the bytes alone, so its result is kept by the SHA-256 of the bytes
//! for as long as the process runs. Only what parsed is kept, and only the parse: every check
//! on the parsed certificates (signatures, names, validity, revocation, what they say about the
//! chip) runs on every join.

use std::sync::Mutex;

use aws_lc_rs::digest::{SHA256, digest};

use crate::generations::Generations;

/// Parsed values by the digest of their bytes; two generations of at most `capacity` each, so
/// values in use stay and a flood of new bytes costs at most a parse again later. The bytes
/// are a node's, given before anything is verified, so only inputs of at most `max_input`
/// bytes are kept: what a flood of made-up certificates can make the memo hold is bounded by
/// about 2 × `capacity` × `max_input`, whatever the size of the documents it sends.
#[derive(Debug)]
pub struct ParseMemo<V> {
    max_input: usize,
    /// By the SHA-256 of the parsed bytes.
    generations: Mutex<Generations<[u8; 32], V>>,
}

impl<V: Clone> ParseMemo<V> {
    pub fn new(capacity: usize, max_input: usize) -> Self {
        Self {
            max_input,
            generations: Mutex::new(Generations::new(capacity)),
        }
    }

    /// `parse(bytes)`, or what it returned for the same bytes before.
    pub fn get_or_parse<E>(
        &self,
        bytes: &[u8],
        parse: impl FnOnce(&[u8]) -> Result<V, E>,
    ) -> Result<V, E> {
        if bytes.len() > self.max_input {
            return parse(bytes);
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(digest(&SHA256, bytes).as_ref());
        if let Some(value) = self.lock().get(key) {
            return Ok(value);
        }
        // Parsed without the lock held: joins on other threads go on meanwhile.
        let value = parse(bytes)?;
        self.lock().insert(key, value.clone());
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations<[u8; 32], V>> {
        self.generations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn parses_each_bytes_once_and_never_keeps_a_failure() {
        let memo = ParseMemo::new(2, 4);
        let parses = Cell::new(0);
        let parse = |bytes: &[u8]| {
            parses.set(parses.get() + 1);
            std::str::from_utf8(bytes).map(str::to_owned)
        };
        assert_eq!(memo.get_or_parse(b"a", parse).unwrap(), "a");
        assert_eq!(memo.get_or_parse(b"a", parse).unwrap(), "a");
        assert_eq!(parses.get(), 1);
        assert!(memo.get_or_parse(b"\xff", parse).is_err());
        assert!(memo.get_or_parse(b"\xff", parse).is_err());
        assert_eq!(parses.get(), 3);
        // Two generations of two: "a" survives two more values, not four.
        for bytes in [b"b", b"c"] {
            memo.get_or_parse(bytes, parse).unwrap();
        }
        memo.get_or_parse(b"a", parse).unwrap();
        assert_eq!(parses.get(), 5);
        for bytes in [b"d", b"e", b"f", b"g", b"h"] {
            memo.get_or_parse(bytes, parse).unwrap();
        }
        memo.get_or_parse(b"b", parse).unwrap();
        assert_eq!(parses.get(), 11);
        // Larger than kept: parsed every time.
        memo.get_or_parse(b"large", parse).unwrap();
        memo.get_or_parse(b"large", parse).unwrap();
        assert_eq!(parses.get(), 13);
    }
}
