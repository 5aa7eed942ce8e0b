//! The bounds at accept on a real, in-process attest-proxy: a source over its rate is refused at
//! once and counted by reason, `0` turns the per-source limits off (every node behind one load
//! balancer address), and the flags' defaults are the documented ones.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser as _;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

struct Running {
    addr: SocketAddr,
    admin: SocketAddr,
    trigger: plumbing::shutdown::Trigger,
    _dir: tempfile::TempDir,
}

async fn start(flags: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("attestationConfig");
    std::fs::write(
        &policy,
        testsupport::harness::attestation_config(&attestation::AkTrust::AnyKey, &[]),
    )
    .unwrap();
    let socket = dir.path().join("join-core.sock");
    let uid = testsupport::harness::own_uid().unwrap().to_string();
    let mut args = vec![
        "attest-proxy",
        "--upstream-uid",
        &uid,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
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
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (trigger, shutdown) = plumbing::shutdown::channel();
    tokio::spawn(proxy.serve(shutdown));
    Running {
        addr,
        admin,
        trigger,
        _dir: dir,
    }
}

async fn metric(admin: SocketAddr, name: &str) -> f64 {
    testsupport::harness::metric(admin, name).await.unwrap()
}

/// Whether the proxy closed `tcp` within `within` (without a byte sent either way).
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(within, tcp.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_over_its_rate_is_refused_at_accept() {
    let proxy = start(&[
        "--per-peer-rate",
        "0.5",
        "--per-peer-burst",
        "3",
        "--max-attestations-per-peer",
        "0",
    ])
    .await;
    // The burst is held open (silent clients, waiting for their first record); the rest are
    // closed at once.
    let mut held = Vec::new();
    let started = Instant::now();
    for n in 0..8 {
        let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
        let closed = closed_within(&mut tcp, Duration::from_millis(300)).await;
        assert_eq!(closed, n >= 3, "connection {n}");
        held.push(tcp);
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refusals were not immediate"
    );
    assert_eq!(
        metric(
            proxy.admin,
            "attest_proxy_connections_shed_total{reason=\"peer_rate\"}"
        )
        .await,
        5.0
    );
    assert_eq!(
        metric(proxy.admin, "attest_proxy_connections_waiting").await,
        3.0
    );
    assert_eq!(
        metric(proxy.admin, "attest_proxy_rate_limited_sources").await,
        1.0
    );
    // Another source has its own bucket.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 9], 0).into()).unwrap();
    let mut other = socket.connect(proxy.addr).await.unwrap();
    assert!(!closed_within(&mut other, Duration::from_millis(300)).await);
    proxy.trigger.fire();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_turns_the_per_source_limits_off() {
    let proxy = start(&["--per-peer-rate", "0", "--max-attestations-per-peer", "0"]).await;
    // 40 connections at once from one address, as from a load balancer: all held.
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(TcpStream::connect(proxy.addr).await.unwrap());
    }
    for tcp in &mut held {
        assert!(!closed_within(tcp, Duration::from_millis(50)).await);
    }
    assert_eq!(
        metric(proxy.admin, "attest_proxy_connections_waiting").await,
        40.0
    );
    assert_eq!(
        metric(proxy.admin, "attest_proxy_rate_limited_sources").await,
        0.0
    );
    proxy.trigger.fire();
}

#[test]
fn defaults_are_the_documented_ones() {
    // join-core's uid has no default: a client must be told whom to trust.
    assert!(attest_proxy::Config::try_parse_from(["attest-proxy"]).is_err());
    let config =
        attest_proxy::Config::try_parse_from(["attest-proxy", "--upstream-uid", "10002"]).unwrap();
    assert_eq!(config.max_waiting, 16384);
    assert_eq!(config.max_handshakes, 512);
    assert_eq!(config.verify_queue, 512);
    assert_eq!(config.handshake_queue_wait, Duration::from_secs(5));
    assert_eq!(config.max_attestations_per_peer, 4);
    assert!((config.per_peer_rate - 10.0).abs() < f64::EPSILON);
    assert_eq!(config.per_peer_burst, 20);
    assert_eq!(config.handshake_timeout, Duration::from_secs(10));
    assert_eq!(config.idle_timeout, Duration::from_secs(10));
    assert_eq!(config.max_connection_age, Duration::from_secs(60));
    assert_eq!(config.upstream_timeout, Duration::from_secs(15));
    assert_eq!(
        config.upstream_socket,
        std::path::PathBuf::from("/run/joinservice/join-core/join-core.sock")
    );
    // Nonsense is refused at startup rather than silently meaning "unlimited".
    for bad in [
        ["--max-handshakes", "0"],
        ["--max-waiting", "0"],
        ["--per-peer-rate", "-1"],
        ["--per-peer-burst", "0"],
    ] {
        let mut args = vec!["attest-proxy", "--upstream-uid", "10002"];
        args.extend(bad);
        assert!(
            attest_proxy::Config::try_parse_from(args).is_err(),
            "{bad:?}"
        );
    }
}
