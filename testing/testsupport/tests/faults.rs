//! System-level failures: the key service down or hanging, token-issuer down, and an API server
//! so slow that join-core gives up on token-issuer. Each must reach the node as a specific
//! status and leave no token and no `JoiningNode` behind; the service recovers by itself.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use testsupport::harness::{Options, System, join_request, refusal};
use tonic::Code;

const DISK: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

/// Sends `signal` (`STOP`, `CONT`) to a process this test started.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// No Kubernetes write was even attempted.
async fn assert_kubernetes_untouched(system: &System, what: &str) {
    assert!(
        system.join_objects().await.is_empty(),
        "{what}: {:?}",
        system.join_objects().await
    );
    assert!(
        system.kube.requests().iter().all(|r| r.method == "GET"),
        "{what}: keys come first, so nothing was written: {:?}",
        system.kube.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_service_down_is_unavailable_and_creates_nothing() {
    let mut system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    system.keyservice.kill();
    let status = refusal(client.join(join_request("worker-1", DISK).unwrap()).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("key service"),
        "{}",
        status.message()
    );
    assert_kubernetes_untouched(&system, "key service down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_service_hanging_is_unavailable_within_the_deadline_and_creates_nothing() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let pid = system.keyservice.id();
    signal(pid, "STOP");
    let started = Instant::now();
    let result = client.join(join_request("worker-1", DISK).unwrap()).await;
    signal(pid, "CONT");
    let status = refusal(result);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("key service"),
        "{}",
        status.message()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "join-core's KMS deadline bounds the wait: {:?}",
        started.elapsed()
    );
    assert_kubernetes_untouched(&system, "key service hanging").await;
    // Once it answers again, the node joins.
    client
        .join(join_request("worker-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(
        system.join_objects().await.len(),
        2,
        "one token, one JoiningNode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_issuer_down_is_unavailable_and_creates_nothing() {
    let mut system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    system.token_issuer.kill();
    let before = system.kube.requests().len();
    let status = refusal(client.join(join_request("worker-1", DISK).unwrap()).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("token-issuer unreachable"),
        "{}",
        status.message()
    );
    assert_eq!(
        system.kube.requests().len(),
        before,
        "{:?}",
        system.kube.requests()
    );
    assert!(system.join_objects().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_slower_than_join_cores_deadline_leaves_nothing_behind() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    // Each API call takes 3 s: the two reads, the JoiningNode and the token outlast join-core's
    // 10 s deadline for token-issuer, which then finishes alone and, finding its caller gone,
    // removes both again.
    system.kube.set_delay(Duration::from_secs(3));
    let status = refusal(client.join(join_request("worker-1", DISK).unwrap()).await);
    assert_eq!(
        status.code(),
        Code::DeadlineExceeded,
        "{status:?}\n{}",
        system.logs()
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let created = system
            .kube
            .requests()
            .iter()
            .any(|r| r.method == "POST" && r.path.ends_with("/secrets"));
        if created && system.join_objects().await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}\n{:?}\n{}",
            system.join_objects().await,
            system.kube.requests(),
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    system.kube.set_delay(Duration::ZERO);
    client
        .join(join_request("worker-1", DISK).unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_down_is_unavailable_and_joins_resume_when_it_is_back() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    system.kube.proxy().set_down(true);
    let status = refusal(client.join(join_request("worker-1", DISK).unwrap()).await);
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "{status:?}\n{}",
        system.logs()
    );
    assert!(
        status.message().contains("Kubernetes API unreachable"),
        "{}",
        status.message()
    );
    system.kube.proxy().set_down(false);
    assert!(system.join_objects().await.is_empty());
    client
        .join(join_request("worker-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(
        system.join_objects().await.len(),
        2,
        "one token, one JoiningNode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_after_the_token_was_stored_leaves_nothing_behind() {
    use testsupport::kube_faults::Fault;
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    system.kube.inject(
        Fault::reset()
            .on("POST")
            .at("/api/v1/namespaces/kube-system/secrets")
            .after_commit(),
    );
    let status = refusal(client.join(join_request("worker-1", DISK).unwrap()).await);
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "{status:?}\n{}",
        system.logs()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !system.join_objects().await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}\n{}",
            system.join_objects().await,
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    client
        .join(join_request("worker-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
}
