//! join-core configuration: flags with environment fallbacks. Tests build [`Config`] directly.

use std::path::PathBuf;
use std::time::Duration;

use plumbing::telemetry::LogFormat;
use tonic::transport::Uri;

/// join-core: the join ticket logic behind attest-proxy. Serves join.API on a Unix socket that
/// admits attest-proxy's uid alone; fetches keys from the key service and Kubernetes
/// credentials from token-issuer.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "join-core", version)]
pub struct Config {
    /// Unix socket to serve join.API on; attest-proxy connects here. Its directory should be
    /// writable by join-core only, so no other container can replace the socket.
    #[arg(
        long,
        env = "JOIN_CORE_SOCKET",
        default_value = "/run/joinservice/join-core/join-core.sock"
    )]
    pub socket: PathBuf,

    /// Permission bits of the socket file, octal. The proxy runs as another uid, so it needs
    /// write access through a group both containers share (the pod's fsGroup); the peer uid
    /// check stays the real fence.
    #[arg(long, env = "JOIN_CORE_SOCKET_MODE", default_value = "660", value_parser = plumbing::unix::parse_mode)]
    pub socket_mode: u32,

    /// The uid attest-proxy runs as: the only peer admitted on the socket.
    #[arg(long, env = "JOIN_CORE_PROXY_UID")]
    pub proxy_uid: u32,

    /// The key service (kms.API, plaintext gRPC), e.g. `http://key-service.kube-system:9000`.
    #[arg(long, env = "JOIN_CORE_KMS_ENDPOINT", value_parser = parse_http_uri)]
    pub kms_endpoint: Uri,

    /// Deadline for fetching one key, retries included. Connection failures, `Unavailable`
    /// answers and attempts that time out are retried with jittered exponential backoff
    /// (50 ms doubling to 1 s, at most 8 attempts) until then. A fetch that still fails is
    /// answered `Unavailable` (fetching a key changes nothing, so the node may simply retry).
    #[arg(long, env = "JOIN_CORE_KMS_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub kms_timeout: Duration,

    /// Deadline for one attempt at the key service, so a hung connection leaves time to retry.
    #[arg(long, env = "JOIN_CORE_KMS_ATTEMPT_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub kms_attempt_timeout: Duration,

    /// How long the measurement secret and the emergency SSH CA (made from its seed) are kept
    /// after they were fetched; they are the same for every join, so a join with kept ones asks
    /// the key service for its state disk key alone. They are derived from the key service's
    /// master secret, fixed for the cluster's life: this bounds how long join-core's memory holds
    /// them after a fetch and how long a key service with another master secret (a restore)
    /// goes unnoticed. `0s` fetches them for every join.
    #[arg(long, env = "JOIN_CORE_CLUSTER_KEYS_MAX_AGE", default_value = "5min", value_parser = humantime::parse_duration)]
    pub cluster_keys_max_age: Duration,

    /// token-issuer's Unix socket, in a directory only token-issuer can write.
    #[arg(
        long,
        env = "JOIN_CORE_TOKEN_ISSUER_SOCKET",
        default_value = "/run/joinservice/token-issuer/token-issuer.sock"
    )]
    pub token_issuer_socket: PathBuf,

    /// The uid token-issuer runs as. Before a request is sent, the process listening on
    /// token-issuer's socket must run as it (`SO_PEERCRED`), so a replaced socket gets nothing.
    #[arg(long, env = "JOIN_CORE_TOKEN_ISSUER_UID")]
    pub token_issuer_uid: u32,

    /// Deadline for each token-issuer call. A call that misses it is answered `DeadlineExceeded`:
    /// token-issuer may already have created the bootstrap token.
    #[arg(long, env = "JOIN_CORE_TOKEN_ISSUER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub token_issuer_timeout: Duration,

    /// The cluster's measurement salt: exactly 32 raw bytes (Constellation's `join-config`
    /// ConfigMap, key `measurementSalt`, mounted as a file). Read once at startup: the salt is
    /// fixed when the cluster is created.
    #[arg(
        long,
        env = "JOIN_CORE_MEASUREMENT_SALT_FILE",
        default_value = "/var/config/measurementSalt"
    )]
    pub measurement_salt_file: PathBuf,

    /// kubeadm's ClusterConfiguration (YAML): the `ClusterConfiguration` key of the
    /// `kube-system/kubeadm-config` ConfigMap, mounted as a file. Its `apiServer.certSANs` become
    /// principals of every SSH host certificate. Read at startup (a missing or unparsable file
    /// stops join-core) and again for each join, since the kubelet updates projected ConfigMaps.
    #[arg(
        long,
        env = "JOIN_CORE_KUBEADM_CONFIG",
        default_value = "/var/kubeadm-config/ClusterConfiguration"
    )]
    pub kubeadm_config: PathBuf,

    /// Lifetime of the SSH host certificates join-core signs (they are valid from five minutes
    /// before issuance, for clock skew).
    #[arg(long, env = "JOIN_CORE_SSH_CERT_VALIDITY", default_value = "365days", value_parser = humantime::parse_duration)]
    pub ssh_cert_validity: Duration,

    /// Address of the admin endpoint (`/livez`, `/readyz`, `/metrics`, plain HTTP), e.g.
    /// `0.0.0.0:9092`. Unset: no admin endpoint. Readiness means the key service and
    /// token-issuer accept connections.
    #[arg(long, env = "JOIN_CORE_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,

    /// How long in-flight requests get to finish after SIGTERM. Keep it below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "JOIN_CORE_GRACE_PERIOD", default_value = "20s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,

    /// Log line format.
    #[arg(long, env = "JOIN_CORE_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

/// Only plaintext `http://host:port`: the key service speaks plaintext gRPC inside the cluster,
/// and this build carries no TLS client for it.
fn parse_http_uri(s: &str) -> Result<Uri, String> {
    let uri: Uri = s.parse().map_err(|e| format!("{s:?} is not a URI: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("{s:?} must look like http://host:port"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_and_required_flags() {
        let config = Config::try_parse_from([
            "join-core",
            "--proxy-uid",
            "10001",
            "--token-issuer-uid",
            "10003",
            "--kms-endpoint",
            "http://key-service:9000",
        ])
        .unwrap();
        assert_eq!(config.proxy_uid, 10001);
        assert_eq!(config.socket_mode, 0o660);
        assert_eq!(config.kms_timeout, Duration::from_secs(5));
        assert_eq!(config.kms_attempt_timeout, Duration::from_secs(2));
        assert_eq!(config.cluster_keys_max_age, Duration::from_secs(300));
        assert_eq!(config.ssh_cert_validity, crate::ssh::DEFAULT_VALIDITY);
        assert_eq!(
            config.kubeadm_config,
            PathBuf::from("/var/kubeadm-config/ClusterConfiguration")
        );
        assert_eq!(
            config.socket,
            PathBuf::from("/run/joinservice/join-core/join-core.sock")
        );

        assert!(Config::try_parse_from(["join-core", "--kms-endpoint", "http://k:9000"]).is_err());
        assert!(Config::try_parse_from(["join-core", "--proxy-uid", "1"]).is_err());
        // token-issuer's uid has no default: a client must be told whom to trust.
        assert!(
            Config::try_parse_from([
                "join-core",
                "--proxy-uid",
                "1",
                "--kms-endpoint",
                "http://k:9000"
            ])
            .is_err()
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let with = |flag: &str, value: &str| {
            Config::try_parse_from([
                "join-core",
                "--proxy-uid",
                "1",
                "--token-issuer-uid",
                "3",
                "--kms-endpoint",
                "http://k:9000",
                flag,
                value,
            ])
        };
        assert!(with("--kms-endpoint", "key-service:9000").is_err());
        assert!(with("--kms-endpoint", "https://k:9000").is_err());
        assert!(with("--socket-mode", "999").is_err());
        assert!(with("--socket-mode", "1777").is_err());
        assert!(with("--kms-timeout", "soon").is_err());
        assert_eq!(
            with("--kms-timeout", "250ms").unwrap().kms_timeout,
            Duration::from_millis(250)
        );
    }
}
