//! gce-identity's configuration: flags with environment fallbacks.

use std::path::PathBuf;
use std::time::Duration;

use plumbing::telemetry::LogFormat;

/// How to run gce-identity. Tests build this directly.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "gce-identity",
    version,
    about = "Tells attest-proxy which vTPM key the GCE API vouches for an instance (gcp-sev-snp)"
)]
pub struct Config {
    /// Unix socket to serve the GceIdentity API on, in a directory only gce-identity can write.
    #[arg(
        long,
        env = "GCE_IDENTITY_SOCKET",
        default_value = "/run/joinservice/gce-identity/gce-identity.sock"
    )]
    pub socket: PathBuf,
    /// Permission bits of the socket file, octal; the peer uid check is the real fence.
    #[arg(long, env = "GCE_IDENTITY_SOCKET_MODE", default_value = "660", value_parser = plumbing::unix::parse_mode)]
    pub socket_mode: u32,
    /// The only uid allowed to connect (attest-proxy's).
    #[arg(long, env = "GCE_IDENTITY_PEER_UID")]
    pub peer_uid: u32,
    /// The GCE metadata server, where the node's service-account token comes from.
    #[arg(
        long,
        env = "GCE_IDENTITY_METADATA_URL",
        default_value = crate::gce::METADATA_URL
    )]
    pub metadata_url: String,
    /// The Compute Engine API.
    #[arg(
        long,
        env = "GCE_IDENTITY_COMPUTE_URL",
        default_value = crate::gce::COMPUTE_URL
    )]
    pub compute_url: String,
    /// Extra CA certificates (PEM) to trust for `--compute-url`, beside the system's roots.
    #[arg(long, env = "GCE_IDENTITY_COMPUTE_CA_FILE")]
    pub compute_ca_file: Option<PathBuf>,
    /// How long one call to the metadata server or the API may take, body included; beyond
    /// it attest-proxy is answered `Unavailable` and the node retries.
    #[arg(long, env = "GCE_IDENTITY_REQUEST_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Address of the admin endpoint (`/livez`, `/readyz`, `/metrics`); none if unset.
    #[arg(long, env = "GCE_IDENTITY_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// How long in-flight calls may finish after SIGTERM; keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "GCE_IDENTITY_GRACE_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,
    /// Log format.
    #[arg(long, env = "GCE_IDENTITY_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_are_google_and_the_pod_socket() {
        let c = Config::try_parse_from(["gce-identity", "--peer-uid", "10001"]).unwrap();
        assert_eq!(c.peer_uid, 10001);
        assert_eq!(c.metadata_url, "http://metadata.google.internal");
        assert_eq!(c.compute_url, "https://compute.googleapis.com");
        assert_eq!(
            c.socket,
            PathBuf::from("/run/joinservice/gce-identity/gce-identity.sock")
        );
        assert_eq!(c.request_timeout, Duration::from_secs(5));
        assert!(Config::try_parse_from(["gce-identity"]).is_err());
    }
}
