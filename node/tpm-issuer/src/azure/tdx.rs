//! azure-tdx: the HCL's TD report, turned into a TD quote by Azure's quote service, and the
//! runtime data as Constellation's azure-tdx InstanceInfo (`{"AttestationReport",
//! "RuntimeData"}`, bytes standard base64).
//!
//! A TD report is MAC'd for the local platform only; Azure's instance metadata service turns it
//! into a quote signed by the platform's quoting enclave: `POST
//! http://169.254.169.254/acc/tdquote` with `{"report": <TD report, base64url unpadded>}`,
//! answered with `{"quote": <quote, base64url unpadded>}`. [`QuoteService`] stands for that
//! service, so tests can put a local HTTP server in its place.

use std::time::Duration;

use attestation::{IssueError, Issuer, Variant};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;

use super::http::HttpError;
use super::{AzureIssuerError, HclReportType, read_hcl_report};
use crate::TpmIssuer;

/// Azure's quote service, as Constellation's azure-tdx issuer reaches it (no proxy).
pub const IMDS_QUOTE_URL: &str = "http://169.254.169.254/acc/tdquote";
/// How long a quote may take, connecting included.
pub const DEFAULT_QUOTE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read: a quote with its certification data is a few kilobytes.
pub const MAX_QUOTE_ANSWER: usize = 64 * 1024;

/// Why no quote was had.
#[derive(Debug, thiserror::Error)]
pub enum QuoteError {
    #[error("the quote service URL {0:?} is not an http:// URL")]
    Url(String),
    #[error("cannot start the HTTP client")]
    Runtime(#[source] std::io::Error),
    #[error("cannot reach Azure's quote service at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("Azure's quote service at {url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("Azure's quote service at {url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("reading the answer of Azure's quote service at {url}: {reason}")]
    Body { url: String, reason: String },
    #[error("Azure's quote service at {url} answered without a usable quote: {reason}")]
    BadAnswer { url: String, reason: String },
}

/// Turns a TD report into a TD quote.
pub trait QuoteService: Send + Sync + std::fmt::Debug {
    fn quote(&self, td_report: &[u8]) -> Result<Vec<u8>, QuoteError>;
}

/// Azure's quote service over HTTP (hyper).
#[derive(Clone, Debug)]
pub struct ImdsQuoteClient {
    url: String,
    uri: http::Uri,
    timeout: Duration,
}

impl ImdsQuoteClient {
    /// The client of the quote service at `url` ([`IMDS_QUOTE_URL`] on Azure), giving up after
    /// `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, QuoteError> {
        let uri: http::Uri = url.parse().map_err(|_| QuoteError::Url(url.to_owned()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(QuoteError::Url(url.to_owned()));
        }
        Ok(ImdsQuoteClient {
            url: url.to_owned(),
            uri,
            timeout,
        })
    }

    fn exchange(&self, body: Vec<u8>) -> Result<Vec<u8>, QuoteError> {
        let request = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| QuoteError::Url(self.url.clone()))?;
        let url = || self.url.clone();
        let (status, body) = super::http::exchange(request, self.timeout, MAX_QUOTE_ANSWER)
            .map_err(|e| match e {
                HttpError::Runtime(e) => QuoteError::Runtime(e),
                HttpError::Unreachable(source) => QuoteError::Unreachable { url: url(), source },
                HttpError::Timeout => QuoteError::Timeout {
                    url: url(),
                    timeout: self.timeout,
                },
                HttpError::Body(reason) => QuoteError::Body { url: url(), reason },
            })?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)])
                .trim()
                .to_owned();
            return Err(QuoteError::Status {
                url: url(),
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(body.to_vec())
    }
}

#[derive(serde::Deserialize)]
struct QuoteAnswer {
    #[serde(default)]
    quote: String,
}

impl QuoteService for ImdsQuoteClient {
    fn quote(&self, td_report: &[u8]) -> Result<Vec<u8>, QuoteError> {
        let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let request = serde_json::json!({ "report": b64url.encode(td_report) }).to_string();
        let answer = self.exchange(request.into_bytes())?;
        let bad = |reason: String| QuoteError::BadAnswer {
            url: self.url.clone(),
            reason,
        };
        let answer: QuoteAnswer = serde_json::from_slice(&answer)
            .map_err(|e| bad(format!("not JSON {{\"quote\"}}: {e}")))?;
        if answer.quote.is_empty() {
            return Err(bad("the quote is empty".to_owned()));
        }
        b64url
            .decode(answer.quote.trim_end_matches('='))
            .map_err(|e| bad(format!("the quote is not base64url: {e}")))
    }
}

/// Issues azure-tdx documents from an Azure TD's vTPM and Azure's quote service.
#[derive(Debug)]
pub struct AzureTdxIssuer {
    tpm: TpmIssuer,
    quotes: Box<dyn QuoteService>,
}

impl AzureTdxIssuer {
    /// An issuer over `tpm`, which must attest with the HCL's key ([`super::open_tpm`]), getting
    /// quotes from `quotes`.
    pub fn new(tpm: TpmIssuer, quotes: Box<dyn QuoteService>) -> Self {
        AzureTdxIssuer { tpm, quotes }
    }

    /// The InstanceInfo for the HCL report the vTPM holds now, with a quote made for it.
    pub fn instance_info(&self) -> Result<Vec<u8>, AzureIssuerError> {
        let hcl = read_hcl_report(&self.tpm, HclReportType::Tdx)?;
        let quote = self
            .quotes
            .quote(&hcl.hw_report)
            .map_err(AzureIssuerError::Quote)?;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let info = serde_json::json!({
            "AttestationReport": b64(&quote),
            "RuntimeData": b64(&hcl.runtime_data),
        });
        Ok(info.to_string().into_bytes())
    }
}

impl Issuer for AzureTdxIssuer {
    fn variant(&self) -> Variant {
        Variant::AzureTdx
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        super::issue_document(
            &self.tpm,
            self.variant(),
            self.instance_info(),
            user_data,
            nonce,
        )
    }
}
