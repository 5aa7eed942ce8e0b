//! join-core in process, end to end: a real tonic client over a real Unix socket, a real key
//! service on loopback, and a test-only token-issuer on another Unix socket that records what
//! it was asked (the real token-issuer is its own crate; this one answers in its wire format).

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use join_core::{Config, JoinCore};
use plumbing::identity;
use plumbing::shutdown::{self, Trigger};
use plumbing::telemetry::LogFormat;
use plumbing::unix::PeerPolicy;
use proto::join::api_client::ApiClient;
use proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
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

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::metadata(dir.path()).unwrap().uid()
}

fn expected_key(id: &str) -> Vec<u8> {
    keyservice::MasterSecret::new(MASTER_SECRET.to_vec(), MASTER_SALT.to_vec())
        .unwrap()
        .derive_key(id, 32)
        .unwrap()
        .to_vec()
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
        }))
    }
}

/// Which parts of the system are up for one test.
struct Setup {
    kms_up: bool,
    token_issuer: Option<Answer>,
    proxy_uid: u32,
    token_issuer_timeout: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            kms_up: true,
            token_issuer: Some(Answer::Credentials),
            proxy_uid: own_uid(),
            token_issuer_timeout: Duration::from_secs(5),
        }
    }
}

struct System {
    _dir: tempfile::TempDir,
    client: ApiClient<Channel>,
    token_issuer_calls: Arc<Mutex<Vec<IssueNodeCredentialsRequest>>>,
    socket: PathBuf,
    stop: Vec<Trigger>,
    join_core: tokio::task::JoinHandle<()>,
}

impl System {
    async fn start(setup: Setup) -> Self {
        plumbing::telemetry::init(LogFormat::Text);
        let dir = tempfile::tempdir().unwrap();
        let mut stop = Vec::new();

        let kms_endpoint = if setup.kms_up {
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
        } else {
            // A port that was free a moment ago: connections are refused.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
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
        let socket = dir.path().join("join-core.sock");
        let config = Config {
            socket: socket.clone(),
            socket_mode: 0o600,
            proxy_uid: setup.proxy_uid,
            kms_endpoint: format!("http://{kms_endpoint}").parse::<Uri>().unwrap(),
            kms_timeout: Duration::from_secs(2),
            token_issuer_socket,
            token_issuer_timeout: setup.token_issuer_timeout,
            measurement_salt_file: salt_file,
            drain_timeout: Duration::from_secs(2),
            log_format: LogFormat::Text,
        };
        let join_core = JoinCore::bind(config).await.unwrap();
        assert_eq!(join_core.socket(), socket);
        let (trigger, shutdown) = shutdown::channel();
        let join_core = tokio::spawn(async move { join_core.serve(shutdown).await.unwrap() });
        stop.insert(0, trigger);

        Self {
            client: ApiClient::new(plumbing::unix::channel(&socket)),
            _dir: dir,
            token_issuer_calls,
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
        host_public_key: Vec::new(),
        host_certificate_principals: Vec::new(),
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
}

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
    // The next issue's fields.
    assert!(ticket.control_plane_files.is_empty());
    assert!(ticket.kubernetes_components.is_empty());
    assert!(ticket.kubernetes_version.is_empty());
    assert!(ticket.authorized_ca_public_key.is_empty());
    assert!(ticket.host_certificate.is_empty());

    let calls = system.token_issuer_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].certificate_request, CSR);
    assert!(calls[0].is_control_plane);
    assert_eq!(calls[0].peer_address, PEER);

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
        kms_up: false,
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
        kms_up: false,
        ..Setup::default()
    })
    .await;

    assert_status(
        system.join(join_request()).await,
        Code::Unavailable,
        "key service",
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
async fn token_issuer_down_is_unavailable() {
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
async fn wrong_size_measurement_salt_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let salt_file = dir.path().join("measurementSalt");
    std::fs::write(&salt_file, b"short\n").unwrap();
    let config = Config {
        socket: dir.path().join("join-core.sock"),
        socket_mode: 0o600,
        proxy_uid: own_uid(),
        kms_endpoint: "http://127.0.0.1:9000".parse().unwrap(),
        kms_timeout: Duration::from_secs(1),
        token_issuer_socket: dir.path().join("token-issuer.sock"),
        token_issuer_timeout: Duration::from_secs(1),
        measurement_salt_file: salt_file,
        drain_timeout: Duration::from_secs(1),
        log_format: LogFormat::Text,
    };
    let error = JoinCore::bind(config).await.unwrap_err();
    assert!(
        matches!(error, join_core::Error::SaltLength { len: 6, .. }),
        "{error}"
    );
}
