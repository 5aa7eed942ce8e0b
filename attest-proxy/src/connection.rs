//! One node connection: aTLS handshake, attestation on the verify pool, then HTTP/2 forwarding.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use plumbing::shutdown::Shutdown;
use tokio::net::TcpStream;
use tower::ServiceBuilder;

use atls::VerifyError;
use attestation::audit;

use crate::admission::{Admission, Admitted};
use crate::allowlist::AllowlistLayer;
use crate::identity::{IdentityLayer, PeerIdentity};
use crate::metrics::{Handshake, Metrics};
use crate::policy::Current;
use crate::status;
use crate::upstream::Upstream;
use crate::verify_pool::{PoolError, VerifyPool};

/// What every connection shares.
#[derive(Debug)]
pub struct Shared {
    pub acceptor: atls::Acceptor,
    pub policy: Arc<Current>,
    pub admission: Admission,
    pub pool: VerifyPool,
    pub allowlist: AllowlistLayer,
    pub upstream: Upstream,
    pub handshake_timeout: std::time::Duration,
    pub metrics: Metrics,
}

/// Serves one node until it disconnects or shutdown drains it.
///
/// Until the client sends its first bytes, the connection's task holds only a socket and this
/// small future: the state of a handshake, a verification and HTTP/2 serving (tens of KiB) is
/// allocated when the client starts talking, so a crowd of silent connections held until the
/// deadline costs little. The deadline runs from accept either way.
pub async fn handle(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    admitted: Admitted,
    shutdown: Shutdown,
) {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + shared.handshake_timeout;
    let first_bytes = tokio::time::timeout_at(deadline, async {
        // `readable` may wake spuriously; a peek waits until a byte has really arrived.
        let mut first = [0u8; 1];
        match tcp.peek(&mut first).await {
            Ok(0) => Err(atls::HandshakeError::UnexpectedEof),
            Ok(_) => Ok(()),
            Err(error) => Err(atls::HandshakeError::Io(error)),
        }
    })
    .await;
    match first_bytes {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return gave_up(&shared, admitted, peer_addr, started, Some(&error)),
        Err(_) => return gave_up(&shared, admitted, peer_addr, started, None),
    }
    Box::pin(attest_and_serve(
        shared, tcp, peer_addr, admitted, shutdown, started, deadline,
    ))
    .await;
}

/// Ends a connection that did not attest: frees its places, counts and logs why (`None`: the
/// deadline passed).
fn gave_up(
    shared: &Shared,
    admitted: Admitted,
    peer_addr: SocketAddr,
    started: Instant,
    error: Option<&atls::HandshakeError>,
) {
    drop(admitted);
    shared.metrics.admission(&shared.admission);
    match error {
        Some(error) => {
            shared
                .metrics
                .handshake(Handshake::Failed, started.elapsed());
            tracing::warn!(peer = %peer_addr, error = %status::chain(error), "aTLS handshake failed");
        }
        None => {
            shared
                .metrics
                .handshake(Handshake::TimedOut, started.elapsed());
            tracing::warn!(peer = %peer_addr, timeout = ?shared.handshake_timeout, "aTLS handshake and attestation timed out");
        }
    }
}

async fn attest_and_serve(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    admitted: Admitted,
    shutdown: Shutdown,
    started: Instant,
    deadline: tokio::time::Instant,
) {
    let attested =
        tokio::time::timeout_at(deadline, attest(&shared, tcp, peer_addr, started)).await;
    let (tls, outcome) = match attested {
        Ok(Ok(attested)) => attested,
        Ok(Err(error)) => return gave_up(&shared, admitted, peer_addr, started, Some(&error)),
        Err(_) => return gave_up(&shared, admitted, peer_addr, started, None),
    };
    // The places are for attesting only; serving the join does not count against them.
    drop(admitted);
    shared.metrics.admission(&shared.admission);
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

/// Runs the handshake, then verification on the pool, and writes the decision's audit line. The
/// node learns why it was refused from a gRPC status on its first call, so a failed check still
/// yields a connection to answer on. `started` is when the connection was accepted: every
/// handshake outcome is timed from there, as the node experiences it.
async fn attest(
    shared: &Shared,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    started: Instant,
) -> Result<(Tls, Result<PeerIdentity, tonic::Status>), atls::HandshakeError> {
    let (tls, evidence) = shared.acceptor.accept(tcp).await?;
    shared
        .metrics
        .handshake(Handshake::Completed, started.elapsed());
    let verifying = Instant::now();
    // Taken once: a policy reload from now on does not affect this connection.
    let active = shared.policy.get();
    let variant = active.validator.variant();
    let evidence = Arc::new(evidence);
    let verdict = {
        let (active, evidence) = (active.clone(), evidence.clone());
        shared
            .pool
            .run(move || {
                let result = evidence.verify(active.validator.as_ref());
                let subject = audit::Subject::now(
                    peer_addr,
                    variant,
                    active.digest.as_str(),
                    audit::Evidence::Certificate(evidence.peer_certificate().as_ref()),
                );
                let decision = match &result {
                    Ok(verified) => audit::Decision::accepted(subject, verified),
                    Err(error) => rejection(subject, error),
                };
                (result, decision)
            })
            .await
    };
    let (outcome, decision) = match verdict {
        Ok((Ok(verified), decision)) => (
            Ok(PeerIdentity {
                variant: verified.variant,
                peer_addr,
                policy_digest: active.digest.clone(),
                evidence_sha256: decision.evidence.sha256.clone(),
            }),
            decision,
        ),
        Ok((Err(error), decision)) => (
            Err(tonic::Status::unauthenticated(format!(
                "attestation rejected: {}",
                status::chain(&error)
            ))),
            decision,
        ),
        Err(error) => {
            let decision = audit::Decision::rejected(
                audit::Subject::now(
                    peer_addr,
                    variant,
                    active.digest.as_str(),
                    audit::Evidence::Certificate(evidence.peer_certificate().as_ref()),
                ),
                &error,
            );
            match error {
                PoolError::Overloaded { .. } => (
                    Err(tonic::Status::resource_exhausted(format!(
                        "{error}; retry later"
                    ))),
                    decision.with_check("overloaded"),
                ),
                PoolError::Gone => (
                    Err(tonic::Status::unavailable(error.to_string())),
                    decision.with_check("verifier_unavailable"),
                ),
            }
        }
    };
    shared.metrics.verification(verifying.elapsed());
    shared.metrics.decision(&decision);
    let line = decision.to_json_line();
    match decision.result {
        audit::Outcome::Accepted => tracing::info!(target: audit::TARGET, "{line}"),
        audit::Outcome::Rejected => tracing::warn!(target: audit::TARGET, "{line}"),
    }
    Ok((tls, outcome))
}

/// The audit record of a refused certificate, naming the check for failures outside the
/// validator (the validator's own are named by `attestation::audit`).
fn rejection(subject: audit::Subject<'_>, error: &VerifyError) -> audit::Decision {
    let decision = audit::Decision::rejected(subject, error);
    let check = match error {
        VerifyError::Attestation { .. } => return decision,
        VerifyError::CertificateTooLarge { .. } => "certificate_too_large",
        VerifyError::MalformedCertificate(_) => "certificate_malformed",
        VerifyError::NotValidNow { .. } => "certificate_validity",
        VerifyError::WeakSelfSignature { .. } => "certificate_weak_signature",
        VerifyError::BadSelfSignature(_) => "certificate_signature",
        VerifyError::MissingAttestation { .. } => "attestation_missing",
        VerifyError::VariantMismatch { .. } => "validator_variant",
        VerifyError::UserDataMismatch => "user_data",
    };
    decision.with_check(check)
}

/// Serves HTTP/2 on the TLS stream. On shutdown the connection is drained gracefully: streams in
/// flight finish, new ones are refused with GOAWAY. A node that was still attesting when the
/// drain began has not sent its call yet; its connection answers that first call before the
/// GOAWAY, so a join in flight finishes (the drain timeout bounds the wait). A refusing
/// connection closes after its first answer so an unattested client cannot hold it.
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
    let (answered_tx, answered) = tokio::sync::watch::channel(false);
    let service = {
        let answered_tx = Arc::new(answered_tx);
        tower::ServiceExt::map_response(service, move |response| {
            answered_tx.send_replace(true);
            response
        })
    };
    let first_answer = || {
        let mut answered = answered.clone();
        async move {
            // An error means the service (and with it the connection) is gone.
            let _ = answered.wait_for(|answered| *answered).await;
        }
    };
    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let closing = async {
        if close_after_first {
            first_answer().await;
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
        () = shutdown.wait() => {
            if !close_after_first && !*answered.borrow() {
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%error, "connection ended with an error while draining");
                        }
                        return;
                    }
                    () = first_answer() => {}
                }
            }
        }
        () = closing => {}
    }
    connection.as_mut().graceful_shutdown();
    if let Err(error) = connection.await {
        tracing::debug!(%error, "connection ended with an error while draining");
    }
}
