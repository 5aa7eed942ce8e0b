//! Verifying the TLS handshake signature (`CertificateVerify` / `ServerKeyExchange`) against the
//! key of the certificate the peer presented.
//!
//! This is the proof that the peer holds the private key of its aTLS certificate. Without it an
//! attacker could relay the server's nonce to an honest node, obtain that node's freshly
//! attested certificate, and present it as its own. rustls' own helpers for this live
//! behind its `webpki` feature, which would pull in a second pre-release crate just to parse a
//! SubjectPublicKeyInfo, so we do the small remaining step ourselves on top of the aws-lc-rs
//! provider's algorithm table.

use rustls::SignerPublicKey;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, SignatureScheme, WebPkiSupportedAlgorithms};
use rustls::error::{CertificateError, Error, PeerMisbehaved};
use rustls::server::danger::SignatureVerificationInput;
use x509_parser::prelude::FromDer as _;

use crate::der::split_spki;

/// TLS 1.2 rules, for `verify_tls12_signature` of both verifier traits.
pub(crate) fn verify_tls12(
    input: &SignatureVerificationInput<'_>,
    provider: &CryptoProvider,
) -> Result<HandshakeSignatureValid, Error> {
    verify(
        input,
        &provider.signature_verification_algorithms,
        Version::Tls12,
    )
}

/// TLS 1.3 rules, for `verify_tls13_signature` of both verifier traits.
pub(crate) fn verify_tls13(
    input: &SignatureVerificationInput<'_>,
    provider: &CryptoProvider,
) -> Result<HandshakeSignatureValid, Error> {
    verify(
        input,
        &provider.signature_verification_algorithms,
        Version::Tls13,
    )
}

/// The schemes we can verify, most preferred first.
pub(crate) fn supported_schemes(provider: &CryptoProvider) -> Vec<SignatureScheme> {
    provider
        .signature_verification_algorithms
        .supported_schemes()
}

/// Which TLS version's rules apply to the signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    Tls12,
    Tls13,
}

/// The schemes TLS 1.3 allows in `CertificateVerify` (RFC 8446 4.4.3: no PKCS#1 v1.5, no SHA-1).
const TLS13_SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ECDSA_NISTP521_SHA512,
    SignatureScheme::ED25519,
    SignatureScheme::ED448,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA512,
];

/// Verifies `input` with the provider's algorithms.
///
/// TLS 1.2 tries every algorithm mapped to the scheme (there, `ECDSA_NISTP256_SHA256` does not
/// pin the curve); TLS 1.3 binds scheme and curve, so only the first mapping applies. In both
/// cases the algorithm must match the key's own AlgorithmIdentifier.
fn verify(
    input: &SignatureVerificationInput<'_>,
    algorithms: &WebPkiSupportedAlgorithms,
    version: Version,
) -> Result<HandshakeSignatureValid, Error> {
    let scheme = input.signature.scheme;
    if version == Version::Tls13 && !TLS13_SCHEMES.contains(&scheme) {
        return Err(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into());
    }
    let candidates = algorithms
        .mapping()
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, algs)| *algs)
        .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
    let candidates = match version {
        Version::Tls12 => candidates,
        Version::Tls13 => candidates.get(..1).unwrap_or_default(),
    };

    let spki = match input.signer {
        SignerPublicKey::X509(cert) => certificate_spki(cert.as_ref())?,
        SignerPublicKey::RawPublicKey(spki) => spki.as_ref(),
        _ => return Err(CertificateError::BadEncoding.into()),
    };
    let (key_alg, key) = split_spki(spki).ok_or(CertificateError::BadEncoding)?;

    let alg = candidates
        .iter()
        .find(|alg| alg.public_key_alg_id().as_ref() == key_alg)
        .ok_or(CertificateError::BadSignature)?;
    alg.verify_signature(key, input.message, input.signature.signature())
        .map_err(|_| CertificateError::BadSignature)?;
    Ok(HandshakeSignatureValid::assertion())
}

/// The raw SubjectPublicKeyInfo of a DER certificate.
fn certificate_spki(der: &[u8]) -> Result<&[u8], Error> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|_| CertificateError::BadEncoding)?;
    Ok(cert.tbs_certificate.subject_pki.raw)
}
