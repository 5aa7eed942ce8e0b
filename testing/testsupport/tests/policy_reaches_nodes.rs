//! A tightened measurement policy reaches a node that has joined before: its client dials per
//! call and the proxy serves one call per connection, so no connection attested under the old
//! policy carries the node's next call.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use testsupport::harness::{self, Options, System};

const DISK: &str = "6a2e4c1d-8b3f-4e5a-9c7d-1f0e2d3c4b5a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_policy_refuses_a_joined_node_on_its_next_call() {
    let system = System::start(Options::default()).await.unwrap();
    let issuer = system.issuer().unwrap();
    let client = system.client(issuer).unwrap();
    client
        .join(harness::join_request("worker-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));

    // Tighten: PCR 15 must now hold a value this node's TPM never measured.
    let tightened = system.attestation_config(&[(15, [0x15; 32], false)]);
    let digest = attestation::QemuVtpmConfig::from_attestation_config(tightened.as_bytes())
        .unwrap()
        .digest();
    let dir = system.paths.attestation_config.parent().unwrap();
    harness::project_config_map(dir, &[("attestationConfig", tightened.as_bytes())]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !system
        .proxy
        .log()
        .lines()
        .any(|l| l.contains("measurement policy reloaded") && l.contains(&digest))
    {
        assert!(
            Instant::now() < deadline,
            "the tightened policy was not loaded\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The same client, the same node: its next call is refused, and so is a rejoin.
    let refused = tokio::time::timeout(Duration::from_secs(30), client.rejoin(DISK))
        .await
        .expect("the rejoin was not answered in time")
        .unwrap_err();
    match refused {
        node_client::ClientError::Status(status) => {
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            assert!(status.message().contains("measurement 15"), "{status:?}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
}
