//! The TPM 2.0 structures a quote consists of, written the way a TPM marshals them (big-endian,
//! `TPM2B`s with a `u16` size), so the validator's parsers see exactly what a real TPM sends.

use attestation::tpm::{ST_ATTEST_QUOTE, TPM_GENERATED, alg, curve, object_attributes};

/// `TPMA_OBJECT` of go-tpm-tools' attestation key templates: a restricted signing key that
/// never leaves the TPM (0x00050072).
pub(crate) const AK_ATTRIBUTES: u32 = object_attributes::FIXED_TPM
    | object_attributes::FIXED_PARENT
    | object_attributes::SENSITIVE_DATA_ORIGIN
    | object_attributes::USER_WITH_AUTH
    | object_attributes::RESTRICTED
    | object_attributes::SIGN_ENCRYPT;

fn tpm2b(out: &mut Vec<u8>, bytes: &[u8]) {
    // Every buffer written here is a digest, a key or a signature of at most 512 bytes.
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The part of `TPMT_PUBLIC` both key types share: type, name algorithm, attributes, an empty
/// auth policy and no symmetric algorithm (a signing key has none).
fn public_header(key_type: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(300);
    out.extend_from_slice(&key_type.to_be_bytes());
    out.extend_from_slice(&alg::SHA256.to_be_bytes());
    out.extend_from_slice(&AK_ATTRIBUTES.to_be_bytes());
    tpm2b(&mut out, &[]);
    out.extend_from_slice(&alg::NULL.to_be_bytes());
    out
}

/// `TPMT_PUBLIC` of a P-256 ECDSA-SHA256 key with the affine coordinates `x` and `y`.
pub(crate) fn public_ecc_p256(x: &[u8], y: &[u8]) -> Vec<u8> {
    let mut out = public_header(alg::ECC);
    out.extend_from_slice(&alg::ECDSA.to_be_bytes());
    out.extend_from_slice(&alg::SHA256.to_be_bytes());
    out.extend_from_slice(&curve::NIST_P256.to_be_bytes());
    out.extend_from_slice(&alg::NULL.to_be_bytes()); // KDF
    tpm2b(&mut out, x);
    tpm2b(&mut out, y);
    out
}

/// `TPMT_PUBLIC` of an RSASSA-SHA256 key. The TPM writes the default exponent 65537 as 0.
pub(crate) fn public_rsa(modulus: &[u8], exponent: u32) -> Vec<u8> {
    let mut out = public_header(alg::RSA);
    out.extend_from_slice(&alg::RSASSA.to_be_bytes());
    out.extend_from_slice(&alg::SHA256.to_be_bytes());
    out.extend_from_slice(&((modulus.len() * 8) as u16).to_be_bytes());
    let exponent = if exponent == 65537 { 0 } else { exponent };
    out.extend_from_slice(&exponent.to_be_bytes());
    tpm2b(&mut out, modulus);
    out
}

/// The key's TPM name: the name algorithm's id followed by the hash of its `TPMT_PUBLIC`. A TPM
/// puts it in every quote as the qualified signer.
pub(crate) fn name(public: &[u8]) -> Vec<u8> {
    let mut out = alg::SHA256.to_be_bytes().to_vec();
    out.extend_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, public).as_ref());
    out
}

/// What a quote attests besides the signer and the qualifying data.
#[derive(Clone, Debug)]
pub(crate) struct QuoteBody<'a> {
    pub clock: u64,
    pub firmware_version: u64,
    /// The bank's TPM algorithm ID (SHA-256's, or SHA-384's for the second quote).
    pub bank: u16,
    /// The bank's selected PCR indices, ascending.
    pub indices: &'a [u32],
    /// SHA-256 over the selected values in index order.
    pub pcr_digest: &'a [u8],
}

/// `TPMS_ATTEST` of a SHA-256 bank quote.
pub(crate) fn attest_quote(signer: &[u8], extra_data: &[u8], body: &QuoteBody<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(150);
    out.extend_from_slice(&TPM_GENERATED.to_be_bytes());
    out.extend_from_slice(&ST_ATTEST_QUOTE.to_be_bytes());
    tpm2b(&mut out, signer);
    tpm2b(&mut out, extra_data);
    // TPMS_CLOCK_INFO: clock, resetCount, restartCount, safe.
    out.extend_from_slice(&body.clock.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.push(1);
    out.extend_from_slice(&body.firmware_version.to_be_bytes());
    // TPML_PCR_SELECTION with one TPMS_PCR_SELECTION; PC Client TPMs use a 3-byte bitmap.
    let mut select = [0u8; 3];
    for &i in body.indices {
        select[(i / 8) as usize] |= 1 << (i % 8);
    }
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&body.bank.to_be_bytes());
    out.push(select.len() as u8);
    out.extend_from_slice(&select);
    tpm2b(&mut out, body.pcr_digest);
    out
}

/// `TPMT_SIGNATURE` of ECDSA-SHA256 with the fixed-width scalars `r` and `s`.
pub(crate) fn signature_ecdsa_sha256(r: &[u8], s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(72);
    out.extend_from_slice(&alg::ECDSA.to_be_bytes());
    out.extend_from_slice(&alg::SHA256.to_be_bytes());
    tpm2b(&mut out, r);
    tpm2b(&mut out, s);
    out
}

/// `TPMT_SIGNATURE` of RSASSA-PKCS1-v1_5-SHA256.
pub(crate) fn signature_rsassa_sha256(sig: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(sig.len() + 6);
    out.extend_from_slice(&alg::RSASSA.to_be_bytes());
    out.extend_from_slice(&alg::SHA256.to_be_bytes());
    tpm2b(&mut out, sig);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use attestation::tpm::{Attest, Public, PublicKey, Signature};

    #[test]
    fn the_validator_parses_what_is_written() {
        let ecc = Public::parse(&public_ecc_p256(&[1; 32], &[2; 32])).unwrap();
        assert_eq!(ecc.object_attributes, 0x0005_0072);
        assert!(matches!(
            ecc.key,
            PublicKey::Ecc {
                curve: curve::NIST_P256,
                ..
            }
        ));
        let rsa = Public::parse(&public_rsa(&[0xc1; 256], 65537)).unwrap();
        assert!(matches!(
            rsa.key,
            PublicKey::Rsa {
                key_bits: 2048,
                exponent: 0,
                ..
            }
        ));

        let indices: Vec<u32> = (0..24).collect();
        let body = QuoteBody {
            clock: 5,
            firmware_version: 7,
            bank: alg::SHA256,
            indices: &indices,
            pcr_digest: &[9; 32],
        };
        let attest = Attest::parse(&attest_quote(&name(b"key"), &[3; 32], &body)).unwrap();
        assert_eq!(attest.qualified_signer.len(), 34);
        assert_eq!(attest.extra_data, vec![3; 32]);
        assert_eq!(attest.quote.pcr_select[0].indices(), indices);
        assert_eq!(attest.quote.pcr_digest, vec![9; 32]);

        assert!(matches!(
            Signature::parse(&signature_ecdsa_sha256(&[1; 32], &[2; 32])).unwrap(),
            Signature::Ecdsa {
                hash: alg::SHA256,
                ..
            }
        ));
        assert!(matches!(
            Signature::parse(&signature_rsassa_sha256(&[1; 256])).unwrap(),
            Signature::RsaSsa {
                hash: alg::SHA256,
                ..
            }
        ));
    }
}
