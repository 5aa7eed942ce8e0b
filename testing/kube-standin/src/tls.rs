//! The stand-in's own CA and serving certificate, and the rustls server config.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls23::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::Error;

/// A fresh CA, a serving certificate for `localhost`, `127.0.0.1`, `::1` and `extra_ip`, and a
/// server config offering h2 and http/1.1 (kube-rs negotiates h2 when available). The other
/// stand-ins (the KDS) serve TLS with it too.
pub fn generate(extra_ip: IpAddr) -> Result<(String, Arc<rustls23::ServerConfig>), Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Certificate)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-standin-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(Error::Certificate)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(Error::Certificate)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut sans = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !extra_ip.is_loopback() {
        sans.push(extra_ip.to_string());
    }
    let mut params = CertificateParams::new(sans).map_err(Error::Certificate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
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
