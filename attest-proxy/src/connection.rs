//! One node connection: aTLS handshake, attestation on the verify pool, then HTTP/2 forwarding.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use plumbing::shutdown::Shutdown;
use tokio::net::TcpStream;
use tower::ServiceBuilder;

use crate::allowlist::AllowlistLayer;
use crate::identity::{IdentityLayer, PeerIdentity};
use crate::policy::Current;
use crate::status;
use crate::upstream::Upstream;
use crate::verify_pool::{PoolError, VerifyPool};

/// What every connection shares.
#[derive(Debug)]
pub struct Shared {
    pub acceptor: atls::Acceptor,
    pub policy: Current,
    pub pool: VerifyPool,
    pub allowlist: AllowlistLayer,
    pub upstream: Upstream,
    pub handshake_timeout: std::time::Duration,
}

/// Serves one node until it disconnects or shutdown drains it.
pub async fn handle(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    shutdown: Shutdown,
) {
    let started = Instant::now();
    let attested =
        tokio::time::timeout(shared.handshake_timeout, attest(&shared, tcp, peer_addr)).await;
    let (tls, outcome) = match attested {
        Ok(Ok(attested)) => attested,
        Ok(Err(error)) => {
            tracing::warn!(peer = %peer_addr, error = %status::chain(&error), "aTLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::warn!(peer = %peer_addr, timeout = ?shared.handshake_timeout, "aTLS handshake and attestation timed out");
            return;
        }
    };
    match outcome {
        Ok(identity) => {
            tracing::debug!(peer = %peer_addr, elapsed = ?started.elapsed(), "attested connection ready");
            let service = ServiceBuilder::new()
                .layer(shared.allowlist.clone())
                .layer(IdentityLayer::new(&identity))
                .service(shared.upstream.clone());
            serve(tls, service, shutdown, false).await;
        }
        Err(refusal) => {
            let service =
                tower::service_fn(move |_request: http::Request<hyper::body::Incoming>| {
                    let refusal = refusal.clone();
                    async move { Ok::<_, std::convert::Infallible>(status::respond(refusal)) }
                });
            serve(tls, service, shutdown, true).await;
        }
    }
}

type Tls = atls::TlsStream<TcpStream>;

/// Runs the handshake, then verification on the pool. The node learns why it was refused from a
/// gRPC status on its first call, so a failed check still yields a connection to answer on.
async fn attest(
    shared: &Shared,
    tcp: TcpStream,
    peer_addr: SocketAddr,
) -> Result<(Tls, Result<PeerIdentity, tonic::Status>), atls::HandshakeError> {
    let (tls, evidence) = shared.acceptor.accept(tcp).await?;
    let active = shared.policy.get();
    let validator = active.validator.clone();
    let verdict = shared
        .pool
        .run(move || evidence.verify(validator.as_ref()))
        .await;
    let outcome = match verdict {
        Ok(Ok(verified)) => {
            for warning in &verified.warnings {
                tracing::warn!(peer = %peer_addr, policy = %active.digest, %warning, "warn-only measurement mismatch");
            }
            tracing::info!(peer = %peer_addr, variant = %verified.variant, policy = %active.digest, "node attested");
            Ok(PeerIdentity {
                variant: verified.variant,
                peer_addr,
                policy_digest: active.digest.clone(),
            })
        }
        Ok(Err(error)) => {
            let reason = status::chain(&error);
            tracing::warn!(peer = %peer_addr, policy = %active.digest, %reason, "attestation rejected");
            Err(tonic::Status::unauthenticated(format!(
                "attestation rejected: {reason}"
            )))
        }
        Err(error @ PoolError::Overloaded { .. }) => {
            tracing::warn!(peer = %peer_addr, %error, "verification refused, node told to retry");
            Err(tonic::Status::resource_exhausted(format!(
                "{error}; retry later"
            )))
        }
        Err(error @ PoolError::Gone) => Err(tonic::Status::unavailable(error.to_string())),
    };
    Ok((tls, outcome))
}

/// Serves HTTP/2 on the TLS stream. On shutdown the connection is drained gracefully: streams in
/// flight finish, new ones are refused with GOAWAY. A refusing connection closes after its first
/// answer so an unattested client cannot hold it.
async fn serve<S>(tls: Tls, service: S, shutdown: Shutdown, close_after_first: bool)
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let answered = Arc::new(tokio::sync::Notify::new());
    let service = {
        let answered = answered.clone();
        tower::ServiceExt::map_response(service, move |response| {
            answered.notify_one();
            response
        })
    };
    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let closing = async {
        if close_after_first {
            answered.notified().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
            return;
        }
        () = shutdown.wait() => {}
        () = closing => {}
    }
    connection.as_mut().graceful_shutdown();
    if let Err(error) = connection.await {
        tracing::debug!(%error, "connection ended with an error while draining");
    }
}
