//! How long a node's connection lives once its attestation is decided, on a real in-process
//! attest-proxy in front of a trivial join API on a Unix socket: one call per connection, then
//! the connection closes; a refused connection closes right after its status; a silent one at
//! `--idle-timeout`; every one at `--max-connection-age`; and a join-core that does not answer
//! costs the node `--upstream-timeout`, not forever.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proto::join::api_client::ApiClient;
use soft_issuer::SoftIssuer;
use testsupport::harness::{BOOT_MEASUREMENTS, extended_once};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

struct Running {
    addr: SocketAddr,
    trigger: plumbing::shutdown::Trigger,
    _dir: tempfile::TempDir,
}

/// Starts the proxy with `flags`, forwarding to the trivial join API unless `upstream` is
/// `Upstream::Silent` (a socket that accepts and never answers).
async fn start(upstream: Upstream, flags: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("attestationConfig");
    std::fs::write(
        &policy,
        testsupport::harness::attestation_config(&attestation::AkTrust::AnyKey, &[]),
    )
    .unwrap();
    let socket = dir.path().join("join-core.sock");
    let (trigger, shutdown) = plumbing::shutdown::channel();
    match upstream {
        Upstream::Trivial => {
            let uid = testsupport::harness::own_uid().unwrap();
            let (socket, shutdown) = (socket.clone(), shutdown.clone());
            tokio::spawn(async move {
                loadgen::trivial::serve_unix(&socket, uid, shutdown)
                    .await
                    .unwrap();
            });
        }
        Upstream::Silent => {
            let listener = plumbing::unix::bind(&socket, 0o600).unwrap();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((stream, _)) = listener.accept().await {
                    held.push(stream);
                }
            });
        }
    }
    let uid = testsupport::harness::own_uid().unwrap().to_string();
    let mut args = vec![
        "attest-proxy",
        "--upstream-uid",
        &uid,
        "--listen",
        "127.0.0.1:0",
        "--upstream-socket",
        socket.to_str().unwrap(),
        "--attestation-config",
        policy.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let proxy = attest_proxy::Proxy::bind(attest_proxy::Config::try_parse_from(args).unwrap())
        .await
        .unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.serve(shutdown));
    Running {
        addr,
        trigger,
        _dir: dir,
    }
}

#[derive(Clone, Copy)]
enum Upstream {
    Trivial,
    Silent,
}

/// A node whose quotes satisfy the harness policy, or (`attests: false`) carry other PCRs.
fn node(attests: bool) -> Arc<atls::Connector> {
    let byte = |b: u8| if attests { b } else { b ^ 0xff };
    let pcrs: Vec<_> = BOOT_MEASUREMENTS
        .iter()
        .map(|&(index, b)| (index, extended_once(&[byte(b); 32])))
        .collect();
    let issuer = SoftIssuer::ecdsa_p256().unwrap().with_pcrs(pcrs).unwrap();
    Arc::new(atls::Connector::new(Arc::new(issuer)))
}

/// One attested HTTP/2 connection that is never redialled: the calls made on it, and a future
/// that ends when the connection does.
type Sender = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<hyper::body::Incoming>,
    hyper::Error,
>;

struct Connection {
    api: ApiClient<Sender>,
    closed: tokio::task::JoinHandle<()>,
}

async fn connect(addr: SocketAddr, connector: &atls::Connector) -> Connection {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector.connect(tcp).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    let closed = tokio::spawn(async move {
        let _ = connection.await;
    });
    let sender = tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move { sender.send_request(request).await }
    });
    Connection {
        api: ApiClient::with_origin(Sender::new(sender), "http://node".parse().unwrap()),
        closed,
    }
}

fn request() -> proto::join::IssueJoinTicketRequest {
    proto::join::IssueJoinTicketRequest {
        disk_uuid: "00000000-0000-4000-8000-000000000000".to_owned(),
        ..Default::default()
    }
}

/// Whether the connection ends within `within` of now.
async fn closes_within(connection: Connection, within: Duration) -> bool {
    tokio::time::timeout(within, connection.closed)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attested_connection_serves_one_call_and_closes() {
    let proxy = start(Upstream::Trivial, &["--idle-timeout", "30s"]).await;
    let connector = node(true);
    let mut connection = connect(proxy.addr, &connector).await;
    connection.api.issue_join_ticket(request()).await.unwrap();
    // A second call on the same connection never reaches join-core.
    let second = connection
        .api
        .issue_rejoin_ticket(proto::join::IssueRejoinTicketRequest {
            disk_uuid: "00000000-0000-4000-8000-000000000000".to_owned(),
        })
        .await;
    assert!(second.is_err(), "a second call was served: {second:?}");
    let started = Instant::now();
    assert!(
        closes_within(connection, Duration::from_secs(3)).await,
        "the connection stayed open after its call"
    );
    // The node's client dials per call, so its next call attests again and is served.
    let mut next = connect(proxy.addr, &connector).await;
    next.api.issue_join_ticket(request()).await.unwrap();
    eprintln!("closed {:?} after the call", started.elapsed());
    proxy.trigger.fire();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_closes_right_after_its_status() {
    let proxy = start(Upstream::Trivial, &["--idle-timeout", "30s"]).await;
    let mut connection = connect(proxy.addr, &node(false)).await;
    let refused = connection
        .api
        .issue_join_ticket(request())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        closes_within(connection, Duration::from_secs(3)).await,
        "the refused connection stayed open after its status"
    );
    proxy.trigger.fire();
}

/// Completes the aTLS handshake and then sends nothing, not even the HTTP/2 preface; returns how
/// long after the handshake the proxy closed the connection (`None`: not within `patience`).
async fn silent_after_handshake(
    addr: SocketAddr,
    connector: &atls::Connector,
    patience: Duration,
) -> Option<Duration> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect(tcp).await.unwrap();
    let attested = Instant::now();
    let mut buf = [0u8; 256];
    tokio::time::timeout(patience, async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| attested.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_close_at_the_idle_timeout() {
    let proxy = start(Upstream::Trivial, &["--idle-timeout", "1s"]).await;
    for attests in [true, false] {
        let closed = silent_after_handshake(proxy.addr, &node(attests), Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("attests {attests}: still open 5 s after the handshake"));
        assert!(
            closed >= Duration::from_millis(800) && closed < Duration::from_secs(3),
            "attests {attests}: closed {closed:?} after the handshake, idle timeout 1 s"
        );
    }
    proxy.trigger.fire();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_outlives_its_maximum_age() {
    let proxy = start(
        Upstream::Trivial,
        &["--idle-timeout", "30s", "--max-connection-age", "2s"],
    )
    .await;
    let closed = silent_after_handshake(proxy.addr, &node(true), Duration::from_secs(6))
        .await
        .expect("still open 6 s after the handshake, maximum age 2 s");
    assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
    proxy.trigger.fire();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_core_that_does_not_answer_costs_the_upstream_timeout() {
    let proxy = start(Upstream::Silent, &["--upstream-timeout", "1s"]).await;
    let mut connection = connect(proxy.addr, &node(true)).await;
    let started = Instant::now();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        connection.api.issue_join_ticket(request()),
    )
    .await
    .expect("the node waited beyond the upstream timeout")
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered after {:?}",
        started.elapsed()
    );
    proxy.trigger.fire();
}
