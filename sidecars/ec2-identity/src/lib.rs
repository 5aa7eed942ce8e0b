//! ec2-identity: for aws-nitro-tpm only, the one process of the pod with an AWS credential.
//!
//! ```text
//! attest-proxy ──gRPC over a Unix socket──▶ ec2-identity ──HTTP──▶ instance metadata (IMDSv2: role credential)
//!                                                        ──HTTPS─▶ ec2.{region}.amazonaws.com (DescribeImages, SigV4)
//! ```
//!
//! Constellation's aws-nitro-tpm nodes prove nothing about their attestation key; what EC2 can
//! add is whether the image their identity document names boots with a NitroTPM
//! (`DescribeImages`' `tpmSupport`). Asking needs a credential: the control-plane instance's
//! role, whose temporary credential IMDS hands to processes on the instance. attest-proxy
//! parses untrusted input and must hold no credential, so it asks this process, over a Unix
//! socket that admits attest-proxy's uid only ([`plumbing::unix`]), one question: what does EC2
//! say about this image's TPM support ([`service`])? The credential never leaves this process,
//! and nothing else can be asked of AWS through it ([`ec2`]).
//!
//! It is a process of its own rather than a second mode of gce-identity: each cloud's
//! credential sits in a process that can only ask that cloud its one question, and a pod runs
//! only the one its variant needs.

#![forbid(unsafe_code)]

mod config;
pub mod ec2;
pub mod service;
pub mod sigv4;

use std::sync::Arc;

use plumbing::shutdown::Shutdown;
use plumbing::unix;
use proto::ec2identity::ec2_identity_server::Ec2IdentityServer;

pub use config::Config;

/// Why ec2-identity could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("setting up the EC2 client")]
    Client(#[source] ec2::SetupError),
    #[error("binding the Ec2Identity socket")]
    Bind(#[source] unix::Error),
    #[error("serving Ec2Identity")]
    Serve(#[source] tonic::transport::Error),
    #[error("binding the admin endpoint on {addr}")]
    Admin {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Serves Ec2Identity on `config.socket` until `shutdown` fires, then lets calls in flight
/// finish for at most `config.grace_period`.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    let client = ec2::Ec2Client::new(
        &config.imds_url,
        &config.ec2_url,
        config.ec2_ca_file.as_deref(),
        config.request_timeout,
    )
    .map_err(Error::Client)?;
    let lookups = service::Lookups::default();
    let admin = match config.admin_listen {
        Some(addr) => {
            let mut admin = plumbing::admin::Admin::new("ec2_identity");
            admin.registry().register(
                "lookups",
                "DescribeImages lookups, by result",
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
        ec2 = %config.ec2_url,
        "ec2-identity serving"
    );
    let result = server
        .serve(
            tonic::service::Routes::new(Ec2IdentityServer::new(service)),
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
