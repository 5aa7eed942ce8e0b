//! certifier: the only process of the join service that reaches the node's attestation device.
//!
//! ```text
//! attest-proxy ──gRPC over a Unix socket (uid checked)──▶ certifier ──▶ /dev/tpmrm0 (or SNP / TDX)
//! ```
//!
//! attest-proxy presents nodes a TLS server key bound to attestation evidence of the
//! control-plane node it runs on (ARCHITECTURE.md, "The service attests itself"). Producing that
//! evidence needs the device, and whoever can ask the device for evidence over a key of their
//! choice can impersonate the service; so the device sits here, behind one question asked by one
//! uid: certify this public key for this validity window ([`service`]). The user data and nonce
//! of the document are computed here from the key and the window
//! ([`atls::server_evidence::certify`]), never taken from the caller, and the window must be
//! current and short. The certifier holds no key and no credential, and parses nothing from the
//! network.

#![forbid(unsafe_code)]

mod config;
pub mod device;
pub mod service;

use std::sync::Arc;

use attestation::Issuer;
use plumbing::shutdown::Shutdown;
use plumbing::unix;
use proto::certifier::certifier_server::CertifierServer;

pub use config::Config;

/// Why the certifier could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the Certifier socket")]
    Bind(#[source] unix::Error),
    #[error("serving Certifier")]
    Serve(#[source] tonic::transport::Error),
}

/// Serves Certifier on `config.socket`, with documents from `issuer`, until `shutdown` fires;
/// then lets a call in flight finish for at most `config.grace_period`.
pub async fn run(config: Config, issuer: Arc<dyn Issuer>, shutdown: Shutdown) -> Result<(), Error> {
    let server = unix::UnixServer::bind(&config.socket, config.socket_mode, config.peer_uid)
        .map_err(Error::Bind)?;
    tracing::info!(
        socket = %config.socket.display(),
        peer_uid = config.peer_uid,
        variant = %issuer.variant(),
        "certifier serving"
    );
    let routes = tonic::service::Routes::new(CertifierServer::new(service::Service::new(issuer)));
    server
        .serve(routes, shutdown, config.grace_period)
        .await
        .map_err(Error::Serve)
}
