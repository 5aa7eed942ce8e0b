//! The Google calls: a service-account token from the metadata server, and with it two reads of
//! the Compute Engine API: `instances.getShieldedInstanceIdentity` (the vTPM's signing key) and
//! `instances.get` limited to `confidentialInstanceConfig` (`?fields=`, so a large instance
//! resource is never read whole).
//!
//! The token is the node's own (the control-plane VM's default service account), fetched when
//! first needed and again shortly before it expires or when the API refuses it (401); one fetch
//! at a time. Every call carries the configured timeout, body included.

use std::time::{Duration, Instant};

use attestation::gce::{ConfidentialCompute, InstanceRef};
use http_body_util::{BodyExt, Empty, Limited};
use plumbing::https::HttpsClient;

/// The GCE metadata server.
pub const METADATA_URL: &str = "http://metadata.google.internal";
/// The Compute Engine API.
pub const COMPUTE_URL: &str = "https://compute.googleapis.com";
/// The metadata path of the default service account's token.
pub const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// The largest answer read: a token or an identity is a few kilobytes.
const MAX_BODY: usize = 64 * 1024;
/// A token is replaced this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// Why a signing key could not be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GceError {
    /// The API does not know the instance (404).
    #[error("the GCE API knows no instance {0}")]
    NotFound(String),
    /// The API answered, but with no signing key this service can read.
    #[error("the GCE API's identity of {instance} has no usable signing key: {reason}")]
    NoSigningKey { instance: String, reason: String },
    /// The API answered `instances.get` with something that is not an instance.
    #[error("the GCE API's answer for {instance} is unreadable: {reason}")]
    Unreadable { instance: String, reason: String },
    /// The API cannot be asked now: the metadata server or the API failed, refused (403,
    /// 429, 5xx) or did not answer in time. Nothing is wrong with the node.
    ///
    /// `google` is the message of Google's error answer. It can name this cluster's service
    /// account, project and permissions, so it is for this process's log only: the error's text
    /// (what attest-proxy relays to the unauthenticated node) leaves it out.
    #[error("{reason}")]
    Unavailable {
        reason: String,
        google: Option<String>,
        retry_after: Option<Duration>,
    },
}

fn unavailable(reason: String) -> GceError {
    GceError::Unavailable {
        reason,
        google: None,
        retry_after: None,
    }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0:?} is not an http(s):// URL")]
    Url(String),
    #[error(transparent)]
    Client(plumbing::https::SetupError),
}

struct Token {
    value: String,
    refresh_at: Instant,
}

/// Asks Google. Cheap to share behind an `Arc`.
pub struct GceClient {
    metadata: String,
    compute: String,
    client: HttpsClient,
    timeout: Duration,
    token: tokio::sync::Mutex<Option<Token>>,
}

impl std::fmt::Debug for GceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceClient")
            .field("metadata", &self.metadata)
            .field("compute", &self.compute)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
}

impl GceClient {
    /// A client of the metadata server at `metadata` and the API at `compute`, trusting the
    /// system's roots plus the PEM certificates in `extra_ca` for HTTPS.
    pub fn new(
        metadata: &str,
        compute: &str,
        extra_ca: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<GceClient, SetupError> {
        let base = |url: &str| {
            let url = url.trim_end_matches('/').to_owned();
            if url.starts_with("https://") || url.starts_with("http://") {
                Ok(url)
            } else {
                Err(SetupError::Url(url))
            }
        };
        let (metadata, compute) = (base(metadata)?, base(compute)?);
        let client = plumbing::https::client(extra_ca).map_err(SetupError::Client)?;
        Ok(GceClient {
            metadata,
            compute,
            client,
            timeout,
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// The DER SubjectPublicKeyInfo of `signingKey.ekPub` in the instance's shielded identity.
    pub async fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceError> {
        let url = format!(
            "{}/compute/v1/projects/{}/zones/{}/instances/{}/getShieldedInstanceIdentity",
            self.compute, instance.project, instance.zone, instance.instance
        );
        let body = self
            .compute_get(&url, instance, "getShieldedInstanceIdentity")
            .await?;
        parse_identity(instance, &body)
    }

    /// The instance's `confidentialInstanceConfig`, from `instances.get`.
    pub async fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<ConfidentialCompute, GceError> {
        let url = format!(
            "{}/compute/v1/projects/{}/zones/{}/instances/{}?fields=confidentialInstanceConfig",
            self.compute, instance.project, instance.zone, instance.instance
        );
        let body = self.compute_get(&url, instance, "instances.get").await?;
        ConfidentialCompute::from_instance_json(&body).map_err(|reason| GceError::Unreadable {
            instance: instance.to_string(),
            reason,
        })
    }

    /// One authorized GET of the Compute API, returning the body of a 200.
    async fn compute_get(
        &self,
        url: &str,
        instance: &InstanceRef,
        call: &str,
    ) -> Result<bytes::Bytes, GceError> {
        let mut refreshed = false;
        loop {
            let token = self.token(refreshed).await?;
            let auth = format!("Bearer {token}");
            let (status, headers, body) = self.get(url, &[("authorization", &auth)]).await?;
            match status {
                http::StatusCode::OK => return Ok(body),
                // The token was revoked or expired early: once with a fresh one.
                http::StatusCode::UNAUTHORIZED if !refreshed => refreshed = true,
                http::StatusCode::NOT_FOUND => {
                    return Err(GceError::NotFound(instance.to_string()));
                }
                status => {
                    let retry_after = headers
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    return Err(GceError::Unavailable {
                        reason: format!("{call} of {instance}: HTTP {status}"),
                        google: google_message(&body),
                        retry_after,
                    });
                }
            }
        }
    }

    /// A token for the node's service account, from cache unless it is due or `fresh`.
    async fn token(&self, fresh: bool) -> Result<String, GceError> {
        let mut cached = self.token.lock().await;
        if let Some(token) = cached.as_ref()
            && !fresh
            && Instant::now() < token.refresh_at
        {
            return Ok(token.value.clone());
        }
        let url = format!("{}{TOKEN_PATH}", self.metadata);
        let (status, _, body) = self.get(&url, &[("metadata-flavor", "Google")]).await?;
        if status != http::StatusCode::OK {
            return Err(unavailable(format!(
                "the metadata server gave no service-account token: HTTP {status}"
            )));
        }
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            unavailable(format!(
                "the metadata server's token answer is not JSON with access_token and expires_in: {e}"
            ))
        })?;
        let lifetime = Duration::from_secs(answer.expires_in);
        *cached = Some(Token {
            value: answer.access_token.clone(),
            refresh_at: Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN),
        });
        Ok(answer.access_token)
    }

    async fn get(
        &self,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<(http::StatusCode, http::HeaderMap, bytes::Bytes), GceError> {
        let mut request = http::Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| unavailable(format!("{url}: {e}")))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unavailable(format!("{url}: {e}")))?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| unavailable(format!("{url}: reading the answer: {e}")))?
                .to_bytes();
            Ok((status, headers, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unavailable(format!("{url}: no answer within {:?}", self.timeout)))?
    }
}

fn parse_identity(instance: &InstanceRef, body: &[u8]) -> Result<Vec<u8>, GceError> {
    attestation::gce::signing_key_from_identity_json(body).map_err(|reason| {
        GceError::NoSigningKey {
            instance: instance.to_string(),
            reason,
        }
    })
}

/// The message of Google's error JSON, if the body is one (at most 200 characters).
fn google_message(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .map(|m| m.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn instance() -> InstanceRef {
        InstanceRef {
            project: "my-project-1".into(),
            zone: "us-central1-a".into(),
            instance: "w".into(),
        }
    }

    #[test]
    fn identities_without_a_readable_signing_key_are_named() {
        for (body, needle) in [
            (&b"not json"[..], "not a shieldedInstanceIdentity"),
            (
                br#"{"kind":"compute#shieldedInstanceIdentity"}"#,
                "no signingKey.ekPub",
            ),
            (br#"{"signingKey":{}}"#, "no signingKey.ekPub"),
            (
                br#"{"signingKey":{"ekPub":"junk"}}"#,
                "not a PEM PUBLIC KEY",
            ),
        ] {
            let error = parse_identity(&instance(), body).unwrap_err();
            assert!(error.to_string().contains(needle), "{needle}: {error}");
        }
    }

    #[test]
    fn google_error_messages_are_quoted() {
        let body = br#"{"error":{"code":429,"message":"Quota exceeded"}}"#;
        assert_eq!(google_message(body).as_deref(), Some("Quota exceeded"));
        assert_eq!(google_message(b"<html>"), None);
    }
}
