//! Faults under a continuous stream of joins.
//!
//! Each test starts the whole system (real processes, `testsupport::harness::System`) and runs a
//! storm: a few workers joining simulated nodes one after another (soft-issuer documents that
//! match the harness's policy, each node from its own loopback address, no retries, so every
//! attempt is seen). Then it breaks something and checks what the nodes saw: which joins failed,
//! with which status, how long they took, and what was left in the Kubernetes API.
//!
//! The tests run one at a time (each storm wants the machine) and need the workspace binaries
//! (`cargo build --workspace --bins`). Times are bounded generously (a deadline plus seconds), as
//! a busy 2-core machine needs.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgen::node::{loopback_source, node_ip};
use loadgen::report::Failure;
use loadgen::{SoftAttestation, Target};
use soft_issuer::KeyType;
use testsupport::harness::{self, JunkDocument, Options, Service, System};
use testsupport::kube_faults::Fault;
use testsupport::process::Signal;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tonic::Code;

/// The simulated nodes attest with software keys, a new one per node: the harness's policy must
/// trust any attestation key instead of pinning its swtpm's.
fn soft_keys() -> Options {
    Options {
        trust_any_ak: true,
        ..Options::default()
    }
}

/// Storms take turns: two at once on two cores would measure each other.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Workers joining at once.
const WORKERS: u64 = 4;
/// The node's own deadline for one join; the service's deadlines are shorter, so a node sees
/// the service's answer, and a join that reaches this hung.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// join-core's longest deadline (token-issuer, 10 s) plus slack for a busy machine: no failed
/// join may take longer.
const SERVICE_DEADLINE: Duration = Duration::from_secs(12);

/// One join attempt of the storm.
#[derive(Clone, Debug)]
struct Join {
    node: String,
    started: Instant,
    ended: Instant,
    result: Result<(), Failure>,
}

impl Join {
    fn took(&self) -> Duration {
        self.ended - self.started
    }

    /// Whether the attempt overlapped `[from, to]`.
    fn overlaps(&self, from: Instant, to: Instant) -> bool {
        self.started <= to && self.ended >= from
    }
}

/// A continuous stream of joins until stopped.
struct Storm {
    stop: Arc<AtomicBool>,
    joins: Arc<Mutex<Vec<Join>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Storm {
    fn start(system: &System) -> Self {
        let target = Arc::new(Target::Atls {
            addr: system.proxy_addr,
            server_policy: None,
            attestation: SoftAttestation::matching_harness_policy(KeyType::EcdsaP256)
                .unwrap()
                .into(),
        });
        let prefix = loadgen::run::random_prefix();
        let next = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let joins = Arc::new(Mutex::new(Vec::new()));
        let workers = (0..WORKERS)
            .map(|_| {
                let (target, prefix, next) = (target.clone(), prefix.clone(), next.clone());
                let (stop, joins) = (stop.clone(), joins.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let name = format!("{prefix}-{index}");
                        let node = target
                            .node(&name, node_ip(index), Some(loopback_source(index)))
                            .unwrap();
                        let started = Instant::now();
                        let result = node.join(CLIENT_TIMEOUT).await;
                        let failed = result.is_err();
                        joins.lock().unwrap().push(Join {
                            node: name,
                            started,
                            ended: Instant::now(),
                            result,
                        });
                        if failed {
                            // A refusal comes at once; the next node need not spin on it.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            joins,
            workers,
        }
    }

    fn joins(&self) -> Vec<Join> {
        self.joins.lock().unwrap().clone()
    }

    /// Waits until `n` joins that started at or after `since` have succeeded.
    async fn successes_since(&self, since: Instant, n: usize, system: &System) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let joins = self.joins();
            let ok = joins
                .iter()
                .filter(|j| j.started >= since && j.result.is_ok())
                .count();
            if ok >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {ok} of {n} joins succeeded; the last attempts: {:?}\n{}",
                joins.iter().rev().take(8).collect::<Vec<_>>(),
                system.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until a join that ended after `since` has failed.
    async fn failure_since(&self, since: Instant, system: &System) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .joins()
            .iter()
            .any(|j| j.ended >= since && j.result.is_err())
        {
            assert!(
                Instant::now() < deadline,
                "no join failed since the fault\n{}",
                system.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops starting joins, waits for the ones in flight, returns every attempt.
    async fn stop(self) -> Vec<Join> {
        self.stop.store(true, Ordering::SeqCst);
        for worker in self.workers {
            worker.await.unwrap();
        }
        let mut joins = self.joins.lock().unwrap().clone();
        joins.sort_by_key(|j| j.started);
        joins
    }
}

fn failures(joins: &[Join]) -> Vec<&Join> {
    joins.iter().filter(|j| j.result.is_err()).collect()
}

fn code(join: &Join) -> Option<Code> {
    join.result.as_ref().err().map(|f| f.code)
}

/// No join failed, and there were some.
fn assert_all_joined(joins: &[Join], at_least: usize, system: &System) {
    let failed = failures(joins);
    assert!(
        failed.is_empty(),
        "{} of {} joins failed: {failed:?}\n{}",
        failed.len(),
        joins.len(),
        system.logs()
    );
    assert!(joins.len() >= at_least, "only {} joins", joins.len());
}

/// The processes' ids, to show that the ones a test did not touch were not restarted.
fn pids(system: &mut System) -> Vec<(Service, u32)> {
    [
        Service::Proxy,
        Service::JoinCore,
        Service::TokenIssuer,
        Service::KeyService,
    ]
    .into_iter()
    .map(|service| (service, system.process(service).id()))
    .collect()
}

fn assert_untouched(system: &mut System, before: &[(Service, u32)], except: Service) {
    for &(service, pid) in before {
        if service == except {
            continue;
        }
        let process = system.process(service);
        assert_eq!(process.id(), pid, "{service:?} was restarted");
        process.check_running().unwrap();
    }
}

/// The node names the join objects in the API server are for: (JoiningNodes, token Secrets).
async fn objects_for(system: &System) -> (BTreeSet<String>, BTreeSet<String>) {
    let joining = system
        .kube
        .joining_nodes()
        .await
        .iter()
        .map(|o| {
            o.data["spec"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let tokens = system
        .kube
        .bootstrap_tokens()
        .await
        .iter()
        .map(|s| {
            let description = s
                .data
                .as_ref()
                .and_then(|data| data.get("description"))
                .map(|d| String::from_utf8_lossy(&d.0).into_owned())
                .unwrap_or_default();
            description
                .strip_prefix("Bootstrap token for node ")
                .and_then(|rest| rest.split(',').next())
                .unwrap_or(&description)
                .to_owned()
        })
        .collect();
    (joining, tokens)
}

/// Exactly the joins that succeeded have a JoiningNode and a bootstrap token, once rollbacks of
/// failed joins have finished.
async fn assert_nothing_left_behind(system: &System, joins: &[Join]) {
    let succeeded: BTreeSet<String> = joins
        .iter()
        .filter(|j| j.result.is_ok())
        .map(|j| j.node.clone())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (joining, tokens) = objects_for(system).await;
        if joining == succeeded && tokens == succeeded {
            return;
        }
        if Instant::now() > deadline {
            let extra = |found: &BTreeSet<String>| {
                found.difference(&succeeded).cloned().collect::<Vec<_>>()
            };
            let missing =
                |found: &BTreeSet<String>| succeeded.difference(found).cloned().collect::<Vec<_>>();
            panic!(
                "left behind: JoiningNodes {:?}, tokens {:?}; missing: JoiningNodes {:?}, tokens {:?}\n{}",
                extra(&joining),
                extra(&tokens),
                missing(&joining),
                missing(&tokens),
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// kill -9 join-core, then token-issuer, then the key service, each restarted with its first
/// command line after a while: joins in flight or started while it is down fail fast with
/// `Unavailable`, every join started once it is back succeeds, and no other process restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_fail_joins_fast_and_recover_when_restarted() {
    let _machine = MACHINE.lock().await;
    let mut system = System::start(soft_keys()).await.unwrap();
    let storm = Storm::start(&system);
    storm.successes_since(Instant::now(), 3, &system).await;
    let mut outages = Vec::new();
    for service in [Service::JoinCore, Service::TokenIssuer, Service::KeyService] {
        let before = pids(&mut system);
        let killed = Instant::now();
        let process = system.process(service);
        process.signal(Signal::Kill).unwrap();
        process.wait_exit(Duration::from_secs(5)).unwrap();
        // The storm runs into the gap until a join has failed because of it: join-core
        // retries the key service for a few seconds before it gives up.
        storm.failure_since(killed, &system).await;
        system.restart(service).unwrap();
        let back = Instant::now();
        assert_untouched(&mut system, &before, service);
        storm.successes_since(back, 4, &system).await;
        outages.push((service, killed, back));
    }
    let joins = storm.stop().await;

    for &(service, killed, back) in &outages {
        let affected: Vec<&Join> = joins
            .iter()
            .filter(|j| j.overlaps(killed, back) && j.result.is_err())
            .collect();
        assert!(!affected.is_empty(), "no join noticed {service:?} was down");
        for join in &affected {
            assert_eq!(
                code(join),
                Some(Code::Unavailable),
                "{service:?} down: {join:?}"
            );
            assert!(
                join.took() <= SERVICE_DEADLINE,
                "{service:?} down: a join hung for {:?}: {join:?}",
                join.took()
            );
        }
    }
    // Every join outside the outages succeeded, all the later ones included.
    let unexpected: Vec<&Join> = joins
        .iter()
        .filter(|j| j.result.is_err())
        .filter(|j| !outages.iter().any(|&(_, k, b)| j.overlaps(k, b)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "joins failed while every process was up: {unexpected:?}\n{}",
        system.logs()
    );
    eprintln!(
        "{} joins, {} failed during the outages",
        joins.len(),
        failures(&joins).len()
    );
}

/// The Kubernetes API slow, answering 500 and 429, and now and then slower than join-core's
/// deadline: failed joins fail within the deadline with a status that says "retry", token-issuer
/// gives up after a bounded number of calls, and exactly the joins that succeeded have a token
/// and a JoiningNode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_api_faults_hold_deadlines_and_leave_nothing_behind() {
    let _machine = MACHINE.lock().await;
    let system = System::start(soft_keys()).await.unwrap();
    let storm = Storm::start(&system);
    storm.successes_since(Instant::now(), 3, &system).await;

    // Slow: every call takes 400 ms (a join makes a handful), within every deadline.
    system.kube.set_delay(Duration::from_millis(400));
    tokio::time::sleep(Duration::from_secs(3)).await;
    system.kube.set_delay(Duration::ZERO);
    // Errors: 500s and 429s on the writes and reads a join makes. (Not on the rollback's
    // DELETE: token-issuer leaves a JoiningNode it cannot delete to expire at its deadline.)
    for (code, method, path) in [
        (500, "POST", "/secrets"),
        (429, "POST", "/joiningnodes"),
        (500, "GET", "/nodeversions"),
        (429, "POST", "/secrets"),
    ] {
        system
            .kube
            .inject(Fault::once(code).on(method).at(path).times(3));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Slower than join-core's 10 s deadline for token-issuer, for a few token writes: those
    // joins end in DeadlineExceeded and token-issuer removes what it wrote.
    system.kube.inject(
        Fault::slow(Duration::from_secs(11))
            .on("POST")
            .at("/secrets")
            .times(2),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calm = Instant::now();
    storm.successes_since(calm, 4, &system).await;
    let joins = storm.stop().await;

    let failed = failures(&joins);
    assert!(!failed.is_empty(), "no fault reached a join");
    for join in &failed {
        assert!(
            matches!(
                code(join),
                Some(Code::Unavailable | Code::DeadlineExceeded | Code::Aborted)
            ),
            "a fault of the API became {join:?}"
        );
        assert!(
            join.took() <= SERVICE_DEADLINE,
            "a join outlived the deadline: {:?}: {join:?}",
            join.took()
        );
    }
    // Joins started after the faults were used up all succeeded.
    let late: Vec<&Join> = failed
        .iter()
        .copied()
        .filter(|j| j.started >= calm)
        .collect();
    assert!(late.is_empty(), "failed after the faults: {late:?}");

    assert_nothing_left_behind(&system, &joins).await;
    // Retries are bounded: once the storm and the rollbacks are over, the API hears nothing more,
    // and no join cost more than a handful of calls.
    let settled = system.kube.requests().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = system.kube.requests();
    assert_eq!(
        requests.len(),
        settled,
        "calls after the storm: {:?}",
        &requests[settled..]
    );
    let per_join = requests.len() as f64 / joins.len() as f64;
    assert!(
        per_join < 12.0,
        "{} API calls for {} joins",
        requests.len(),
        joins.len()
    );
    eprintln!(
        "{} joins, {} failed by API faults, {per_join:.1} API calls per join",
        joins.len(),
        failed.len()
    );
}

/// The attestation config rewritten every 100 ms between equivalent policies (a warn-only
/// register toggled) and re-read by the proxy every 50 ms: no join fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_reloads_every_100ms_fail_no_join() {
    let _machine = MACHINE.lock().await;
    let system = System::start(Options {
        proxy_args: vec!["--policy-poll-interval".into(), "50ms".into()],
        ..soft_keys()
    })
    .await
    .unwrap();
    let reloads_before = policy_reloads(&system).await;
    let storm = Storm::start(&system);
    let path = system.paths.attestation_config.clone();
    let policies = [
        system.attestation_config(&[]),
        system.attestation_config(&[(16, [0xaa; 32], true)]),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let tmp = path.with_extension("tmp");
            let mut writes = 0usize;
            while !stop.load(Ordering::SeqCst) {
                // A whole file at once (rename), as a ConfigMap update lands.
                std::fs::write(&tmp, &policies[writes % 2]).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
                writes += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            writes
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    let joins = storm.stop().await;

    assert_all_joined(&joins, 10, &system);
    let reloads = policy_reloads(&system).await - reloads_before;
    assert!(
        reloads >= 20.0,
        "the proxy applied {reloads} of {writes} policy changes"
    );
    eprintln!(
        "{} joins, {writes} policy writes, {reloads} reloads applied",
        joins.len()
    );
}

async fn policy_reloads(system: &System) -> f64 {
    harness::metric(
        system.admin.proxy,
        "attest_proxy_policy_reloads_total{result=\"ok\"}",
    )
    .await
    .unwrap()
}

/// SIGTERM to each process in turn, with joins held in flight by a slow API: the joins in
/// flight finish within the grace period, joins that arrive meanwhile are refused cleanly
/// (`Unavailable`, at once), the process exits, and once restarted every join succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_joins_in_flight_finish_and_refuses_new_ones_cleanly() {
    let _machine = MACHINE.lock().await;
    let mut system = System::start(soft_keys()).await.unwrap();
    let storm = Storm::start(&system);
    storm.successes_since(Instant::now(), 3, &system).await;
    let target = Target::Atls {
        addr: system.proxy_addr,
        server_policy: None,
        attestation: SoftAttestation::matching_harness_policy(KeyType::EcdsaP256)
            .unwrap()
            .into(),
    };
    let mut outages = Vec::new();
    for (round, service) in [
        Service::Proxy,
        Service::JoinCore,
        Service::TokenIssuer,
        Service::KeyService,
    ]
    .into_iter()
    .enumerate()
    {
        // A join takes a few seconds now, most of it in token-issuer's API calls (after the
        // key service, in join-core and the proxy).
        system.kube.set_delay(Duration::from_millis(600));
        let in_flight: Vec<_> = (0..3u64)
            .map(|n| {
                let index = 1_000_000 + 10 * round as u64 + n;
                let node = target
                    .node(
                        &format!("inflight-{round}-{n}"),
                        node_ip(index),
                        Some(loopback_source(index)),
                    )
                    .unwrap();
                tokio::spawn(async move {
                    let started = Instant::now();
                    (node.join(CLIENT_TIMEOUT).await, started.elapsed())
                })
            })
            .collect();
        // Long enough to be past the handshake and the key service, short of the end.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = pids(&mut system);
        let terminated = Instant::now();
        system.process(service).signal(Signal::Term).unwrap();
        for (n, join) in in_flight.into_iter().enumerate() {
            let (result, took) = join.await.unwrap();
            assert!(
                result.is_ok(),
                "join {n} in flight at SIGTERM to {service:?} failed after {took:?}: {result:?}\n{}",
                system.logs()
            );
        }
        // The grace periods are 20 s; the joins in flight need a few.
        system
            .process(service)
            .wait_exit(Duration::from_secs(22))
            .unwrap();
        system.kube.set_delay(Duration::ZERO);
        system.restart(service).unwrap();
        let back = Instant::now();
        assert_untouched(&mut system, &before, service);
        storm.successes_since(back, 3, &system).await;
        outages.push((service, terminated, back));
    }
    let joins = storm.stop().await;

    for join in failures(&joins) {
        let during = outages
            .iter()
            .find(|&&(_, t, b)| join.overlaps(t, b))
            .map(|&(service, _, _)| service);
        assert!(
            during.is_some(),
            "a join failed while every process was up: {join:?}\n{}",
            system.logs()
        );
        assert_eq!(
            code(join),
            Some(Code::Unavailable),
            "not a clean refusal while {during:?} stopped: {join:?}"
        );
        assert!(
            join.took() <= SERVICE_DEADLINE,
            "a refusal took {:?}: {join:?}",
            join.took()
        );
    }
    eprintln!(
        "{} joins, {} refused while a process stopped",
        joins.len(),
        failures(&joins).len()
    );
}

async fn connect_from(host: u8, target: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(IpAddr::from([127, 0, 0, host]), 0))
        .unwrap();
    socket.connect(target).await.unwrap()
}

/// Waits until the server closes `tcp`, writing `trickle` one byte a second meanwhile; returns
/// how long that took.
async fn closed_after(mut tcp: TcpStream, trickle: &[u8]) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let mut bytes = trickle.iter();
    loop {
        tokio::select! {
            read = tcp.read(&mut buf) => match read {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            },
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if let Some(byte) = bytes.next() {
                    if tcp.write_all(&[*byte]).await.is_err() {
                        return started.elapsed();
                    }
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the proxy never closed the connection"
        );
    }
}

/// A ClientHello-shaped record: header, then a body that keeps the parser waiting for more.
fn slow_client_hello() -> Vec<u8> {
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00, 0x00, 0xfc, 0x03, 0x03,
    ];
    hello.extend_from_slice(&[0x42; 64]);
    hello
}

/// Slowloris (a ClientHello at one byte a second), garbage on the port, and certificates and
/// documents beyond the limits, each from its own address, while the storm runs: each is refused
/// within the handshake deadline and no join of the storm fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_are_refused_within_the_deadline_and_joins_go_on() {
    const DEADLINE: Duration = Duration::from_secs(3);
    let _machine = MACHINE.lock().await;
    let system = System::start(Options {
        proxy_args: vec!["--handshake-timeout".into(), "3s".into()],
        ..soft_keys()
    })
    .await
    .unwrap();
    let addr = system.proxy_addr;
    let storm = Storm::start(&system);
    storm.successes_since(Instant::now(), 2, &system).await;

    let mut hostile = tokio::task::JoinSet::new();
    for n in 0..6u8 {
        // Byte-a-second handshakes, and silence after a connect.
        hostile.spawn(async move {
            let trickle = if n % 2 == 0 {
                slow_client_hello()
            } else {
                vec![]
            };
            (
                "slowloris",
                closed_after(connect_from(10 + n, addr).await, &trickle).await,
            )
        });
        // Garbage: HTTP/1.1, and random bytes.
        hostile.spawn(async move {
            let mut tcp = connect_from(20 + n, addr).await;
            let garbage: Vec<u8> = if n % 2 == 0 {
                b"GET / HTTP/1.1\r\nhost: join\r\n\r\n".to_vec()
            } else {
                (0..4096).map(|_| rand::random::<u8>()).collect()
            };
            let _ = tcp.write_all(&garbage).await;
            ("garbage", closed_after(tcp, &[]).await)
        });
        // A certificate beyond the 64 KiB limit, and a junk document just under it.
        for (what, size, host) in [
            ("oversized certificate", 200 * 1024, 30 + n),
            ("junk document", 60 * 1024, 40 + n),
        ] {
            hostile.spawn(async move {
                let connector = atls::Connector::new(Arc::new(JunkDocument { size }));
                let started = Instant::now();
                let tcp = connect_from(host, addr).await;
                match connector.connect(tcp).await {
                    // Refused in the handshake.
                    Err(_) => (what, started.elapsed()),
                    // Refused on the first call, and the connection is closed after it.
                    Ok(tls) => {
                        let handshake = hyper::client::conn::http2::handshake(
                            hyper_util::rt::TokioExecutor::new(),
                            hyper_util::rt::TokioIo::new(tls),
                        )
                        .await;
                        // TLS 1.3 lets the client finish before the server has looked at its
                        // certificate; refusing it, the proxy closes the connection.
                        let (mut send, connection) = match handshake {
                            Ok(handshake) => handshake,
                            Err(error) => {
                                assert_eq!(what, "oversized certificate", "{error}");
                                return (what, started.elapsed());
                            }
                        };
                        let closed = tokio::spawn(connection);
                        let request = http::Request::post("http://join/join.API/IssueJoinTicket")
                            .header("content-type", "application/grpc")
                            .body(tonic::body::Body::empty())
                            .unwrap();
                        let response = match send.send_request(request).await {
                            Ok(response) => response,
                            Err(error) => {
                                assert_eq!(what, "oversized certificate", "{error}");
                                return (what, started.elapsed());
                            }
                        };
                        let status = response
                            .headers()
                            .get("grpc-status")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<i32>().ok());
                        assert_eq!(
                            status,
                            Some(Code::Unauthenticated as i32),
                            "{what}: {response:?}"
                        );
                        drop(send);
                        let _ = closed.await;
                        (what, started.elapsed())
                    }
                }
            });
        }
    }
    while let Some(done) = hostile.join_next().await {
        let (what, took) = done.unwrap();
        assert!(
            took <= DEADLINE + Duration::from_secs(2),
            "{what} held the proxy for {took:?}"
        );
    }
    let after = Instant::now();
    storm.successes_since(after, 2, &system).await;
    let joins = storm.stop().await;
    assert_all_joined(&joins, 4, &system);
    eprintln!("{} joins during the hostile clients", joins.len());
}
