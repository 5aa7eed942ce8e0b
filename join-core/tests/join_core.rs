//! join-core in process, end to end: a real tonic client over a real Unix socket, a real key
//! service on loopback, and a test-only token-issuer on another Unix socket that records what
//! it was asked (the real token-issuer is its own crate; this one answers in its wire format).
//! Key service failures a real one cannot be made to show on cue (answering `Unavailable`,
//! answering slowly, refusing) come from a test-only kms.API server that derives keys exactly
//! as the real one does.

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use base64::Engine;

use join_core::{Config, JoinCore};
use plumbing::identity;
use plumbing::shutdown::{self, Trigger};
use plumbing::telemetry::LogFormat;
use plumbing::unix::PeerPolicy;
use proto::join::api_client::ApiClient;
use proto::join::{IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest};
use proto::kms::api_server::{Api as KmsApi, ApiServer as KmsServer};
use proto::kms::{GetDataKeyRequest, GetDataKeyResponse};
use proto::tokenissuer::token_issuer_server::{TokenIssuer, TokenIssuerServer};
use proto::tokenissuer::{IssueNodeCredentialsRequest, IssueNodeCredentialsResponse};
use tonic::transport::{Channel, Uri};
use tonic::{Code, Request, Response, Status};

const MASTER_SECRET: [u8; 32] = [0x42; 32];
const MASTER_SALT: [u8; 32] = [0x17; 32];
const MEASUREMENT_SALT: [u8; 32] = [0x5a; 32];
const DISK_UUID: &str = "8c3e1d9a-4f2b-4a51-9d0e-7b6c5a4f3e21";
const PEER: &str = "192.0.2.7:40123";
/// Not a parseable CSR, but shaped like DER; join-core leaves real CSR checks to token-issuer.
const CSR: &[u8] = &[0x30, 0x82, 0x01, 0x0a, 0xde, 0xad, 0xbe, 0xef];
/// What the node asks its host certificate to name, as a Constellation node does: its
/// addresses and hostname.
const REQUESTED_PRINCIPALS: [&str; 2] = ["10.0.0.7", "worker-0"];
/// The API server's cert SANs in the mounted ClusterConfiguration; one repeats a requested
/// principal (it must appear once).
const API_SERVER_SANS: [&str; 3] = ["10.9.0.1", "10.0.0.7", "api.cluster.example"];

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::metadata(dir.path()).unwrap().uid()
}

fn master() -> keyservice::MasterSecret {
    keyservice::MasterSecret::new(MASTER_SECRET.to_vec(), MASTER_SALT.to_vec()).unwrap()
}

fn expected_key(id: &str) -> Vec<u8> {
    master().derive_key(id, 32).unwrap().to_vec()
}

/// The emergency SSH CA public key, computed here from the seed the key service derives.
fn expected_ca_public_key() -> Vec<u8> {
    Ed25519KeyPair::from_seed_unchecked(&expected_key("ca_emergency_ssh"))
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec()
}

fn ssh_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The node's Ed25519 host public key in SSH wire format.
fn host_public_key() -> Vec<u8> {
    let pair = Ed25519KeyPair::from_seed_unchecked(&[0x33; 32]).unwrap();
    let mut wire = Vec::new();
    ssh_string(&mut wire, b"ssh-ed25519");
    ssh_string(&mut wire, pair.public_key().as_ref());
    wire
}

/// Checks an OpenSSH host certificate line the way an SSH client would: parses it, and
/// verifies its Ed25519 signature with `ca_public_key` over everything before the signature
/// field (PROTOCOL.certkeys). Returns the parsed certificate for further checks.
fn verify_host_certificate(line: &[u8], ca_public_key: &[u8]) -> ssh_key::Certificate {
    let text = std::str::from_utf8(line).unwrap();
    assert!(text.ends_with('\n'), "one newline-terminated line");
    let cert = ssh_key::Certificate::from_openssh(text).unwrap();
    assert_eq!(cert.cert_type(), ssh_key::certificate::CertType::Host);

    let blob = base64::engine::general_purpose::STANDARD
        .decode(text.split(' ').nth(1).unwrap().trim_end())
        .unwrap();
    // string(string("ssh-ed25519") || string(64-byte signature)) closes the certificate.
    let signature_field = 4 + (4 + 11) + (4 + 64);
    let (signed, signature_field) = blob.split_at(blob.len() - signature_field);
    assert_eq!(&signature_field[..4], &83u32.to_be_bytes());
    assert_eq!(&signature_field[4..19], b"\0\0\0\x0bssh-ed25519");
    let signature = &signature_field[23..];
    let ca = UnparsedPublicKey::new(&ED25519, ca_public_key);
    ca.verify(signed, signature)
        .expect("host certificate signed by the emergency SSH CA");
    let mut tampered = signed.to_vec();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(ca.verify(&tampered, signature).is_err());
    cert
}

/// How the key service behaves in one test.
#[derive(Clone, Copy, Debug)]
enum Kms {
    /// The real key service.
    Up,
    /// Nothing listens: connections are refused.
    Down,
    /// Answers `Unavailable` to the first calls, then derives keys.
    UnavailableFirst(u32),
    /// Answers every call only after this long.
    Slow(Duration),
    /// Refuses every call with this code.
    Refusing(Code),
}

/// A kms.API server that misbehaves on cue and otherwise derives keys as the real one does.
struct FakeKms {
    behaviour: Kms,
    calls: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl KmsApi for FakeKms {
    async fn get_data_key(
        &self,
        request: Request<GetDataKeyRequest>,
    ) -> Result<Response<GetDataKeyResponse>, Status> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Kms::UnavailableFirst(n) if call < n => {
                return Err(Status::unavailable("key service is starting"));
            }
            Kms::Slow(delay) => tokio::time::sleep(delay).await,
            Kms::Refusing(code) => return Err(Status::new(code, "refused")),
            _ => {}
        }
        let request = request.into_inner();
        let key = master()
            .derive_key(&request.data_key_id, request.length as usize)
            .unwrap();
        Ok(Response::new(GetDataKeyResponse {
            data_key: key.to_vec(),
        }))
    }
}

/// How the fake token-issuer answers.
#[derive(Clone, Debug)]
enum Answer {
    Credentials,
    Refuse(Code, &'static str),
    After(Duration),
}

#[derive(Clone)]
struct FakeTokenIssuer {
    received: Arc<Mutex<Vec<IssueNodeCredentialsRequest>>>,
    answer: Answer,
}

#[tonic::async_trait]
impl TokenIssuer for FakeTokenIssuer {
    async fn issue_node_credentials(
        &self,
        request: Request<IssueNodeCredentialsRequest>,
    ) -> Result<Response<IssueNodeCredentialsResponse>, Status> {
        self.received.lock().unwrap().push(request.into_inner());
        match self.answer {
            Answer::Credentials => {}
            Answer::Refuse(code, message) => return Err(Status::new(code, message)),
            Answer::After(delay) => tokio::time::sleep(delay).await,
        }
        Ok(Response::new(IssueNodeCredentialsResponse {
            token: "abcdef.0123456789abcdef".into(),
            discovery_token_ca_cert_hash: format!("sha256:{}", "ab".repeat(32)),
            api_server_endpoint: "10.0.0.1:6443".into(),
            kubelet_cert: b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"
                .to_vec(),
            node_name: "worker-0".into(),
            kubernetes_version: "v1.30.4".into(),
            kubernetes_components: vec![proto::components::Component {
                url: "https://example.invalid/kubelet".into(),
                hash: format!("sha256:{}", "cd".repeat(32)),
                install_path: "/run/state/bin/kubelet".into(),
                extract: false,
            }],
            control_plane_files: vec![proto::tokenissuer::ControlPlaneFile {
                name: "etcd/ca.key".into(),
                data: b"-----BEGIN EC PRIVATE KEY-----\n".to_vec(),
            }],
        }))
    }
}

/// Which parts of the system are up for one test.
struct Setup {
    kms: Kms,
    kms_timeout: Duration,
    kms_attempt_timeout: Duration,
    token_issuer: Option<Answer>,
    proxy_uid: u32,
    /// The uid join-core expects token-issuer to run as.
    token_issuer_uid: u32,
    token_issuer_timeout: Duration,
    /// `apiServer.certSANs` of the mounted ClusterConfiguration.
    api_server_sans: Vec<&'static str>,
    cluster_keys_max_age: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            kms: Kms::Up,
            kms_timeout: Duration::from_secs(2),
            kms_attempt_timeout: Duration::from_secs(1),
            token_issuer: Some(Answer::Credentials),
            proxy_uid: own_uid(),
            token_issuer_uid: own_uid(),
            token_issuer_timeout: Duration::from_secs(5),
            api_server_sans: API_SERVER_SANS.to_vec(),
            cluster_keys_max_age: Duration::from_secs(300),
        }
    }
}

/// A kubeadm ClusterConfiguration as kubeadm writes it into the kubeadm-config ConfigMap.
fn cluster_configuration(sans: &[&str]) -> String {
    let mut yaml = String::from("apiServer:\n");
    if !sans.is_empty() {
        yaml.push_str("  certSANs:\n");
        for san in sans {
            yaml.push_str(&format!("  - {san}\n"));
        }
    }
    yaml.push_str(
        "  extraArgs:\n    profiling: \"false\"\napiVersion: kubeadm.k8s.io/v1beta3\n\
         clusterName: constell\nkind: ClusterConfiguration\nkubernetesVersion: v1.30.4\n",
    );
    yaml
}

struct System {
    _dir: tempfile::TempDir,
    client: ApiClient<Channel>,
    /// The admin endpoint (`/livez`, `/readyz`, `/metrics`).
    admin: std::net::SocketAddr,
    token_issuer_calls: Arc<Mutex<Vec<IssueNodeCredentialsRequest>>>,
    kms_calls: Arc<AtomicU32>,
    kubeadm_config: PathBuf,
    socket: PathBuf,
    stop: Vec<Trigger>,
    join_core: tokio::task::JoinHandle<()>,
}

impl System {
    async fn start(setup: Setup) -> Self {
        plumbing::telemetry::init(LogFormat::Text);
        let dir = tempfile::tempdir().unwrap();
        let mut stop = Vec::new();

        let kms_calls = Arc::new(AtomicU32::new(0));
        let kms_endpoint = match setup.kms {
            Kms::Up => {
                let config = keyservice::Config::local(
                    "127.0.0.1:0".parse().unwrap(),
                    &MASTER_SECRET,
                    &MASTER_SALT,
                );
                let server = keyservice::KeyServer::bind(config).await.unwrap();
                let addr = server.local_addr();
                let (trigger, shutdown) = shutdown::channel();
                tokio::spawn(server.serve(shutdown));
                stop.push(trigger);
                addr
            }
            Kms::Down => {
                // A port that was free a moment ago: connections are refused.
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                listener.local_addr().unwrap()
            }
            behaviour => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let fake = FakeKms {
                    behaviour,
                    calls: kms_calls.clone(),
                };
                let (trigger, shutdown) = shutdown::channel();
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(KmsServer::new(fake))
                        .serve_with_incoming_shutdown(
                            tokio_stream::wrappers::TcpListenerStream::new(listener),
                            shutdown.wait(),
                        ),
                );
                stop.push(trigger);
                addr
            }
        };

        let token_issuer_socket = dir.path().join("token-issuer.sock");
        let token_issuer_calls = Arc::new(Mutex::new(Vec::new()));
        if let Some(answer) = setup.token_issuer {
            let fake = FakeTokenIssuer {
                received: token_issuer_calls.clone(),
                answer,
            };
            let listener = plumbing::unix::bind(&token_issuer_socket, 0o600).unwrap();
            let (trigger, shutdown) = shutdown::channel();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(TokenIssuerServer::new(fake))
                    .serve_with_incoming_shutdown(
                        plumbing::unix::incoming(listener, PeerPolicy::uids([own_uid()])),
                        shutdown.wait(),
                    ),
            );
            stop.push(trigger);
        }

        let salt_file = dir.path().join("measurementSalt");
        std::fs::write(&salt_file, MEASUREMENT_SALT).unwrap();
        let kubeadm_config = dir.path().join("ClusterConfiguration");
        std::fs::write(
            &kubeadm_config,
            cluster_configuration(&setup.api_server_sans),
        )
        .unwrap();
        let socket = dir.path().join("join-core.sock");
        let config = Config {
            socket: socket.clone(),
            socket_mode: 0o600,
            proxy_uid: setup.proxy_uid,
            token_issuer_uid: setup.token_issuer_uid,
            kms_endpoint: format!("http://{kms_endpoint}").parse::<Uri>().unwrap(),
            kms_timeout: setup.kms_timeout,
            kms_attempt_timeout: setup.kms_attempt_timeout,
            cluster_keys_max_age: setup.cluster_keys_max_age,
            token_issuer_socket,
            token_issuer_timeout: setup.token_issuer_timeout,
            measurement_salt_file: salt_file,
            kubeadm_config: kubeadm_config.clone(),
            ssh_cert_validity: Duration::from_secs(24 * 60 * 60),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            grace_period: Duration::from_secs(2),
            log_format: LogFormat::Text,
        };
        let join_core = JoinCore::bind(config).await.unwrap();
        let admin = join_core.admin_addr().unwrap();
        assert_eq!(join_core.socket(), socket);
        let (trigger, shutdown) = shutdown::channel();
        let join_core = tokio::spawn(async move { join_core.serve(shutdown).await.unwrap() });
        stop.insert(0, trigger);

        Self {
            client: ApiClient::new(plumbing::unix::channel(&socket, own_uid())),
            admin,
            _dir: dir,
            token_issuer_calls,
            kms_calls,
            kubeadm_config,
            socket,
            stop,
            join_core,
        }
    }

    fn token_issuer_calls(&self) -> Vec<IssueNodeCredentialsRequest> {
        self.token_issuer_calls.lock().unwrap().clone()
    }

    async fn join(
        &self,
        message: IssueJoinTicketRequest,
    ) -> Result<proto::join::IssueJoinTicketResponse, Status> {
        self.client
            .clone()
            .issue_join_ticket(forwarded(message))
            .await
            .map(Response::into_inner)
    }

    async fn rejoin(
        &self,
        disk_uuid: &str,
    ) -> Result<proto::join::IssueRejoinTicketResponse, Status> {
        let message = IssueRejoinTicketRequest {
            disk_uuid: disk_uuid.into(),
        };
        self.client
            .clone()
            .issue_rejoin_ticket(forwarded(message))
            .await
            .map(Response::into_inner)
    }

    /// Stops join-core first (it must drain and remove its socket), then the backends.
    async fn stop(self) {
        for trigger in &self.stop {
            trigger.fire();
        }
        drop(self.client);
        tokio::time::timeout(Duration::from_secs(5), self.join_core)
            .await
            .expect("join-core drains within its drain timeout")
            .unwrap();
        assert!(
            !Path::new(&self.socket).exists(),
            "socket file removed on shutdown"
        );
    }
}

fn join_request() -> IssueJoinTicketRequest {
    IssueJoinTicketRequest {
        disk_uuid: DISK_UUID.into(),
        certificate_request: CSR.to_vec(),
        is_control_plane: false,
        host_public_key: host_public_key(),
        host_certificate_principals: REQUESTED_PRINCIPALS.map(String::from).to_vec(),
    }
}

/// A request as attest-proxy forwards it.
fn forwarded<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(identity::VARIANT, "qemu-vtpm".parse().unwrap());
    request
        .metadata_mut()
        .insert(identity::PEER_ADDR, PEER.parse().unwrap());
    request
        .metadata_mut()
        .insert(identity::EVIDENCE_SHA256, EVIDENCE.parse().unwrap());
    request
}

/// The evidence digest attest-proxy forwards.
const EVIDENCE: &str = "5e0b3a7c9d1f2e4a6b8c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a";

fn assert_status(result: Result<impl std::fmt::Debug, Status>, code: Code, mentions: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(mentions),
        "{:?} should mention {mentions:?}",
        status.message()
    );
}

#[tokio::test]
async fn issues_a_full_join_ticket() {
    let system = System::start(Setup::default()).await;
    let mut request = join_request();
    request.is_control_plane = true;

    let ticket = system.join(request).await.unwrap();
    assert_eq!(ticket.state_disk_key, expected_key(DISK_UUID));
    assert_eq!(ticket.measurement_secret, expected_key("measurementSecret"));
    assert_eq!(ticket.measurement_salt, MEASUREMENT_SALT);
    assert_eq!(ticket.token, "abcdef.0123456789abcdef");
    assert_eq!(ticket.api_server_endpoint, "10.0.0.1:6443");
    assert_eq!(
        ticket.discovery_token_ca_cert_hash,
        format!("sha256:{}", "ab".repeat(32))
    );
    assert!(
        ticket
            .kubelet_cert
            .starts_with(b"-----BEGIN CERTIFICATE-----")
    );
    // token-issuer's Kubernetes-side parts pass through unchanged.
    assert_eq!(ticket.kubernetes_version, "v1.30.4");
    assert_eq!(ticket.kubernetes_components.len(), 1);
    assert_eq!(
        ticket.kubernetes_components[0].install_path,
        "/run/state/bin/kubelet"
    );
    assert_eq!(ticket.control_plane_files.len(), 1);
    assert_eq!(ticket.control_plane_files[0].name, "etcd/ca.key");

    // The CA key line parses and is the key from the `ca_emergency_ssh` seed.
    let ca_line = std::str::from_utf8(&ticket.authorized_ca_public_key).unwrap();
    assert!(ca_line.starts_with("ssh-ed25519 ") && ca_line.ends_with('\n'));
    let ca_key = ssh_key::PublicKey::from_openssh(ca_line.trim_end()).unwrap();
    let ca_public_key = expected_ca_public_key();
    assert_eq!(
        ca_key.key_data().ed25519().unwrap().as_ref(),
        &ca_public_key[..]
    );
    // The host certificate verifies with that key, certifies the node's host key, and names
    // the requested principals, then the SANs (the repeated one once).
    let cert = verify_host_certificate(&ticket.host_certificate, &ca_public_key);
    assert_eq!(
        ssh_key::PublicKey::from(cert.public_key().clone())
            .to_bytes()
            .unwrap(),
        host_public_key()
    );
    assert_eq!(cert.signature_key(), ca_key.key_data());
    assert_eq!(
        cert.valid_principals(),
        ["10.0.0.7", "worker-0", "10.9.0.1", "api.cluster.example"]
    );
    assert_eq!(cert.key_id(), DISK_UUID);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(cert.valid_after() <= now && now < cert.valid_before());
    assert_eq!(
        cert.valid_before() - cert.valid_after(),
        24 * 60 * 60 + 5 * 60
    );

    let calls = system.token_issuer_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].certificate_request, CSR);
    assert!(calls[0].is_control_plane);
    assert_eq!(calls[0].peer_address, PEER);
    assert_eq!(
        calls[0].attested_evidence_sha256, EVIDENCE,
        "the evidence digest reaches token-issuer for its audit record"
    );

    system.stop().await;
}

#[tokio::test]
async fn without_api_server_sans_the_peer_address_is_a_principal() {
    let system = System::start(Setup {
        api_server_sans: Vec::new(),
        ..Setup::default()
    })
    .await;
    let ticket = system.join(join_request()).await.unwrap();
    let cert = verify_host_certificate(&ticket.host_certificate, &expected_ca_public_key());
    assert_eq!(
        cert.valid_principals(),
        ["10.0.0.7", "worker-0", "192.0.2.7"]
    );

    // A node that asks for nothing still gets a certificate for its address, never one
    // without principals (which OpenSSH would accept for any host).
    let mut request = join_request();
    request.host_certificate_principals.clear();
    let ticket = system.join(request).await.unwrap();
    let cert = verify_host_certificate(&ticket.host_certificate, &expected_ca_public_key());
    assert_eq!(cert.valid_principals(), ["192.0.2.7"]);
    system.stop().await;
}

#[tokio::test]
async fn the_kubeadm_config_is_read_for_each_join() {
    let system = System::start(Setup::default()).await;
    std::fs::write(
        &system.kubeadm_config,
        cluster_configuration(&["203.0.113.9"]),
    )
    .unwrap();
    let ticket = system.join(join_request()).await.unwrap();
    let cert = verify_host_certificate(&ticket.host_certificate, &expected_ca_public_key());
    assert_eq!(
        cert.valid_principals(),
        ["10.0.0.7", "worker-0", "203.0.113.9"]
    );

    // Broken after startup: the join is refused before token-issuer is asked.
    std::fs::write(&system.kubeadm_config, "kind: InitConfiguration\n").unwrap();
    assert_status(
        system.join(join_request()).await,
        Code::Internal,
        "kubeadm ClusterConfiguration",
    );
    assert_eq!(system.token_issuer_calls().len(), 1);
    system.stop().await;
}

#[tokio::test]
async fn rejoin_returns_the_same_keys() {
    let system = System::start(Setup::default()).await;
    let ticket = system.join(join_request()).await.unwrap();
    let rejoin = system.rejoin(DISK_UUID).await.unwrap();
    assert_eq!(rejoin.state_disk_key, ticket.state_disk_key);
    assert_eq!(rejoin.measurement_secret, ticket.measurement_secret);

    let other = system.rejoin("another-disk").await.unwrap();
    assert_ne!(other.state_disk_key, ticket.state_disk_key);
    assert_eq!(other.measurement_secret, ticket.measurement_secret);

    assert_eq!(
        system.token_issuer_calls().len(),
        1,
        "rejoin asks only the KMS"
    );
    system.stop().await;
}

#[tokio::test]
async fn requests_without_identity_headers_are_refused() {
    let system = System::start(Setup::default()).await;
    let mut client = system.client.clone();

    let bare = client.issue_join_ticket(join_request()).await;
    assert_status(bare, Code::Unauthenticated, "not forwarded by attest-proxy");

    let mut half = Request::new(join_request());
    half.metadata_mut()
        .insert(identity::VARIANT, "qemu-vtpm".parse().unwrap());
    let half = client.issue_join_ticket(half).await;
    assert_status(half, Code::Unauthenticated, identity::PEER_ADDR);

    let rejoin = client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: DISK_UUID.into(),
        })
        .await;
    assert_status(
        rejoin,
        Code::Unauthenticated,
        "not forwarded by attest-proxy",
    );

    assert!(system.token_issuer_calls().is_empty());
    system.stop().await;
}

#[tokio::test]
async fn bad_requests_are_refused_before_any_backend_call() {
    // The key service is down: had any request reached it, the answer would be Unavailable.
    let system = System::start(Setup {
        kms: Kms::Down,
        ..Setup::default()
    })
    .await;

    let with_uuid = |disk_uuid: &str| IssueJoinTicketRequest {
        disk_uuid: disk_uuid.into(),
        ..join_request()
    };
    let with_csr = |certificate_request: Vec<u8>| IssueJoinTicketRequest {
        certificate_request,
        ..join_request()
    };
    let with_host_key = |host_public_key: Vec<u8>| IssueJoinTicketRequest {
        host_public_key,
        ..join_request()
    };
    let with_principals = |principals: &[&str]| IssueJoinTicketRequest {
        host_certificate_principals: principals.iter().map(|p| (*p).to_owned()).collect(),
        ..join_request()
    };
    let mut rsa_key = Vec::new();
    ssh_string(&mut rsa_key, b"ssh-rsa");
    ssh_string(&mut rsa_key, &[1, 0, 1]);
    ssh_string(&mut rsa_key, &[0x00, 0xc5, 0x17, 0x29]);
    let many: Vec<&str> = vec!["node"; 65];
    let cases = [
        (with_uuid(""), "disk_uuid: empty"),
        (with_uuid("../../etc/passwd"), "disk_uuid"),
        (with_uuid(&"a".repeat(65)), "disk_uuid"),
        (with_uuid("measurementSecret"), "reserved"),
        (with_csr(Vec::new()), "certificate_request: empty"),
        (
            with_csr(b"-----BEGIN CERTIFICATE REQUEST-----".to_vec()),
            "not DER",
        ),
        (
            with_csr([&[0x30][..], &[0u8; 16 * 1024]].concat()),
            "at most",
        ),
        (with_host_key(Vec::new()), "host_public_key: empty"),
        (
            with_host_key(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5".to_vec()),
            "host_public_key: not an SSH public key",
        ),
        (with_host_key(rsa_key), "key type ssh-rsa is not certified"),
        (with_principals(&["ok", ""]), "principal 1"),
        (with_principals(&["*"]), "pattern character"),
        (with_principals(&["a b"]), "host_certificate_principals"),
        (with_principals(&many), "at most 64"),
    ];
    for (request, mentions) in cases {
        assert_status(system.join(request).await, Code::InvalidArgument, mentions);
    }
    assert_status(
        system.rejoin("a b").await,
        Code::InvalidArgument,
        "disk_uuid",
    );

    assert!(system.token_issuer_calls().is_empty());
    system.stop().await;
}

#[tokio::test]
async fn key_service_down_is_unavailable_and_creates_nothing() {
    let system = System::start(Setup {
        kms: Kms::Down,
        ..Setup::default()
    })
    .await;

    let started = Instant::now();
    assert_status(
        system.join(join_request()).await,
        Code::Unavailable,
        "key service unreachable",
    );
    // Retried, but within the deadline (2 s) and with some slack for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_status(
        system.rejoin(DISK_UUID).await,
        Code::Unavailable,
        "key service",
    );
    assert!(
        system.token_issuer_calls().is_empty(),
        "token-issuer must not be asked when the keys cannot be had"
    );
    system.stop().await;
}

#[tokio::test]
async fn slow_key_service_is_unavailable_within_the_deadline_and_creates_nothing() {
    let system = System::start(Setup {
        kms: Kms::Slow(Duration::from_secs(30)),
        kms_timeout: Duration::from_millis(1200),
        kms_attempt_timeout: Duration::from_millis(500),
        ..Setup::default()
    })
    .await;
    let started = Instant::now();
    assert_status(
        system.join(join_request()).await,
        Code::Unavailable,
        "key service did not answer within",
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3),
        "the overall deadline holds: {elapsed:?}"
    );
    // Each key was asked more than once: hung attempts are cut short and retried.
    assert!(system.kms_calls.load(Ordering::SeqCst) > 3);
    assert!(system.token_issuer_calls().is_empty());
    system.stop().await;
}

#[tokio::test]
async fn key_service_recovering_within_the_deadline_is_retried() {
    let system = System::start(Setup {
        kms: Kms::UnavailableFirst(4),
        ..Setup::default()
    })
    .await;
    let ticket = system.join(join_request()).await.unwrap();
    assert_eq!(ticket.state_disk_key, expected_key(DISK_UUID));
    assert_eq!(ticket.measurement_secret, expected_key("measurementSecret"));
    verify_host_certificate(&ticket.host_certificate, &expected_ca_public_key());
    // Three keys, four refusals first: at least seven calls.
    assert!(system.kms_calls.load(Ordering::SeqCst) >= 7);
    assert_eq!(system.token_issuer_calls().len(), 1);
    system.stop().await;
}

#[tokio::test]
async fn key_service_refusals_are_internal_and_not_retried() {
    let system = System::start(Setup {
        kms: Kms::Refusing(Code::InvalidArgument),
        ..Setup::default()
    })
    .await;
    assert_status(
        system.join(join_request()).await,
        Code::Internal,
        "key service refused",
    );
    assert_status(
        system.rejoin(DISK_UUID).await,
        Code::Internal,
        "key service refused",
    );
    // join asks for three keys, rejoin for two, each once.
    assert_eq!(system.kms_calls.load(Ordering::SeqCst), 5);
    assert!(system.token_issuer_calls().is_empty());
    system.stop().await;
}

/// Joins of a system whose key service counts its calls, with cluster keys kept `max_age`:
/// the key service calls they took, and the tickets.
async fn joins_counting_key_calls(
    max_age: Duration,
    joins: usize,
) -> (u32, Vec<IssueJoinTicketResponse>) {
    let system = System::start(Setup {
        kms: Kms::UnavailableFirst(0),
        cluster_keys_max_age: max_age,
        ..Setup::default()
    })
    .await;
    let mut tickets = Vec::new();
    for _ in 0..joins {
        tickets.push(system.join(join_request()).await.unwrap());
    }
    let calls = system.kms_calls.load(Ordering::SeqCst);
    system.stop().await;
    (calls, tickets)
}

#[tokio::test]
async fn cluster_keys_are_kept_for_their_max_age_and_every_ticket_has_them() {
    // Kept: the first join asks for three keys, each later one for its state disk key alone.
    let (calls, tickets) = joins_counting_key_calls(Duration::from_secs(300), 3).await;
    assert_eq!(calls, 3 + 1 + 1);
    // Not kept: three keys for every join.
    let (calls_unkept, unkept) = joins_counting_key_calls(Duration::ZERO, 2).await;
    assert_eq!(calls_unkept, 3 + 3);
    // Expired before the second join: fetched again.
    let (calls_expired, _) = joins_counting_key_calls(Duration::from_nanos(1), 2).await;
    assert_eq!(calls_expired, 3 + 3);

    for ticket in tickets.iter().chain(&unkept) {
        assert_eq!(ticket.state_disk_key, expected_key(DISK_UUID));
        assert_eq!(ticket.measurement_secret, expected_key("measurementSecret"));
        assert_eq!(
            ticket.authorized_ca_public_key,
            tickets[0].authorized_ca_public_key
        );
        verify_host_certificate(&ticket.host_certificate, &expected_ca_public_key());
    }
}

#[tokio::test]
async fn token_issuer_down_is_unavailable() {
    // Nothing can be created: token-issuer is the only process that creates anything.
    let system = System::start(Setup {
        token_issuer: None,
        ..Setup::default()
    })
    .await;
    assert_status(
        system.join(join_request()).await,
        Code::Unavailable,
        "token-issuer",
    );
    // Rejoin does not need token-issuer.
    system.rejoin(DISK_UUID).await.unwrap();

    // Readiness names the missing dependency; the refusal is counted under its step.
    let (status, body) = admin_get(system.admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("ok key_service"), "{body}");
    assert!(body.contains("failed token_issuer"), "{body}");
    let (_, metrics) = admin_get(system.admin, "/metrics").await;
    assert!(
        metrics.contains(r#"join_core_tickets_total{method="IssueJoinTicket",result="refused",reason="token_issuer"} 1"#),
        "{metrics}"
    );
    system.stop().await;
}

async fn admin_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    plumbing::admin::get(addr, path).await.unwrap()
}

#[tokio::test]
async fn admin_endpoint_is_ready_and_counts_tickets_and_backend_calls() {
    let system = System::start(Setup::default()).await;
    assert_eq!(admin_get(system.admin, "/livez").await.0, 200);
    let (status, body) = admin_get(system.admin, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok key_service\nok token_issuer\n")
    );

    system.join(join_request()).await.unwrap();
    system.rejoin(DISK_UUID).await.unwrap();
    let (_, metrics) = admin_get(system.admin, "/metrics").await;
    for line in [
        r#"join_core_tickets_total{method="IssueJoinTicket",result="issued",reason="ok"} 1"#,
        r#"join_core_tickets_total{method="IssueRejoinTicket",result="issued",reason="ok"} 1"#,
        // Three keys for the join; the rejoin's state disk key alone, the measurement secret kept.
        r#"join_core_backend_call_duration_seconds_count{backend="key_service",outcome="ok"} 4"#,
        r#"join_core_backend_call_duration_seconds_count{backend="token_issuer",outcome="ok"} 1"#,
        r#"join_core_ticket_duration_seconds_count{method="IssueJoinTicket"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
    system.stop().await;
}

#[tokio::test]
async fn token_issuer_refusals_pass_through_with_the_step_named() {
    let system = System::start(Setup {
        token_issuer: Some(Answer::Refuse(
            Code::InvalidArgument,
            "CSR subject O must be system:nodes",
        )),
        ..Setup::default()
    })
    .await;
    let status = system.join(join_request()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "token-issuer IssueNodeCredentials: CSR subject O must be system:nodes"
    );
    system.stop().await;
}

#[tokio::test]
async fn slow_token_issuer_is_deadline_exceeded() {
    let system = System::start(Setup {
        token_issuer: Some(Answer::After(Duration::from_secs(3))),
        token_issuer_timeout: Duration::from_millis(200),
        ..Setup::default()
    })
    .await;
    assert_status(
        system.join(join_request()).await,
        Code::DeadlineExceeded,
        "token-issuer IssueNodeCredentials did not answer",
    );
    system.stop().await;
}

#[tokio::test]
async fn peers_other_than_the_proxy_uid_are_cut_off() {
    let system = System::start(Setup {
        proxy_uid: own_uid().wrapping_add(4242),
        ..Setup::default()
    })
    .await;

    // The connection is closed before any HTTP/2 is spoken: no gRPC answer comes back, only a
    // transport failure the client makes itself (tonic reports it as Unknown or Unavailable,
    // depending on when the close is noticed).
    let status = system.join(join_request()).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown),
        "{status:?}"
    );
    assert!(
        std::error::Error::source(&status).is_some(),
        "a transport failure, not a server answer: {status:?}"
    );

    // On the raw socket: accepted by the kernel, then closed unread.
    use tokio::io::AsyncReadExt;
    let mut raw = tokio::net::UnixStream::connect(&system.socket)
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut byte)).await;
    assert_eq!(read.unwrap().unwrap(), 0, "refused peer sees EOF");

    assert!(system.token_issuer_calls().is_empty());
    system.stop().await;
}

#[tokio::test]
async fn a_token_issuer_socket_served_by_another_uid_gets_nothing() {
    // The socket at token-issuer's path is served by a process of our own uid, but join-core
    // expects another: it must not send the CSR there.
    let system = System::start(Setup {
        token_issuer_uid: own_uid().wrapping_add(4242),
        ..Setup::default()
    })
    .await;
    let status = system.join(join_request()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        system.token_issuer_calls().is_empty(),
        "the CSR reached a token-issuer of the wrong uid"
    );
    system.stop().await;
}

#[tokio::test]
async fn bad_salt_or_kubeadm_config_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let salt_file = dir.path().join("measurementSalt");
    std::fs::write(&salt_file, b"short\n").unwrap();
    let config = Config {
        socket: dir.path().join("join-core.sock"),
        socket_mode: 0o600,
        proxy_uid: own_uid(),
        token_issuer_uid: own_uid(),
        kms_endpoint: "http://127.0.0.1:9000".parse().unwrap(),
        kms_timeout: Duration::from_secs(1),
        kms_attempt_timeout: Duration::from_secs(1),
        cluster_keys_max_age: Duration::from_secs(1),
        token_issuer_socket: dir.path().join("token-issuer.sock"),
        token_issuer_timeout: Duration::from_secs(1),
        measurement_salt_file: salt_file.clone(),
        kubeadm_config: dir.path().join("ClusterConfiguration"),
        ssh_cert_validity: Duration::from_secs(60),
        admin_listen: None,
        grace_period: Duration::from_secs(1),
        log_format: LogFormat::Text,
    };
    let error = JoinCore::bind(config.clone()).await.unwrap_err();
    assert!(
        matches!(error, join_core::Error::SaltLength { len: 6, .. }),
        "{error}"
    );

    // A good salt but no kubeadm ClusterConfiguration: startup stops too.
    std::fs::write(&salt_file, MEASUREMENT_SALT).unwrap();
    let error = JoinCore::bind(config.clone()).await.unwrap_err();
    assert!(
        matches!(error, join_core::Error::KubeadmConfig(_)),
        "{error}"
    );
    std::fs::write(&config.kubeadm_config, "kind: JoinConfiguration\n").unwrap();
    let error = JoinCore::bind(config).await.unwrap_err();
    assert!(
        matches!(error, join_core::Error::KubeadmConfig(_)),
        "{error}"
    );
}
