//! The one HTTP exchange the Azure issuers make (azure-tdx with Azure's quote service,
//! azure-trustedlaunch with the site publishing Azure's vTPM CA): plain HTTP with hyper, bounded in
//! time and size, callable from blocking code inside a tokio runtime or not.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

/// Why an exchange had no answer.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// No runtime for the client could be started.
    Runtime(std::io::Error),
    /// Connecting or sending failed.
    Unreachable(hyper_util::client::legacy::Error),
    /// No whole answer within the timeout.
    Timeout,
    /// The body could not be read within the size limit.
    Body(String),
}

/// Sends `request` and returns the answer's status and body (at most `limit` bytes), all within
/// `timeout`. The exchange runs on a thread of its own with a runtime of its own, so blocking
/// callers inside a runtime do not stall it.
pub(crate) fn exchange(
    request: http::Request<Full<Bytes>>,
    timeout: Duration,
    limit: usize,
) -> Result<(http::StatusCode, Bytes), HttpError> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(HttpError::Runtime)?;
                runtime.block_on(async {
                    tokio::time::timeout(timeout, send(request, limit))
                        .await
                        .map_err(|_| HttpError::Timeout)?
                })
            })
            .join()
            .unwrap_or_else(|_| {
                Err(HttpError::Body(
                    "the HTTP client thread panicked".to_owned(),
                ))
            })
    })
}

async fn send(
    request: http::Request<Full<Bytes>>,
    limit: usize,
) -> Result<(http::StatusCode, Bytes), HttpError> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let response = client
        .request(request)
        .await
        .map_err(HttpError::Unreachable)?;
    let status = response.status();
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|e| HttpError::Body(e.to_string()))?
        .to_bytes();
    Ok((status, body))
}
