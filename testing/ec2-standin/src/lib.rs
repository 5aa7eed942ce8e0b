//! A stand-in for the two AWS endpoints aws-nitro-tpm uses.
//!
//! - **The instance metadata service** (plain HTTP, as `http://169.254.169.254` is), IMDSv2
//!   only: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1–21600; 400
//!   otherwise) answers a session token; every `GET` must carry it as
//!   `X-aws-ec2-metadata-token` (401 otherwise, as on an instance that requires IMDSv2); a
//!   request with `X-Forwarded-For` is refused. It serves
//!   `/latest/meta-data/iam/security-credentials/` (the role's name),
//!   `/latest/meta-data/iam/security-credentials/{role}` (a fresh temporary credential:
//!   `Code`, `LastUpdated`, `Type`, `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`) and
//!   `/latest/dynamic/instance-identity/document` (the identity document a test set).
//! - **The EC2 Query API** (HTTPS with a CA of its own): `GET /?Action=DescribeImages&ImageId.1=
//!   ...&Version=...`, checked as EC2 checks it: Signature Version 4 over the request with a
//!   credential IMDS issued and that has not expired, its session token in
//!   `X-Amz-Security-Token` (401 `AuthFailure` otherwise, 403 `SignatureDoesNotMatch` for a bad
//!   signature); answers `DescribeImagesResponse` XML for the images a test registered, 400
//!   `InvalidAMIID.NotFound` for others, and EC2's `<Response><Errors>` XML for every error.
//!
//! A test sets faults the way EC2 fails: 403 `UnauthorizedOperation` (the role lacks
//! `ec2:DescribeImages`), 503 `RequestLimitExceeded` (throttling), 503 `Unavailable`, or no
//! answer at all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ec2_identity::sigv4;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng as _;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// The role the stand-in's instance profile carries.
pub const ROLE: &str = "joinservice-control-plane";

/// How the EC2 endpoint answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer as EC2 does.
    None,
    /// 403 `UnauthorizedOperation`: the role may not call `DescribeImages`.
    Unauthorized,
    /// 503 `RequestLimitExceeded`: the account's API requests are being throttled.
    Throttled,
    /// 503 `Unavailable`: the service cannot handle the request now.
    ServerError,
    /// Accept the request and never answer.
    Hang,
}

/// What went wrong starting the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the EC2 stand-in: {0}")]
    Bind(#[source] std::io::Error),
    #[error("the EC2 stand-in's certificates: {0}")]
    Tls(#[source] standin_tls::Error),
}

struct Issued {
    secret: String,
    token: String,
    expires: Instant,
}

struct State {
    images: Mutex<HashMap<(String, String), Option<String>>>,
    imds_tokens: Mutex<HashMap<String, Instant>>,
    credentials: Mutex<HashMap<String, Issued>>,
    credential_lifetime: Mutex<Duration>,
    identity: Mutex<Option<String>>,
    fault: Mutex<Fault>,
    describe_requests: AtomicUsize,
    credentials_issued: AtomicUsize,
}

/// A running stand-in; dropping it stops both endpoints.
pub struct Ec2Standin {
    imds: SocketAddr,
    ec2: SocketAddr,
    ca_pem: String,
    state: Arc<State>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Ec2Standin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Standin")
            .field("imds", &self.imds)
            .field("ec2", &self.ec2)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ec2Standin {
    /// Serves both endpoints on free loopback ports.
    pub async fn start() -> Result<Ec2Standin, Error> {
        let imds = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let ec2 = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let imds_addr = imds.local_addr().map_err(Error::Bind)?;
        let ec2_addr = ec2.local_addr().map_err(Error::Bind)?;
        let (ca_pem, tls) = standin_tls::generate(ec2_addr.ip()).map_err(Error::Tls)?;
        let state = Arc::new(State {
            images: Mutex::default(),
            imds_tokens: Mutex::default(),
            credentials: Mutex::default(),
            credential_lifetime: Mutex::new(Duration::from_secs(6 * 3600)),
            identity: Mutex::default(),
            fault: Mutex::new(Fault::None),
            describe_requests: AtomicUsize::new(0),
            credentials_issued: AtomicUsize::new(0),
        });
        let tasks = vec![
            tokio::spawn(serve(imds, None, state.clone(), false)),
            tokio::spawn(serve(
                ec2,
                Some(TlsAcceptor::from(tls)),
                state.clone(),
                true,
            )),
        ];
        Ok(Ec2Standin {
            imds: imds_addr,
            ec2: ec2_addr,
            ca_pem,
            state,
            tasks,
        })
    }

    /// `http://127.0.0.1:<port>`, standing for `http://169.254.169.254`.
    pub fn imds_url(&self) -> String {
        format!("http://{}", self.imds)
    }

    /// `https://127.0.0.1:<port>`, standing for every region's `https://ec2.{region}.amazonaws.com`.
    pub fn ec2_url(&self) -> String {
        format!("https://{}", self.ec2)
    }

    /// The CA of the EC2 endpoint's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Registers an image; `tpm_support` is its `tpmSupport` (`None`: the element is absent).
    pub fn put_image(&self, region: &str, image_id: &str, tpm_support: Option<&str>) {
        lock(&self.state.images).insert(
            (region.to_owned(), image_id.to_owned()),
            tpm_support.map(str::to_owned),
        );
    }

    /// The identity document IMDS serves at `/latest/dynamic/instance-identity/document`.
    pub fn set_identity_document(&self, json: &str) {
        *lock(&self.state.identity) = Some(json.to_owned());
    }

    pub fn set_fault(&self, fault: Fault) {
        *lock(&self.state.fault) = fault;
    }

    /// How long credentials issued from now on live.
    pub fn set_credential_lifetime(&self, lifetime: Duration) {
        *lock(&self.state.credential_lifetime) = lifetime;
    }

    /// Makes every credential issued so far invalid, as a rotated role credential is.
    pub fn revoke_credentials(&self) {
        lock(&self.state.credentials).clear();
    }

    /// `DescribeImages` requests the EC2 endpoint received.
    pub fn describe_requests(&self) -> usize {
        self.state.describe_requests.load(Ordering::SeqCst)
    }

    /// Role credentials IMDS handed out.
    pub fn credentials_issued(&self) -> usize {
        self.state.credentials_issued.load(Ordering::SeqCst)
    }
}

impl Drop for Ec2Standin {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, state: Arc<State>, ec2: bool) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let tls = tls.clone();
                let state = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(if ec2 {
                                ec2_answer(&state, req).await
                            } else {
                                imds_answer(&state, &req)
                            })
                        }
                    });
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(tcp).await else { return };
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                        }
                    }
                });
            }
        }
    }
}

type Answer = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Answer {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill(&mut b[..]);
    hex::encode(b)
}

fn imds_answer(state: &State, req: &Request<hyper::body::Incoming>) -> Answer {
    let plain = |status, body: &'static str| text(status, body, "text/plain");
    if req.headers().contains_key("x-forwarded-for") {
        return plain(StatusCode::FORBIDDEN, "Forbidden");
    }
    let path = req.uri().path();
    if req.method() == http::Method::PUT && path == ec2_identity::ec2::IMDS_TOKEN_PATH {
        let ttl = req
            .headers()
            .get("x-aws-ec2-metadata-token-ttl-seconds")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ttl| (1..=21600).contains(ttl));
        let Some(ttl) = ttl else {
            return plain(StatusCode::BAD_REQUEST, "Bad Request");
        };
        let token = format!("AQAEA{}", random_hex(24));
        lock(&state.imds_tokens).insert(token.clone(), Instant::now() + Duration::from_secs(ttl));
        return text(StatusCode::OK, token, "text/plain");
    }
    if req.method() != http::Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let authorized = req
        .headers()
        .get("x-aws-ec2-metadata-token")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| lock(&state.imds_tokens).get(t).copied())
        .is_some_and(|expires| Instant::now() < expires);
    if !authorized {
        return plain(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let credentials = ec2_identity::ec2::IMDS_CREDENTIALS_PATH;
    if path == credentials {
        return text(StatusCode::OK, ROLE, "text/plain");
    }
    if path.strip_prefix(credentials) == Some(ROLE) {
        let lifetime = *lock(&state.credential_lifetime);
        let access_key = format!("ASIA{}", random_hex(8).to_uppercase());
        let secret = random_hex(20);
        let token = format!("IQoJb3JpZ2luX2Vj{}", random_hex(48));
        lock(&state.credentials).insert(
            access_key.clone(),
            Issued {
                secret: secret.clone(),
                token: token.clone(),
                expires: Instant::now() + lifetime,
            },
        );
        state.credentials_issued.fetch_add(1, Ordering::SeqCst);
        let now = SystemTime::now();
        let body = serde_json::json!({
            "Code": "Success",
            "LastUpdated": humantime::format_rfc3339_seconds(now).to_string(),
            "Type": "AWS-HMAC",
            "AccessKeyId": access_key,
            "SecretAccessKey": secret,
            "Token": token,
            "Expiration": humantime::format_rfc3339_seconds(now + lifetime).to_string(),
        });
        return text(StatusCode::OK, body.to_string(), "text/plain");
    }
    if path == "/latest/dynamic/instance-identity/document"
        && let Some(doc) = lock(&state.identity).clone()
    {
        return text(StatusCode::OK, doc, "text/plain");
    }
    plain(StatusCode::NOT_FOUND, "Not Found")
}

/// EC2's error answer.
fn ec2_error(status: StatusCode, code: &str, message: &str) -> Answer {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
        escape(code),
        escape(message),
        random_hex(16)
    );
    text(status, body, "text/xml;charset=UTF-8")
}

/// The parameters of a query string, as sent (still encoded).
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (p.to_owned(), String::new()),
        })
        .collect()
}

/// Checks the request's Signature Version 4 as EC2 does; the error answer if it fails.
fn check_signature(state: &State, req: &Request<hyper::body::Incoming>) -> Result<(), Box<Answer>> {
    let auth_failure = || {
        Box::new(ec2_error(
            StatusCode::UNAUTHORIZED,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
        ))
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let authorization = header("authorization").ok_or_else(auth_failure)?;
    let fields = authorization
        .strip_prefix(sigv4::ALGORITHM)
        .ok_or_else(auth_failure)?;
    let mut credential = None;
    let mut signed = None;
    for part in fields.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v.to_owned());
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v.to_owned());
        }
    }
    let (credential, signed) = credential.zip(signed).ok_or_else(auth_failure)?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key, _date, region, "ec2", "aws4_request"] = scope.as_slice() else {
        return Err(auth_failure());
    };
    let (secret, token) = {
        let issued = lock(&state.credentials);
        let Some(found) = issued.get(*access_key) else {
            return Err(auth_failure());
        };
        if Instant::now() >= found.expires {
            return Err(Box::new(ec2_error(
                StatusCode::BAD_REQUEST,
                "RequestExpired",
                "Request has expired.",
            )));
        }
        (found.secret.clone(), found.token.clone())
    };
    if header("x-amz-security-token").as_deref() != Some(token.as_str()) {
        return Err(auth_failure());
    }
    let date = header("x-amz-date").ok_or_else(auth_failure)?;
    let names: Vec<&str> = signed.split(';').collect();
    if !names.contains(&"host") || !names.contains(&"x-amz-date") {
        return Err(auth_failure());
    }
    let values: Vec<(String, String)> = names
        .iter()
        .map(|n| ((*n).to_owned(), header(n).unwrap_or_default()))
        .collect();
    let headers: Vec<(&str, &str)> = values
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let pairs = query_pairs(req.uri().query().unwrap_or_default());
    let query: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let expected = sigv4::authorization(
        &sigv4::Credential {
            access_key_id: (*access_key).to_owned(),
            secret_access_key: secret,
            session_token: Some(token),
        },
        &sigv4::Request {
            method: req.method().as_str(),
            path: req.uri().path(),
            query: &query,
            headers: &headers,
            payload: b"",
        },
        &date,
        region,
        "ec2",
    );
    if expected != authorization {
        return Err(Box::new(ec2_error(
            StatusCode::FORBIDDEN,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )));
    }
    Ok(())
}

async fn ec2_answer(state: &State, req: Request<hyper::body::Incoming>) -> Answer {
    state.describe_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(answer) = check_signature(state, &req) {
        return *answer;
    }
    let fault = *lock(&state.fault);
    match fault {
        Fault::None => {}
        Fault::Hang => std::future::pending::<()>().await,
        Fault::Unauthorized => {
            return ec2_error(
                StatusCode::FORBIDDEN,
                "UnauthorizedOperation",
                &format!(
                    "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/{ROLE}/i-0abc is not authorized to perform: ec2:DescribeImages"
                ),
            );
        }
        Fault::Throttled => {
            return ec2_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "RequestLimitExceeded",
                "Request limit exceeded.",
            );
        }
        Fault::ServerError => {
            return ec2_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                "The server is overloaded and can't handle the request.",
            );
        }
    }
    let pairs = query_pairs(req.uri().query().unwrap_or_default());
    let param = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if param("Action") != Some("DescribeImages") {
        return ec2_error(
            StatusCode::BAD_REQUEST,
            "InvalidAction",
            "The action is not valid for this web service.",
        );
    }
    let Some(image_id) = param("ImageId.1") else {
        return ec2_error(
            StatusCode::BAD_REQUEST,
            "MissingParameter",
            "This stand-in answers DescribeImages for named images only (ImageId.1).",
        );
    };
    let region = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(2))
        .unwrap_or_default()
        .to_owned();
    if !image_id.starts_with("ami-") {
        return ec2_error(
            StatusCode::BAD_REQUEST,
            "InvalidAMIID.Malformed",
            &format!("Invalid id: \"{image_id}\" (expecting \"ami-...\")"),
        );
    }
    let Some(tpm) = lock(&state.images)
        .get(&(region, image_id.to_owned()))
        .cloned()
    else {
        return ec2_error(
            StatusCode::BAD_REQUEST,
            "InvalidAMIID.NotFound",
            &format!("The image id '[{image_id}]' does not exist"),
        );
    };
    let tpm = tpm
        .map(|t| format!("\n            <tpmSupport>{t}</tpmSupport>"))
        .unwrap_or_default();
    let body = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>{}</requestId>
    <imagesSet>
        <item>
            <imageId>{image_id}</imageId>
            <imageLocation>123456789012/standin-image</imageLocation>
            <imageState>available</imageState>
            <imageOwnerId>123456789012</imageOwnerId>
            <isPublic>false</isPublic>
            <architecture>x86_64</architecture>
            <imageType>machine</imageType>
            <name>standin-image</name>
            <rootDeviceType>ebs</rootDeviceType>
            <rootDeviceName>/dev/xvda</rootDeviceName>
            <blockDeviceMapping>
                <item><deviceName>/dev/xvda</deviceName><ebs><volumeSize>10</volumeSize><volumeType>gp3</volumeType></ebs></item>
            </blockDeviceMapping>
            <virtualizationType>hvm</virtualizationType>
            <hypervisor>xen</hypervisor>
            <enaSupport>true</enaSupport>
            <bootMode>uefi</bootMode>{tpm}
        </item>
    </imagesSet>
</DescribeImagesResponse>"#,
        random_hex(16)
    );
    text(StatusCode::OK, body, "text/xml;charset=UTF-8")
}
