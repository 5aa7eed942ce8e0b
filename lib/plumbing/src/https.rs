//! The HTTP(S) client the processes use to reach services outside the cluster (AMD's KDS, the
//! GCE metadata server and Compute API): rustls on aws-lc-rs, the system's roots plus an operator's
//! extra CA, HTTP/1.1, plain `http://` allowed for a proxy or a metadata server.

use std::path::Path;
use std::sync::Arc;

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A client for GET requests with an empty body.
pub type HttpsClient =
    Client<hyper_rustls::HttpsConnector<HttpConnector>, http_body_util::Empty<bytes::Bytes>>;

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("reading the CA file {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// A client trusting the system's roots plus the PEM certificates in `extra_ca`.
pub fn client(extra_ca: Option<&Path>) -> Result<HttpsClient, SetupError> {
    use rustls23::pki_types::CertificateDer;
    use rustls23::pki_types::pem::PemObject;
    let mut roots = rustls23::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = extra_ca {
        let ca_error = |reason: String| SetupError::Ca {
            path: path.display().to_string(),
            reason,
        };
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| ca_error(e.to_string()))? {
            let cert = cert.map_err(|e| ca_error(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls23::crypto::aws_lc_rs::default_provider());
    let config = rustls23::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SetupError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}
