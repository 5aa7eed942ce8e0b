//! The admin endpoint each process serves beside its API: liveness, readiness and metrics.
//!
//! - `GET /livez`: 200 while the process's runtime answers at all. A kubelet restarts the
//!   container when it stops answering; it never depends on other processes, so one broken
//!   dependency cannot make the kubelet restart every container in turn.
//! - `GET /readyz`: 200 only if every readiness check passes (each under a short deadline, all at
//!   once), 503 otherwise, and 503 once the process drains, so the pod leaves the Service's
//!   endpoints before it stops accepting. The body names each check and why it failed, and
//!   lists notes: conditions worth seeing that do not make the process unready (attest-proxy
//!   enforcing its last good policy while the file on disk is invalid).
//! - `GET /metrics`: the process's Prometheus registry in the text exposition format.
//! - `POST` to a path a process registers ([`Admin::post`]): its handler gets the body (within a
//!   bound; larger is refused with 413) and the query string. attest-proxy answers `/dry-run`.
//!
//! It is plain HTTP/1.1 on its own port, which the NetworkPolicy opens to the kubelet and the
//! monitoring namespace only; it serves no secret. Whoever can reach it still cannot pin the
//! process: at most [`MAX_CONNECTIONS`] connections are served at once (more are closed at
//! accept), and each lives at most [`CONNECTION_TIMEOUT`], request headers included; probes and
//! scrapes take milliseconds and reconnect as they need.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

/// The future a readiness check returns: `Err` says why the dependency is not usable.
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One readiness condition, such as "join-core's socket accepts connections".
pub trait Check: Send + Sync + 'static {
    /// Runs the check once.
    fn check(&self) -> CheckFuture;
}

impl<F, Fut> Check for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn check(&self) -> CheckFuture {
        Box::pin(self())
    }
}

/// How long one readiness check may take before it counts as failed. Kubernetes' probe timeout
/// defaults to one second; staying under it keeps a slow dependency from failing the whole probe
/// with a timeout that names nothing.
pub const CHECK_TIMEOUT: Duration = Duration::from_millis(800);

/// Admin connections served at once; more are closed at accept. Probes and a scraper or two
/// need a handful.
pub const MAX_CONNECTIONS: usize = 32;

/// How long one admin connection lives, from accept: a client that sends its headers a byte at a
/// time, or keeps a connection idle, gives up its place by then.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A condition shown in the `/readyz` body without failing readiness: `Some(text)` while it
/// holds.
pub type Note = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// What a POST handler gets.
#[derive(Debug)]
pub struct PostRequest {
    /// The query string, without the `?`.
    pub query: Option<String>,
    /// The whole body.
    pub body: Bytes,
}

/// What a POST handler answers.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// `text/plain` or `application/json`, with charset where it applies.
    pub content_type: &'static str,
    pub body: String,
}

/// The future a POST handler returns.
pub type AnswerFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// A POST handler: what [`Admin::post`] registers.
pub type PostHandler = Box<dyn Fn(PostRequest) -> AnswerFuture + Send + Sync>;

/// Collects the metrics registry and the readiness checks, then binds the endpoint.
pub struct Admin {
    registry: Registry,
    checks: Vec<(&'static str, Box<dyn Check>)>,
    notes: Vec<(&'static str, Note)>,
    posts: Vec<Post>,
    limits: Limits,
}

/// A registered POST path.
struct Post {
    path: &'static str,
    max_body: usize,
    handler: PostHandler,
}

/// The bounds on admin connections.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_connections: usize,
    connection_timeout: Duration,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field(
                "checks",
                &self.checks.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// An endpoint whose metric names all start with `prefix` (e.g. `attest_proxy`).
    pub fn new(prefix: &str) -> Self {
        Self {
            registry: Registry::with_prefix(prefix),
            checks: Vec::new(),
            notes: Vec::new(),
            posts: Vec::new(),
            limits: Limits {
                max_connections: MAX_CONNECTIONS,
                connection_timeout: CONNECTION_TIMEOUT,
            },
        }
    }

    /// Replaces [`MAX_CONNECTIONS`] and [`CONNECTION_TIMEOUT`].
    pub fn connection_limits(
        mut self,
        max_connections: usize,
        connection_timeout: Duration,
    ) -> Self {
        self.limits = Limits {
            max_connections,
            connection_timeout,
        };
        self
    }

    /// The registry to register this process's metrics in.
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Adds a readiness condition named `name` (shown in the `/readyz` body).
    pub fn check(mut self, name: &'static str, check: impl Check) -> Self {
        self.checks.push((name, Box::new(check)));
        self
    }

    /// Adds a note named `name`: shown in the `/readyz` body as `warn <name>: <text>` while
    /// `note` returns text, without making the process unready.
    pub fn note(
        mut self,
        name: &'static str,
        note: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.notes.push((name, Box::new(note)));
        self
    }

    /// Answers `POST path` with `handler`, given a body of at most `max_body` bytes. Whoever
    /// reaches the admin port can call it: register only what they may do (the NetworkPolicy
    /// opens the port to the monitoring namespace), and bound its cost in the handler.
    pub fn post(
        mut self,
        path: &'static str,
        max_body: usize,
        handler: impl Fn(PostRequest) -> AnswerFuture + Send + Sync + 'static,
    ) -> Self {
        self.posts.push(Post {
            path,
            max_body,
            handler: Box::new(handler),
        });
        self
    }

    /// Binds the endpoint on `addr` (port 0 picks a free port).
    pub async fn bind(self, addr: SocketAddr) -> io::Result<AdminServer> {
        let listener = TcpListener::bind(addr).await?;
        Ok(AdminServer {
            listener,
            limits: self.limits,
            state: Arc::new(State {
                registry: self.registry,
                checks: self.checks,
                notes: self.notes,
                posts: self.posts,
            }),
        })
    }
}

struct State {
    registry: Registry,
    checks: Vec<(&'static str, Box<dyn Check>)>,
    notes: Vec<(&'static str, Note)>,
    posts: Vec<Post>,
}

/// A bound admin endpoint.
pub struct AdminServer {
    listener: TcpListener,
    limits: Limits,
    state: Arc<State>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the task is dropped. Readiness turns false once `draining` fires; the
    /// endpoint itself keeps answering while the process drains, so probes see the drain.
    pub async fn serve(self, draining: Shutdown) {
        let places = Arc::new(tokio::sync::Semaphore::new(self.limits.max_connections));
        let timeout = self.limits.connection_timeout;
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "admin endpoint: accept failed");
                    // Out of file descriptors and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(place) = places.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "admin endpoint: too many connections; closed at accept");
                continue;
            };
            let state = self.state.clone();
            let draining = draining.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    let draining = draining.clone();
                    async move { Ok::<_, Infallible>(respond(&state, &draining, request).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tokio::time::timeout(
                    timeout,
                    builder.serve_connection(TokioIo::new(stream), service),
                )
                .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "admin connection ended"),
                    Err(_) => tracing::debug!(%peer, "admin connection reached its time limit"),
                }
                drop(place);
            });
        }
    }

    /// Runs [`AdminServer::serve`] on its own task; abort the handle when the process is done.
    pub fn spawn(self, draining: Shutdown) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.serve(draining))
    }
}

async fn respond(
    state: &State,
    draining: &Shutdown,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.method() == Method::POST {
        return answer_post(state, request).await;
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET, and POST where a handler is registered\n".to_owned(),
        );
    }
    match request.uri().path() {
        "/livez" => text(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => readiness(state, draining).await,
        "/metrics" => metrics(&state.registry),
        other => text(StatusCode::NOT_FOUND, format!("no such path {other:?}\n")),
    }
}

async fn answer_post(state: &State, request: Request<Incoming>) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt as _;
    let path = request.uri().path().to_owned();
    let Some(post) = state.posts.iter().find(|p| p.path == path) else {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("POST is not served on {path:?}\n"),
        );
    };
    let query = request.uri().query().map(str::to_owned);
    let body = match http_body_util::Limited::new(request.into_body(), post.max_body)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "cannot read the body (at most {} bytes): {error}\n",
                    post.max_body
                ),
            );
        }
    };
    let answer = (post.handler)(PostRequest { query, body }).await;
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() = answer.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(answer.content_type),
    );
    response
}

async fn readiness(state: &State, draining: &Shutdown) -> Response<Full<Bytes>> {
    if draining.is_fired() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: shutdown requested\n".to_owned(),
        );
    }
    let results = futures::future::join_all(state.checks.iter().map(|(name, check)| async move {
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
        };
        (*name, outcome)
    }))
    .await;
    let mut body = String::new();
    let mut ready = true;
    for (name, outcome) in results {
        match outcome {
            Ok(()) => body.push_str(&format!("ok {name}\n")),
            Err(reason) => {
                ready = false;
                body.push_str(&format!("failed {name}: {reason}\n"));
            }
        }
    }
    for (name, note) in &state.notes {
        if let Some(note) = note() {
            body.push_str(&format!("warn {name}: {note}\n"));
        }
    }
    if ready {
        text(StatusCode::OK, body)
    } else {
        tracing::warn!(checks = %body.trim_end().replace('\n', "; "), "not ready");
        text(StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

fn metrics(registry: &Registry) -> Response<Full<Bytes>> {
    let mut body = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut body, registry) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {error}\n"),
        );
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    response
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Latency buckets (seconds) for the processes' histograms: handshakes and backend calls take
/// milliseconds, deadlines are seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// `GET path` from an admin endpoint, as a probe or a scraper does it: (HTTP status, body).
/// A small client for tests and tools; gives up after five seconds.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let head = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    exchange(addr, head.as_bytes(), &[], Duration::from_secs(5)).await
}

/// `POST path` with `body` to an admin endpoint: (HTTP status, body). A small client for tests
/// and tools; gives up after `timeout`.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: admin\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    exchange(addr, head.as_bytes(), body, timeout).await
}

/// Sends one HTTP/1.1 request (`head`, then `body`) on a new connection and reads the answer
/// to its close: (HTTP status, body).
async fn exchange(
    addr: SocketAddr,
    head: &[u8],
    body: &[u8],
    timeout: Duration,
) -> io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(head).await?;
        stream.write_all(body).await?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await?;
        let status = raw.get(9..12).and_then(|code| code.parse().ok());
        let body = raw.split_once("\r\n\r\n").map(|(_, body)| body.to_owned());
        match (status, body) {
            (Some(status), Some(body)) => Ok((status, body)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP/1.1 response: {raw:?}"),
            )),
        }
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )
    })?
}

/// A readiness check that passes when a Unix socket accepts a connection: the peer process is
/// up and listening. (Its uid check may still refuse us; accepting is what "reachable" means.)
pub fn unix_socket_check(path: impl Into<std::path::PathBuf>) -> impl Check {
    let path: Arc<std::path::Path> = Arc::from(path.into());
    move || {
        let path = path.clone();
        async move {
            tokio::net::UnixStream::connect(&*path)
                .await
                .map(drop)
                .map_err(|error| format!("cannot connect to {}: {error}", path.display()))
        }
    }
}

/// A readiness check that passes when a TCP endpoint (`host:port`) accepts a connection.
pub fn tcp_check(endpoint: impl Into<String>) -> impl Check {
    let endpoint: Arc<str> = Arc::from(endpoint.into());
    move || {
        let endpoint = endpoint.clone();
        async move {
            tokio::net::TcpStream::connect(&*endpoint)
                .await
                .map(drop)
                .map_err(|error| format!("cannot connect to {endpoint}: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        super::get(addr, path).await.unwrap()
    }

    #[tokio::test]
    async fn a_registered_post_gets_its_body_within_the_bound_and_nothing_else_is_posted() {
        let admin = Admin::new("test").post("/echo", 16, |request: PostRequest| {
            Box::pin(async move {
                Answer {
                    status: StatusCode::OK,
                    content_type: "text/plain; charset=utf-8",
                    body: format!(
                        "{} bytes, query {:?}: {}",
                        request.body.len(),
                        request.query,
                        String::from_utf8_lossy(&request.body)
                    ),
                }
            }) as AnswerFuture
        });
        let server = admin.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (_trigger, draining) = crate::shutdown::channel();
        let task = server.spawn(draining);
        let wait = Duration::from_secs(5);
        assert_eq!(
            post(addr, "/echo?format=json", b"hello", wait)
                .await
                .unwrap(),
            (
                200,
                "5 bytes, query Some(\"format=json\"): hello".to_owned()
            )
        );
        let (status, body) = post(addr, "/echo", &[b'x'; 17], wait).await.unwrap();
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("at most 16 bytes"), "{body}");
        let (status, body) = post(addr, "/livez", b"", wait).await.unwrap();
        assert_eq!(status, 405, "{body}");
        assert!(body.contains("POST is not served on \"/livez\""), "{body}");
        // GET is served as before, and a GET of the POST path finds nothing.
        assert_eq!(get(addr, "/livez").await, (200, "ok\n".to_owned()));
        assert_eq!(get(addr, "/echo").await.0, 404);
        task.abort();
    }

    #[tokio::test]
    async fn live_ready_metrics_and_drain() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("dep.sock");
        let mut admin = Admin::new("test");
        let joins = Counter::<u64>::default();
        admin
            .registry()
            .register("joins", "Joins seen", joins.clone());
        joins.inc_by(3);
        let degraded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = degraded.clone();
        let admin = admin
            .check("dependency", unix_socket_check(&socket))
            .check("always", || async { Ok(()) })
            .note("degraded", move || {
                flag.load(std::sync::atomic::Ordering::Relaxed)
                    .then(|| "running on the last good input".to_owned())
            });
        let server = admin.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (trigger, draining) = crate::shutdown::channel();
        let task = server.spawn(draining);

        assert_eq!(get(addr, "/livez").await, (200, "ok\n".to_owned()));

        // The dependency's socket does not exist yet: not ready, and the body says why.
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(
            body.contains("failed dependency: cannot connect to"),
            "{body}"
        );
        assert!(body.contains("ok always"), "{body}");

        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ok dependency\nok always\n"));

        // A note shows, and readiness stays.
        degraded.store(true, std::sync::atomic::Ordering::Relaxed);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (
                200,
                "ok dependency\nok always\nwarn degraded: running on the last good input\n"
            )
        );

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("test_joins_total 3"), "{body}");

        assert_eq!(get(addr, "/nope").await.0, 404);

        // Draining: still live, no longer ready.
        trigger.fire();
        assert_eq!(get(addr, "/livez").await.0, 200);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.starts_with("draining"), "{body}");
        task.abort();
    }

    #[tokio::test]
    async fn a_hanging_check_fails_within_the_deadline() {
        let admin = Admin::new("test").check("stuck", || async {
            std::future::pending::<()>().await;
            Ok(())
        });
        let server = admin.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (_trigger, draining) = crate::shutdown::channel();
        let task = server.spawn(draining);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("failed stuck: no answer within"), "{body}");
        task.abort();
    }

    /// Whether the server closed `tcp` within `within` (nothing sent).
    async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(within, tcp.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn connections_are_capped_and_time_limited() {
        let admin = Admin::new("test").connection_limits(4, Duration::from_secs(1));
        let server = admin.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (_trigger, draining) = crate::shutdown::channel();
        let task = server.spawn(draining);
        // Four silent clients (a header never sent) hold every place.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let mut fifth = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut fifth, Duration::from_millis(500)).await,
            "a connection beyond the cap was kept"
        );
        // The time limit frees the places: the silent ones are closed, probes answer again.
        let started = std::time::Instant::now();
        for tcp in &mut held {
            assert!(
                closed_within(tcp, Duration::from_secs(3)).await,
                "a silent connection outlived its time limit"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(get(addr, "/livez").await.0, 200);
        task.abort();
    }
}
