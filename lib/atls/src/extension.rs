//! The attested certificate: a self-signed X.509 certificate carrying an attestation document
//! in one extension.
//!
//! Wire format, as Constellation's Go code writes it (`pkix.Extension{Id: issuer.OID(), Value:
//! attDoc}`): the extension's OID names the variant (see [`attestation::Variant::oid`]), it is
//! not critical, and `extnValue` (the OCTET STRING) holds the document bytes directly, not
//! wrapped in any further ASN.1. The subject is `CN=Constellation` and the validity runs from
//! two hours before to two hours after issuance.

use std::time::Duration;

use attestation::{Issuer, Variant};
use aws_lc_rs::digest;
use rcgen::{CertificateParams, CustomExtension, DnType, KeyPair, PublicKeyData as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use crate::error::HandshakeError;

/// The subject CommonName Constellation puts into aTLS certificates.
pub const SUBJECT_COMMON_NAME: &str = "Constellation";

/// How far the client certificate's validity reaches either side of "now", as in Go; it covers
/// clock skew between node and service.
const CLIENT_VALIDITY_SLACK: Duration = Duration::from_secs(2 * 60 * 60);

/// Constellation's OID arc; every attestation variant's extension lives below it.
const CONSTELLATION_ARC: &str = "1.3.9900.";

/// A freshly generated key and the certificate for it.
#[derive(Debug)]
pub struct AttestedCertificate {
    /// The DER certificate.
    pub certificate: CertificateDer<'static>,
    /// The matching private key, PKCS#8.
    pub private_key: PrivateKeyDer<'static>,
}

/// The user data an attestation must bind for a certificate with this SubjectPublicKeyInfo:
/// `SHA-256(DER SubjectPublicKeyInfo)`, as Go's `hashPublicKey` computes it.
pub fn user_data_for_spki(spki_der: &[u8]) -> [u8; 32] {
    let hash = digest::digest(&digest::SHA256, spki_der);
    let mut out = [0u8; 32];
    out.copy_from_slice(hash.as_ref());
    out
}

/// Makes a fresh ECDSA P-256 key, asks `issuer` for a document over the key's hash and `nonce`,
/// and returns a self-signed certificate carrying it.
///
/// `issuer.issue` may block (a TPM quote); call this where blocking is acceptable.
pub fn attested_certificate(
    issuer: &dyn Issuer,
    nonce: &[u8],
) -> Result<AttestedCertificate, HandshakeError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(HandshakeError::Certificate)?;
    let user_data = user_data_for_spki(&key.subject_public_key_info());
    let document = issuer
        .issue(&user_data, nonce)
        .map_err(HandshakeError::Issue)?;
    let certificate = self_signed(
        &key,
        Some((issuer.variant(), document)),
        CLIENT_VALIDITY_SLACK,
    )
    .map_err(HandshakeError::Certificate)?;
    Ok(AttestedCertificate {
        certificate,
        private_key: PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
    })
}

/// A self-signed `CN=Constellation` certificate for `key`, valid from `slack` before to `slack`
/// after now, with the attestation extension if one is given.
pub(crate) fn self_signed(
    key: &KeyPair,
    attestation: Option<(Variant, Vec<u8>)>,
    slack: Duration,
) -> Result<CertificateDer<'static>, rcgen::Error> {
    let now = OffsetDateTime::now_utc();
    self_signed_for(key, attestation, None, now - slack, now + slack)
}

/// A self-signed `CN=Constellation` certificate for `key`, valid from `not_before` to
/// `not_after`, with the attestation extension if one is given, and the collateral extension
/// ([`crate::server_collateral`]) if that is given. X.509 times have whole seconds; callers that
/// bind the window elsewhere must pass whole seconds.
pub(crate) fn self_signed_for(
    key: &KeyPair,
    attestation: Option<(Variant, Vec<u8>)>,
    collateral: Option<Vec<u8>>,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<CertificateDer<'static>, rcgen::Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, SUBJECT_COMMON_NAME);
    params.not_before = not_before;
    params.not_after = not_after;
    if let Some((variant, document)) = attestation {
        // rcgen places `content` verbatim inside extnValue's OCTET STRING, which is exactly
        // where Go puts the document.
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(variant.oid(), document));
    }
    if let Some(collateral) = collateral {
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(
                crate::server_collateral::SERVER_COLLATERAL_OID,
                collateral,
            ));
    }
    Ok(params.self_signed(key)?.der().clone())
}

/// The attestation document for `variant` in `cert`, if the certificate carries one.
pub fn find_document<'a>(cert: &X509Certificate<'a>, variant: Variant) -> Option<&'a [u8]> {
    let wanted = variant.oid_string();
    cert.extensions()
        .iter()
        .find(|ext| ext.oid.to_id_string() == wanted)
        .map(|ext| ext.value)
}

/// The dotted OIDs of all attestation extensions (Constellation's arc, without the server
/// collateral's) in `cert`, for telling an operator what a rejected node did present.
pub fn attestation_oids(cert: &X509Certificate<'_>) -> Vec<String> {
    let collateral = crate::server_collateral::oid_string();
    cert.extensions()
        .iter()
        .map(|ext| ext.oid.to_id_string())
        .filter(|oid| oid.starts_with(CONSTELLATION_ARC) && *oid != collateral)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer as _;

    #[derive(Debug)]
    struct EchoIssuer;

    impl Issuer for EchoIssuer {
        fn variant(&self) -> Variant {
            Variant::QemuVtpm
        }
        fn issue(
            &self,
            user_data: &[u8],
            nonce: &[u8],
        ) -> Result<Vec<u8>, attestation::IssueError> {
            Ok([user_data, nonce].concat())
        }
    }

    #[test]
    fn document_sits_verbatim_in_the_extension() {
        let nonce = [5u8; 32];
        let made = attested_certificate(&EchoIssuer, &nonce).unwrap();
        let (rest, cert) = X509Certificate::from_der(made.certificate.as_ref()).unwrap();
        assert!(rest.is_empty());

        let document = find_document(&cert, Variant::QemuVtpm).unwrap();
        let spki = cert.tbs_certificate.subject_pki.raw;
        // The user data was computed from rcgen's SPKI before the certificate existed; it must
        // equal the hash of the SPKI as it appears in the certificate.
        assert_eq!(&document[..32], user_data_for_spki(spki));
        assert_eq!(&document[32..], nonce);

        let ext = cert
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.9900.5.1")
            .unwrap();
        assert!(!ext.critical);
        assert_eq!(attestation_oids(&cert), vec!["1.3.9900.5.1".to_owned()]);
        assert!(find_document(&cert, Variant::AzureSevSnp).is_none());
        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            SUBJECT_COMMON_NAME
        );
        cert.verify_signature(None).unwrap();
    }
}
