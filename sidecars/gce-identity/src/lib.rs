//! gce-identity: for gcp-sev-snp and gcp-sev-es, the one process of the pod with a cloud
//! credential.
//!
//! ```text
//! attest-proxy ──gRPC over a Unix socket──▶ gce-identity ──HTTP──▶ metadata server (token)
//!                                                        ──HTTPS─▶ compute.googleapis.com
//! ```
//!
//! A GCE node's evidence does not name its vTPM attestation key (an SEV-SNP report carries only
//! the connection's binding, an SEV-ES machine has no report); the GCE API vouches for it
//! (`instances.getShieldedInstanceIdentity`), and for gcp-sev-es also says whether the instance
//! is a confidential VM (`instances.get`). Asking needs a credential: the control-plane VM's own
//! service account, whose token the metadata server hands to any process on the VM.
//! attest-proxy parses untrusted input and must hold no credential, so it asks this process,
//! over a Unix socket that admits attest-proxy's uid only ([`plumbing::unix`]), two questions:
//! which key does GCE vouch for this instance, and is it a confidential VM ([`service`])? The
//! token never leaves this process, and nothing else can be asked of Google through it
//! ([`gce`]).

#![forbid(unsafe_code)]

mod config;
pub mod gce;
pub mod service;

use std::sync::Arc;

use plumbing::shutdown::Shutdown;
use plumbing::unix;
use proto::gceidentity::gce_identity_server::GceIdentityServer;

pub use config::Config;

/// Why gce-identity could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("setting up the GCE client")]
    Client(#[source] gce::SetupError),
    #[error("binding the GceIdentity socket")]
    Bind(#[source] unix::Error),
    #[error("serving GceIdentity")]
    Serve(#[source] tonic::transport::Error),
    #[error("binding the admin endpoint on {addr}")]
    Admin {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Serves GceIdentity on `config.socket` until `shutdown` fires, then lets calls in flight
/// finish for at most `config.grace_period`.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    let client = gce::GceClient::new(
        &config.metadata_url,
        &config.compute_url,
        config.compute_ca_file.as_deref(),
        config.request_timeout,
    )
    .map_err(Error::Client)?;
    let lookups = service::Lookups::default();
    let admin = match config.admin_listen {
        Some(addr) => {
            let mut admin = plumbing::admin::Admin::new("gce_identity");
            admin.registry().register(
                "lookups",
                "GCE API calls (getShieldedInstanceIdentity, instances.get), by call and result",
                lookups.clone(),
            );
            let server = admin
                .bind(addr)
                .await
                .map_err(|source| Error::Admin { addr, source })?;
            Some(server.spawn(shutdown.clone()))
        }
        None => None,
    };
    let service = service::Service::new(Arc::new(client), lookups);
    let server = unix::UnixServer::bind(&config.socket, config.socket_mode, config.peer_uid)
        .map_err(Error::Bind)?;
    tracing::info!(
        socket = %config.socket.display(),
        peer_uid = config.peer_uid,
        compute = %config.compute_url,
        "gce-identity serving"
    );
    let result = server
        .serve(
            tonic::service::Routes::new(GceIdentityServer::new(service)),
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
