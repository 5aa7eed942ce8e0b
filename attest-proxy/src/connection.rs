//! One node connection: aTLS handshake, attestation on the verify pool, then HTTP/2 forwarding.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tower::ServiceBuilder;

use atls::VerifyError;
use attestation::audit;

use crate::admission::{Admission, Admitted, Waiting};
use crate::allowlist::AllowlistLayer;
use crate::first_record::{self, Prefixed};
use crate::identity::{IdentityLayer, PeerIdentity};
use crate::metrics::{Handshake, Metrics};
use crate::policy::Current;
use crate::status;
use crate::upstream::Upstream;
use crate::verify_pool::{PoolError, VerifyPool};

/// What every connection shares.
#[derive(Debug)]
pub struct Shared {
    /// Shared with the server-key rotator, which swaps its key.
    pub acceptor: Arc<atls::Acceptor>,
    pub policy: Arc<Current>,
    pub admission: Admission,
    pub pool: VerifyPool,
    pub allowlist: AllowlistLayer,
    pub upstream: Upstream,
    pub handshake_timeout: std::time::Duration,
    /// How long a connection whose first record arrived may queue for a handshake place.
    pub handshake_queue_wait: std::time::Duration,
    pub lifetime: Lifetime,
    pub metrics: Metrics,
    /// The hash chain every audit record of this process is sealed into.
    pub audit: attestation::audit_trail::Chain,
    /// Where decided evidence is kept for dry runs, when it is.
    pub evidence: Option<Arc<crate::evidence::Keeper>>,
}

/// How long a connection lives once its attestation is decided.
///
/// A node needs one call per connection (it connects again for the next), so every connection,
/// attested or refused, answers one call and closes; until that call arrives it may stay idle
/// for `idle`, and no connection outlives `max_age` from accept. Together they bound what a
/// crowd of clients that handshake and then stall can hold, as the handshake deadline does
/// before attestation, and they make each call meet the policy in force when it connected.
#[derive(Clone, Copy, Debug)]
pub struct Lifetime {
    pub idle: std::time::Duration,
    pub max_age: std::time::Duration,
}

/// How long a connection that has sent its answer may take to close gracefully (the GOAWAY and
/// the ping that confirms it) before it is simply dropped.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves one node connection: attestation, then its one call, within the connection's deadlines.
///
/// Until the client's first TLS record has arrived, the connection's task holds only a socket,
/// the bytes sent so far and its waiting place: a handshake place, the state of a handshake, a
/// verification and HTTP/2 serving (tens of KiB) are taken when the client has shown it talks,
/// so a crowd of silent connections held until the deadline costs little and delays no node.
/// The deadline runs from accept either way.
pub async fn handle(shared: Arc<Shared>, tcp: TcpStream, peer_addr: SocketAddr, waiting: Waiting) {
    let started = Instant::now();
    let expires = tokio::time::Instant::now() + shared.lifetime.max_age;
    let deadline = tokio::time::Instant::now() + shared.handshake_timeout;
    let first = tokio::time::timeout_at(deadline, first_record::read(tcp)).await;
    let stream = match in_time(first) {
        Ok(stream) => stream,
        Err(error) => {
            drop(waiting);
            return gave_up(&shared, peer_addr, started, error.as_ref());
        }
    };
    let queue_until = deadline.min(tokio::time::Instant::now() + shared.handshake_queue_wait);
    let admitted = shared.admission.start(waiting, queue_until).await;
    shared.metrics.admission(&shared.admission);
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(reason) => {
            tracing::debug!(peer = %peer_addr, reason = reason.label(), "connection refused at its first record");
            shared.metrics.shed(reason);
            return;
        }
    };
    Box::pin(attest_and_serve(
        shared, stream, peer_addr, admitted, started, deadline, expires,
    ))
    .await;
}

/// A step run against the connection's deadline: its value, or why the connection ends (`None`:
/// the deadline passed).
fn in_time<T>(
    step: Result<Result<T, atls::HandshakeError>, tokio::time::error::Elapsed>,
) -> Result<T, Option<atls::HandshakeError>> {
    match step {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(Some(error)),
        Err(_) => Err(None),
    }
}

/// Ends a connection that did not attest (its places already freed): counts and logs why
/// (`None`: the deadline passed).
fn gave_up(
    shared: &Shared,
    peer_addr: SocketAddr,
    started: Instant,
    error: Option<&atls::HandshakeError>,
) {
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
    tcp: Prefixed,
    peer_addr: SocketAddr,
    admitted: Admitted,
    started: Instant,
    deadline: tokio::time::Instant,
    expires: tokio::time::Instant,
) {
    let attested =
        tokio::time::timeout_at(deadline, attest(&shared, tcp, peer_addr, started)).await;
    let (tls, outcome) = match in_time(attested) {
        Ok(attested) => attested,
        Err(error) => {
            drop(admitted);
            return gave_up(&shared, peer_addr, started, error.as_ref());
        }
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
            serve(tls, service, shared.lifetime.idle, expires, peer_addr).await;
        }
        Err(refusal) => {
            let service =
                tower::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let refusal = refusal.clone();
                    async move {
                        read_call(request.into_body()).await;
                        Ok::<_, std::convert::Infallible>(status::respond(refusal))
                    }
                });
            serve(tls, service, shared.lifetime.idle, expires, peer_addr).await;
        }
    }
}

type Tls = atls::TlsStream<Prefixed>;

/// The most of a refused call's body read before it is answered: a join request is a few
/// kilobytes.
const REFUSED_CALL_MAX: usize = 64 * 1024;

/// Reads a refused call's body (at most [`REFUSED_CALL_MAX`], within [`CLOSE_GRACE`]) before it
/// is answered. Answered before its body was in, the connection's close raced the node's
/// request: the node could see the connection go away rather than the status saying why it was
/// refused. Nothing read is kept or looked at.
async fn read_call(body: hyper::body::Incoming) {
    use http_body_util::BodyExt as _;
    let limited = http_body_util::Limited::new(body, REFUSED_CALL_MAX);
    let _ = tokio::time::timeout(CLOSE_GRACE, limited.collect()).await;
}

/// Runs the handshake, then verification on the pool, and writes the decision's audit line. The
/// node learns why it was refused from a gRPC status on its first call, so a failed check still
/// yields a connection to answer on. `started` is when the connection was accepted: every
/// handshake outcome is timed from there, as the node experiences it.
async fn attest(
    shared: &Shared,
    tcp: Prefixed,
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
                // The collateral this verification makes the cache fetch counts against this
                // peer's share (see `collateral::for_peer`).
                let result = collateral::for_peer(peer_addr.ip(), || {
                    evidence.verify(active.validator.as_ref())
                });
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
    // Only a verification that ran decided on the evidence; an overloaded or gone pool did not.
    let verified_here = verdict.is_ok();
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
        // Collateral that cannot be had now (AMD's KDS rate-limits or is down, nothing cached):
        // nothing is wrong with the node's evidence, so it is told to retry, not refused.
        Ok((Err(error), decision)) if collateral_unavailable(&error) => (
            Err(tonic::Status::unavailable(format!(
                "attestation could not be completed now, retry: {}",
                status::chain(&error)
            ))),
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
    if let (true, Some(keeper)) = (verified_here, &shared.evidence) {
        keeper.keep(decision.clone(), variant, evidence.clone());
    }
    shared.audit.seal(decision.to_value(), |_, canonical| {
        plumbing::telemetry::audit(decision.result == audit::Outcome::Accepted, canonical);
    });
    Ok((tls, outcome))
}

fn collateral_unavailable(error: &VerifyError) -> bool {
    matches!(error, VerifyError::Attestation { source, .. } if source.is_unavailable())
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

/// Serves HTTP/2 on the TLS stream for one call, then closes.
///
/// - The first call is served; any further one is answered `Unavailable` without reaching the
///   service (a node connects again per call), and at most one stream is open at a time.
/// - Once the first answer's headers are out, the connection shuts down gracefully: GOAWAY, the
///   answer's body and trailers finish, then the connection closes, within [`CLOSE_GRACE`].
/// - No call within `idle` of the attestation decision: closed at once.
/// - At `expires` (the maximum age, from accept) it is closed whatever it is doing.
///
/// A drain needs nothing more: every connection closes by itself within these bounds, and a
/// node that was attesting when the drain began still gets its one call answered (the drain
/// timeout bounds the wait).
async fn serve<S>(
    tls: Tls,
    service: S,
    idle: std::time::Duration,
    expires: tokio::time::Instant,
    peer_addr: SocketAddr,
) where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let calls = Arc::new(CallState::default());
    let service = OneCall {
        inner: service,
        calls: calls.clone(),
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder.max_concurrent_streams(1);
    let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let idle_deadline = tokio::time::Instant::now() + idle;
    let idle_expired = async {
        tokio::time::sleep_until(idle_deadline).await;
        if calls.received() {
            // A call is in flight or answered: the answer and the age bound end it.
            std::future::pending::<()>().await;
        }
    };
    let closing = tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(peer = %peer_addr, %error, "connection ended with an error");
            }
            return;
        }
        () = calls.answered() => Closing::Answered,
        () = idle_expired => Closing::Idle,
        () = tokio::time::sleep_until(expires) => Closing::Expired,
    };
    match closing {
        Closing::Answered => {
            connection.as_mut().graceful_shutdown();
            let grace = (tokio::time::Instant::now() + CLOSE_GRACE).min(expires);
            match tokio::time::timeout_at(grace, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(peer = %peer_addr, %error, "connection ended with an error while closing");
                }
                Err(_) => {
                    tracing::debug!(peer = %peer_addr, "connection did not close gracefully in time; dropped");
                }
            }
        }
        Closing::Idle => {
            tracing::debug!(peer = %peer_addr, ?idle, "no call on the connection in time; closed");
        }
        Closing::Expired => {
            tracing::info!(peer = %peer_addr, "connection reached its maximum age; closed");
        }
    }
}

/// Why a connection is being closed by the proxy.
enum Closing {
    Answered,
    Idle,
    Expired,
}

/// Whether a connection's one call has arrived and been answered.
#[derive(Debug, Default)]
struct CallState {
    received: std::sync::atomic::AtomicBool,
    answered: tokio::sync::Notify,
    answered_flag: std::sync::atomic::AtomicBool,
}

impl CallState {
    /// Marks a call as received; true only for the first one.
    fn receive(&self) -> bool {
        !self
            .received
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    fn received(&self) -> bool {
        self.received.load(std::sync::atomic::Ordering::Acquire)
    }

    fn answer(&self) {
        self.answered_flag
            .store(true, std::sync::atomic::Ordering::Release);
        self.answered.notify_waiters();
    }

    async fn answered(&self) {
        loop {
            let notified = self.answered.notified();
            if self
                .answered_flag
                .load(std::sync::atomic::Ordering::Acquire)
            {
                return;
            }
            notified.await;
        }
    }
}

/// Passes the connection's first call to `inner` and answers every later one `Unavailable`, so
/// one connection (one attestation, under one policy) never carries more than one call.
#[derive(Clone)]
struct OneCall<S> {
    inner: S,
    calls: Arc<CallState>,
}

impl<S, B> tower::Service<http::Request<B>> for OneCall<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !self.calls.receive() {
            return Box::pin(async {
                Ok(status::respond(tonic::Status::unavailable(
                    "this connection has served its call; connect again for the next one",
                )))
            });
        }
        let calls = self.calls.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            calls.answer();
            response
        })
    }
}
