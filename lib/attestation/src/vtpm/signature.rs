//! Verifying a quote's signature with the attestation key.
//!
//! ring (the project's one crypto provider) verifies every combination it implements:
//! RSASSA-PKCS1-v1_5 and RSA-PSS with SHA-256/384/512 (keys of 2048 to 8192 bits), and ECDSA
//! on P-256 and P-384 with SHA-256 and SHA-384.
//!
//! ring has no ECDSA with SHA-512 on P-256 or P-384, yet a TPM signs that way when the AK's
//! scheme says so (it truncates the 64-byte digest to the curve order's size, as FIPS 186
//! prescribes). Refusing those keys would reject genuine nodes for a library gap, so for exactly
//! those two combinations the digest is computed with ring and the prehash is verified with
//! RustCrypto's `p256`/`p384` (pure Rust, no OpenSSL, verification only, so no secret-dependent
//! code paths are involved; its `verify_prehash` performs the same leftmost-bits truncation).

use crate::Error;
use crate::tpm::{HashAlg, PublicKey, Signature, curve, object_attributes};

/// Smallest RSA modulus accepted: ring refuses smaller ones, and so should we.
const MIN_RSA_BITS: u16 = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Curve {
    P256,
    P384,
}

impl Curve {
    fn field_len(self) -> usize {
        match self {
            Curve::P256 => 32,
            Curve::P384 => 48,
        }
    }
}

/// An attestation key ready to verify quotes.
#[derive(Clone, Debug)]
pub(crate) enum AkKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// SEC1 uncompressed point.
    Ecc {
        curve: Curve,
        point: Vec<u8>,
    },
}

impl AkKey {
    /// Checks that the public area describes a key that can sign quotes and converts it.
    pub(crate) fn from_public(public: &crate::tpm::Public) -> Result<AkKey, Error> {
        // A restricted signing key only signs data the TPM generated itself (or digests it
        // computed), so it cannot be tricked into signing a forged TPMS_ATTEST. Every AK
        // template (go-tpm-tools, tpm2_createak, cloud vTPMs) sets both bits.
        let needed = object_attributes::SIGN_ENCRYPT | object_attributes::RESTRICTED;
        if !public.has_attributes(needed) {
            return Err(Error::AkUnsuitable(format!(
                "object attributes 0x{:08x} lack sign and restricted; an attestation key must be a restricted signing key",
                public.object_attributes
            )));
        }
        if public.has_attributes(object_attributes::DECRYPT) {
            return Err(Error::AkUnsuitable(
                "attestation key is also a decryption key".to_owned(),
            ));
        }
        match &public.key {
            PublicKey::Rsa {
                key_bits,
                exponent,
                modulus,
                ..
            } => {
                if *key_bits < MIN_RSA_BITS {
                    return Err(Error::AkUnsuitable(format!(
                        "RSA key of {key_bits} bits is below the minimum of {MIN_RSA_BITS}"
                    )));
                }
                if modulus.len() != usize::from(*key_bits / 8) {
                    return Err(Error::AkUnsuitable(format!(
                        "RSA modulus has {} bytes but the key claims {key_bits} bits",
                        modulus.len()
                    )));
                }
                // The TPM writes 0 for the default exponent 2^16 + 1.
                let e = if *exponent == 0 { 65537 } else { *exponent };
                let e = e.to_be_bytes();
                let first = e.iter().position(|&b| b != 0).unwrap_or(e.len());
                Ok(AkKey::Rsa {
                    n: modulus.clone(),
                    e: e[first..].to_vec(),
                })
            }
            PublicKey::Ecc {
                curve: curve_id,
                x,
                y,
                ..
            } => {
                let curve = match *curve_id {
                    curve::NIST_P256 => Curve::P256,
                    curve::NIST_P384 => Curve::P384,
                    other => {
                        return Err(Error::AkUnsuitable(format!(
                            "ECC curve 0x{other:04x} is not supported (P-256 and P-384 are)"
                        )));
                    }
                };
                let mut point = vec![0x04];
                point.extend(fixed_width(x, curve.field_len()).ok_or_else(|| {
                    Error::AkUnsuitable("ECC point x is longer than the curve's field".to_owned())
                })?);
                point.extend(fixed_width(y, curve.field_len()).ok_or_else(|| {
                    Error::AkUnsuitable("ECC point y is longer than the curve's field".to_owned())
                })?);
                Ok(AkKey::Ecc { curve, point })
            }
        }
    }

    /// Verifies `sig` over `message` (the marshalled TPMS_ATTEST) and returns the signature's
    /// hash, which is also the hash the TPM used for the quote's PCR digest.
    pub(crate) fn verify(
        &self,
        index: usize,
        bank: HashAlg,
        sig: &Signature,
        message: &[u8],
    ) -> Result<HashAlg, Error> {
        let unsupported = |reason: String| Error::UnsupportedSignature { index, reason };
        let hash = HashAlg::from_id(sig.hash())
            .ok_or_else(|| unsupported(format!("hash algorithm 0x{:04x}", sig.hash())))?;
        if hash == HashAlg::Sha1 {
            return Err(unsupported("SHA-1 signatures are not accepted".to_owned()));
        }
        let bad = || Error::BadSignature { index, bank };
        match (self, sig) {
            (AkKey::Rsa { n, e }, Signature::RsaSsa { sig, .. }) => {
                let params = match hash {
                    HashAlg::Sha256 => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                    HashAlg::Sha384 => &ring::signature::RSA_PKCS1_2048_8192_SHA384,
                    HashAlg::Sha512 => &ring::signature::RSA_PKCS1_2048_8192_SHA512,
                    HashAlg::Sha1 => return Err(bad()),
                };
                ring::signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .map_err(|_| bad())?;
            }
            (AkKey::Rsa { n, e }, Signature::RsaPss { sig, .. }) => {
                // The TPM's PSS salt is as long as the digest, which is what ring expects.
                let params = match hash {
                    HashAlg::Sha256 => &ring::signature::RSA_PSS_2048_8192_SHA256,
                    HashAlg::Sha384 => &ring::signature::RSA_PSS_2048_8192_SHA384,
                    HashAlg::Sha512 => &ring::signature::RSA_PSS_2048_8192_SHA512,
                    HashAlg::Sha1 => return Err(bad()),
                };
                ring::signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .map_err(|_| bad())?;
            }
            (AkKey::Ecc { curve, point }, Signature::Ecdsa { r, s, .. }) => {
                let len = curve.field_len();
                let (Some(r), Some(s)) = (fixed_width(r, len), fixed_width(s, len)) else {
                    return Err(bad());
                };
                let mut rs = r;
                rs.extend(s);
                verify_ecdsa(*curve, hash, point, message, &rs).map_err(|()| bad())?;
            }
            (AkKey::Rsa { .. }, Signature::Ecdsa { .. }) => {
                return Err(unsupported(
                    "ECDSA signature but the attestation key is RSA".to_owned(),
                ));
            }
            (AkKey::Ecc { .. }, Signature::RsaSsa { .. } | Signature::RsaPss { .. }) => {
                return Err(unsupported(format!(
                    "{} signature but the attestation key is ECC",
                    sig.scheme_name()
                )));
            }
        }
        Ok(hash)
    }
}

fn verify_ecdsa(
    curve: Curve,
    hash: HashAlg,
    point: &[u8],
    message: &[u8],
    rs: &[u8],
) -> Result<(), ()> {
    use ring::signature as rs_;
    // ring offers the cross combinations (P-256 with SHA-384, P-384 with SHA-256) only with
    // ASN.1 signatures, so those get r and s DER-encoded.
    let (ring_alg, der): (&'static rs_::EcdsaVerificationAlgorithm, bool) = match (curve, hash) {
        (Curve::P256, HashAlg::Sha256) => (&rs_::ECDSA_P256_SHA256_FIXED, false),
        (Curve::P384, HashAlg::Sha384) => (&rs_::ECDSA_P384_SHA384_FIXED, false),
        (Curve::P256, HashAlg::Sha384) => (&rs_::ECDSA_P256_SHA384_ASN1, true),
        (Curve::P384, HashAlg::Sha256) => (&rs_::ECDSA_P384_SHA256_ASN1, true),
        (_, HashAlg::Sha512) => return verify_ecdsa_sha512(curve, point, message, rs),
        (_, HashAlg::Sha1) => return Err(()),
    };
    let sig = if der {
        let (r, s) = rs.split_at(rs.len() / 2);
        der_ecdsa_signature(r, s)
    } else {
        rs.to_vec()
    };
    rs_::UnparsedPublicKey::new(ring_alg, point)
        .verify(message, &sig)
        .map_err(|_| ())
}

/// `ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }` for scalars of at most 66 bytes, so
/// every length fits DER's short form.
fn der_ecdsa_signature(r: &[u8], s: &[u8]) -> Vec<u8> {
    fn integer(v: &[u8], out: &mut Vec<u8>) {
        let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
        let v = &v[first..];
        let pad = v.first().is_none_or(|&b| b & 0x80 != 0);
        out.push(0x02);
        out.push((v.len() + usize::from(pad)) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
    }
    let mut body = Vec::with_capacity(2 * 70);
    integer(r, &mut body);
    integer(s, &mut body);
    let mut out = vec![0x30, body.len() as u8];
    out.extend(body);
    out
}

/// The combinations ring lacks; see the module comment for why RustCrypto verifies them.
fn verify_ecdsa_sha512(curve: Curve, point: &[u8], message: &[u8], rs: &[u8]) -> Result<(), ()> {
    let digest = HashAlg::Sha512.digest(message);
    match curve {
        Curve::P256 => {
            use p256::ecdsa::signature::hazmat::PrehashVerifier;
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(|_| ())?;
            let sig = p256::ecdsa::Signature::from_slice(rs).map_err(|_| ())?;
            key.verify_prehash(&digest, &sig).map_err(|_| ())
        }
        Curve::P384 => {
            use p384::ecdsa::signature::hazmat::PrehashVerifier;
            let key = p384::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(|_| ())?;
            let sig = p384::ecdsa::Signature::from_slice(rs).map_err(|_| ())?;
            key.verify_prehash(&digest, &sig).map_err(|_| ())
        }
    }
}

/// Left-pads a big-endian integer to `len` bytes; `None` if it does not fit. TPMs may drop
/// leading zero bytes of ECC coordinates and signature scalars.
fn fixed_width(v: &[u8], len: usize) -> Option<Vec<u8>> {
    let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
    let v = &v[first..];
    if v.len() > len {
        return None;
    }
    let mut out = vec![0u8; len - v.len()];
    out.extend_from_slice(v);
    Some(out)
}
