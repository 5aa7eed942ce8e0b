//! A flood of bad attestations does not starve honest nodes.
//!
//! A real attest-proxy runs in this process with a deliberately small verify pool (one thread,
//! two queued jobs) in front of the real join-core, key service and token-issuer processes of the
//! harness. From other loopback addresses, many clients at once open connections that stall in
//! the handshake, present certificates beyond the size limit, or present large junk documents
//! that must be parsed before they can be refused. Meanwhile a node with a real (swtpm)
//! attestation joins again and again, and each join must succeed promptly, without retries.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use attestation::Issuer;
use clap::Parser as _;
use testsupport::harness::{self, JunkDocument, Options, System};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpSocket;

#[derive(Debug, Default)]
struct Tally {
    attempts: AtomicUsize,
    closed_before_tls: AtomicUsize,
    handshakes: AtomicUsize,
}

async fn connect_from(
    source: IpAddr,
    target: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(target).await
}

/// Connects from `source` over and over, presenting documents from `issuer`, until `stop`.
fn flooder(
    source: IpAddr,
    target: SocketAddr,
    issuer: Arc<dyn Issuer>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let connector = atls::Connector::new(issuer);
        while !stop.load(Ordering::SeqCst) {
            tally.attempts.fetch_add(1, Ordering::Relaxed);
            let Ok(tcp) = connect_from(source, target).await else {
                continue;
            };
            match tokio::time::timeout(Duration::from_secs(5), connector.connect(tcp)).await {
                Ok(Ok(tls)) => {
                    tally.handshakes.fetch_add(1, Ordering::Relaxed);
                    drop(tls);
                }
                Ok(Err(atls::HandshakeError::UnexpectedEof | atls::HandshakeError::Io(_))) => {
                    tally.closed_before_tls.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(_)) | Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Opens connections from `source` that send half a ClientHello and then nothing.
fn staller(
    source: IpAddr,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            tally.attempts.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut tcp) = connect_from(source, target).await {
                let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
                // Held until the proxy gives up on it or the flood ends.
                let mut buf = [0u8; 1];
                let _ = tokio::time::timeout(
                    Duration::from_secs(3),
                    tokio::io::AsyncReadExt::read(&mut tcp, &mut buf),
                )
                .await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

fn join_request(node_name: &str) -> proto::join::IssueJoinTicketRequest {
    harness::join_request(node_name, "3c9d2e1f-7a6b-4c5d-8e9f-0a1b2c3d4e5f").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_nodes_join_during_a_flood() {
    // The proxy under test runs in this process, as this process's uid: join-core must admit it.
    let system = System::start(Options {
        same_uid: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let uid = system.uids.join_core.to_string();
    let config = attest_proxy::Config::try_parse_from([
        "attest-proxy",
        "--upstream-uid",
        &uid,
        "--listen",
        "127.0.0.1:0",
        "--upstream-socket",
        system.paths.join_core_socket.to_str().unwrap(),
        "--attestation-config",
        system.paths.attestation_config.to_str().unwrap(),
        "--verify-threads",
        "1",
        "--verify-queue",
        "2",
        "--max-attestations-per-peer",
        "1",
        "--handshake-timeout",
        "2s",
    ])
    .unwrap();
    let proxy = attest_proxy::Proxy::bind(config).await.unwrap();
    let addr = proxy.local_addr().unwrap();
    let (trigger, shutdown) = plumbing::shutdown::channel();
    let serving = tokio::spawn(proxy.serve(shutdown));

    // The flood: two sources with 32 connections each, and one source stalling handshakes. With
    // one attestation in progress per source, the flood can hold at most two of the pool's three
    // places (one thread, two queued), so the honest node always finds one; without the cap the
    // flood fills the queue and the honest node is told to retry (ResourceExhausted).
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for host in 2..=3u8 {
        let source = IpAddr::from([127, 0, 0, host]);
        for n in 0..32 {
            // Just below and well above the 64 KiB certificate limit.
            let size = if n % 2 == 0 { 60 * 1024 } else { 200 * 1024 };
            let issuer: Arc<dyn Issuer> = Arc::new(JunkDocument { size });
            tasks.push(flooder(source, addr, issuer, stop.clone(), tally.clone()));
        }
    }
    for _ in 0..16 {
        tasks.push(staller(
            [127, 0, 0, 6].into(),
            addr,
            stop.clone(),
            tally.clone(),
        ));
    }
    // Let the flood build up before the honest node starts.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let issuer = system.issuer().unwrap();
    let mut slowest = Duration::ZERO;
    for n in 0..5 {
        let started = Instant::now();
        let client =
            node_client::Client::new(addr, issuer.clone(), Duration::from_secs(10)).unwrap();
        client
            .join(join_request(&format!("honest-{n}")))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "honest join {n} failed during the flood: {e}\n{}",
                    system.logs()
                )
            });
        slowest = slowest.max(started.elapsed());
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }

    // The flood was real and was held back at the door, not queued.
    let (attempts, closed, handshakes) = (
        tally.attempts.load(Ordering::Relaxed),
        tally.closed_before_tls.load(Ordering::Relaxed),
        tally.handshakes.load(Ordering::Relaxed),
    );
    assert!(attempts > 200, "flood too small: {attempts} attempts");
    assert!(closed > 0, "no flood connection was refused at accept");
    assert!(handshakes > 0, "no junk document reached verification");
    assert!(
        slowest < Duration::from_secs(8),
        "an honest join took {slowest:?} ({attempts} flood attempts, {closed} closed before TLS, {handshakes} verified)"
    );
    eprintln!(
        "slowest honest join {slowest:?}; flood: {attempts} attempts, {closed} closed before TLS, {handshakes} handshakes"
    );

    trigger.fire();
    tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
