//! The benchmark's trivial upstream: `join.API` answering every call with one fixed small ticket,
//! so that what is measured is the connection, the handshake and one unary call, not the ticket.
//!
//! Served over TCP with mutual TLS for setup A ([`serve_mtls`]), and over a Unix socket behind
//! attest-proxy for setup B ([`serve_unix`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use plumbing::shutdown::Shutdown;
use plumbing::unix::PeerPolicy;
use proto::join::api_server::{Api, ApiServer};
use proto::join::{
    IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest,
    IssueRejoinTicketResponse,
};
use tokio::net::TcpListener;

/// How long a client has for the TLS handshake before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the trivial upstream stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrivialError {
    #[error("cannot listen on the Unix socket")]
    Unix(#[source] plumbing::unix::Error),
    #[error("serving gRPC failed")]
    Serve(#[source] tonic::transport::Error),
}

/// The fixed ticket: every field a node reads, small and constant.
pub fn fixed_ticket() -> IssueJoinTicketResponse {
    IssueJoinTicketResponse {
        state_disk_key: vec![0x5d; 32],
        measurement_salt: vec![0x5a; 32],
        measurement_secret: vec![0x5e; 32],
        kubelet_cert: b"-----BEGIN CERTIFICATE-----\nbG9hZGdlbg==\n-----END CERTIFICATE-----\n"
            .to_vec(),
        api_server_endpoint: "10.0.0.1:6443".to_owned(),
        token: "abcdef.0123456789abcdef".to_owned(),
        discovery_token_ca_cert_hash: format!("sha256:{}", "0".repeat(64)),
        kubernetes_version: "v1.31.0".to_owned(),
        ..Default::default()
    }
}

/// `join.API` with constant answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Trivial;

#[tonic::async_trait]
impl Api for Trivial {
    async fn issue_join_ticket(
        &self,
        _request: tonic::Request<IssueJoinTicketRequest>,
    ) -> Result<tonic::Response<IssueJoinTicketResponse>, tonic::Status> {
        Ok(tonic::Response::new(fixed_ticket()))
    }

    async fn issue_rejoin_ticket(
        &self,
        _request: tonic::Request<IssueRejoinTicketRequest>,
    ) -> Result<tonic::Response<IssueRejoinTicketResponse>, tonic::Status> {
        Ok(tonic::Response::new(IssueRejoinTicketResponse {
            state_disk_key: vec![0x5d; 32],
            measurement_secret: vec![0x5e; 32],
        }))
    }
}

/// Serves on a Unix socket to processes of `peer_uid` only, as join-core serves attest-proxy.
pub async fn serve_unix(
    path: &Path,
    peer_uid: u32,
    shutdown: Shutdown,
) -> Result<(), TrivialError> {
    let listener = plumbing::unix::bind(path, 0o600).map_err(TrivialError::Unix)?;
    tracing::info!(socket = %path.display(), peer_uid, "trivial upstream listening");
    tonic::transport::Server::builder()
        .add_service(ApiServer::new(Trivial))
        .serve_with_incoming_shutdown(
            plumbing::unix::incoming(listener, PeerPolicy::uids([peer_uid])),
            shutdown.wait(),
        )
        .await
        .map_err(TrivialError::Serve)
}

/// Serves [`Trivial`] over HTTP/2 and mutual TLS on `listener`: per connection a full handshake,
/// then gRPC, as attest-proxy serves its nodes but without attestation and without forwarding.
pub async fn serve_mtls(
    listener: TcpListener,
    tls: Arc<rustls23::ServerConfig>,
    shutdown: Shutdown,
) -> Result<(), TrivialError> {
    serve_mtls_with(listener, tls, Trivial, shutdown).await
}

/// [`serve_mtls`] with another `join.API` implementation (tests answer with chosen statuses).
pub async fn serve_mtls_with(
    listener: TcpListener,
    tls: Arc<rustls23::ServerConfig>,
    api: impl Api,
    shutdown: Shutdown,
) -> Result<(), TrivialError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let service = ApiServer::new(api);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "trivial upstream listening (mutual TLS)");
    }
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.clone().wait() => break,
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, service) = (acceptor.clone(), service.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service))
                .await;
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    // Open connections end with the process; the benchmark stops this server between setups.
    Ok(())
}
