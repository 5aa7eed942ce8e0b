//! A stand-in for the Kubernetes API server, for token-issuer's own unit-level tests.
//!
//! The whole-system tests and the local run meet the real kube-apiserver
//! (`testsupport::control_plane`); this crate remains for token-issuer's in-process tests. It
//! serves the real paths over HTTPS (h2 and http/1.1) with its own CA, authenticates bearer
//! tokens, authorizes with RBAC-shaped rules ([`rbac`]) and fails with the real `Status` bodies
//! ([`status`]). It runs no admission: what the deployed ValidatingAdmissionPolicy admits is
//! judged by the real API server only. Tests steer it with [`Fault`]s (per method and path: forced codes, slowness)
//! and seed and inspect what it stores through [`Running`]; out-of-process users get the same
//! through the test-only admin endpoints under [`ADMIN_PREFIX`] when [`StandinConfig::admin_api`]
//! is on.
//!
//! Served: every call token-issuer makes, on the resources in one table (`resources.rs`):
//! Secrets, ConfigMaps and Events (`/api/v1/namespaces/{ns}/...`; Events validated as the API
//! server does on create), Nodes (`/api/v1/nodes`, lists filtered by `labelSelector`), and
//! Constellation's cluster-scoped
//! `NodeVersion` and `JoiningNode` (`/apis/update.edgeless.systems/v1alpha1/...`), each with get,
//! list, create, delete (with `uid`/`resourceVersion` preconditions) and patch (server-side apply
//! with field managers and `force`, JSON merge patch). PUT, watch, deletecollection, JSON patch
//! and strategic merge patch are refused as such (405/415): nothing here uses them.

#![forbid(unsafe_code)]

mod apply;
mod faults;
pub mod fixtures;
pub mod rbac;
mod resources;
mod secrets;
mod selector;
mod server;
pub mod status;
mod store;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use plumbing::shutdown::{self, Trigger};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

pub use faults::Fault;
pub use rbac::{Grant, PolicyRule, User};
pub use resources::EDGELESS_GROUP;
pub use secrets::is_dns1123_subdomain;
pub use server::RequestRecord;
pub use store::StoredObject;

/// Path prefix of the test-only control endpoints: `GET objects`, `POST objects` (seed one
/// object; its `kind` picks the resource), `GET requests`, `POST faults` (a [`Fault`] as JSON),
/// `PUT delay` (`{"millis": N}`).
pub const ADMIN_PREFIX: &str = "/__standin/";

/// Errors starting the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Generating the CA or serving certificate failed.
    #[error("cannot generate the stand-in's certificates")]
    Certificate(#[source] rcgen::Error),
    /// The TLS configuration was rejected.
    #[error("cannot build the stand-in's TLS configuration")]
    Tls(#[source] rustls23::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// How to run the stand-in.
#[derive(Clone, Debug)]
pub struct StandinConfig {
    /// TCP address; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Known users, by bearer token.
    pub users: Vec<User>,
    /// Namespaces that exist (creating in another answers 404 like the real server).
    pub namespaces: Vec<String>,
    /// Serve the test-only admin endpoints under [`ADMIN_PREFIX`].
    pub admin_api: bool,
}

impl StandinConfig {
    /// Loopback, port 0, kubeadm's namespaces, the given users, no admin API.
    pub fn new(users: Vec<User>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            users,
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .to_vec(),
            admin_api: false,
        }
    }
}

/// Starts stand-ins.
#[derive(Debug)]
pub struct KubeStandin;

impl KubeStandin {
    /// Binds, generates a CA and serving certificate, and serves until [`Running::shutdown`]
    /// (or drop).
    pub async fn start(config: StandinConfig) -> Result<Running, Error> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Listen {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        let (ca_pem, tls) = tls::generate(addr.ip())?;
        let state = Arc::new(server::State {
            users: config.users,
            admin_api: config.admin_api,
            server_address: addr.to_string(),
            store: Mutex::new(store::Store::new(config.namespaces)),
            faults: Mutex::new(faults::Faults::default()),
            log: Mutex::new(Vec::new()),
        });
        let (trigger, stop) = shutdown::channel();
        let task = tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(tls),
            state.clone(),
            stop,
        ));
        Ok(Running {
            url: format!("https://{addr}"),
            addr,
            ca_pem,
            state,
            trigger,
            task: Some(task),
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: Arc<server::State>,
    stop: shutdown::Shutdown,
) {
    let mut conns = JoinSet::new();
    let stopped = stop.wait();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    // Small, latency-bound answers, as the real API server's Go net stack sends
                    // them: no Nagle delay.
                    let _ = tcp.set_nodelay(true);
                    let acceptor = acceptor.clone();
                    let state = state.clone();
                    conns.spawn(async move {
                        let tls = match acceptor.accept(tcp).await {
                            Ok(tls) => tls,
                            Err(error) => {
                                tracing::debug!(%error, "kube-standin: TLS handshake failed");
                                return;
                            }
                        };
                        let svc = hyper::service::service_fn(move |req| server::service(state.clone(), req));
                        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                        if let Err(error) = builder.serve_connection(TokioIo::new(tls), svc).await {
                            tracing::debug!(%error, "kube-standin: connection ended with error");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "kube-standin: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    // A stand-in has nothing to drain: in-flight requests are simply cut off.
    conns.abort_all();
}

/// A running stand-in. Dropping it stops the server.
#[derive(Debug)]
pub struct Running {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The bound address.
    pub addr: SocketAddr,
    /// The stand-in CA's certificate, PEM (trust anchor for clients).
    pub ca_pem: String,
    state: Arc<server::State>,
    trigger: Trigger,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// A kubeconfig (YAML) that makes a kube-rs or client-go client talk to this stand-in with
    /// `token`.
    pub fn kubeconfig(&self, token: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        // JSON strings are valid YAML scalars, so quoting this way is safe for any token.
        let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-standin\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: kube-standin-user\n  user:\n    token: {token}\ncontexts:\n- name: kube-standin\n  context:\n    cluster: kube-standin\n    user: kube-standin-user\n    namespace: default\ncurrent-context: kube-standin\n",
            server = q(&self.url),
            ca = q(&ca),
            token = q(token),
        )
    }

    /// Every stored object.
    pub fn objects(&self) -> Vec<StoredObject> {
        server::lock(&self.state.store).snapshot()
    }

    /// The Secrets stored in `namespace`.
    pub fn secrets(&self, namespace: &str) -> Vec<StoredObject> {
        self.objects()
            .into_iter()
            .filter(|o| o.resource == "secrets" && o.namespace.as_deref() == Some(namespace))
            .collect()
    }

    /// The objects of `resource` (plural, e.g. `joiningnodes`), in every namespace.
    pub fn objects_of(&self, resource: &str) -> Vec<StoredObject> {
        self.objects()
            .into_iter()
            .filter(|o| o.resource == resource)
            .collect()
    }

    /// The `JoiningNode` objects.
    pub fn joining_nodes(&self) -> Vec<StoredObject> {
        self.objects_of("joiningnodes")
    }

    /// Stores `object` (with `apiVersion`, `kind`, `metadata.name`, and `metadata.namespace`
    /// for namespaced kinds) as if a cluster admin had created it, with server-set metadata.
    /// Fails like a create would (e.g. 409 if it exists).
    pub fn seed(
        &self,
        object: serde_json::Value,
    ) -> Result<serde_json::Value, Box<status::Status>> {
        server::seed(&self.state, object).map_err(|f| f.status)
    }

    /// Every request answered so far (health checks and admin calls included).
    pub fn requests(&self) -> Vec<RequestRecord> {
        server::lock(&self.state.log).clone()
    }

    /// Queues a fault.
    pub fn inject(&self, fault: Fault) {
        server::lock(&self.state.faults).push(fault);
    }

    /// Delays every authenticated request by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        server::lock(&self.state.faults).delay = delay;
    }

    /// Stops accepting and closes all connections.
    pub async fn shutdown(mut self) {
        self.trigger.fire();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.trigger.fire();
    }
}
