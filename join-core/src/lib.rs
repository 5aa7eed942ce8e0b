//! join-core: the ticket logic of the join service.
//!
//! ```text
//! node ─aTLS─▶ attest-proxy ─Unix socket─▶ join-core ──GetDataKey──▶ key service
//!                                             └──IssueNodeCredentials (Unix socket)──▶ token-issuer
//! ```
//!
//! join-core serves `join.API` on a Unix socket that admits attest-proxy's uid alone, so the
//! identity headers the proxy adds ([`plumbing::identity`]) can be believed; a request without
//! them is refused. For a join it checks the request ([`request`], and the SSH host key and
//! principals, [`ssh`]), fetches the node's state disk key, the measurement secret and the
//! emergency SSH CA seed from the key service concurrently, retrying within one deadline
//! ([`keys`], [`retry`]), reads the API server's cert SANs ([`kubeadm`]) and signs the node's
//! SSH host certificate, and only then asks token-issuer for Kubernetes credentials
//! ([`credentials`]), so every failure before that creates nothing in Kubernetes. It holds no
//! Kubernetes credential; a node's state disk key only for the request that fetched it, and the
//! keys every node gets alike (the measurement secret, the SSH CA) for a bounded time, so most
//! joins ask the key service one question ([`keys`]). [`error`] sorts
//! failures by layer and maps them to gRPC statuses in one place.
//!
//! The SSH host certificate names the principals the node asked for without checking them
//! against any list (as Constellation does: the node has just proved it runs the cluster's
//! image, and join-core has no source of truth for its hostnames and addresses), but bounded in
//! number, length and characters, with no wildcards; [`ssh`] gives the rules and the reasons.
//!
//! [`run`] serves until shutdown; [`JoinCore::bind`] then [`JoinCore::serve`] does the same in
//! two steps, so a test knows the socket is listening before it connects.

#![forbid(unsafe_code)]

mod call;
pub mod config;
pub mod credentials;
pub mod error;
pub mod keys;
pub mod kubeadm;
pub mod metrics;
pub mod request;
pub mod retry;
pub mod ssh;
pub mod ticket;

use std::path::{Path, PathBuf};
use std::time::Duration;

use plumbing::admin::{Admin, AdminServer, tcp_check, unix_socket_check};
use plumbing::shutdown::Shutdown;
use plumbing::unix::PeerPolicy;
use proto::join::api_server::ApiServer;
use tokio::net::UnixListener;

pub use config::Config;
pub use error::Error;

use credentials::CredentialsClient;
use keys::KeyClient;
use kubeadm::KubeadmConfig;
use metrics::Metrics;
use retry::RetryPolicy;
use ticket::{HostCertificates, TicketService};

/// Size of the measurement salt, as Constellation generates it.
pub const MEASUREMENT_SALT_LEN: usize = 32;
/// Largest join.API request decoded. Far above any honest request (a CSR is capped at
/// [`request::MAX_CSR_LEN`]), far below tonic's 4 MiB default.
pub const MAX_REQUEST_LEN: usize = 64 * 1024;

/// A bound, not yet serving join-core.
#[derive(Debug)]
pub struct JoinCore {
    listener: UnixListener,
    socket: PathBuf,
    policy: PeerPolicy,
    service: TicketService,
    admin: Option<AdminServer>,
    grace_period: Duration,
}

impl JoinCore {
    /// Reads the measurement salt, checks the kubeadm ClusterConfiguration, sets up the backend
    /// channels (they connect on first use) and binds the socket. Must run inside a tokio runtime.
    pub async fn bind(config: Config) -> Result<Self, Error> {
        let measurement_salt = read_measurement_salt(&config.measurement_salt_file)?;
        let kubeadm = KubeadmConfig::open(&config.kubeadm_config).map_err(Error::KubeadmConfig)?;
        let mut admin = Admin::new("join_core");
        let metrics = Metrics::register(admin.registry());
        let keys = KeyClient::new(
            config.kms_endpoint.clone(),
            RetryPolicy::new(config.kms_timeout, config.kms_attempt_timeout),
        )
        .keeping_cluster_keys(config.cluster_keys_max_age)
        .with_metrics(metrics.clone());
        tokio::spawn(keys.sweep());
        let service = TicketService::new(
            keys.clone(),
            CredentialsClient::new(
                &config.token_issuer_socket,
                config.token_issuer_uid,
                config.token_issuer_timeout,
            )
            .with_metrics(metrics.clone()),
            measurement_salt,
            HostCertificates {
                kubeadm,
                validity: config.ssh_cert_validity,
            },
        )
        .with_metrics(metrics);
        let admin = match config.admin_listen {
            Some(addr) => {
                let admin = admin
                    .check("key_service", tcp_check(authority(&config.kms_endpoint)))
                    .check(
                        "token_issuer",
                        unix_socket_check(&config.token_issuer_socket),
                    );
                Some(
                    admin
                        .bind(addr)
                        .await
                        .map_err(|source| Error::Admin { addr, source })?,
                )
            }
            None => None,
        };
        let listener =
            plumbing::unix::bind(&config.socket, config.socket_mode).map_err(Error::Socket)?;
        Ok(Self {
            listener,
            socket: config.socket,
            policy: PeerPolicy::uids([config.proxy_uid]),
            service,
            admin,
            grace_period: config.grace_period,
        })
    }

    /// Where the admin endpoint listens, if one is configured.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin
            .as_ref()
            .and_then(|admin| admin.local_addr().ok())
    }

    /// The socket join.API is served on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serves join.API until `shutdown` fires, then gives in-flight requests the drain timeout
    /// to finish and removes the socket file.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), Error> {
        tracing::info!(socket = %self.socket.display(), policy = ?self.policy, "join-core listening");
        let admin = self.admin.map(|admin| {
            if let Ok(addr) = admin.local_addr() {
                tracing::info!(%addr, "admin endpoint listening");
            }
            admin.spawn(shutdown.clone())
        });
        let api = ApiServer::new(self.service).max_decoding_message_size(MAX_REQUEST_LEN);
        let serve = tonic::transport::Server::builder()
            .add_service(api)
            .serve_with_incoming_shutdown(
                plumbing::unix::incoming(self.listener, self.policy),
                shutdown.clone().wait(),
            );
        let result = plumbing::shutdown::drain(serve, shutdown, self.grace_period)
            .await
            .map_err(Error::Serve);
        if let Some(admin) = admin {
            admin.abort();
        }
        if let Err(error) = std::fs::remove_file(&self.socket) {
            tracing::debug!(%error, "socket file not removed");
        }
        result
    }
}

/// Binds and serves until `shutdown` fires.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    JoinCore::bind(config).await?.serve(shutdown).await
}

/// `host:port` of an `http://` URI (port 80 if it names none), for the readiness check.
fn authority(uri: &tonic::transport::Uri) -> String {
    let host = uri.host().unwrap_or_default();
    let port = uri.port_u16().unwrap_or(80);
    format!("{host}:{port}")
}

fn read_measurement_salt(path: &Path) -> Result<Vec<u8>, Error> {
    let salt = std::fs::read(path).map_err(|source| Error::ReadSalt {
        path: path.to_owned(),
        source,
    })?;
    // Refused rather than trimmed or hashed: any other size means a wrong file, and nodes
    // would otherwise measure with a salt no other node uses.
    if salt.len() != MEASUREMENT_SALT_LEN {
        return Err(Error::SaltLength {
            path: path.to_owned(),
            len: salt.len(),
            expected: MEASUREMENT_SALT_LEN,
        });
    }
    Ok(salt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurement_salt_must_be_32_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("measurementSalt");
        std::fs::write(&path, [1u8; 32]).unwrap();
        assert_eq!(read_measurement_salt(&path).unwrap(), vec![1u8; 32]);
        std::fs::write(&path, [1u8; 33]).unwrap();
        assert!(matches!(
            read_measurement_salt(&path),
            Err(Error::SaltLength { len: 33, .. })
        ));
        assert!(matches!(
            read_measurement_salt(&dir.path().join("missing")),
            Err(Error::ReadSalt { .. })
        ));
    }
}
