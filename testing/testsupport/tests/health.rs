//! Every service process's admin endpoint, end to end: liveness, readiness that follows the
//! real dependencies, and the metrics a join moves.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plumbing::admin::get as admin_get;
use testsupport::harness::{Options, System, join_request};

/// Polls `/readyz` until it answers `want`, returning the last body.
async fn wait_ready(addr: SocketAddr, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = admin_get(addr, "/readyz").await.unwrap();
        if status == want || Instant::now() > deadline {
            assert_eq!(status, want, "{addr}/readyz: {body}");
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metrics(addr: SocketAddr) -> String {
    let (status, body) = admin_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_dependencies_and_a_join_moves_the_metrics() {
    let mut system = System::start(Options::default()).await.unwrap();
    let admin = system.admin;
    for addr in [admin.proxy, admin.join_core, admin.token_issuer] {
        assert_eq!(admin_get(addr, "/livez").await.unwrap().0, 200);
    }
    let proxy = wait_ready(admin.proxy, 200).await;
    assert_eq!(proxy, "ok join-core\n");
    let core = wait_ready(admin.join_core, 200).await;
    assert_eq!(core, "ok key_service\nok token_issuer\n");
    let issuer = wait_ready(admin.token_issuer, 200).await;
    assert_eq!(issuer, "ok kubernetes_api\n");

    {
        let issuer = system.issuer().unwrap();
        let client = system.client(issuer).unwrap();
        let request = join_request("worker-0", "6a1c0f3e-0000-4000-8000-000000000001").unwrap();
        client.join(request).await.unwrap();
    }
    let core = metrics(admin.join_core).await;
    for line in [
        r#"join_core_tickets_total{method="IssueJoinTicket",result="issued",reason="ok"} 1"#,
        r#"join_core_backend_call_duration_seconds_count{backend="key_service",outcome="ok"} 3"#,
        r#"join_core_backend_call_duration_seconds_count{backend="token_issuer",outcome="ok"} 1"#,
    ] {
        assert!(core.contains(line), "missing {line}:\n{core}");
    }
    let issuer = metrics(admin.token_issuer).await;
    for line in [
        r#"token_issuer_credentials_total{result="issued",step="ok"} 1"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="create_secret",outcome="ok"} 1"#,
    ] {
        assert!(issuer.contains(line), "missing {line}:\n{issuer}");
    }
    let proxy = metrics(admin.proxy).await;
    for line in [
        "attest_proxy_policy_failing 0",
        r#"attest_proxy_attestations_total{result="accepted",check="none"} 1"#,
        r#"attest_proxy_handshake_duration_seconds_count{outcome="completed"} 1"#,
        "attest_proxy_verification_duration_seconds_count 1",
    ] {
        assert!(proxy.contains(line), "missing {line}:\n{proxy}");
    }

    // The key service goes away: join-core stops being ready and says why; the others stay.
    system.keyservice.kill();
    let core = wait_ready(admin.join_core, 503).await;
    assert!(core.contains("failed key_service"), "{core}");
    assert!(core.contains("ok token_issuer"), "{core}");
    wait_ready(admin.token_issuer, 200).await;
    // Liveness never depends on another process.
    assert_eq!(admin_get(admin.join_core, "/livez").await.unwrap().0, 200);

    // token-issuer goes away: join-core names it too, and the proxy still reaches join-core.
    system.token_issuer.kill();
    let core = wait_ready(admin.join_core, 503).await;
    assert!(core.contains("failed token_issuer"), "{core}");
    wait_ready(admin.proxy, 200).await;
}
