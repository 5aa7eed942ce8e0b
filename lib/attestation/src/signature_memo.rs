//! Signatures that verified once, remembered so that the same signature over the same bytes by
//! the same key is not verified again on the next join.
//!
//! Whether a key signed some bytes depends on nothing but the key, the bytes and the signature,
//! so a success can be remembered by their digests for as long as the process runs. The
//! vendors' certificates, CRLs and collateral (AMD's ARK → ASK → VCEK chain and CRL, Intel's
//! PCK chain, CRLs, TCB info, QE identity and each platform's QE report) are the same for every
//! node of a platform; only the signature binding a node's own evidence is new with each join.
//! Everything that depends on the moment (validity periods, freshness, revocation, the trusted
//! root) stays with the callers, checked on every join.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_lc_rs::digest::{Context, SHA256, digest};

use crate::generations::Generations;

/// Signatures that verified, by the digest of what was signed (with its signature) and of the
/// signer (an issuer's certificate, or a public key).
///
/// Bounded: two generations of at most [`SignatureMemo::GENERATION`] entries each; when the
/// current one is full it becomes the previous one and the oldest is dropped, so pairs in use
/// stay (a hit in the previous generation is carried over) and a flood of new signers costs at
/// most a re-verification later. Only successes are remembered: a signature that failed is
/// checked again, and fails again, every time.
#[derive(Debug)]
pub struct SignatureMemo {
    /// The remembered pairs.
    generations: Mutex<Generations<[u8; 64], ()>>,
    verified: AtomicU64,
    hits: AtomicU64,
}

impl Default for SignatureMemo {
    fn default() -> Self {
        Self {
            generations: Mutex::new(Generations::new(Self::GENERATION)),
            verified: AtomicU64::default(),
            hits: AtomicU64::default(),
        }
    }
}

impl SignatureMemo {
    /// Entries per generation: far more intermediates, chips and platforms than a cluster's
    /// nodes run on, at 64 bytes each.
    pub const GENERATION: usize = 8192;

    /// The digest of `signed` (each part length-prefixed, so no two splits of the same bytes
    /// collide) beside the digest of `signer`.
    fn key(signed: &[&[u8]], signer: &[u8]) -> [u8; 64] {
        let mut context = Context::new(&SHA256);
        for part in signed {
            context.update(&(part.len() as u64).to_le_bytes());
            context.update(part);
        }
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(context.finish().as_ref());
        key[32..].copy_from_slice(digest(&SHA256, signer).as_ref());
        key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations<[u8; 64], ()>> {
        self.generations.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `verify` unless `signed` (a certificate or CRL, which carries its signature, or a
    /// message and its signature) is already known to be signed by `signer`; remembers it if
    /// it verifies.
    pub fn check<E>(
        &self,
        signed: &[&[u8]],
        signer: &[u8],
        verify: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let key = Self::key(signed, signer);
        if self.lock().get(key).is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Verified without the lock held: joins on other threads go on meanwhile.
        verify()?;
        self.verified.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, ());
        Ok(())
    }

    /// Signatures verified so far (each a real verification).
    pub fn verified(&self) -> u64 {
        self.verified.load(Ordering::Relaxed)
    }

    /// Checks answered from the memo so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_keeps_two_generations_and_drops_the_oldest() {
        let memo = SignatureMemo::default();
        let ok = || Ok::<(), ()>(());
        let n = SignatureMemo::GENERATION;
        for i in 0..=n {
            memo.check(&[&i.to_le_bytes()], b"issuer", ok).unwrap();
        }
        // The first generation became the previous one; its entries still hit.
        assert_eq!(memo.verified(), n as u64 + 1);
        memo.check(&[&0usize.to_le_bytes()], b"issuer", ok).unwrap();
        assert_eq!(memo.hits(), 1);
        // The same object under another issuer is another pair.
        memo.check(&[&0usize.to_le_bytes()], b"other", ok).unwrap();
        assert_eq!(memo.verified(), n as u64 + 2);
        // Two more full generations push the first one out.
        for i in n + 1..3 * n + 2 {
            memo.check(&[&i.to_le_bytes()], b"issuer", ok).unwrap();
        }
        let before = memo.verified();
        memo.check(&[&1usize.to_le_bytes()], b"issuer", ok).unwrap();
        assert_eq!(memo.verified(), before + 1);
        assert!(
            memo.check(&[&7usize.to_le_bytes()], b"new", || Err(()))
                .is_err()
        );
    }

    #[test]
    fn the_parts_of_what_was_signed_are_not_interchangeable() {
        let memo = SignatureMemo::default();
        let ok = || Ok::<(), ()>(());
        memo.check(&[b"message", b"signature"], b"key", ok).unwrap();
        // The same bytes split elsewhere (another message with another signature) is new.
        memo.check(&[b"messagesig", b"nature"], b"key", ok).unwrap();
        memo.check(&[b"message", b"signature"], b"another key", ok)
            .unwrap();
        assert_eq!((memo.verified(), memo.hits()), (3, 0));
        memo.check(&[b"message", b"signature"], b"key", || Err(()))
            .unwrap();
        assert_eq!(memo.hits(), 1);
    }
}
