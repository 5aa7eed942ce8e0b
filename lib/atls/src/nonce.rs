//! How the server's nonce travels: as the only acceptable-CA distinguished name of the TLS
//! `CertificateRequest`.
//!
//! Constellation's Go server puts a throwaway certificate whose subject is
//! `CN=<standard base64 of the nonce>` into `tls.Config.ClientCAs`; Go then sends that
//! certificate's raw subject, a complete DER `Name` (outer SEQUENCE of RDN SETs), as the only
//! entry of `certificate_authorities`. Go writes the CommonName as a PrintableString (every
//! base64 character, `+`, `/` and `=` included, is printable). The Go client requires exactly
//! one entry, unmarshals it as an `RDNSequence` and base64-decodes the first CommonName.
//!
//! rustls sends each `DistinguishedName` verbatim, so we hand it the complete DER `Name`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls::DistinguishedName;
use x509_parser::prelude::FromDer as _;
use x509_parser::x509::X509Name;

use crate::der::{TAG_OID, TAG_PRINTABLE_STRING, TAG_SEQUENCE, TAG_SET, write_tlv};
use crate::error::HandshakeError;

/// Length of the server's nonce, as in Constellation (`crypto.RNGLengthDefault`).
pub const NONCE_LEN: usize = 32;

/// DER contents of the OID 2.5.4.3 (id-at-commonName).
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// Draws a fresh nonce from the system CSPRNG.
pub(crate) fn generate(
    rng: &dyn aws_lc_rs::rand::SecureRandom,
) -> Result<[u8; NONCE_LEN], HandshakeError> {
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill(&mut nonce).map_err(|_| HandshakeError::Random)?;
    Ok(nonce)
}

/// The DER `Name` `CN=<base64(nonce)>` that carries `nonce` to the client.
pub fn encode_distinguished_name(nonce: &[u8]) -> Vec<u8> {
    let encoded = STANDARD.encode(nonce);

    let mut oid = Vec::new();
    write_tlv(&mut oid, TAG_OID, OID_COMMON_NAME);
    let mut attribute = oid;
    write_tlv(&mut attribute, TAG_PRINTABLE_STRING, encoded.as_bytes());

    let mut type_and_value = Vec::new();
    write_tlv(&mut type_and_value, TAG_SEQUENCE, &attribute);
    let mut rdn = Vec::new();
    write_tlv(&mut rdn, TAG_SET, &type_and_value);
    let mut name = Vec::new();
    write_tlv(&mut name, TAG_SEQUENCE, &rdn);
    name
}

/// The `DistinguishedName` hint for rustls.
pub(crate) fn hint(nonce: &[u8]) -> DistinguishedName {
    DistinguishedName::from(encode_distinguished_name(nonce))
}

/// Recovers the nonce from the acceptable-CA names of a `CertificateRequest`, with the same
/// rules as Constellation's client: exactly one name, its first CommonName, standard base64.
pub fn decode_from_hints(hints: &[DistinguishedName]) -> Result<Vec<u8>, HandshakeError> {
    let [name] = hints else {
        return Err(HandshakeError::NoNonce(format!(
            "expected exactly one acceptable CA name, got {}",
            hints.len()
        )));
    };
    decode_distinguished_name(name.as_ref())
}

/// Recovers the nonce from one DER `Name`.
pub fn decode_distinguished_name(der: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let (rest, name) = X509Name::from_der(der)
        .map_err(|e| HandshakeError::NoNonce(format!("acceptable CA name is not DER: {e}")))?;
    if !rest.is_empty() {
        return Err(HandshakeError::NoNonce(
            "trailing bytes after the acceptable CA name".to_owned(),
        ));
    }
    let common_name = name.iter_common_name().next().ok_or_else(|| {
        HandshakeError::NoNonce("acceptable CA name has no CommonName".to_owned())
    })?;
    let text = common_name
        .as_str()
        .map_err(|e| HandshakeError::NoNonce(format!("CommonName is not a string: {e}")))?;
    STANDARD
        .decode(text)
        .map_err(|e| HandshakeError::NoNonce(format!("CommonName is not standard base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        // Chosen so the base64 contains '+', '/' and '='.
        let nonce: Vec<u8> = (0..NONCE_LEN as u8).map(|i| 0xfb ^ i).collect();
        let der = encode_distinguished_name(&nonce);
        // SEQUENCE { SET { SEQUENCE { OID 2.5.4.3, PrintableString(44 chars) } } }
        assert_eq!(&der[..2], &[0x30, 55]);
        assert_eq!(&der[2..4], &[0x31, 53]);
        assert_eq!(&der[4..6], &[0x30, 51]);
        assert_eq!(&der[6..11], &[0x06, 0x03, 0x55, 0x04, 0x03]);
        assert_eq!(&der[11..13], &[0x13, 44]);
        let text = std::str::from_utf8(&der[13..]).unwrap();
        assert!(text.contains('+') || text.contains('/'));
        assert!(text.ends_with('='));
        assert_eq!(decode_distinguished_name(&der).unwrap(), nonce);
        assert_eq!(decode_from_hints(&[hint(&nonce)]).unwrap(), nonce);
    }

    #[test]
    fn a_utf8_common_name_is_accepted_too() {
        // Other encoders may choose UTF8String; Go's client accepts any string type.
        let nonce = [9u8; NONCE_LEN];
        let mut name = rcgen::DistinguishedName::new();
        name.push(
            rcgen::DnType::CommonName,
            rcgen::DnValue::Utf8String(STANDARD.encode(nonce)),
        );
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = name;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.der()).unwrap();
        let subject = parsed.subject().as_raw();
        assert_eq!(decode_distinguished_name(subject).unwrap(), nonce);
    }

    #[test]
    fn rejects_what_go_rejects() {
        let one = hint(&[1; NONCE_LEN]);
        assert!(matches!(
            decode_from_hints(&[]),
            Err(HandshakeError::NoNonce(_))
        ));
        assert!(matches!(
            decode_from_hints(&[one.clone(), one]),
            Err(HandshakeError::NoNonce(_))
        ));
        assert!(decode_distinguished_name(b"\x30\x00").is_err());
        assert!(decode_distinguished_name(b"garbage").is_err());
    }
}
