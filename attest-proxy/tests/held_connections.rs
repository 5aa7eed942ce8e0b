//! 10,000 connections held open before their handshake: the proxy's memory stays bounded, every
//! one of them is closed by the handshake deadline, and nodes that talk attest beside them.
//!
//! The real attest-proxy binary runs as its own process, so its resident memory can be read from
//! `/proc/<pid>/status`. Clients from 10,000 distinct loopback addresses (as many nodes would
//! come from) connect and then stall: half send the first bytes of a ClientHello, half send
//! nothing. Twice: with the defaults (every connection waits for its first record until the
//! deadline, which shows what one waiting connection costs), and with the bound on waiting
//! connections below the crowd (all but that many are closed at accept). Then a crowd that is
//! opened again as the proxy closes it, while nodes attest.
//!
//! Then 10,000 connections that complete their handshake (half attested, half refused by the
//! policy) and then stay silent: each is closed at the idle deadline, and the proxy's memory
//! stays bounded.
//!
//! The test raises its open-file limit to fit the crowd (the proxy inherits it); if the hard
//! limit is lower, it uses as many connections as the limit allows and says so.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgen::node::loopback_source;
use loadgen::procstat;
use testsupport::harness;
use testsupport::process::{Process, free_port};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

const CROWD: usize = 10_000;
const DEADLINE: Duration = Duration::from_secs(4);
/// What the proxy may grow by whatever it holds: its runtime's and verify pool's buffers and the
/// handshakes in flight (the client keeps 32 at a time).
const FIXED_GROWTH: u64 = 16 << 20;
/// What one connection may cost the proxy while it is held silent after its handshake: its TLS
/// state with record buffers and its HTTP/2 connection.
const PER_HELD_CONNECTION: u64 = 80 << 10;
/// The proxy's default `--max-handshakes`, used as a waiting bound below the crowd.
const DEFAULT_MAX_HANDSHAKES: usize = 512;

/// One crowd at a time: the tests of this file each fill the open-file limit, and a crowd's
/// timings mean something only when it has the machine to itself.
static ONE_CROWD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Raises the open-file limit for the crowd and returns how many connections fit under it.
fn crowd_size() -> usize {
    // This process holds one descriptor per connection, and so does the proxy while it holds it.
    let wanted = u64::try_from(CROWD + 1024).unwrap();
    let limit = rlimit::increase_nofile_limit(wanted).unwrap();
    let fits = usize::try_from(limit)
        .unwrap()
        .saturating_sub(1024)
        .min(CROWD);
    if fits < CROWD {
        eprintln!("open-file limit {limit}: holding {fits} connections instead of {CROWD}");
    }
    fits
}

struct Proxy {
    process: Process,
    addr: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

fn start_proxy(extra: &[&str]) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("attestationConfig");
    std::fs::write(
        &policy,
        harness::attestation_config(&attestation::AkTrust::AnyKey, &[]),
    )
    .unwrap();
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let (addr, admin) = (
        loopback(free_port().unwrap()),
        loopback(free_port().unwrap()),
    );
    let mut process = Process::spawn(
        "attest-proxy",
        Command::new(env!("CARGO_BIN_EXE_attest-proxy"))
            // Every shed handshake would log a warning; the counts are in the metrics.
            .env("RUST_LOG", "error")
            .args(["--listen", &addr.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            // Nothing gets that far: no connection finishes its handshake.
            .arg("--upstream-socket")
            .arg(dir.path().join("join-core.sock"))
            .args(["--upstream-uid", &harness::own_uid().unwrap().to_string()])
            .arg("--attestation-config")
            .arg(&policy)
            .args([
                "--handshake-timeout",
                &humantime::format_duration(DEADLINE).to_string(),
            ])
            .args(extra),
        dir.path(),
    )
    .unwrap();
    process.wait_for_tcp(addr).unwrap();
    Proxy {
        process,
        addr,
        admin,
        _dir: dir,
    }
}

async fn metric(proxy: &Proxy, name: &str) -> f64 {
    harness::metric(proxy.admin, name).await.unwrap()
}

async fn connect_from(index: usize, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(
        loopback_source(u64::try_from(index).unwrap()),
        0,
    ))?;
    socket.connect(target).await
}

/// Opens `n` stalling connections, each from its own address, and returns for each how long
/// after it was opened the proxy closed it (`None`: still open `patience` after opening).
async fn hold(target: SocketAddr, n: usize, patience: Duration) -> Vec<Option<Duration>> {
    // Connecting faster than the proxy accepts would only test the kernel's listen queue.
    let connecting = Arc::new(tokio::sync::Semaphore::new(64));
    let mut held = tokio::task::JoinSet::new();
    for index in 0..n {
        let permit = connecting.clone().acquire_owned().await.unwrap();
        held.spawn(async move {
            let mut tcp = connect_from(index, target).await.unwrap();
            drop(permit);
            let opened = Instant::now();
            if index % 2 == 0 {
                // A TLS record header announcing a 512-byte handshake message, and one byte of it.
                let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
            }
            let mut buf = [0u8; 64];
            let closed = tokio::time::timeout(patience, async {
                // EOF, a reset, or (never, here) bytes the server sent: any of them ends the wait
                // only when the connection is gone.
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            closed.ok().map(|()| opened.elapsed())
        });
    }
    let mut closed = Vec::with_capacity(n);
    while let Some(result) = held.join_next().await {
        closed.push(result.unwrap());
    }
    closed
}

/// Runs one crowd against `proxy` and checks that each connection was closed by the deadline.
/// Returns (peak RSS growth in bytes, connections that the proxy held until the deadline).
async fn crowd(proxy: &Proxy, n: usize) -> (u64, usize) {
    let pid = proxy.process.id();
    let before = procstat::memory(pid).unwrap();
    let started = Instant::now();
    let patience = DEADLINE + Duration::from_secs(2);
    let closed = hold(proxy.addr, n, patience).await;
    // VmHWM: the peak since this proxy started, so the crowd's peak.
    let peak = procstat::memory(pid).unwrap().peak_rss;

    let mut histogram = std::collections::BTreeMap::new();
    for c in &closed {
        *histogram.entry(c.map(|d| d.as_millis() / 500)).or_insert(0) += 1;
    }
    eprintln!("connections by when they were closed (half seconds after opening): {histogram:?}");
    let open = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(
        open,
        0,
        "{open} of {n} connections were still open {patience:?} after they were opened (deadline {DEADLINE:?}); log:\n{}",
        proxy.process.log()
    );
    // Held ones are closed at the deadline, shed ones at once.
    let held_to_deadline = closed
        .iter()
        .flatten()
        .filter(|after| **after >= DEADLINE.mul_f64(0.9))
        .count();
    eprintln!(
        "{n} connections in {:?}: {held_to_deadline} held until the deadline; proxy RSS {} KiB before, peak {} KiB",
        started.elapsed(),
        before.rss / 1024,
        peak / 1024
    );
    (peak.saturating_sub(before.rss), held_to_deadline)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_stalled_connections_wait_apart_stay_bounded_and_are_shed_at_the_deadline() {
    let _alone = ONE_CROWD.lock().await;
    let n = crowd_size();

    // Defaults: every connection waits for its first record until the deadline, holding a
    // socket and a small task but no handshake place and no TLS state.
    let proxy = start_proxy(&[]);
    let (growth, held) = crowd(&proxy, n).await;
    assert!(
        held >= n * 9 / 10,
        "only {held} of {n} connections were held until the deadline"
    );
    for reason in ["waiting", "handshakes"] {
        assert_eq!(
            metric(
                &proxy,
                &format!("attest_proxy_connections_shed_total{{reason=\"{reason}\"}}")
            )
            .await,
            0.0,
            "shed by {reason}"
        );
    }
    let timed_out = metric(
        &proxy,
        "attest_proxy_handshake_duration_seconds_count{outcome=\"timeout\"}",
    )
    .await;
    assert!(
        timed_out >= held as f64,
        "{timed_out} timeouts for {held} held"
    );
    for gauge in [
        "attest_proxy_connections_waiting",
        "attest_proxy_handshakes_in_progress",
    ] {
        assert_eq!(metric(&proxy, gauge).await, 0.0, "{gauge}");
    }
    let per_connection = growth / u64::try_from(n).unwrap();
    assert!(
        per_connection < 8 << 10,
        "each waiting connection cost the proxy {per_connection} bytes"
    );
    drop(proxy);

    // The waiting bound: beyond it connections are closed at accept.
    let proxy = start_proxy(&["--max-waiting", &DEFAULT_MAX_HANDSHAKES.to_string()]);
    let (growth, held) = crowd(&proxy, n).await;
    assert!(
        held <= DEFAULT_MAX_HANDSHAKES,
        "{held} connections held, beyond the bound"
    );
    let shed = metric(
        &proxy,
        "attest_proxy_connections_shed_total{reason=\"waiting\"}",
    )
    .await;
    assert!(
        shed >= (n - DEFAULT_MAX_HANDSHAKES) as f64,
        "{shed} connections shed at accept of {n}"
    );
    assert!(
        growth < 48 << 20,
        "the proxy grew by {} KiB holding at most {DEFAULT_MAX_HANDSHAKES} waiting connections",
        growth / 1024
    );
}

/// The idle deadline of the post-handshake crowd.
const IDLE: Duration = Duration::from_secs(2);

/// Nodes for the post-handshake crowd: one whose quotes satisfy the harness policy, one whose
/// quotes carry other PCRs (the proxy refuses it after the handshake).
fn connectors() -> [Arc<atls::Connector>; 2] {
    [true, false].map(|attests| {
        let pcrs: Vec<_> = harness::BOOT_MEASUREMENTS
            .iter()
            .map(|&(index, b)| {
                let b = if attests { b } else { b ^ 0xff };
                (index, harness::extended_once(&[b; 32]))
            })
            .collect();
        let issuer = soft_issuer::SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs(pcrs)
            .unwrap();
        Arc::new(atls::Connector::new(Arc::new(issuer)))
    })
}

/// One silent connection after its handshake: when the proxy decided (its first bytes arrived),
/// and how long after that it closed the connection (`None`: still open `patience` after; zero:
/// closed before deciding).
type Held = (Instant, Option<Duration>);

/// The most connections open at once between the proxy's decision and its close.
fn most_held_at_once(held: &[Held]) -> usize {
    let mut events: Vec<(Instant, i64)> = Vec::with_capacity(held.len() * 2);
    for &(decided, closed) in held {
        if let Some(after) = closed.filter(|after| !after.is_zero()) {
            events.push((decided, 1));
            events.push((decided + after, -1));
        }
    }
    // A close and an open at the same instant: the close first.
    events.sort();
    let (mut open, mut most) = (0i64, 0i64);
    for (_, change) in events {
        open += change;
        most = most.max(open);
    }
    usize::try_from(most).unwrap()
}

/// Opens `n` connections, each from its own address, that complete the aTLS handshake and then
/// send nothing; returns for each when the proxy decided and how long after it closed it.
async fn hold_attested(target: SocketAddr, n: usize, patience: Duration) -> Vec<Held> {
    let connectors = connectors();
    // Handshakes cost CPU on both sides; a bounded number in flight keeps them within the
    // handshake deadline on a small machine.
    let handshaking = Arc::new(tokio::sync::Semaphore::new(32));
    let mut held = tokio::task::JoinSet::new();
    for index in 0..n {
        let permit = handshaking.clone().acquire_owned().await.unwrap();
        let connector = connectors[index % 2].clone();
        held.spawn(async move {
            let tcp = connect_from(index, target).await.unwrap();
            let mut tls = connector.connect(tcp).await.unwrap();
            // The proxy's first HTTP/2 bytes (its SETTINGS) follow its attestation decision,
            // which comes after the client's side of the handshake: the idle deadline runs
            // from there.
            let mut buf = [0u8; 256];
            let first = tokio::time::timeout(patience, tls.read(&mut buf)).await;
            drop(permit);
            let attested = Instant::now();
            if !matches!(first, Ok(Ok(1..))) {
                return (attested, Some(Duration::ZERO));
            }
            let closed = tokio::time::timeout(patience, async {
                loop {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            (attested, closed.ok().map(|()| attested.elapsed()))
        });
    }
    let mut closed = Vec::with_capacity(n);
    while let Some(result) = held.join_next().await {
        closed.push(result.unwrap());
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_silent_connections_after_the_handshake_are_closed_and_stay_bounded() {
    let _alone = ONE_CROWD.lock().await;
    let n = crowd_size();
    let proxy = start_proxy(&[
        "--idle-timeout",
        &humantime::format_duration(IDLE).to_string(),
        // Every connection comes from its own address; the verify queue must not refuse any.
        "--verify-queue",
        "100000",
    ]);
    let pid = proxy.process.id();
    let before = procstat::memory(pid).unwrap();
    let started = Instant::now();
    let patience = IDLE + Duration::from_secs(3);
    let held = hold_attested(proxy.addr, n, patience).await;
    let peak = procstat::memory(pid).unwrap().peak_rss;
    let most_at_once = most_held_at_once(&held);
    let closed: Vec<Option<Duration>> = held.iter().map(|&(_, closed)| closed).collect();
    let open = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(
        open,
        0,
        "{open} of {n} connections were still open {patience:?} after their handshake (idle timeout {IDLE:?}); log:\n{}",
        proxy.process.log()
    );
    let undecided = closed
        .iter()
        .filter(|c| **c == Some(Duration::ZERO))
        .count();
    assert_eq!(
        undecided, 0,
        "{undecided} connections were closed before the proxy answered their handshake"
    );
    let latest = closed.iter().flatten().max().copied().unwrap_or_default();
    eprintln!(
        "{n} connections in {:?}, the last closed {latest:?} after its handshake; proxy RSS {} KiB before, peak {} KiB",
        started.elapsed(),
        before.rss / 1024,
        peak / 1024
    );
    let attested = metric(
        &proxy,
        "attest_proxy_handshake_duration_seconds_count{outcome=\"completed\"}",
    )
    .await;
    assert!(
        attested >= n as f64,
        "{attested} handshakes completed of {n}"
    );
    // At most the connections of one idle period are open at once, however fast they come;
    // each holds its TLS and HTTP/2 state until then. The proxy's growth is bounded by what it
    // holds at once: a fixed part (runtime, verify pool, the handshakes in flight) and a bounded
    // cost per connection held, not by how many connections came in all.
    let growth = peak.saturating_sub(before.rss);
    let per_held =
        growth.saturating_sub(FIXED_GROWTH) / u64::try_from(most_at_once.max(1)).unwrap();
    eprintln!(
        "at most {most_at_once} connections held at once after their handshake; growth {} KiB, {} KiB per held connection beyond {} KiB",
        growth / 1024,
        per_held / 1024,
        FIXED_GROWTH / 1024
    );
    assert!(
        most_at_once > 0 && most_at_once < n,
        "{most_at_once} of {n} connections were held at once: the idle deadline did not close them as they came"
    );
    assert!(
        per_held < PER_HELD_CONNECTION,
        "the proxy grew by {} KiB holding at most {most_at_once} silent connections after their handshake: {} KiB each beyond {} KiB",
        growth / 1024,
        per_held / 1024,
        FIXED_GROWTH / 1024
    );
}

/// Nodes that talk keep attesting while a crowd of 10,000 that connected first stays silent or
/// stalls inside its first record (each member from its own address, opened again whenever the
/// proxy closes it): the crowd waits apart and takes none of the handshake places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_attest_while_ten_thousand_stalled_connections_are_held() {
    let _alone = ONE_CROWD.lock().await;
    let n = crowd_size();
    let proxy = start_proxy(&[]);
    let crowd = loadgen::crowd::Crowd::hold(proxy.addr, n).await.unwrap();
    let waiting = metric(&proxy, "attest_proxy_connections_waiting").await;
    eprintln!(
        "crowd of {n}: {} open, {waiting} waiting at the proxy",
        crowd.open()
    );
    const NODES: usize = 64;
    let [attests, _] = connectors();
    let at_once = Arc::new(tokio::sync::Semaphore::new(8));
    let target = proxy.addr;
    let mut nodes = tokio::task::JoinSet::new();
    for index in 0..NODES {
        let (connector, at_once) = (attests.clone(), at_once.clone());
        nodes.spawn(async move {
            let _turn = at_once.acquire().await.unwrap();
            tokio::time::timeout(DEADLINE, async {
                let tcp = connect_from(index, target)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut tls = connector.connect(tcp).await.map_err(|e| e.to_string())?;
                // The proxy's first HTTP/2 bytes follow its decision on the node.
                let mut buf = [0u8; 64];
                match tls.read(&mut buf).await {
                    Ok(1..) => Ok(()),
                    other => Err(format!("no answer after the handshake: {other:?}")),
                }
            })
            .await
            .unwrap_or_else(|_| Err(format!("not decided within {DEADLINE:?}")))
        });
    }
    let mut failed = Vec::new();
    while let Some(result) = nodes.join_next().await {
        if let Err(error) = result.unwrap() {
            failed.push(error);
        }
    }
    let held = crowd.open();
    let stats = crowd.stop().await;
    eprintln!("crowd: {stats:?}, {held} open when the nodes were done");
    assert!(
        failed.is_empty(),
        "{} of {NODES} nodes did not attest beside the crowd, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(
        metric(
            &proxy,
            "attest_proxy_connections_shed_total{reason=\"handshakes\"}"
        )
        .await,
        0.0
    );
    assert!(
        held >= n * 9 / 10,
        "only {held} of the crowd's {n} were held open while the nodes attested"
    );
}
