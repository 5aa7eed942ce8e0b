//! Verifying a quote's signature with the attestation key.
//!
//! aws-lc-rs (the project's one crypto provider) verifies every combination a TPM signs with:
//! RSASSA-PKCS1-v1_5 and RSA-PSS with SHA-256/384/512 (keys of 2048 to 8192 bits), and ECDSA
//! on P-256 and P-384 with SHA-256, SHA-384 and SHA-512 (a TPM signs with SHA-512 when the AK's
//! scheme says so, and truncates the 64-byte digest to the curve order's size, as FIPS 186
//! prescribes; so does the provider).

use crate::Error;
use crate::tpm::{HashAlg, PublicKey, Signature, curve, object_attributes};

/// Smallest RSA modulus accepted: the provider refuses smaller ones, and so should we.
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
                    HashAlg::Sha256 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
                    HashAlg::Sha384 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA384,
                    HashAlg::Sha512 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA512,
                    HashAlg::Sha1 => return Err(bad()),
                };
                aws_lc_rs::signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .map_err(|_| bad())?;
            }
            (AkKey::Rsa { n, e }, Signature::RsaPss { sig, .. }) => {
                // The TPM's PSS salt is as long as the digest, which is what the provider expects.
                let params = match hash {
                    HashAlg::Sha256 => &aws_lc_rs::signature::RSA_PSS_2048_8192_SHA256,
                    HashAlg::Sha384 => &aws_lc_rs::signature::RSA_PSS_2048_8192_SHA384,
                    HashAlg::Sha512 => &aws_lc_rs::signature::RSA_PSS_2048_8192_SHA512,
                    HashAlg::Sha1 => return Err(bad()),
                };
                aws_lc_rs::signature::RsaPublicKeyComponents { n, e }
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
    use aws_lc_rs::signature as rs_;
    // The provider offers the cross combinations (P-256 with SHA-384 or SHA-512, P-384 with
    // SHA-256 or SHA-512) only with ASN.1 signatures, so those get r and s DER-encoded.
    let (alg, der): (&'static rs_::EcdsaVerificationAlgorithm, bool) = match (curve, hash) {
        (Curve::P256, HashAlg::Sha256) => (&rs_::ECDSA_P256_SHA256_FIXED, false),
        (Curve::P384, HashAlg::Sha384) => (&rs_::ECDSA_P384_SHA384_FIXED, false),
        (Curve::P256, HashAlg::Sha384) => (&rs_::ECDSA_P256_SHA384_ASN1, true),
        (Curve::P256, HashAlg::Sha512) => (&rs_::ECDSA_P256_SHA512_ASN1, true),
        (Curve::P384, HashAlg::Sha256) => (&rs_::ECDSA_P384_SHA256_ASN1, true),
        (Curve::P384, HashAlg::Sha512) => (&rs_::ECDSA_P384_SHA512_ASN1, true),
        (_, HashAlg::Sha1) => return Err(()),
    };
    let sig = if der {
        let (r, s) = rs.split_at(rs.len() / 2);
        der_ecdsa_signature(r, s)
    } else {
        rs.to_vec()
    };
    rs_::UnparsedPublicKey::new(alg, point)
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
