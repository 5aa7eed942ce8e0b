//! A stand-in for the two Google endpoints `gce-identity` calls (gcp-sev-snp, gcp-sev-es).
//!
//! - **The metadata server** (plain HTTP, as `http://metadata.google.internal` is):
//!   `GET /computeMetadata/v1/instance/service-accounts/default/token` answers
//!   `{"access_token", "expires_in", "token_type": "Bearer"}` only with the header
//!   `Metadata-Flavor: Google` (403 without it, as the real server) and sets that header on
//!   its answers; a request carrying `X-Forwarded-For` is refused, as the real one refuses
//!   proxied requests. With a VM set ([`GceStandin::set_vm`]) it also answers, as the metadata
//!   server of that VM, `project/project-id`, `instance/zone` (`projects/<number>/zones/<zone>`)
//!   and `instance/name` under `/computeMetadata/v1/`, as a node's issuer asks them.
//! - **The Compute Engine API** (HTTPS with a CA of its own):
//!   `GET /compute/v1/projects/{project}/zones/{zone}/instances/{instance}/getShieldedInstanceIdentity`
//!   answers `{"kind": "compute#shieldedInstanceIdentity", "signingKey": {"ekPub": <PEM>},
//!   "encryptionKey": {"ekPub": <PEM>}}` for the instances a test registered, only with
//!   `Authorization: Bearer <a token the metadata server issued and that has not expired>`
//!   (401 otherwise), and Google's error JSON with 404 for any other instance.
//!   `GET /compute/v1/projects/{project}/zones/{zone}/instances/{instance}` (`instances.get`)
//!   answers the instance resource (`kind`, `id`, `name`, `zone`, `status`,
//!   `shieldedInstanceConfig`, and `confidentialInstanceConfig` unless the instance is not
//!   confidential, as the real API leaves it out), cut to the top-level fields a `fields=` query
//!   names, as Google's partial responses are. An instance is registered as an AMD SEV
//!   confidential VM (`{"enableConfidentialCompute": true}`) unless a test says otherwise
//!   ([`GceStandin::set_confidential`]).
//!
//! - **A control endpoint** (plain HTTP, no Google counterpart) through which another process
//!   registers instances: `PUT /standin/instances/{project}/{zone}/{instance}` with the signing
//!   key's DER SubjectPublicKeyInfo as the body answers 204 ([`put_instance_at`] is its client).
//!   `local-cluster` runs the stand-in; the load generator, another process, registers each
//!   simulated node's instance there before the node joins.
//!
//! A test sets faults the way the real API fails: 403 (the service account lacks
//! `compute.instances.getShieldedInstanceIdentity`), 429 with `Retry-After`, 503, or no answer
//! at all; and the metadata server can fail on its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng as _;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// The metadata path of the default service account's access token.
pub const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// The control endpoint's path under which instances are registered.
pub const CONTROL_INSTANCES: &str = "/standin/instances";

/// How an endpoint answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer as the real service does.
    None,
    /// 403 Forbidden: the caller's service account lacks the permission.
    Forbidden,
    /// 429 Too Many Requests with `Retry-After: <seconds>`.
    RateLimited { retry_after: u64 },
    /// 503 Service Unavailable.
    ServerError,
    /// Accept the request and never answer.
    Hang,
}

/// What went wrong starting the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the GCE stand-in: {0}")]
    Bind(#[source] std::io::Error),
    #[error("the GCE stand-in's certificates: {0}")]
    Tls(#[source] standin_tls::Error),
}

/// One registered instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    pub project: String,
    pub zone: String,
    pub name: String,
}

#[derive(Clone)]
struct Identity {
    signing_pem: String,
    encryption_pem: Option<String>,
    /// `confidentialInstanceConfig`, or `None` for an instance that is not confidential.
    confidential: Option<Confidential>,
}

/// An instance's `confidentialInstanceConfig`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confidential {
    /// `enableConfidentialCompute`.
    pub enable_confidential_compute: bool,
    /// `confidentialInstanceType` (`SEV`, `SEV_SNP`, `TDX`), if set.
    pub confidential_instance_type: Option<String>,
}

impl Confidential {
    /// An AMD SEV confidential VM as created with `--confidential-compute`.
    pub fn sev() -> Confidential {
        Confidential {
            enable_confidential_compute: true,
            confidential_instance_type: None,
        }
    }
}

struct State {
    instances: Mutex<HashMap<Instance, Identity>>,
    /// The VM whose metadata server this is, for a node's questions.
    vm: Mutex<Option<Instance>>,
    tokens: Mutex<HashMap<String, Instant>>,
    token_lifetime: Mutex<Duration>,
    compute_fault: Mutex<Fault>,
    metadata_fault: Mutex<Fault>,
    token_requests: AtomicUsize,
    compute_requests: AtomicUsize,
}

/// A running stand-in; dropping it stops both endpoints.
pub struct GceStandin {
    metadata: SocketAddr,
    compute: SocketAddr,
    control: SocketAddr,
    ca_pem: String,
    state: Arc<State>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for GceStandin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceStandin")
            .field("metadata", &self.metadata)
            .field("compute", &self.compute)
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

/// A PEM `PUBLIC KEY` block, as the API writes `ekPub`.
pub fn public_key_pem(spki_der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(spki_der);
    let mut out = "-----BEGIN PUBLIC KEY-----\n".to_owned();
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out + "-----END PUBLIC KEY-----\n"
}

impl GceStandin {
    /// Serves both endpoints on free loopback ports.
    pub async fn start() -> Result<GceStandin, Error> {
        let metadata = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let compute = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let control = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let control_addr = control.local_addr().map_err(Error::Bind)?;
        let metadata_addr = metadata.local_addr().map_err(Error::Bind)?;
        let compute_addr = compute.local_addr().map_err(Error::Bind)?;
        let (ca_pem, tls) = standin_tls::generate(compute_addr.ip()).map_err(Error::Tls)?;
        let state = Arc::new(State {
            instances: Mutex::default(),
            vm: Mutex::default(),
            tokens: Mutex::default(),
            token_lifetime: Mutex::new(Duration::from_secs(3599)),
            compute_fault: Mutex::new(Fault::None),
            metadata_fault: Mutex::new(Fault::None),
            token_requests: AtomicUsize::new(0),
            compute_requests: AtomicUsize::new(0),
        });
        let tasks = vec![
            tokio::spawn(serve(metadata, None, state.clone(), Endpoint::Metadata)),
            tokio::spawn(serve(
                compute,
                Some(TlsAcceptor::from(tls)),
                state.clone(),
                Endpoint::Compute,
            )),
            tokio::spawn(serve(control, None, state.clone(), Endpoint::Control)),
        ];
        Ok(GceStandin {
            metadata: metadata_addr,
            compute: compute_addr,
            control: control_addr,
            ca_pem,
            state,
            tasks,
        })
    }

    /// `http://127.0.0.1:<port>`, standing for `http://metadata.google.internal`.
    pub fn metadata_url(&self) -> String {
        format!("http://{}", self.metadata)
    }

    /// `https://127.0.0.1:<port>`, standing for `https://compute.googleapis.com`.
    pub fn compute_url(&self) -> String {
        format!("https://{}", self.compute)
    }

    /// Where other processes register instances ([`put_instance_at`]).
    pub fn control_addr(&self) -> SocketAddr {
        self.control
    }

    /// The CA of the compute endpoint's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Registers an instance whose vTPM signing key (the AK) is `signing_spki` (DER) and, if
    /// given, whose endorsement key is `encryption_spki`.
    pub fn put_instance(
        &self,
        instance: Instance,
        signing_spki: &[u8],
        encryption_spki: Option<&[u8]>,
    ) {
        lock(&self.state.instances).insert(
            instance,
            Identity {
                signing_pem: public_key_pem(signing_spki),
                encryption_pem: encryption_spki.map(public_key_pem),
                confidential: Some(Confidential::sev()),
            },
        );
    }

    /// Sets a registered instance's `confidentialInstanceConfig` (`None`: not a confidential
    /// VM, the field absent); returns whether the instance is registered.
    pub fn set_confidential(
        &self,
        instance: &Instance,
        confidential: Option<Confidential>,
    ) -> bool {
        match lock(&self.state.instances).get_mut(instance) {
            Some(identity) => {
                identity.confidential = confidential;
                true
            }
            None => false,
        }
    }

    /// Removes an instance (it was deleted): the API answers 404 for it.
    pub fn remove_instance(&self, instance: &Instance) {
        lock(&self.state.instances).remove(instance);
    }

    /// Makes the metadata server that of `vm`: it names its project, zone and name.
    pub fn set_vm(&self, vm: Instance) {
        *lock(&self.state.vm) = Some(vm);
    }

    pub fn set_compute_fault(&self, fault: Fault) {
        *lock(&self.state.compute_fault) = fault;
    }

    pub fn set_metadata_fault(&self, fault: Fault) {
        *lock(&self.state.metadata_fault) = fault;
    }

    /// How long tokens issued from now on live (`expires_in`).
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        *lock(&self.state.token_lifetime) = lifetime;
    }

    /// Makes every token issued so far invalid, as a revoked or rotated credential is.
    pub fn revoke_tokens(&self) {
        lock(&self.state.tokens).clear();
    }

    /// Token requests the metadata server answered with a token.
    pub fn token_requests(&self) -> usize {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    /// Requests the compute endpoint received.
    pub fn compute_requests(&self) -> usize {
        self.state.compute_requests.load(Ordering::SeqCst)
    }
}

impl Drop for GceStandin {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy)]
enum Endpoint {
    Metadata,
    Compute,
    Control,
}

async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    state: Arc<State>,
    endpoint: Endpoint,
) {
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
                            Ok::<_, std::convert::Infallible>(match endpoint {
                                Endpoint::Metadata => metadata(&state, req).await,
                                Endpoint::Compute => compute(&state, req).await,
                                Endpoint::Control => control(&state, req).await,
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

/// Google's JSON error body, as the Compute API writes it.
fn google_error(status: StatusCode, message: &str, reason: &str, code_name: &str) -> Answer {
    let body = serde_json::json!({
        "error": {
            "code": status.as_u16(),
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": code_name,
        }
    });
    text(status, body.to_string(), "application/json; charset=UTF-8")
}

/// The configured fault's answer, or `None` to answer normally.
async fn fault_answer(fault: Fault, google: bool) -> Option<Answer> {
    let answer = |status: StatusCode, message: &str, reason: &str, code: &str| {
        if google {
            google_error(status, message, reason, code)
        } else {
            text(status, message.to_owned(), "text/plain; charset=utf-8")
        }
    };
    match fault {
        Fault::None => None,
        Fault::Hang => std::future::pending().await,
        Fault::Forbidden => Some(answer(
            StatusCode::FORBIDDEN,
            "Required 'compute.instances.getShieldedInstanceIdentity' permission",
            "forbidden",
            "PERMISSION_DENIED",
        )),
        Fault::ServerError => Some(answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "The service is currently unavailable.",
            "backendError",
            "UNAVAILABLE",
        )),
        Fault::RateLimited { retry_after } => {
            let mut r = answer(
                StatusCode::TOO_MANY_REQUESTS,
                "Quota exceeded for quota metric 'Read requests'",
                "rateLimitExceeded",
                "RESOURCE_EXHAUSTED",
            );
            if let Ok(value) = http::HeaderValue::from_str(&retry_after.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, value);
            }
            Some(r)
        }
    }
}

async fn metadata(state: &State, req: Request<hyper::body::Incoming>) -> Answer {
    let mut answer = metadata_answer(state, req).await;
    answer
        .headers_mut()
        .insert("metadata-flavor", http::HeaderValue::from_static("Google"));
    answer
}

async fn metadata_answer(state: &State, req: Request<hyper::body::Incoming>) -> Answer {
    let fault = *lock(&state.metadata_fault);
    if let Some(answer) = fault_answer(fault, false).await {
        return answer;
    }
    let plain = |status, body: &'static str| text(status, body, "text/plain; charset=utf-8");
    if req.headers().get("metadata-flavor").map(|v| v.as_bytes()) != Some(b"Google") {
        return plain(
            StatusCode::FORBIDDEN,
            "Missing required header: \"Metadata-Flavor\"",
        );
    }
    if req.headers().contains_key("x-forwarded-for") {
        return plain(StatusCode::FORBIDDEN, "Request had X-Forwarded-For header");
    }
    if req.method() != http::Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let vm_field = |vm: &Instance| match req.uri().path() {
        "/computeMetadata/v1/project/project-id" => Some(vm.project.clone()),
        // The real server names the project by number here.
        "/computeMetadata/v1/instance/zone" => {
            Some(format!("projects/1234567890/zones/{}", vm.zone))
        }
        "/computeMetadata/v1/instance/name" => Some(vm.name.clone()),
        _ => None,
    };
    if let Some(answer) = lock(&state.vm).as_ref().and_then(vm_field) {
        return text(StatusCode::OK, answer, "application/text");
    }
    if req.uri().path() != TOKEN_PATH {
        return plain(StatusCode::NOT_FOUND, "Not Found");
    }
    let token = format!(
        "ya29.standin-{}",
        hex::encode(rand::rng().random::<[u8; 24]>())
    );
    let lifetime = *lock(&state.token_lifetime);
    lock(&state.tokens).insert(token.clone(), Instant::now() + lifetime);
    state.token_requests.fetch_add(1, Ordering::SeqCst);
    let body = serde_json::json!({
        "access_token": token,
        "expires_in": lifetime.as_secs(),
        "token_type": "Bearer",
    });
    text(StatusCode::OK, body.to_string(), "application/json")
}

async fn compute(state: &State, req: Request<hyper::body::Incoming>) -> Answer {
    state.compute_requests.fetch_add(1, Ordering::SeqCst);
    let authorized = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| lock(&state.tokens).get(token).copied())
        .is_some_and(|expires| Instant::now() < expires);
    if !authorized {
        return google_error(
            StatusCode::UNAUTHORIZED,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
            "authError",
            "UNAUTHENTICATED",
        );
    }
    let fault = *lock(&state.compute_fault);
    if let Some(answer) = fault_answer(fault, true).await {
        return answer;
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let segments: Vec<&str> = path.split('/').collect();
    let (instance, call) = match segments.as_slice() {
        [
            "",
            "compute",
            "v1",
            "projects",
            project,
            "zones",
            zone,
            "instances",
            name,
            rest @ ..,
        ] if matches!(rest, [] | ["getShieldedInstanceIdentity"]) => {
            let instance = Instance {
                project: (*project).to_owned(),
                zone: (*zone).to_owned(),
                name: (*name).to_owned(),
            };
            (
                instance,
                if rest.is_empty() {
                    Call::Get
                } else {
                    Call::Identity
                },
            )
        }
        _ => {
            return google_error(
                StatusCode::NOT_FOUND,
                &format!("The requested URL {path} was not found on this server."),
                "notFound",
                "NOT_FOUND",
            );
        }
    };
    if req.method() != http::Method::GET {
        return google_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed",
            "httpMethodNotAllowed",
            "INVALID_ARGUMENT",
        );
    }
    let identity = lock(&state.instances).get(&instance).cloned();
    let Some(identity) = identity else {
        return google_error(
            StatusCode::NOT_FOUND,
            &format!(
                "The resource 'projects/{}/zones/{}/instances/{}' was not found",
                instance.project, instance.zone, instance.name
            ),
            "notFound",
            "NOT_FOUND",
        );
    };
    let body = match call {
        Call::Identity => {
            let mut body = serde_json::json!({
                "kind": "compute#shieldedInstanceIdentity",
                "signingKey": {"ekPub": identity.signing_pem},
            });
            if let Some(pem) = identity.encryption_pem {
                body["encryptionKey"] = serde_json::json!({"ekPub": pem});
            }
            body
        }
        Call::Get => partial(instance_resource(&instance, &identity), &query),
    };
    text(
        StatusCode::OK,
        body.to_string(),
        "application/json; charset=UTF-8",
    )
}

/// Which Compute API read a path names.
enum Call {
    /// `instances.getShieldedInstanceIdentity`.
    Identity,
    /// `instances.get`.
    Get,
}

/// The instance resource `instances.get` answers (the fields a confidential-computing check
/// reads, and the ones around them every answer has).
fn instance_resource(instance: &Instance, identity: &Identity) -> serde_json::Value {
    // A stable number per instance, as Google's ids are.
    let id = {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = std::hash::DefaultHasher::new();
        instance.hash(&mut hasher);
        hasher.finish() >> 1
    };
    let mut body = serde_json::json!({
        "kind": "compute#instance",
        "id": id.to_string(),
        "name": instance.name,
        "zone": format!(
            "https://www.googleapis.com/compute/v1/projects/{}/zones/{}",
            instance.project, instance.zone
        ),
        "status": "RUNNING",
        "shieldedInstanceConfig": {
            "enableSecureBoot": true,
            "enableVtpm": true,
            "enableIntegrityMonitoring": true,
        },
    });
    if let Some(confidential) = &identity.confidential {
        let mut config = serde_json::json!({
            "enableConfidentialCompute": confidential.enable_confidential_compute,
        });
        if let Some(kind) = &confidential.confidential_instance_type {
            config["confidentialInstanceType"] = serde_json::Value::String(kind.clone());
        }
        body["confidentialInstanceConfig"] = config;
    }
    body
}

/// `resource` cut to the top-level fields a `fields=a,b` query names (all without one).
fn partial(resource: serde_json::Value, query: &str) -> serde_json::Value {
    let Some(fields) = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("fields="))
    else {
        return resource;
    };
    let wanted: Vec<&str> = fields.split(',').map(str::trim).collect();
    match resource {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter()
                .filter(|(k, _)| wanted.contains(&k.as_str()))
                .collect(),
        ),
        other => other,
    }
}

/// The instance a control path names (`/standin/instances/{project}/{zone}/{instance}`).
fn control_instance(path: &str) -> Option<Instance> {
    let rest = path.strip_prefix(CONTROL_INSTANCES)?.strip_prefix('/')?;
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        [project, zone, name] if ![project, zone, name].iter().any(|s| s.is_empty()) => {
            Some(Instance {
                project: (*project).to_owned(),
                zone: (*zone).to_owned(),
                name: (*name).to_owned(),
            })
        }
        _ => None,
    }
}

async fn control(state: &State, req: Request<hyper::body::Incoming>) -> Answer {
    use http_body_util::BodyExt as _;
    let plain = |status, body: String| text(status, body, "text/plain; charset=utf-8");
    let Some(instance) = control_instance(req.uri().path()) else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("not {CONTROL_INSTANCES}/{{project}}/{{zone}}/{{instance}}"),
        );
    };
    if req.method() != http::Method::PUT {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "PUT only".to_owned());
    }
    let spki = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
    };
    if spki.is_empty() {
        return plain(
            StatusCode::BAD_REQUEST,
            "the body must be the signing key's DER SubjectPublicKeyInfo".to_owned(),
        );
    }
    lock(&state.instances).insert(
        instance,
        Identity {
            signing_pem: public_key_pem(&spki),
            encryption_pem: None,
            confidential: Some(Confidential::sev()),
        },
    );
    text(
        StatusCode::NO_CONTENT,
        Bytes::new(),
        "text/plain; charset=utf-8",
    )
}

/// Why registering an instance at a stand-in's control endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("talking to the GCE stand-in's control endpoint at {addr}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the GCE stand-in at {addr} answered {status_line:?}")]
    Refused {
        addr: SocketAddr,
        status_line: String,
    },
}

/// Registers `instance` with signing key `signing_spki` (DER) at the control endpoint `addr` of
/// a stand-in in another process, as [`GceStandin::put_instance`] does in process.
///
/// Blocking, one HTTP/1.1 request on its own connection: the caller makes nodes on plain
/// threads, and must not call this from a runtime that serves the stand-in itself.
pub fn put_instance_at(
    addr: SocketAddr,
    instance: &Instance,
    signing_spki: &[u8],
) -> Result<(), ControlError> {
    use std::io::{BufRead as _, Write as _};
    let io = |source| ControlError::Io { addr, source };
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let head = format!(
        "PUT {CONTROL_INSTANCES}/{}/{}/{} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        instance.project,
        instance.zone,
        instance.name,
        signing_spki.len()
    );
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(signing_spki).map_err(io)?;
    let mut status_line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut status_line)
        .map_err(io)?;
    let status_line = status_line.trim_end().to_owned();
    match status_line.split(' ').nth(1) {
        Some("204") => Ok(()),
        _ => Err(ControlError::Refused { addr, status_line }),
    }
}
