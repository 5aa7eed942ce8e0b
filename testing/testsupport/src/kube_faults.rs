//! A small proxy in front of the real kube-apiserver, for the faults a real API server shows
//! (429, 5xx, slowness, an answer lost after the write committed, a dropped connection, the
//! server down and back) and for the record of what token-issuer asked. It imitates nothing: every request it does not fault is forwarded as is
//! (headers, bearer token, body) to the real server, which authenticates, authorizes, admits and
//! answers it; a faulted request gets the `Status` body the API server sends for that code.
//!
//! It terminates TLS with a certificate from the cluster CA, so a client trusting the cluster CA
//! (token-issuer's kubeconfig) cannot tell it from the API server.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Answer the next `times` requests matching a method and a path with `code` (and the `Status`
/// body the API server sends for it), after `delay`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// HTTP status code (429, 500, 503, 504, 409, 403, ...); `0` only delays, then forwards.
    pub code: u16,
    /// How many requests to answer this way.
    pub times: u32,
    /// Only requests with this method (`POST`, `DELETE`, ...); `None`: any.
    pub method: Option<String>,
    /// Only requests whose path contains this; `None`: any.
    pub path: Option<String>,
    /// Wait this long before answering (or forwarding).
    pub delay: Duration,
    /// Forward the request first and only then answer with the fault: the write committed but
    /// its answer was lost, so the client cannot tell it happened.
    pub after_commit: bool,
    /// Drop the connection instead of answering (with [`Fault::after_commit`], after the
    /// request was carried out).
    pub reset: bool,
}

impl Fault {
    /// The next request (any method, any path) answers `code`.
    pub fn once(code: u16) -> Self {
        Self {
            code,
            times: 1,
            method: None,
            path: None,
            delay: Duration::ZERO,
            after_commit: false,
            reset: false,
        }
    }

    /// The next request's connection is dropped without an answer.
    pub fn reset() -> Self {
        Self {
            reset: true,
            ..Self::once(0)
        }
    }

    /// The next request is forwarded, but only after `delay`.
    pub fn slow(delay: Duration) -> Self {
        Self::once(0).delayed(delay)
    }

    /// Only requests whose path contains `part`.
    pub fn at(mut self, part: &str) -> Self {
        self.path = Some(part.to_owned());
        self
    }

    /// Wait `delay` first.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Only requests with `method`.
    pub fn on(mut self, method: &str) -> Self {
        self.method = Some(method.to_ascii_uppercase());
        self
    }

    /// This many requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = n;
        self
    }

    /// Forward the request, then fail.
    pub fn after_commit(mut self) -> Self {
        self.after_commit = true;
        self
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.path.as_deref().is_none_or(|p| path.contains(p))
    }
}

/// One request that reached the proxy and what it was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The query, if any (`labelSelector=...`).
    pub query: Option<String>,
    /// The HTTP status the client got (0: none, the connection was dropped).
    pub code: u16,
}

#[derive(Debug, Default)]
struct State {
    faults: VecDeque<Fault>,
    delay: Duration,
    requests: Vec<RequestRecord>,
    /// The API server is down: connections are closed at once, requests dropped unanswered.
    down: bool,
}

impl State {
    /// Takes one use of the first fault matching.
    fn take(&mut self, method: &str, path: &str) -> Option<Fault> {
        let index = self.faults.iter().position(|f| f.matches(method, path))?;
        let fault = self.faults.get_mut(index)?;
        fault.times = fault.times.saturating_sub(1);
        let taken = fault.clone();
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(taken)
    }
}

/// The running proxy; it stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The reason the API server's `Status` gives for `code`.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The answer the API server gives with `code`: a `Status` body, and for 429 the Retry-After
/// its Priority and Fairness filter sends.
fn status_response(code: u16) -> hyper::Response<Body> {
    let message = match code {
        429 => "Too many requests, please try again later.".to_owned(),
        504 => "Timeout: request did not complete within the allotted timeout".to_owned(),
        _ => format!("injected by the test's fault proxy: {}", reason(code)),
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason(code),
        "code": code,
    });
    let mut response = hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json");
    if code == 429 {
        response = response.header("retry-after", "1");
    }
    response
        .body(full(body.to_string()))
        .unwrap_or_else(|_| hyper::Response::new(full("")))
}

/// How the proxy reaches the API server: TLS to `upstream`, trusting the cluster CA.
#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl Upstream {
    async fn connect(&self) -> anyhow::Result<hyper::client::conn::http2::SendRequest<Incoming>> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let name = rustls_pki_types::ServerName::IpAddress(self.addr.ip().into());
        let tls = self.tls.connect(name, tcp).await?;
        let (send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(send)
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to the API server at `upstream`, whose
    /// certificate chains to `ca_cert`; serves with a certificate `ca_cert`/`ca_key` issue.
    pub async fn start(
        upstream: SocketAddr,
        ca_cert: &Path,
        ca_key: &Path,
    ) -> anyhow::Result<FaultProxy> {
        let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
        let ca_pem = std::fs::read_to_string(ca_cert)?;
        let issuer = crate::control_plane::load_issuer(ca_cert, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
        let cert = params.signed_by(&key, &issuer)?;
        let mut server = rustls23::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));

        let mut roots = rustls23::RootCertStore::empty();
        for der in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(der.context("the cluster CA's PEM")?)?;
        }
        let mut client = rustls23::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"h2".to_vec()];
        let upstream = Upstream {
            addr: upstream,
            tls: tokio_rustls::TlsConnector::from(Arc::new(client)),
        };

        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(serve(listener, acceptor, upstream, state.clone()));
        Ok(FaultProxy { addr, state, task })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues `fault` behind the faults already queued.
    pub fn inject(&self, fault: Fault) {
        if fault.times > 0 {
            self.lock().faults.push_back(fault);
        }
    }

    /// Delays every request by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Takes the API server down (every connection is dropped, new ones closed at once, as a
    /// client sees a server that went away) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    upstream: Upstream,
    state: Arc<Mutex<State>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        if state.lock().unwrap_or_else(|e| e.into_inner()).down {
            drop(tcp);
            continue;
        }
        let (acceptor, upstream, state) = (acceptor.clone(), upstream.clone(), state.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            // One upstream connection per client connection, opened at its first request.
            let sender = Arc::new(tokio::sync::Mutex::new(None));
            let service = hyper::service::service_fn(move |request| {
                handle(request, upstream.clone(), sender.clone(), state.clone())
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

type Sender = Arc<tokio::sync::Mutex<Option<hyper::client::conn::http2::SendRequest<Incoming>>>>;

/// Why a connection was dropped instead of answered.
#[derive(Debug, thiserror::Error)]
enum Dropped {
    #[error("the API server is down")]
    Down,
    #[error("a fault drops the connection")]
    Reset,
}

async fn handle(
    request: hyper::Request<Incoming>,
    upstream: Upstream,
    sender: Sender,
    state: Arc<Mutex<State>>,
) -> Result<hyper::Response<Body>, Dropped> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let record = |code: u16| {
        let record = RequestRecord {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            code,
        };
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests
            .push(record);
    };
    let (fault, delay, down) = {
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        (state.take(&method, &path), state.delay, state.down)
    };
    if down {
        record(0);
        return Err(Dropped::Down);
    }
    let wait = delay + fault.as_ref().map_or(Duration::ZERO, |f| f.delay);
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    let response = match &fault {
        Some(f) if f.reset && !f.after_commit => None,
        Some(f) if f.code != 0 && !f.after_commit => Some(status_response(f.code)),
        _ => {
            let forwarded = forward(request, &upstream, &sender).await;
            match &fault {
                Some(f) if f.code != 0 || f.reset => {
                    // Let the write finish before the answer is replaced or dropped.
                    if let Ok(response) = forwarded {
                        let _ = response.into_body().collect().await;
                    }
                    (!f.reset).then(|| status_response(f.code))
                }
                _ => Some(forwarded.unwrap_or_else(|error| {
                    tracing::warn!("fault proxy: the API server did not answer: {error:#}");
                    status_response(503)
                })),
            }
        }
    };
    match response {
        Some(response) => {
            record(response.status().as_u16());
            Ok(response)
        }
        None => {
            record(0);
            Err(Dropped::Reset)
        }
    }
}

async fn forward(
    request: hyper::Request<Incoming>,
    upstream: &Upstream,
    sender: &Sender,
) -> anyhow::Result<hyper::Response<Body>> {
    let mut guard = sender.lock().await;
    let mut send = match guard.take() {
        Some(send) if send.is_ready() => send,
        _ => upstream.connect().await?,
    };
    *guard = Some(send.clone());
    drop(guard);
    // HTTP/2 upstream: the authority goes into :authority, the Host header must not be sent.
    let (mut parts, body) = request.into_parts();
    parts.version = hyper::Version::HTTP_2;
    parts.headers.remove(hyper::header::HOST);
    parts.headers.remove(hyper::header::CONNECTION);
    let authority = upstream.addr.to_string();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = hyper::Uri::builder()
        .scheme("https")
        .authority(authority)
        .path_and_query(path)
        .build()?;
    send.ready().await?;
    let response = send
        .send_request(hyper::Request::from_parts(parts, body))
        .await?;
    Ok(response.map(|body| body.boxed()))
}
