//! A node with a service policy refuses a join service that cannot prove what it is, before
//! it sends the request, prints the audit record of the refusal and does not retry; it talks to
//! one that can. The servers are aTLS servers on loopback presenting real qemu-vtpm evidence from
//! soft-issuer's software key (or none); the node's own attestation is soft-issuer's too.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use atls::{Acceptor, ServerKey, Window};
use attestation::Variant;
use attestation::audit::Outcome;
use node_client::{Backoff, Client, ClientError, ServicePolicy};
use soft_issuer::SoftIssuer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const GOOD_PCR: [u8; 32] = [0x44; 32];

/// The control-plane node's software TPM, with PCR 4 = `pcr4`.
fn machine(pcr4: [u8; 32]) -> SoftIssuer {
    SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs([(4, pcr4)])
        .unwrap()
}

fn write_policy(dir: &Path, trusted: &SoftIssuer) -> std::path::PathBuf {
    let path = dir.join("service-policy.json");
    let json = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(GOOD_PCR), "warnOnly": false}},
        "trustedAkDigests": [hex::encode(attestation::ak_digest(trusted.ak_public()))],
    });
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// An aTLS server that reports, per connection, whether the handshake completed (a completed
/// handshake means the node sent its certificate and would send its request next).
async fn server(acceptor: Acceptor) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = Arc::new(acceptor);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let completed = acceptor.accept(tcp).await.is_ok();
                let _ = tx.send(completed);
            });
        }
    });
    (addr, rx)
}

fn node(addr: std::net::SocketAddr, policy: &Path) -> Client {
    let issuer = Arc::new(SoftIssuer::ecdsa_p256().unwrap());
    Client::new(addr, issuer, Duration::from_secs(10))
        .unwrap()
        .with_service_policy(ServicePolicy::load(Variant::QemuVtpm, policy).unwrap())
}

fn certified(tpm: &SoftIssuer) -> Acceptor {
    let now = SystemTime::now();
    Acceptor::with_credential(
        ServerKey::generate(Window::for_rotation_at(now))
            .unwrap()
            .certify_with(tpm, now)
            .unwrap(),
    )
}

async fn rejoin(client: &Client) -> (Result<(), ClientError>, u32) {
    let backoff = Backoff {
        give_up_after: Duration::from_secs(5),
        ..Backoff::default()
    };
    let retried = backoff
        .run(|| async { client.rejoin("disk").await.map(|_| ()) })
        .await;
    (retried.result, retried.retries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_an_unattested_service_with_its_audit_record_and_without_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let tpm = machine(GOOD_PCR);
    let policy = write_policy(dir.path(), &tpm);
    let (addr, mut completed) = server(Acceptor::new().unwrap()).await;
    let client = node(addr, &policy);
    assert!(client.verifies_service());

    let (result, retries) = rejoin(&client).await;
    assert_eq!(retries, 0, "a refused server is not asked again");
    let Err(ClientError::ServerRefused { peer, decision, .. }) = result else {
        panic!("expected a server refusal, got {result:?}");
    };
    assert_eq!(peer, addr);
    assert_eq!(decision.result, Outcome::Rejected);
    assert_eq!(decision.check.as_deref(), Some("server_evidence_missing"));
    assert_eq!(decision.variant, "qemu-vtpm");
    assert_eq!(
        decision.policy,
        ServicePolicy::load(Variant::QemuVtpm, &policy)
            .unwrap()
            .digest()
    );
    let explained = decision.explain().to_string();
    assert!(
        explained.starts_with("REJECTED by check server_evidence_missing"),
        "{explained}"
    );
    assert!(
        !completed.recv().await.unwrap(),
        "the server got no node certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_service_whose_measurements_differ_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let tpm = machine([0x66; 32]);
    let policy = write_policy(dir.path(), &tpm);
    let (addr, mut completed) = server(certified(&tpm)).await;

    let (result, _) = rejoin(&node(addr, &policy)).await;
    let Err(ClientError::ServerRefused { decision, .. }) = result else {
        panic!("expected a server refusal, got {result:?}");
    };
    assert_eq!(decision.check.as_deref(), Some("measurements"));
    assert_eq!(decision.measurements.len(), 1);
    assert_eq!(decision.measurements[0].index, 4);
    assert_eq!(decision.measurements[0].expected, hex::encode(GOOD_PCR));
    assert_eq!(
        decision.measurements[0].actual,
        Some(hex::encode([0x66; 32]))
    );
    assert!(!completed.recv().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goes_on_to_the_request_with_a_service_that_attests_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let tpm = machine(GOOD_PCR);
    let policy = write_policy(dir.path(), &tpm);
    let (addr, mut completed) = server(certified(&tpm)).await;

    // This server completes the handshake and then hangs up without answering: the node got
    // past the check and failed only at the gRPC call.
    let (result, _) = rejoin(&node(addr, &policy)).await;
    assert!(matches!(result, Err(ClientError::Status(_))), "{result:?}");
    assert!(completed.recv().await.unwrap(), "the handshake completed");
}

#[test]
fn a_service_policy_trusting_any_key_is_refused() {
    // Under it any machine in the network path that quotes the expected PCRs with a key of its
    // own would be "verified" as the join service.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("service-policy.json");
    let json = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(GOOD_PCR), "warnOnly": false}},
        "trustAnyAk": true,
    });
    std::fs::write(&path, json.to_string()).unwrap();

    let error = ServicePolicy::load(Variant::QemuVtpm, &path).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("\"trustAnyAk\": true"), "{text}");
    assert!(text.contains("impersonate the join service"), "{text}");
    assert!(text.contains("trustedAkDigests"), "{text}");
}
