//! The AWS calls: a role credential from the instance metadata service (IMDSv2), and EC2's
//! `DescribeImages` signed with it.
//!
//! IMDSv2 first hands out a session token (`PUT /latest/api/token` with a TTL header), which
//! every metadata read then carries; the role's name is read from
//! `/latest/meta-data/iam/security-credentials/` and its temporary credential from
//! `/latest/meta-data/iam/security-credentials/{role}`. Both are kept until shortly before they
//! expire, fetched again when IMDS refuses the token (401) or EC2 the credential, one fetch at a
//! time. `DescribeImages` is the Query API's `GET /?Action=DescribeImages&ImageId.1=...&Version=
//! 2016-11-15` at the region's endpoint, signed with Signature Version 4. Every call carries the
//! configured timeout, body included.

use std::time::{Duration, Instant, SystemTime};

use attestation::variants::aws_nitro_tpm::ImageRef;
use attestation::variants::aws_nitro_tpm::ec2_answer::{self, MAX_ANSWER};
use http_body_util::{BodyExt, Empty, Limited};
use plumbing::https::HttpsClient;

use crate::sigv4::{self, Credential};

/// The instance metadata service.
pub const IMDS_URL: &str = "http://169.254.169.254";
/// EC2's regional endpoint; `{region}` is replaced by the image's region.
pub const EC2_URL: &str = "https://ec2.{region}.amazonaws.com";
/// The Query API version of EC2 this process speaks.
pub const EC2_API_VERSION: &str = "2016-11-15";
/// IMDSv2's session token path.
pub const IMDS_TOKEN_PATH: &str = "/latest/api/token";
/// Where IMDS lists the instance profile's role and serves its credential.
pub const IMDS_CREDENTIALS_PATH: &str = "/latest/meta-data/iam/security-credentials/";

/// How long an IMDS session token is asked to live.
const IMDS_TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);
/// A token or credential is replaced this long before it expires.
const MARGIN: Duration = Duration::from_secs(300);

/// Why EC2's word on an image could not be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Ec2Error {
    /// EC2 does not know the image.
    #[error("EC2 knows no {0}")]
    NotFound(String),
    /// EC2 cannot be asked now: IMDS or EC2 failed, refused or did not answer in time.
    ///
    /// `aws` is EC2's error code and message. The message can name this cluster's role and
    /// account, so it is for this process's log only: the error's text (what attest-proxy relays
    /// to the unauthenticated node) carries the code alone.
    #[error("{reason}")]
    Unavailable { reason: String, aws: Option<String> },
}

fn unavailable(reason: String) -> Ec2Error {
    Ec2Error::Unavailable { reason, aws: None }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0:?} is not an http(s):// URL")]
    Url(String),
    #[error(transparent)]
    Client(plumbing::https::SetupError),
}

struct Cached<T> {
    value: T,
    refresh_at: Instant,
}

/// Asks AWS. Cheap to share behind an `Arc`.
pub struct Ec2Client {
    imds: String,
    ec2: String,
    client: HttpsClient,
    timeout: Duration,
    imds_token: tokio::sync::Mutex<Option<Cached<String>>>,
    credential: tokio::sync::Mutex<Option<Cached<Credential>>>,
}

impl std::fmt::Debug for Ec2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Client")
            .field("imds", &self.imds)
            .field("ec2", &self.ec2)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RoleCredential {
    code: String,
    access_key_id: String,
    secret_access_key: String,
    token: String,
    expiration: String,
}

/// EC2 error codes that say the credential or the signature's time is no longer good: asked
/// again once with a fresh credential.
const STALE_CREDENTIAL: [&str; 4] = [
    "AuthFailure",
    "RequestExpired",
    "ExpiredToken",
    "InvalidClientTokenId",
];

impl Ec2Client {
    /// A client of IMDS at `imds` and EC2 at `ec2` (a URL with `{region}` in it, or one
    /// endpoint for every region), trusting the system's roots plus the PEM certificates in
    /// `extra_ca` for HTTPS.
    pub fn new(
        imds: &str,
        ec2: &str,
        extra_ca: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<Ec2Client, SetupError> {
        let base = |url: &str| {
            let url = url.trim_end_matches('/').to_owned();
            if url.starts_with("https://") || url.starts_with("http://") {
                Ok(url)
            } else {
                Err(SetupError::Url(url))
            }
        };
        let (imds, ec2) = (base(imds)?, base(ec2)?);
        let client = plumbing::https::client(extra_ca).map_err(SetupError::Client)?;
        Ok(Ec2Client {
            imds,
            ec2,
            client,
            timeout,
            imds_token: tokio::sync::Mutex::new(None),
            credential: tokio::sync::Mutex::new(None),
        })
    }

    /// The image's `tpmSupport`, `None` when it has none.
    pub async fn tpm_support(&self, image: &ImageRef) -> Result<Option<String>, Ec2Error> {
        let endpoint = self.ec2.replace("{region}", &image.region);
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| unavailable(format!("EC2 endpoint {endpoint}: {e}")))?;
        let host = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or_else(|| unavailable(format!("EC2 endpoint {endpoint} names no host")))?;
        let query = [
            ("Action", "DescribeImages"),
            ("ImageId.1", image.image_id.as_str()),
            ("Version", EC2_API_VERSION),
        ];
        let url = format!("{endpoint}/?{}", sigv4::canonical_query(&query));
        let mut refreshed = false;
        loop {
            let credential = self.credential(refreshed).await?;
            let date = sigv4::amz_date(SystemTime::now());
            let mut headers = vec![("host", host.as_str()), ("x-amz-date", date.as_str())];
            if let Some(token) = &credential.session_token {
                headers.push(("x-amz-security-token", token.as_str()));
            }
            let authorization = sigv4::authorization(
                &credential,
                &sigv4::Request {
                    method: "GET",
                    path: "/",
                    query: &query,
                    headers: &headers,
                    payload: b"",
                },
                &date,
                &image.region,
                "ec2",
            );
            headers.push(("authorization", authorization.as_str()));
            let (status, body) = self.send(http::Method::GET, &url, &headers).await?;
            if status == http::StatusCode::OK {
                let images = ec2_answer::parse_describe_images(&body)
                    .map_err(|e| unavailable(format!("DescribeImages of {image}: {e}")))?;
                return images
                    .into_iter()
                    .find(|i| i.image_id == image.image_id)
                    .map(|i| i.tpm_support)
                    .ok_or_else(|| Ec2Error::NotFound(image.to_string()));
            }
            let error = ec2_answer::parse_error(&body).ok();
            let code = error.as_ref().map(|e| e.code.as_str()).unwrap_or_default();
            if code.starts_with("InvalidAMIID.") {
                return Err(Ec2Error::NotFound(format!("{image} ({code})")));
            }
            if STALE_CREDENTIAL.contains(&code) && !refreshed {
                refreshed = true;
                continue;
            }
            return Err(Ec2Error::Unavailable {
                reason: format!(
                    "DescribeImages of {image}: HTTP {status}{}",
                    if code.is_empty() {
                        String::new()
                    } else {
                        format!(" {code}")
                    }
                ),
                aws: error.map(|e| format!("{}: {}", e.code, e.message)),
            });
        }
    }

    /// An IMDSv2 session token, from cache unless it is due or `fresh`.
    async fn imds_token(&self, fresh: bool) -> Result<String, Ec2Error> {
        let mut cached = self.imds_token.lock().await;
        if let Some(token) = cached.as_ref()
            && !fresh
            && Instant::now() < token.refresh_at
        {
            return Ok(token.value.clone());
        }
        let ttl = IMDS_TOKEN_TTL.as_secs().to_string();
        let (status, body) = self
            .send(
                http::Method::PUT,
                &format!("{}{IMDS_TOKEN_PATH}", self.imds),
                &[("x-aws-ec2-metadata-token-ttl-seconds", ttl.as_str())],
            )
            .await?;
        if status != http::StatusCode::OK || body.is_empty() {
            return Err(unavailable(format!(
                "the instance metadata service gave no session token: HTTP {status}"
            )));
        }
        let token = String::from_utf8_lossy(&body).trim().to_owned();
        *cached = Some(Cached {
            value: token.clone(),
            refresh_at: Instant::now() + IMDS_TOKEN_TTL.saturating_sub(MARGIN),
        });
        Ok(token)
    }

    /// An IMDS read with a session token, once more with a fresh token if IMDS refuses it.
    async fn imds_get(&self, path: &str) -> Result<bytes::Bytes, Ec2Error> {
        let url = format!("{}{path}", self.imds);
        let mut fresh = false;
        loop {
            let token = self.imds_token(fresh).await?;
            let (status, body) = self
                .send(
                    http::Method::GET,
                    &url,
                    &[("x-aws-ec2-metadata-token", token.as_str())],
                )
                .await?;
            match status {
                http::StatusCode::OK => return Ok(body),
                http::StatusCode::UNAUTHORIZED if !fresh => fresh = true,
                status => {
                    return Err(unavailable(format!(
                        "the instance metadata service answered {path} with HTTP {status}"
                    )));
                }
            }
        }
    }

    /// The instance role's credential, from cache unless it is due or `fresh`.
    async fn credential(&self, fresh: bool) -> Result<Credential, Ec2Error> {
        let mut cached = self.credential.lock().await;
        if let Some(credential) = cached.as_ref()
            && !fresh
            && Instant::now() < credential.refresh_at
        {
            return Ok(credential.value.clone());
        }
        let roles = self.imds_get(IMDS_CREDENTIALS_PATH).await?;
        let role = String::from_utf8_lossy(&roles)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                unavailable("the instance has no IAM role (no instance profile)".to_owned())
            })?;
        if !role
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c))
        {
            return Err(unavailable(
                "the instance metadata service names no valid role".to_owned(),
            ));
        }
        let body = self
            .imds_get(&format!("{IMDS_CREDENTIALS_PATH}{role}"))
            .await?;
        let answer: RoleCredential = serde_json::from_slice(&body).map_err(|e| {
            unavailable(format!(
                "the role credential from the instance metadata service is not the expected JSON: {e}"
            ))
        })?;
        if answer.code != "Success" {
            return Err(unavailable(format!(
                "the instance metadata service has no credential for the role: Code {:?}",
                answer.code.chars().take(40).collect::<String>()
            )));
        }
        let lifetime = humantime::parse_rfc3339(&answer.expiration)
            .ok()
            .and_then(|t| t.duration_since(SystemTime::now()).ok())
            .unwrap_or_default();
        let credential = Credential {
            access_key_id: answer.access_key_id,
            secret_access_key: answer.secret_access_key,
            session_token: Some(answer.token).filter(|t| !t.is_empty()),
        };
        *cached = Some(Cached {
            value: credential.clone(),
            refresh_at: Instant::now() + lifetime.saturating_sub(MARGIN),
        });
        Ok(credential)
    }

    async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<(http::StatusCode, bytes::Bytes), Ec2Error> {
        // The URL without its query names the call in errors; the query is not secret, but
        // long.
        let what = url.split('?').next().unwrap_or(url).to_owned();
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| unavailable(format!("{what}: {e}")))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unavailable(format!("{what}: {e}")))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| unavailable(format!("{what}: reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unavailable(format!("{what}: no answer within {:?}", self.timeout)))?
    }
}
