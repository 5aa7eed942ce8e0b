//! The service attests itself, through a real in-process attest-proxy and certifier over a real
//! Unix socket: a node with a service policy accepts the proxy's certified key (and then reaches
//! the proxy's gRPC layer); when the certifier is not there, the proxy serves an uncertified
//! key, says so in `/readyz`, and the node refuses it before sending anything.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use clap::Parser as _;
use node_client::{Client, ClientError, ServicePolicy};
use soft_issuer::SoftIssuer;

const PCR4: [u8; 32] = [0x44; 32];

struct Running {
    addr: SocketAddr,
    admin: SocketAddr,
    _proxy: plumbing::shutdown::Trigger,
    _certifier: Option<plumbing::shutdown::Trigger>,
}

/// Starts the certifier (when `with_certifier`) with `device` and attest-proxy asking it,
/// expecting it to run as `certifier_uid` (this process's uid unless given).
async fn start(dir: &Path, device: &SoftIssuer, with_certifier: bool) -> Running {
    start_expecting(dir, device, with_certifier, None).await
}

async fn start_expecting(
    dir: &Path,
    device: &SoftIssuer,
    with_certifier: bool,
    certifier_uid: Option<u32>,
) -> Running {
    let uid = testsupport::harness::own_uid().unwrap();
    let certifier_socket = dir.join("certifier/certifier.sock");
    let certifier = if with_certifier {
        let (trigger, shutdown) = plumbing::shutdown::channel();
        let config = certifier::Config::try_parse_from([
            "certifier",
            "--peer-uid",
            &uid.to_string(),
            "--socket",
            certifier_socket.to_str().unwrap(),
        ])
        .unwrap();
        tokio::spawn(certifier::run(config, Arc::new(device.clone()), shutdown));
        for _ in 0..100 {
            if certifier_socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(trigger)
    } else {
        None
    };
    let policy = dir.join("attestationConfig");
    std::fs::write(
        &policy,
        testsupport::harness::attestation_config(&attestation::AkTrust::AnyKey, &[]),
    )
    .unwrap();
    let expected_certifier = certifier_uid.unwrap_or(uid).to_string();
    let uid = uid.to_string();
    let proxy = attest_proxy::Proxy::bind(
        attest_proxy::Config::try_parse_from([
            "attest-proxy",
            "--upstream-uid",
            &uid,
            "--upstream-socket",
            dir.join("join-core.sock").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--attestation-config",
            policy.to_str().unwrap(),
            "--certifier-uid",
            &expected_certifier,
            "--certifier-socket",
            certifier_socket.to_str().unwrap(),
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (trigger, shutdown) = plumbing::shutdown::channel();
    tokio::spawn(proxy.serve(shutdown));
    Running {
        addr,
        admin,
        _proxy: trigger,
        _certifier: certifier,
    }
}

fn node(dir: &Path, addr: SocketAddr, device: &SoftIssuer) -> Client {
    let path = dir.join("service-policy.json");
    let json = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(PCR4), "warnOnly": false}},
        "trustedAkDigests": [hex::encode(attestation::ak_digest(device.ak_public()))],
    });
    std::fs::write(&path, json.to_string()).unwrap();
    Client::new(
        addr,
        Arc::new(SoftIssuer::ecdsa_p256().unwrap()),
        Duration::from_secs(10),
    )
    .unwrap()
    .with_service_policy(ServicePolicy::load(Variant::QemuVtpm, &path).unwrap())
}

fn control_plane_tpm() -> SoftIssuer {
    SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs([(4, PCR4)])
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_service_policy_accepts_the_certified_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let device = control_plane_tpm();
    let running = start(dir.path(), &device, true).await;

    // The node's own attestation is then refused by the proxy (its PCRs are not the policy's
    // and no join-core runs here): the answer is a gRPC status from the proxy, which only a
    // node that accepted the proxy's evidence gets to see.
    let result = node(dir.path(), running.addr, &device).rejoin("disk").await;
    match result {
        Err(ClientError::Status(status)) => {
            assert_ne!(status.code(), tonic::Code::Ok);
        }
        other => panic!("expected the proxy's gRPC answer, got {other:?}"),
    }
    let (_, ready) = plumbing::admin::get(running.admin, "/readyz")
        .await
        .unwrap();
    assert!(!ready.contains("uncertified server key"), "{ready}");
    let certified =
        testsupport::harness::metric(running.admin, "attest_proxy_server_key_certified")
            .await
            .unwrap();
    assert_eq!(certified, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_certifier_the_proxy_says_so_and_nodes_with_a_policy_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let device = control_plane_tpm();
    let running = start(dir.path(), &device, false).await;

    let (_, ready) = plumbing::admin::get(running.admin, "/readyz")
        .await
        .unwrap();
    assert!(
        ready.contains("serving an uncertified server key"),
        "{ready}"
    );
    let certified =
        testsupport::harness::metric(running.admin, "attest_proxy_server_key_certified")
            .await
            .unwrap();
    assert_eq!(certified, 0.0);
    let result = node(dir.path(), running.addr, &device).rejoin("disk").await;
    let Err(ClientError::ServerRefused { decision, .. }) = result else {
        panic!("expected a server refusal, got {result:?}");
    };
    assert_eq!(decision.check.as_deref(), Some("server_evidence_missing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_asks_no_certifier_of_another_uid() {
    // Whatever answers on the certifier's socket must run as the certifier's uid: a process of
    // another uid there (here: the real certifier, but attest-proxy expects a different uid)
    // is never asked, so it cannot hand attest-proxy evidence for a key of its own choosing.
    let dir = tempfile::tempdir().unwrap();
    let device = control_plane_tpm();
    let other = testsupport::harness::own_uid().unwrap().wrapping_add(4242);
    let running = start_expecting(dir.path(), &device, true, Some(other)).await;
    let certified =
        testsupport::harness::metric(running.admin, "attest_proxy_server_key_certified")
            .await
            .unwrap();
    assert_eq!(certified, 0.0);
    let (_, ready) = plumbing::admin::get(running.admin, "/readyz")
        .await
        .unwrap();
    assert!(
        ready.contains("serving an uncertified server key"),
        "{ready}"
    );
}

#[test]
fn nodes_accept_the_services_collateral_as_stale_as_the_service_does_by_default() {
    // A node's default allowance for the collateral in the certificate is the proxy's own, so a
    // proxy that still verifies nodes with what it has is still verifiable by them.
    let config = attest_proxy::Config::try_parse_from([
        "attest-proxy",
        "--upstream-uid",
        "1",
        "--attestation-config",
        "/nonexistent",
    ])
    .unwrap();
    assert_eq!(
        config.collateral_max_stale,
        node_client::service_policy::DEFAULT_COLLATERAL_MAX_STALE
    );
}
