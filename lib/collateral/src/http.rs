//! The HTTPS client every vendor source fetches with: the system's roots plus an operator's CA,
//! aws-lc-rs, a timeout on the answer and on its body, a bounded body, and the vendor's
//! `Retry-After` carried into the [`FetchError`] so the cache backs off as asked.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use plumbing::https::HttpsClient;

use crate::FetchError;

/// Why a source's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("URL {0:?} is not http(s)://host[:port]")]
    Url(String),
    #[error("reading the CA file {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// What a vendor answered with a status other than success, rate limiting or a server error.
#[derive(Debug)]
pub(crate) struct Refused {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
}

/// A successful answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

#[derive(Clone)]
pub(crate) struct HttpClient {
    client: HttpsClient,
    timeout: Duration,
    max_body: usize,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// `url` without a trailing slash, if it is http(s).
pub(crate) fn base_url(url: &str) -> Result<String, SetupError> {
    let base = url.trim_end_matches('/').to_owned();
    if !(base.starts_with("https://") || base.starts_with("http://")) {
        return Err(SetupError::Url(base));
    }
    Ok(base)
}

impl HttpClient {
    /// Trusts the system's roots plus the PEM certificates in `extra_ca` (an operator's proxy, a
    /// test's stand-in). Plain HTTP is allowed for a proxy: everything a vendor serves is signed
    /// and checked as such by the verifier.
    pub fn new(
        extra_ca: Option<&std::path::Path>,
        timeout: Duration,
        max_body: usize,
    ) -> Result<HttpClient, SetupError> {
        let client = plumbing::https::client(extra_ca).map_err(|e| match e {
            plumbing::https::SetupError::Ca { path, reason } => SetupError::Ca { path, reason },
            plumbing::https::SetupError::Tls(reason) => SetupError::Tls(reason),
        })?;
        Ok(HttpClient {
            client,
            timeout,
            max_body,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// GETs `url`. 429 and 5xx are failures carrying `Retry-After`; any other unsuccessful
    /// status is handed back as [`Refused`] for the source to name.
    pub async fn get(&self, url: &str) -> Result<Result<Answer, Refused>, FetchError> {
        let request = http::Request::get(url)
            .body(Empty::new())
            .map_err(|e| FetchError::new(format!("{url}: {e}")))?;
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| FetchError::new(format!("{url}: no answer within {:?}", self.timeout)))?
            .map_err(|e| FetchError::new(format!("{url}: {e}")))?;
        let status = response.status();
        if status == http::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            return Err(FetchError {
                reason: format!("{url}: HTTP {status}"),
                retry_after,
            });
        }
        if !status.is_success() {
            return Ok(Err(Refused {
                status,
                headers: response.headers().clone(),
            }));
        }
        let headers = response.headers().clone();
        let body = tokio::time::timeout(
            self.timeout,
            Limited::new(response.into_body(), self.max_body).collect(),
        )
        .await
        .map_err(|_| {
            FetchError::new(format!(
                "{url}: the body did not arrive within {:?}",
                self.timeout
            ))
        })?
        .map_err(|e| FetchError::new(format!("{url}: reading the body: {e}")))?;
        Ok(Ok(Answer {
            headers,
            body: body.to_bytes().to_vec(),
        }))
    }
}
