//! The forwarding end of the stack: one HTTP/2 connection to join-core's Unix socket.
//!
//! tonic's `Channel` is used as a plain HTTP/2 client: request and response bodies stream through
//! untouched, gRPC trailers included, and it reconnects by itself when join-core restarts.

use std::convert::Infallible;
use std::path::Path;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::transport::Channel;

use crate::status;

/// Forwards requests to join-core; transport failures become `Unavailable` answers.
#[derive(Clone, Debug)]
pub struct Upstream {
    channel: Channel,
    timeout: Duration,
}

impl Upstream {
    /// A lazily connecting upstream at join-core's socket, served by `uid`; each call has
    /// `timeout` to get its answer (a unary gRPC answer's headers come with its body, so that is
    /// the whole call).
    pub fn new(socket: &Path, uid: u32, timeout: Duration) -> Self {
        Self {
            channel: plumbing::unix::channel(socket, uid),
            timeout,
        }
    }
}

impl<B> tower::Service<http::Request<B>> for Upstream
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is awaited per call below, so a down join-core becomes an answer, not a
        // connection-level error.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut channel = self.channel.clone();
        let request = request.map(Body::new);
        let timeout = self.timeout;
        Box::pin(async move {
            use tower::ServiceExt;
            let call = async {
                match channel.ready().await {
                    Ok(ready) => ready.call(request).await,
                    Err(error) => Err(error),
                }
            };
            let Ok(result) = tokio::time::timeout(timeout, call).await else {
                tracing::warn!(?timeout, "join-core did not answer in time");
                return Ok(status::respond(tonic::Status::deadline_exceeded(format!(
                    "join-core did not answer within {}",
                    humantime::format_duration(timeout)
                ))));
            };
            Ok(result.unwrap_or_else(|error| {
                let reason = status::chain(&error);
                tracing::warn!(%reason, "join-core is unreachable");
                status::respond(tonic::Status::unavailable(format!(
                    "join-core is unreachable: {reason}"
                )))
            }))
        })
    }
}
