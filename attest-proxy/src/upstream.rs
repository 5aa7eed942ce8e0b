//! The forwarding end of the stack: one HTTP/2 connection to join-core's Unix socket.
//!
//! tonic's `Channel` is used as a plain HTTP/2 client: request and response bodies stream through
//! untouched, gRPC trailers included, and it reconnects by itself when join-core restarts. An
//! answer that breaks off after its headers (join-core killed, its connection cut) ends with an
//! `Unavailable` status in its trailers ([`Finished`]), so the node retries, instead of a stream
//! reset or a message without a status, which it would read as `Internal`.

use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
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
            Ok(match result {
                Ok(response) if response.headers().contains_key(GRPC_STATUS) => response,
                Ok(response) => response.map(|body| Body::new(Finished::new(body))),
                Err(error) => {
                    let reason = status::chain(&error);
                    tracing::warn!(%reason, "join-core is unreachable");
                    status::respond(tonic::Status::unavailable(format!(
                        "join-core is unreachable: {reason}"
                    )))
                }
            })
        })
    }
}

/// The header (or trailer) that carries a gRPC answer's status.
const GRPC_STATUS: &str = "grpc-status";

/// join-core's answer body, which ends with a gRPC status whatever happens to join-core: where
/// the body fails or ends without trailers, trailers saying `Unavailable` end it instead.
struct Finished {
    inner: Body,
    done: bool,
}

impl Finished {
    fn new(inner: Body) -> Self {
        Self { inner, done: false }
    }

    fn unavailable(
        &mut self,
        why: &str,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        self.done = true;
        tracing::warn!(%why, "join-core's answer broke off");
        let status = tonic::Status::unavailable(format!("join-core's answer broke off: {why}"));
        let mut trailers = http::HeaderMap::new();
        // A status made of our own text always fits in a header.
        let _ = status.add_header(&mut trailers);
        Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
    }
}

impl http_body::Body for Finished {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if frame
                    .trailers_ref()
                    .is_some_and(|t| t.contains_key(GRPC_STATUS))
                {
                    self.done = true;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => self.unavailable(&status::chain(&error)),
            None => self.unavailable("it ended without a status"),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::MetadataExt as _;

    use bytes::Bytes;
    use http_body_util::BodyExt as _;
    use tower::Service as _;

    use super::*;

    /// A join-core that sends the answer's headers and part of its message, then fails the
    /// stream, as a join-core killed mid-answer does.
    async fn breaking_upstream(socket: &Path) {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(|_request| async {
                // The headers and the first bytes go out before the failure.
                let frames = futures::stream::unfold(0, |step| async move {
                    match step {
                        0 => Some((
                            Ok(http_body::Frame::data(Bytes::from_static(&[
                                0, 0, 0, 0, 9, 1,
                            ]))),
                            1,
                        )),
                        1 => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Some((Err(std::io::Error::other("join-core went away")), 2))
                        }
                        _ => None,
                    }
                });
                let body = http_body_util::StreamBody::new(frames);
                Ok::<_, Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap(),
                )
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }

    #[tokio::test]
    async fn an_answer_broken_mid_body_ends_as_unavailable_not_as_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("join-core.sock");
        breaking_upstream(&socket).await;
        let uid = std::fs::metadata(dir.path()).unwrap().uid();
        let mut upstream = Upstream::new(&socket, uid, Duration::from_secs(5));
        let request = http::Request::post("http://join-core/join.API/IssueJoinTicket")
            .header("content-type", "application/grpc")
            .body(http_body_util::Full::new(Bytes::from_static(&[
                0, 0, 0, 0, 0,
            ])))
            .unwrap();
        let response = upstream.call(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        assert!(
            !response.headers().contains_key(GRPC_STATUS),
            "the answer's headers came through: {response:?}"
        );
        let collected = response
            .into_body()
            .collect()
            .await
            .expect("the body ends with a status, not an error the node would see as Internal");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "14", "{trailers:?}");
        let message = trailers["grpc-message"].to_str().unwrap();
        assert!(message.contains("join-core"), "{message}");
    }
}
