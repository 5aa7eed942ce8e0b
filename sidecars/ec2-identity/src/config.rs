//! ec2-identity's configuration: flags with environment fallbacks.

use std::path::PathBuf;
use std::time::Duration;

use plumbing::telemetry::LogFormat;

/// How to run ec2-identity. Tests build this directly.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "ec2-identity",
    version,
    about = "Tells attest-proxy whether EC2 says an image boots with a NitroTPM (aws-nitro-tpm)"
)]
pub struct Config {
    /// Unix socket to serve the Ec2Identity API on, in a directory only ec2-identity can write.
    #[arg(
        long,
        env = "EC2_IDENTITY_SOCKET",
        default_value = "/run/joinservice/ec2-identity/ec2-identity.sock"
    )]
    pub socket: PathBuf,
    /// Permission bits of the socket file, octal; the peer uid check is the real fence.
    #[arg(long, env = "EC2_IDENTITY_SOCKET_MODE", default_value = "660", value_parser = plumbing::unix::parse_mode)]
    pub socket_mode: u32,
    /// The only uid allowed to connect (attest-proxy's).
    #[arg(long, env = "EC2_IDENTITY_PEER_UID")]
    pub peer_uid: u32,
    /// The instance metadata service, where the instance role's credential comes from (IMDSv2).
    #[arg(long, env = "EC2_IDENTITY_IMDS_URL", default_value = crate::ec2::IMDS_URL)]
    pub imds_url: String,
    /// EC2's endpoint; `{region}` is replaced by the image's region.
    #[arg(long, env = "EC2_IDENTITY_EC2_URL", default_value = crate::ec2::EC2_URL)]
    pub ec2_url: String,
    /// Extra CA certificates (PEM) to trust for `--ec2-url`, beside the system's roots.
    #[arg(long, env = "EC2_IDENTITY_EC2_CA_FILE")]
    pub ec2_ca_file: Option<PathBuf>,
    /// How long one call to IMDS or EC2 may take, body included; beyond it attest-proxy is
    /// answered `Unavailable` and the node retries.
    #[arg(long, env = "EC2_IDENTITY_REQUEST_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Address of the admin endpoint (`/livez`, `/readyz`, `/metrics`); none if unset.
    #[arg(long, env = "EC2_IDENTITY_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// How long in-flight calls may finish after SIGTERM.
    #[arg(long, env = "EC2_IDENTITY_GRACE_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,
    /// Log format.
    #[arg(long, env = "EC2_IDENTITY_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_are_aws_and_the_pod_socket() {
        let c = Config::try_parse_from(["ec2-identity", "--peer-uid", "10001"]).unwrap();
        assert_eq!(c.peer_uid, 10001);
        assert_eq!(c.imds_url, "http://169.254.169.254");
        assert_eq!(c.ec2_url, "https://ec2.{region}.amazonaws.com");
        assert_eq!(
            c.socket,
            PathBuf::from("/run/joinservice/ec2-identity/ec2-identity.sock")
        );
        assert!(Config::try_parse_from(["ec2-identity"]).is_err());
    }
}
