//! One backend call under a deadline.

use std::future::Future;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::error::CallError;

/// `message` as a request that tells the backend our deadline (grpc-timeout), so it can stop
/// working on an answer nobody waits for.
pub(crate) fn request<T>(message: T, deadline: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Awaits `call`, giving up at `deadline`. tonic's channel already enforces the grpc-timeout it
/// sends; this outer timer keeps the bound from resting on that transport detail.
pub(crate) async fn with_deadline<T>(
    deadline: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(CallError::from_status(status, deadline)),
        Err(_elapsed) => Err(CallError::Timeout(deadline)),
    }
}

/// How a call ended, as the metrics' `outcome` label says it.
pub(crate) fn outcome<T>(result: &Result<T, CallError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(CallError::Unreachable(_)) => "unreachable",
        Err(CallError::Timeout(_)) => "timeout",
        Err(CallError::Refused(_)) => "refused",
    }
}
