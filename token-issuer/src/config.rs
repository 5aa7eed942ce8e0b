//! token-issuer's configuration: flags with environment fallbacks.

use std::path::PathBuf;
use std::time::Duration;

use plumbing::telemetry::LogFormat;

/// How to run token-issuer. Tests build this directly.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    version,
    about = "Issues bootstrap tokens and kubelet certificates to join-core"
)]
pub struct Config {
    /// Unix socket to serve the TokenIssuer API on. Its directory should be writable by
    /// token-issuer only, so no other container can replace the socket.
    #[arg(
        long,
        env = "TOKEN_ISSUER_SOCKET",
        default_value = "/run/joinservice/token-issuer/token-issuer.sock"
    )]
    pub socket: PathBuf,
    /// Permission bits of the socket file, octal. join-core runs as another uid and reaches
    /// the socket through the pod's shared group; the peer uid check stays the real fence.
    #[arg(long, env = "TOKEN_ISSUER_SOCKET_MODE", default_value = "660", value_parser = plumbing::unix::parse_mode)]
    pub socket_mode: u32,
    /// The only uid allowed to connect (join-core's).
    #[arg(long, env = "TOKEN_ISSUER_PEER_UID")]
    pub peer_uid: u32,
    /// Cluster CA certificate (PEM).
    #[arg(
        long,
        env = "TOKEN_ISSUER_CA_CERT",
        default_value = "/etc/kubernetes/pki/ca.crt"
    )]
    pub ca_cert: PathBuf,
    /// Cluster CA private key (PEM: PKCS#1 RSA, PKCS#8, or SEC1 EC).
    #[arg(
        long,
        env = "TOKEN_ISSUER_CA_KEY",
        default_value = "/etc/kubernetes/pki/ca.key"
    )]
    pub ca_key: PathBuf,
    /// The API server endpoint nodes join through, `host:port`. Takes precedence over
    /// `--api-server-host`/`--api-server-port`.
    #[arg(
        long,
        env = "TOKEN_ISSUER_API_SERVER_ENDPOINT",
        required_unless_present = "api_server_host"
    )]
    pub api_server_endpoint: Option<String>,
    /// The API server's host, when no endpoint is given. In the pod: the control-plane node's
    /// own IP from the downward API (`status.hostIP`), since the service runs beside the API
    /// server on every control-plane node. IPv6 addresses are bracketed for the endpoint.
    #[arg(long, env = "TOKEN_ISSUER_API_SERVER_HOST")]
    pub api_server_host: Option<String>,
    /// The API server's port, with `--api-server-host`.
    #[arg(long, env = "TOKEN_ISSUER_API_SERVER_PORT", default_value = "6443")]
    pub api_server_port: u16,
    /// kubeadm's PKI directory; control-plane joiners get its shared CA keys and certificates.
    #[arg(
        long,
        env = "TOKEN_ISSUER_PKI_DIR",
        default_value = "/etc/kubernetes/pki"
    )]
    pub pki_dir: PathBuf,
    /// Kubeconfig for the Kubernetes API; default: in-cluster service account, else KUBECONFIG.
    #[arg(long, env = "TOKEN_ISSUER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Deadline for each Kubernetes API call, retries included.
    #[arg(long, env = "TOKEN_ISSUER_KUBE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub kube_timeout: Duration,
    /// How long a read of the `NodeVersion` and its components ConfigMap is used for later
    /// joins (`0s`: read on every join). An upgrade reaches joining nodes at most
    /// this much later; a node served the previous version is recorded with it (see
    /// `cluster_version`).
    #[arg(long, env = "TOKEN_ISSUER_VERSION_MAX_AGE", value_parser = humantime::parse_duration, default_value = "1s")]
    pub version_max_age: Duration,
    /// Address of the admin endpoint (`/livez`, `/readyz`, `/metrics`, plain HTTP), e.g.
    /// `0.0.0.0:9093`. Unset: no admin endpoint. Readiness means the API server answers
    /// `GET /version` (open to every client by Kubernetes' default RBAC).
    #[arg(long, env = "TOKEN_ISSUER_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// How long in-flight requests may finish after SIGTERM; keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "TOKEN_ISSUER_GRACE_PERIOD", value_parser = humantime::parse_duration, default_value = "20s")]
    pub grace_period: Duration,
    /// This instance's name in the Events it records (`reportingInstance`): the pod name,
    /// which Kubernetes sets as the container's hostname.
    #[arg(long, env = "HOSTNAME", default_value = "token-issuer")]
    pub pod_name: String,
    /// Log format.
    #[arg(long, env = "TOKEN_ISSUER_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

impl Config {
    /// The `host:port` handed to nodes: `--api-server-endpoint`, else host and port.
    pub fn api_server_endpoint(&self) -> Option<String> {
        if let Some(endpoint) = &self.api_server_endpoint {
            return Some(endpoint.clone());
        }
        let host = self.api_server_host.as_deref()?.trim();
        if host.is_empty() {
            return None;
        }
        Some(match host.parse::<std::net::IpAddr>() {
            Ok(ip) => std::net::SocketAddr::new(ip, self.api_server_port).to_string(),
            Err(_) => format!("{host}:{}", self.api_server_port),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn flags_parse() {
        let c = Config::try_parse_from([
            "token-issuer",
            "--peer-uid",
            "1001",
            "--api-server-endpoint",
            "10.0.0.1:6443",
            "--kube-timeout",
            "3s",
        ])
        .unwrap();
        assert_eq!(c.peer_uid, 1001);
        assert_eq!(c.api_server_endpoint().unwrap(), "10.0.0.1:6443");
        assert_eq!(c.pki_dir, PathBuf::from("/etc/kubernetes/pki"));
        assert_eq!(c.kube_timeout, Duration::from_secs(3));
        assert_eq!(c.version_max_age, Duration::from_secs(1));
        assert_eq!(c.ca_key, PathBuf::from("/etc/kubernetes/pki/ca.key"));
    }

    #[test]
    fn endpoint_from_downward_api_host_ip() {
        let parse = |host: &str| {
            Config::try_parse_from(["token-issuer", "--peer-uid", "1", "--api-server-host", host])
                .unwrap()
                .api_server_endpoint()
                .unwrap()
        };
        assert_eq!(parse("192.0.2.10"), "192.0.2.10:6443");
        assert_eq!(parse("fd00::10"), "[fd00::10]:6443");
        assert_eq!(parse("cp.example.com"), "cp.example.com:6443");
        assert!(Config::try_parse_from(["token-issuer", "--peer-uid", "1"]).is_err());
    }
}
