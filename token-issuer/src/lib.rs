//! token-issuer: the only process in the join-service pod with a Kubernetes credential.
//!
//! join-core asks it, over a Unix socket that admits join-core's uid only, for a node's
//! Kubernetes credentials: a bootstrap token ([`bootstrap`]), the kubelet certificate signed by
//! the cluster CA ([`ca`]), the discovery hash, the cluster's Kubernetes version and components
//! ([`cluster_version`]), a `JoiningNode` record of the join ([`joining`]) and, for
//! control-plane joiners the cluster expects ([`control_plane`]), the shared control-plane PKI
//! ([`pki`]); each such release is recorded ([`audit`]). The node's CSR is validated
//! first ([`csr`]); a refused request touches nothing in Kubernetes. [`service`] orders the
//! steps, undoes what a failed join created, and maps errors to gRPC codes in one place.

#![forbid(unsafe_code)]

pub mod audit;
pub mod bootstrap;
pub mod ca;
pub mod cluster_version;
mod config;
pub mod control_plane;
pub mod csr;
pub mod joining;
pub mod kube_api;
pub mod metrics;
pub mod pki;
pub mod service;

use std::path::PathBuf;

use plumbing::shutdown::Shutdown;
use plumbing::unix;
use proto::tokenissuer::token_issuer_server::TokenIssuerServer;

pub use config::Config;

/// Why token-issuer could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configured endpoint is not `host:port` (or none is configured).
    #[error("api server endpoint {0:?} is not host:port")]
    Endpoint(String),
    /// The cluster CA could not be loaded.
    #[error("loading the cluster CA")]
    Ca(#[source] ca::LoadError),
    /// The kubeconfig file could not be read.
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No Kubernetes client configuration could be inferred.
    #[error("inferring the Kubernetes client configuration (in-cluster or KUBECONFIG)")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
    /// The socket could not be bound.
    #[error("binding the TokenIssuer socket")]
    Bind(#[source] unix::Error),
    /// The gRPC server failed.
    #[error("serving TokenIssuer")]
    Serve(#[source] tonic::transport::Error),
    /// The admin endpoint could not be bound.
    #[error("binding the admin endpoint on {addr}")]
    Admin {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn valid_endpoint(endpoint: &str) -> bool {
    match endpoint.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0),
        None => false,
    }
}

async fn kube_client(config: &Config) -> Result<kube::Client, Error> {
    let mut kube_config = match &config.kubeconfig {
        Some(path) => {
            let kc_err = |source| Error::Kubeconfig {
                path: path.clone(),
                source,
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(kc_err)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(kc_err)?
        }
        None => kube::Config::infer().await.map_err(Error::InferConfig)?,
    };
    kube_config.connect_timeout = Some(config.kube_timeout);
    kube_config.read_timeout = Some(config.kube_timeout);
    kube::Client::try_from(kube_config).map_err(Error::Client)
}

/// Binds the admin endpoint: readiness is the API server answering `GET /version`.
async fn admin(
    addr: std::net::SocketAddr,
    client: kube::Client,
) -> Result<plumbing::admin::AdminServer, Error> {
    let mut admin = plumbing::admin::Admin::new("token_issuer");
    metrics::register(admin.registry());
    let admin = admin.check("kubernetes_api", move || {
        let client = client.clone();
        async move {
            client
                .apiserver_version()
                .await
                .map(drop)
                .map_err(|error| format!("GET /version: {error}"))
        }
    });
    let server = admin
        .bind(addr)
        .await
        .map_err(|source| Error::Admin { addr, source })?;
    if let Ok(addr) = server.local_addr() {
        tracing::info!(%addr, "admin endpoint listening");
    }
    Ok(server)
}

/// Serves TokenIssuer on `config.socket` until `shutdown` fires, then lets in-flight requests
/// finish for at most `config.grace_period`.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    // kube-rs builds its rustls config from the process default provider; ours is aws-lc-rs.
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    let endpoint = config.api_server_endpoint().unwrap_or_default();
    if !valid_endpoint(&endpoint) {
        return Err(Error::Endpoint(endpoint));
    }
    let ca = ca::ClusterCa::load(&config.ca_cert, &config.ca_key).map_err(Error::Ca)?;
    let client = kube_client(&config).await?;
    let admin = match config.admin_listen {
        Some(addr) => Some(admin(addr, client.clone()).await?),
        None => None,
    };
    let service = service::Service::new(service::Parts {
        ca,
        tokens: bootstrap::TokenStore::new(client.clone(), config.kube_timeout),
        versions: cluster_version::VersionReader::new(client.clone(), config.kube_timeout)
            .with_max_age(config.version_max_age),
        joining: joining::JoiningNodes::new(client.clone(), config.kube_timeout),
        control_plane: control_plane::ControlPlaneGate::new(client.clone(), config.kube_timeout),
        events: audit::AuditEvents::new(client, config.pod_name.clone(), config.kube_timeout),
        pki: pki::PkiDir::new(config.pki_dir.clone()),
        api_server_endpoint: endpoint,
    });

    let server = unix::UnixServer::bind(&config.socket, config.socket_mode, config.peer_uid)
        .map_err(Error::Bind)?;
    tracing::info!(socket = %config.socket.display(), peer_uid = config.peer_uid, "token-issuer serving");
    let admin = admin.map(|admin| admin.spawn(shutdown.clone()));
    let result = server
        .serve(
            tonic::service::Routes::new(TokenIssuerServer::new(service)),
            shutdown,
            config.grace_period,
        )
        .await
        .map_err(Error::Serve);
    if let Some(admin) = admin {
        admin.abort();
    }
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints() {
        assert!(super::valid_endpoint("10.0.0.1:6443"));
        assert!(super::valid_endpoint("[fd00::1]:6443"));
        assert!(super::valid_endpoint("api.example.com:443"));
        assert!(!super::valid_endpoint("10.0.0.1"));
        assert!(!super::valid_endpoint(":6443"));
        assert!(!super::valid_endpoint("h:0"));
    }
}
