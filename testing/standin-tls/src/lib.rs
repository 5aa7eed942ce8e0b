//! The TLS every HTTPS stand-in of a vendor or cloud service (AMD's KDS, Intel's PCS, the GCE
//! and EC2 APIs) serves with: a CA of its own, made fresh per start, and a serving certificate
//! for the loopback names. The client under test trusts that CA as it would trust the vendor's
//! public roots, so its TLS is real.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls23::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the certificates or the server config could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen could not make a key or a certificate.
    #[error("generating the stand-in's certificates")]
    Certificate(#[source] rcgen::Error),
    /// rustls refused the certificate or its key.
    #[error("building the stand-in's TLS server config")]
    Tls(#[source] rustls23::Error),
}

/// A fresh CA (its PEM) and a server config (h2 and http/1.1, aws-lc-rs) serving a certificate
/// it issues for `localhost`, `127.0.0.1`, `::1` and `extra_ip`.
pub fn generate(extra_ip: IpAddr) -> Result<(String, Arc<rustls23::ServerConfig>), Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Certificate)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "stand-in CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(Error::Certificate)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(Error::Certificate)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !extra_ip.is_loopback() {
        names.push(extra_ip.to_string());
    }
    let mut params = CertificateParams::new(names).map_err(Error::Certificate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "stand-in");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(Error::Certificate)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(Error::Certificate)?;

    let provider = Arc::new(rustls23::crypto::aws_lc_rs::default_provider());
    let mut config = rustls23::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(Error::Tls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), Arc::new(config)))
}
