//! Tower middleware: only the configured gRPC methods reach join-core.
//!
//! The proxy is the only door into join-core, so it decides which calls may pass; anything else
//! is answered here with `Unimplemented` and never forwarded.

use std::collections::HashSet;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use tonic::body::Body;

use crate::status;

/// Adds [`Allowlist`] to a service stack.
#[derive(Clone, Debug)]
pub struct AllowlistLayer {
    methods: Arc<HashSet<String>>,
}

impl AllowlistLayer {
    /// Allow exactly these full method paths, e.g. `/join.API/IssueJoinTicket`.
    pub fn new(methods: impl IntoIterator<Item = String>) -> Self {
        Self {
            methods: Arc::new(methods.into_iter().collect()),
        }
    }
}

impl<S> tower::Layer<S> for AllowlistLayer {
    type Service = Allowlist<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Allowlist {
            methods: self.methods.clone(),
            inner,
        }
    }
}

/// Refuses requests for methods outside the allowlist.
#[derive(Clone, Debug)]
pub struct Allowlist<S> {
    methods: Arc<HashSet<String>>,
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Allowlist<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if request.method() != http::Method::POST || !self.methods.contains(path) {
            tracing::warn!(method = %request.method(), path, "refused request for a method that is not forwarded");
            let refusal = status::respond(tonic::Status::unimplemented(format!(
                "{path} is not served here; this endpoint serves only {}",
                sorted(&self.methods).join(", ")
            )));
            return Either::Left(std::future::ready(Ok(refusal)));
        }
        Either::Right(self.inner.call(request))
    }
}

fn sorted(methods: &HashSet<String>) -> Vec<&str> {
    let mut list: Vec<&str> = methods.iter().map(String::as_str).collect();
    list.sort_unstable();
    list
}
