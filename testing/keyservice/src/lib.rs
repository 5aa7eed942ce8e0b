//! A key service speaking Constellation's `kms.API`, in Constellation-managed mode.
//!
//! In the join flow, join-core asks this service for each node's state-disk key (key id = the
//! disk's UUID) and for the cluster's measurement secret (key id `measurementSecret`):
//!
//! ```text
//! node ─▶ attest-proxy ─▶ join-core ──GetDataKey (plaintext gRPC, :9000)──▶ keyservice
//! ```
//!
//! Every key is HKDF-SHA256 over the cluster's master secret and salt with info
//! `"key-" + data_key_id` ([`derive`]), so a key is never stored: the same id always yields the
//! same key, which is what lets a rebooted node get its disk key back. The derivation matches
//! Constellation's byte for byte, so a cluster's existing disks stay readable.
//!
//! [`run`] serves until shutdown; [`KeyServer::bind`] then [`KeyServer::serve`] does the same in
//! two steps so a caller that bound port 0 can learn the address first.

#![forbid(unsafe_code)]

pub mod config;
pub mod derive;
mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plumbing::shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

pub use config::Config;
pub use derive::{MasterSecret, MasterSecretError};

/// Why the key service could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A master secret or salt file could not be read.
    #[error("cannot read the {what} from {path}")]
    ReadSecret {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The master secret or salt was configured wrongly.
    #[error("the {what} is {problem}")]
    SecretSource {
        what: &'static str,
        problem: &'static str,
    },
    /// The master secret or salt was refused.
    #[error("unusable master secret")]
    MasterSecret(#[source] MasterSecretError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("kms.API server failed")]
    Serve(#[source] tonic::transport::Error),
}

/// A bound, not yet serving key service.
#[derive(Debug)]
pub struct KeyServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    master: Arc<MasterSecret>,
    grace_period: Duration,
}

impl KeyServer {
    /// Loads the master secret and binds the listen address.
    pub async fn bind(config: Config) -> Result<Self, Error> {
        let master = Arc::new(config.load_master_secret()?);
        let bind_err = |source| Error::Bind {
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        Ok(Self {
            listener,
            local_addr,
            master,
            grace_period: config.grace_period,
        })
    }

    /// The address actually bound (the real port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves kms.API until `shutdown` fires, then gives in-flight requests the configured drain
    /// timeout to finish.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), Error> {
        tracing::info!(addr = %self.local_addr, "key service listening");
        let serve = tonic::transport::Server::builder()
            .add_service(service::server(self.master))
            .serve_with_incoming_shutdown(
                // Answers are small and latency-bound: without TCP_NODELAY, Nagle's algorithm and
                // the client's delayed ACK hold a response back for up to 40 ms.
                TcpListenerStream::new(self.listener).map(|accepted| {
                    let stream = accepted?;
                    stream.set_nodelay(true)?;
                    Ok::<_, std::io::Error>(stream)
                }),
                shutdown.clone().wait(),
            );
        plumbing::shutdown::drain(serve, shutdown, self.grace_period)
            .await
            .map_err(Error::Serve)
    }
}

/// Loads the master secret, binds and serves until `shutdown` fires.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    KeyServer::bind(config).await?.serve(shutdown).await
}
