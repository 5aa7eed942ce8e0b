//! Constellation-managed key derivation: every data key is HKDF over the cluster's master secret.

use aws_lc_rs::hkdf;
use zeroize::{Zeroize, Zeroizing};

/// Why a key could not be derived.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeriveError {
    /// The caller asked for a key without naming it.
    #[error("data_key_id must not be empty")]
    EmptyId,
    /// The caller asked for a zero-length key.
    #[error("length must be greater than 0")]
    ZeroLength,
    /// HKDF cannot produce this much output from one hash (RFC 5869 limits it to 255 blocks).
    #[error("length {requested} exceeds HKDF's maximum output of {max} bytes for this hash")]
    TooLong { requested: usize, max: usize },
}

/// Why a master secret was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MasterSecretError {
    /// A short master secret would make every derived key guessable.
    #[error("master secret is {len} bytes; at least {min} are required")]
    SecretTooShort { len: usize, min: usize },
    /// An empty salt is almost certainly an unmounted or empty file, not a choice.
    #[error("master salt is empty")]
    EmptySalt,
}

/// The cluster's master secret and salt. Both are wiped from memory when dropped.
pub struct MasterSecret {
    secret: Zeroizing<Vec<u8>>,
    salt: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for MasterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterSecret")
            .field(
                "secret",
                &format_args!("<{} bytes redacted>", self.secret.len()),
            )
            .field(
                "salt",
                &format_args!("<{} bytes redacted>", self.salt.len()),
            )
            .finish()
    }
}

impl MasterSecret {
    /// Constellation generates 32-byte master secrets and refuses ones shorter than 16 bytes;
    /// so do we.
    pub const MIN_SECRET_LEN: usize = 16;

    /// Checks and takes ownership of a master secret and salt.
    pub fn new(
        secret: impl Into<Zeroizing<Vec<u8>>>,
        salt: impl Into<Zeroizing<Vec<u8>>>,
    ) -> Result<Self, MasterSecretError> {
        let (secret, salt) = (secret.into(), salt.into());
        if secret.len() < Self::MIN_SECRET_LEN {
            return Err(MasterSecretError::SecretTooShort {
                len: secret.len(),
                min: Self::MIN_SECRET_LEN,
            });
        }
        if salt.is_empty() {
            return Err(MasterSecretError::EmptySalt);
        }
        Ok(Self { secret, salt })
    }

    /// The data key named `id`: HKDF-SHA256(IKM = secret, salt, info = "key-" + id, length),
    /// byte-for-byte what Constellation's key service returns for the same master secret.
    pub fn derive_key(&self, id: &str, length: usize) -> Result<Zeroizing<Vec<u8>>, DeriveError> {
        if id.is_empty() {
            return Err(DeriveError::EmptyId);
        }
        let info = format!("key-{id}");
        hkdf_derive(
            hkdf::HKDF_SHA256,
            &self.secret,
            &self.salt,
            info.as_bytes(),
            length,
        )
    }
}

/// The largest `length` [`MasterSecret::derive_key`] accepts: 255 blocks of SHA-256 output.
pub const MAX_KEY_LEN: usize = 255 * 32;

/// HKDF (RFC 5869) extract-then-expand with aws-lc-rs. Public so the RFC's test vectors can be
/// checked against exactly the code that derives production keys.
pub fn hkdf_derive(
    algorithm: hkdf::Algorithm,
    ikm: &[u8],
    salt: &[u8],
    info: &[u8],
    length: usize,
) -> Result<Zeroizing<Vec<u8>>, DeriveError> {
    let max = 255 * algorithm.hmac_algorithm().digest_algorithm().output_len();
    if length == 0 {
        return Err(DeriveError::ZeroLength);
    }
    if length > max {
        return Err(DeriveError::TooLong {
            requested: length,
            max,
        });
    }
    let mut out = Zeroizing::new(vec![0u8; length]);
    let prk = hkdf::Salt::new(algorithm, salt).extract(ikm);
    let info = [info];
    // Both calls only fail for an output longer than 255 blocks, which is excluded above.
    let filled = prk
        .expand(&info, OutputLen(length))
        .and_then(|okm| okm.fill(&mut out));
    match filled {
        Ok(()) => Ok(out),
        Err(aws_lc_rs::error::Unspecified) => {
            out.zeroize();
            Err(DeriveError::TooLong {
                requested: length,
                max,
            })
        }
    }
}

/// aws-lc-rs asks for the output length through its `KeyType` trait.
struct OutputLen(usize);

impl hkdf::KeyType for OutputLen {
    fn len(&self) -> usize {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master() -> MasterSecret {
        MasterSecret::new(vec![7u8; 32], vec![9u8; 32]).unwrap()
    }

    #[test]
    fn same_id_same_key_and_ids_are_separated() {
        let m = master();
        let a = m.derive_key("disk-a", 32).unwrap();
        assert_eq!(a, m.derive_key("disk-a", 32).unwrap());
        assert_ne!(a, m.derive_key("disk-b", 32).unwrap());
        // A shorter key is a prefix of the longer one: HKDF-Expand output is a stream.
        assert_eq!(&a[..16], &m.derive_key("disk-a", 16).unwrap()[..]);
    }

    #[test]
    fn info_is_key_dash_id() {
        let m = master();
        let direct = hkdf_derive(hkdf::HKDF_SHA256, &[7u8; 32], &[9u8; 32], b"key-x", 32).unwrap();
        assert_eq!(m.derive_key("x", 32).unwrap(), direct);
    }

    #[test]
    fn bad_requests_are_refused() {
        let m = master();
        assert_eq!(m.derive_key("", 32), Err(DeriveError::EmptyId));
        assert_eq!(m.derive_key("x", 0), Err(DeriveError::ZeroLength));
        assert_eq!(m.derive_key("x", MAX_KEY_LEN).unwrap().len(), MAX_KEY_LEN);
        assert_eq!(
            m.derive_key("x", MAX_KEY_LEN + 1),
            Err(DeriveError::TooLong {
                requested: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            })
        );
    }

    #[test]
    fn weak_master_secrets_are_refused() {
        assert_eq!(
            MasterSecret::new(vec![1u8; 15], vec![1u8; 32]).unwrap_err(),
            MasterSecretError::SecretTooShort { len: 15, min: 16 }
        );
        assert_eq!(
            MasterSecret::new(vec![1u8; 32], Vec::new()).unwrap_err(),
            MasterSecretError::EmptySalt
        );
    }

    #[test]
    fn debug_does_not_print_secrets() {
        let shown = format!("{:?}", master());
        assert!(!shown.contains('7') && !shown.contains('9'), "{shown}");
    }
}
