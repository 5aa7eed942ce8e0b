//! The load generator's nodes verify the service, as `join-client --service-policy` does: against
//! the whole system with an attested service (the certifier as its own process on the
//! control-plane swtpm, certifying attest-proxy's key), nodes with the service policy join, and
//! nodes whose policy expects other measurements refuse the server in the handshake, each with
//! the failed check, and never join.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use loadgen::{LoadConfig, Mode, SoftAttestation, Stop, Target};
use node_client::{Backoff, ServicePolicy};
use soft_issuer::KeyType;
use testsupport::harness::{Options, System};

/// The service attests itself; the nodes attest with software keys, new for each node.
async fn attested_service() -> System {
    System::start(Options {
        certifier: true,
        trust_any_ak: true,
        ..Options::default()
    })
    .await
    .unwrap()
}

/// Nodes with soft-issuer keys that satisfy the service's policy and check the service with
/// the service policy in `policy`.
fn verifying_nodes(system: &System, policy: &Path) -> Arc<Target> {
    let policy = ServicePolicy::load(Variant::QemuVtpm, policy).unwrap();
    Arc::new(Target::Atls {
        addr: system.proxy_addr,
        attestation: SoftAttestation::matching_harness_policy(KeyType::EcdsaP256)
            .unwrap()
            .into(),
        server_policy: Some(policy.server_policy().clone()),
    })
}

fn config(label: &str, count: u64, retry: Option<Backoff>) -> LoadConfig {
    LoadConfig {
        label: label.to_owned(),
        mode: Mode::Closed {
            concurrency: 3,
            stop: Stop::Count(count),
        },
        timeout: Duration::from_secs(20),
        retry,
        node_prefix: loadgen::run::random_prefix(),
        spread_sources: true,
        pregenerate: count,
        collateral_metrics: None,
        api_server: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_the_service_policy_join_the_attested_service() {
    let system = attested_service().await;
    let target = verifying_nodes(&system, &system.paths.service_policy);
    let report = loadgen::run::run(target, &config("C-mutual", 9, None), &[])
        .await
        .unwrap();
    assert_eq!(
        (report.succeeded, report.failed, report.retries),
        (9, 0, 0),
        "{report}\n{}",
        system.logs()
    );
    // Each join really went through: one JoiningNode per node.
    assert_eq!(system.kube.joining_nodes().await.len(), 9, "{report}");
    // The evidence the nodes checked came from the certifier, not from a key of the proxy's own.
    assert!(
        system.logs().contains("certified a server key"),
        "{}",
        system.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_expecting_other_measurements_refuse_the_service_and_do_not_join() {
    let system = attested_service().await;
    // The control plane's own attestation keys, but PCR 4 as another boot chain would leave it.
    let mut policy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&system.paths.service_policy).unwrap()).unwrap();
    policy["measurements"]["4"]["expected"] = hex::encode([0xee; 32]).into();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("otherServicePolicy");
    std::fs::write(&other, policy.to_string()).unwrap();

    let target = verifying_nodes(&system, &other);
    // Retrying as nodes do: a refused server is final, never retried.
    let retry = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(50),
        give_up_after: Duration::from_secs(5),
    };
    let report = loadgen::run::run(target, &config("other measurements", 6, Some(retry)), &[])
        .await
        .unwrap();
    assert_eq!(
        (report.succeeded, report.failed, report.retries),
        (0, 6, 0),
        "{report}\n{}",
        system.logs()
    );
    assert_eq!(report.errors.len(), 1, "{report}");
    let error = &report.errors[0];
    assert_eq!((error.code.as_str(), error.count), ("Unauthenticated", 6));
    // The node's own refusal of the server, naming the check, not the service refusing the node.
    assert!(
        error.class.starts_with("server refused [measurements]: "),
        "{}",
        error.class
    );
    // Nothing reached the service: no join, no bootstrap token.
    assert!(system.kube.joining_nodes().await.is_empty(), "{report}");
    assert!(system.kube.bootstrap_tokens().await.is_empty(), "{report}");
}
