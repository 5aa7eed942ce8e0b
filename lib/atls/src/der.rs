//! The few DER primitives aTLS needs beyond x509-parser: writing the nonce DN and splitting a
//! SubjectPublicKeyInfo into its algorithm and key. Input is untrusted; nothing here panics.

pub(crate) const TAG_SEQUENCE: u8 = 0x30;
pub(crate) const TAG_SET: u8 = 0x31;
pub(crate) const TAG_OID: u8 = 0x06;
pub(crate) const TAG_PRINTABLE_STRING: u8 = 0x13;
pub(crate) const TAG_BIT_STRING: u8 = 0x03;

/// Appends one DER TLV (definite length, shortest form) to `out`.
pub(crate) fn write_tlv(out: &mut Vec<u8>, tag: u8, contents: &[u8]) {
    out.push(tag);
    let len = contents.len();
    if len < 0x80 {
        // Short form: the length is the byte itself (checked just above).
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let significant = &bytes[skip..];
        // At most size_of::<usize>() bytes, so this always fits in the 7-bit count.
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(contents);
}

/// Reads one DER TLV with a single-byte tag from the front of `input`.
///
/// Returns the tag, the contents and the rest. Rejects indefinite and non-minimal lengths
/// (DER requires the shortest form).
pub(crate) fn read_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    // Multi-byte tags (low five bits all set) never occur in what we parse.
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        // 0x80 is the BER indefinite form; more than 4 length bytes is absurd here.
        if count == 0 || count > 4 {
            return None;
        }
        let (len_bytes, after) = rest.split_at_checked(count)?;
        if len_bytes.first() == Some(&0) {
            return None;
        }
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        if len < 0x80 {
            return None;
        }
        rest = after;
        len
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// Splits a DER SubjectPublicKeyInfo into the contents of its AlgorithmIdentifier (the form
/// `SignatureVerificationAlgorithm::public_key_alg_id` uses) and the public key bytes.
pub(crate) fn split_spki(spki: &[u8]) -> Option<(&[u8], &[u8])> {
    let (tag, body, trailing) = read_tlv(spki)?;
    if tag != TAG_SEQUENCE || !trailing.is_empty() {
        return None;
    }
    let (tag, alg_id, rest) = read_tlv(body)?;
    if tag != TAG_SEQUENCE {
        return None;
    }
    let (tag, bits, trailing) = read_tlv(rest)?;
    if tag != TAG_BIT_STRING || !trailing.is_empty() {
        return None;
    }
    // Public keys are whole bytes: the unused-bits count must be zero.
    match bits.split_first() {
        Some((0, key)) => Some((alg_id, key)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lengths_round_trip() {
        for len in [0usize, 1, 127, 128, 255, 256, 70_000] {
            let contents = vec![7u8; len];
            let mut out = Vec::new();
            write_tlv(&mut out, TAG_SEQUENCE, &contents);
            let (tag, got, rest) = read_tlv(&out).unwrap();
            assert_eq!((tag, got, rest), (TAG_SEQUENCE, &contents[..], &[][..]));
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        // indefinite length
        assert!(read_tlv(&[0x30, 0x80, 0, 0]).is_none());
        // non-minimal long form
        assert!(read_tlv(&[0x30, 0x81, 0x05, 1, 2, 3, 4, 5]).is_none());
        // truncated
        assert!(read_tlv(&[0x30, 0x05, 1, 2]).is_none());
        assert!(read_tlv(&[0x30]).is_none());
        assert!(read_tlv(&[]).is_none());
    }

    #[test]
    fn splits_a_generated_spki() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
        let (alg, point) = split_spki(&spki).unwrap();
        assert_eq!(
            alg,
            rustls_pki_types::alg_id::ECDSA_P256.as_ref(),
            "algorithm identifier contents"
        );
        assert_eq!(point, key.public_key_raw());
        assert!(split_spki(&spki[..spki.len() - 1]).is_none());
    }
}
