//! What the end-to-end tests of a service attesting on simulated hardware share
//! (service_attests_snp.rs, service_attests_tdx.rs, service_attests_azure.rs): the certifier run in the test's process,
//! since the simulated configfs-tsm it quotes through is the kernel's side of file operations
//! and cannot be reached from another process; and the certificate the service presents.

#![allow(dead_code)] // Each test binary uses a different part.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use atls::server_collateral::{ServerCollateral, find_collateral};
use attestation::audit::Decision;
use attestation::{Issuer, Variant};
use clap::Parser as _;
use node_client::{Client, ClientError, ServicePolicy};
use testsupport::harness::{Options, SharedCluster, System, Uids, join_request, own_uid};

/// The largest handshake message Go's crypto/tls accepted before it raised the limit for
/// certificate messages: a Constellation node (Go) reading a larger one fails the handshake.
const GO_MAX_HANDSHAKE_MESSAGE: usize = 64 * 1024;

/// A TLS 1.3 Certificate message's bytes around its one certificate: the request context's
/// length, the list's length, the entry's length and its (empty) extensions' length.
const CERTIFICATE_MESSAGE_FRAMING: usize = 1 + 3 + 3 + 2;

/// The uid attest-proxy runs as: the pod's when run as root, else the test's.
pub fn proxy_uid() -> u32 {
    let own = own_uid().unwrap();
    if own == 0 { Uids::POD.proxy } else { own }
}

/// `certifier::run` (the binary's own code) serving attest-proxy in this process.
pub struct InProcessCertifier {
    trigger: plumbing::shutdown::Trigger,
    task: tokio::task::JoinHandle<()>,
    /// attest-proxy's flags naming the certifier's socket and uid.
    proxy_args: Vec<String>,
}

impl InProcessCertifier {
    /// Starts the certifier of `variant` with `issuer` on a socket in `dir` that only
    /// attest-proxy's uid may use; `args` are its further flags (e.g. `--tcti`), which must
    /// agree with `issuer`.
    pub async fn start(
        dir: &Path,
        variant: Variant,
        args: &[&str],
        issuer: Arc<dyn Issuer>,
    ) -> InProcessCertifier {
        let socket_dir = dir.join("certifier");
        std::fs::create_dir(&socket_dir).unwrap();
        std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = socket_dir.join("certifier.sock");
        let (peer_uid, variant) = (proxy_uid().to_string(), variant.to_string());
        let mut argv = vec![
            "certifier",
            "--peer-uid",
            &peer_uid,
            "--socket",
            socket.to_str().unwrap(),
            // The directory is the test's; the peer uid check is the fence.
            "--socket-mode",
            "666",
            "--variant",
            &variant,
        ];
        argv.extend(args);
        let config = certifier::Config::try_parse_from(argv).unwrap();
        let (trigger, shutdown) = plumbing::shutdown::channel();
        let task = tokio::spawn(async move {
            certifier::run(config, issuer, shutdown).await.unwrap();
        });
        for _ in 0..250 {
            if socket.exists() {
                let proxy_args = vec![
                    "--certifier-uid".to_owned(),
                    own_uid().unwrap().to_string(),
                    "--certifier-socket".to_owned(),
                    socket.display().to_string(),
                ];
                return InProcessCertifier {
                    trigger,
                    task,
                    proxy_args,
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the certifier did not bind {}", socket.display());
    }

    /// The system of `variant` on `cluster` (taken before the certifier's TPM was opened, so
    /// that nothing waits holding it) with the policy at `attestation_config`, its attest-proxy
    /// taking collateral as `site_args` say and its key certified by this certifier.
    pub async fn serve(
        &self,
        cluster: SharedCluster,
        variant: Variant,
        attestation_config: PathBuf,
        mut site_args: Vec<String>,
    ) -> System {
        site_args.extend(self.proxy_args.iter().cloned());
        System::start(Options {
            variant: Some(variant),
            attestation_config: Some(attestation_config),
            proxy_args: site_args,
            cluster: Some(cluster),
            ..Options::default()
        })
        .await
        .unwrap()
    }

    /// Stops the certifier and waits until it has, so that it closes its devices cleanly.
    pub async fn stop(self) {
        drop(self.trigger);
        self.task.await.unwrap();
    }
}

/// A node's service policy of `variant` from `config` (kept in `dir`, as a node keeps it).
pub fn service_policy(dir: &Path, variant: Variant, config: &str) -> ServicePolicy {
    let path = dir.join("servicePolicy");
    std::fs::write(&path, config).unwrap();
    ServicePolicy::load(variant, &path).unwrap()
}

/// The certificate `system`'s service presents to a node attesting with `issuer` whose
/// `policy` accepts it (one aTLS handshake, no request), after checking that a Go node can
/// still read it; and the vendor collateral it carries.
pub async fn served_certificate(
    system: &System,
    issuer: Arc<dyn Issuer>,
    policy: &ServicePolicy,
) -> (Vec<u8>, ServerCollateral) {
    let connector = atls::Connector::new(issuer).with_server_policy(policy.server_policy().clone());
    let tcp = tokio::net::TcpStream::connect(system.proxy_addr)
        .await
        .unwrap();
    let tls = connector
        .connect(tcp)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    let der = tls.peer_end_entity().unwrap().as_ref().to_vec();
    assert!(
        der.len() + CERTIFICATE_MESSAGE_FRAMING <= GO_MAX_HANDSHAKE_MESSAGE,
        "the service's certificate of {} bytes is too large for a Go node",
        der.len()
    );
    let collateral = {
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let Some(bytes) = find_collateral(&cert) else {
            panic!("the service's certificate carries no collateral extension");
        };
        ServerCollateral::decode(bytes).unwrap()
    };
    (der, collateral)
}

/// `client` joins `system` as `node_name` and rejoins for `disk`, getting the same state disk key.
pub async fn joins_and_rejoins(system: &System, client: &Client, node_name: &str, disk: &str) {
    let ticket = client
        .join(join_request(node_name, disk).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(ticket.state_disk_key.len(), 32);
    let rejoined = client
        .rejoin(disk)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(rejoined.state_disk_key, ticket.state_disk_key);
}

/// The audit record of the refusal `client` (whose service policy `system`'s service does not
/// meet) gives itself when it asks to join as `node_name`: the join must not have reached the
/// join service. `case` labels a failure.
pub async fn refused_before_sending(
    system: &System,
    client: &Client,
    node_name: &str,
    disk: &str,
    case: &str,
) -> Decision {
    let decision = match client.join(join_request(node_name, disk).unwrap()).await {
        Err(ClientError::ServerRefused { decision, .. }) => *decision,
        other => panic!(
            "{case}: expected a server refusal, got {other:?}\n{}",
            system.logs()
        ),
    };
    assert!(
        system.kube.bootstrap_tokens().await.is_empty(),
        "{case}: a refused service must not have received the join"
    );
    decision
}
