//! Plain mutual TLS, the benchmark's floor (setup A): the same key types as aTLS, no attestation.
//!
//! The server has a self-signed ECDSA P-256 certificate, as attest-proxy's aTLS server does. Each
//! simulated node has its own ECDSA P-256 key and a certificate signed by a client CA, which the
//! server verifies (one signature, as the aTLS server checks the client certificate's
//! self-signature). The client checks only that the server holds its certificate's key, as the
//! aTLS client does. Session resumption is off on both sides, so every connection is a full
//! handshake, as with aTLS.
//!
//! This uses the workspace's rustls 0.23 with aws-lc-rs (through tokio-rustls), the stock stack a
//! service without attestation would use; aTLS is rustls 0.24 (see `atls`).

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls23::client::Resumption;
use rustls23::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls23::crypto::CryptoProvider;
use rustls23::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls23::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// Why the mutual-TLS setup failed.
#[derive(Debug, thiserror::Error)]
pub enum MtlsError {
    #[error("cannot generate a key or certificate")]
    Certificate(#[source] rcgen::Error),
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    Pem {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("rustls refused the configuration")]
    Tls(#[source] rustls23::Error),
    #[error("cannot build the client certificate verifier")]
    Verifier(#[source] rustls23::server::VerifierBuilderError),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls23::crypto::aws_lc_rs::default_provider())
}

fn p256() -> Result<KeyPair, MtlsError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(MtlsError::Certificate)
}

fn read(path: &Path) -> Result<String, MtlsError> {
    std::fs::read_to_string(path).map_err(|source| MtlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The CA that signs the simulated nodes' client certificates.
#[derive(Debug)]
pub struct ClientCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl ClientCa {
    /// A fresh ECDSA P-256 CA.
    pub fn generate() -> Result<Self, MtlsError> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "loadgen client CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = p256()?;
        let cert = params.self_signed(&key).map_err(MtlsError::Certificate)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA from its PEM certificate and PEM key (as [`ClientCa::write`] left them).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, MtlsError> {
        let cert_pem = read(cert)?;
        let key = KeyPair::from_pem(&read(key)?).map_err(MtlsError::Certificate)?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(MtlsError::Certificate)?;
        Ok(Self { issuer, cert_pem })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Writes the CA certificate and key as PEM files.
    pub fn write(&self, cert: &Path, key: &Path) -> std::io::Result<()> {
        std::fs::write(cert, &self.cert_pem)?;
        std::fs::write(key, self.issuer.key().serialize_pem())
    }

    /// A client TLS config for one node: its own P-256 key and a certificate from this CA.
    pub fn client_config(&self, node_name: &str) -> Result<Arc<ClientConfig>, MtlsError> {
        let key = p256()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, node_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(MtlsError::Certificate)?;
        let provider = provider();
        let mut config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(MtlsError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(UnauthenticatedServer { provider }))
            .with_client_auth_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(MtlsError::Tls)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = Resumption::disabled();
        Ok(Arc::new(config))
    }
}

/// The trivial server's TLS config: a self-signed P-256 certificate, client certificates from
/// the CA in `client_ca_pem` required, no resumption, ALPN `h2`.
pub fn server_config(client_ca_pem: &Path) -> Result<Arc<ServerConfig>, MtlsError> {
    let pem = read(client_ca_pem)?;
    let ca = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|source| MtlsError::Pem {
        path: client_ca_pem.display().to_string(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    roots.add(ca).map_err(MtlsError::Tls)?;
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(MtlsError::Verifier)?;

    let key = p256()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "loadgen trivial upstream");
    let cert = params.self_signed(&key).map_err(MtlsError::Certificate)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(MtlsError::Tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(MtlsError::Tls)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    // As the aTLS server: no session cache, no tickets, so every connection is a full handshake
    // and the server spends nothing on tickets nobody will use.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The name a client puts into its ClientHello: an IP address, so no SNI is sent (as aTLS).
pub fn server_name(addr: std::net::SocketAddr) -> ServerName<'static> {
    ServerName::IpAddress(addr.ip().into())
}

/// Accepts any server certificate but checks the handshake signature, exactly the trust the aTLS
/// client extends to the join service.
#[derive(Debug)]
struct UnauthenticatedServer {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for UnauthenticatedServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls23::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls23::Error> {
        rustls23::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls23::Error> {
        rustls23::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
