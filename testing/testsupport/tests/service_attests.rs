//! End to end, the service attests itself: the certifier runs as its own process on the
//! control-plane node's swtpm and certifies attest-proxy's key; a node with a service policy
//! joins through all the real processes, and refuses a service that is not the one its policy
//! names, or that presents no evidence, before sending anything.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use attestation::Variant;
use attestation::audit::Decision;
use node_client::{ClientError, ServicePolicy};
use testsupport::harness::{Options, System, join_request};

/// The audit record of the refusal a node with `policy` meets when it asks `system`.
async fn refusal(system: &System, policy: ServicePolicy) -> Decision {
    let client = system
        .client(system.issuer().unwrap())
        .unwrap()
        .with_service_policy(policy);
    match client.rejoin("disk").await {
        Err(ClientError::ServerRefused { decision, .. }) => *decision,
        other => panic!("expected a server refusal, got {other:?}"),
    }
}

fn attesting() -> Options {
    Options {
        certifier: true,
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_service_policy_joins_and_rejoins_the_attested_service() {
    let system = System::start(attesting()).await.unwrap();
    let policy = ServicePolicy::load(Variant::QemuVtpm, &system.paths.service_policy).unwrap();
    let client = system
        .client(system.issuer().unwrap())
        .unwrap()
        .with_service_policy(policy);
    let disk = "5d1c2b3a-0f4e-4c6d-8b7a-9e8f7a6b5c4d";
    let ticket = client
        .join(join_request("worker-1", disk).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(ticket.state_disk_key.len(), 32);
    let rejoined = client.rejoin(disk).await.unwrap();
    assert_eq!(rejoined.state_disk_key, ticket.state_disk_key);
    assert!(
        system.logs().contains("certified a server key"),
        "{}",
        system.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_a_service_on_another_machine() {
    let system = System::start(attesting()).await.unwrap();
    // The service's policy pins the node's swtpm, not the control plane's: a policy for another
    // machine, with the same measurements.
    let policy = ServicePolicy::load(Variant::QemuVtpm, &system.paths.attestation_config).unwrap();
    let decision = refusal(&system, policy).await;
    assert_eq!(decision.check.as_deref(), Some("ak_untrusted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_a_service_that_does_not_attest() {
    let reference = System::start(attesting()).await.unwrap();
    let policy = ServicePolicy::load(Variant::QemuVtpm, &reference.paths.service_policy).unwrap();
    drop(reference);
    let system = System::start(Options::default()).await.unwrap();
    let decision = refusal(&system, policy).await;
    assert_eq!(decision.check.as_deref(), Some("server_evidence_missing"));
    assert!(system.kube.bootstrap_tokens().await.is_empty());
}

/// A node without a service policy (as every Go Constellation node is: it passes no validator
/// and only checks the certificate's self-signature and dates) joins the attested service exactly
/// as it joins one that does not attest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_service_policy_joins_the_attested_service() {
    let system = System::start(attesting()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    assert!(!client.verifies_service());
    let disk = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    let ticket = client
        .join(join_request("worker-2", disk).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    assert_eq!(ticket.state_disk_key.len(), 32);
    assert!(
        system.logs().contains("certified a server key"),
        "the service presented certified evidence: {}",
        system.logs()
    );
}
