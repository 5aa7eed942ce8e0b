//! The admin endpoint of a real, in-process attest-proxy: readiness follows join-core's socket,
//! and a refused policy file shows in the metrics without taking the proxy out of service.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser as _;

const POLICY: &str = r#"{"measurements": {"4": {"expected": "4444444444444444444444444444444444444444444444444444444444444444", "warnOnly": false}}, "trustedAkDigests": ["abababababababababababababababababababababababababababababababab"]}"#;

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    plumbing::admin::get(addr, path).await.unwrap()
}

async fn wait_for_metric(addr: SocketAddr, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        if body.lines().any(|l| l == line) {
            return body;
        }
        assert!(Instant::now() < deadline, "no {line:?} in\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn readiness_and_policy_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("attestationConfig");
    let socket = dir.path().join("join-core.sock");
    std::fs::write(&policy, POLICY).unwrap();
    let uid = testsupport::harness::own_uid().unwrap().to_string();
    let config = attest_proxy::Config::try_parse_from([
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
        "--policy-poll-interval",
        "50ms",
    ])
    .unwrap();
    let proxy = attest_proxy::Proxy::bind(config).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let current = proxy.policy();
    let (trigger, shutdown) = plumbing::shutdown::channel();
    let serving = tokio::spawn(proxy.serve(shutdown));

    assert_eq!(get(admin, "/livez").await.0, 200);
    // join-core is not listening yet.
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("failed join-core: cannot connect to"),
        "{body}"
    );
    let _join_core = tokio::net::UnixListener::bind(&socket).unwrap();
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok join-core\n"));

    let body = wait_for_metric(admin, "attest_proxy_policy_failing 0").await;
    assert!(
        body.contains("attest_proxy_policy_reloads_total{result=\"failed\"} 0"),
        "{body}"
    );

    // A broken file: counted, flagged, the old policy still enforced, and still ready.
    let digest = current.status().digest;
    std::fs::write(&policy, "{\"measurements\": ").unwrap();
    let body = wait_for_metric(admin, "attest_proxy_policy_failing 1").await;
    assert!(
        body.contains("attest_proxy_policy_reloads_total{result=\"failed\"} 1"),
        "{body}"
    );
    let status = current.status();
    assert_eq!(status.digest, digest);
    assert!(
        status
            .last_error
            .unwrap()
            .contains("not a valid qemu-vtpm policy")
    );
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!(
            "warn policy: enforcing the last good policy {digest} because the file on disk is refused"
        )),
        "{body}"
    );

    // Fixed: applied and no longer flagged.
    std::fs::write(&policy, POLICY.replace("44444444", "55555555")).unwrap();
    let body = wait_for_metric(admin, "attest_proxy_policy_failing 0").await;
    assert!(
        body.contains("attest_proxy_policy_reloads_total{result=\"ok\"} 1"),
        "{body}"
    );
    assert_ne!(current.status().digest, digest);
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok join-core\n"));
    wait_for_metric(admin, "attest_proxy_trust_any_ak 0").await;

    // Trusting any key works, but shows as a note and a metric while it lasts.
    let any = POLICY.replace(
        r#""trustedAkDigests": ["abababababababababababababababababababababababababababababababab"]"#,
        r#""trustAnyAk": true"#,
    );
    std::fs::write(&policy, any).unwrap();
    wait_for_metric(admin, "attest_proxy_trust_any_ak 1").await;
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("warn attestation-keys: policy ")
            && body.contains("trusts any attestation key"),
        "{body}"
    );
    std::fs::write(&policy, POLICY).unwrap();
    wait_for_metric(admin, "attest_proxy_trust_any_ak 0").await;
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok join-core\n"));

    trigger.fire();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
