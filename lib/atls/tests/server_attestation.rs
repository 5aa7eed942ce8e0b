//! The service attests itself (ARCHITECTURE.md, "The service attests itself"): real handshakes
//! over loopback between a server presenting a key certified with real qemu-vtpm evidence (from
//! soft-issuer's software attestation key) and a node checking it with the real qemu-vtpm
//! validator. Each refusal names its check, and a refused server receives nothing from the node.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use atls::server_evidence::{
    MAX_SERVER_WINDOW, SERVER_EVIDENCE_DOMAIN, certify, server_evidence_nonce,
    verify_server_certificate,
};
use atls::{
    Acceptor, CertifyError, Connector, HandshakeError, ServerCredential, ServerKey, ServerPolicy,
    ServerVerifyError, Window,
};
use attestation::{AkTrust, IssueError, Issuer, Measurement, Policy, QemuVtpmValidator, Variant};
use common::handshake::{Accepted, NodeIssuer, join_once};
use soft_issuer::SoftIssuer;

const GOOD_PCR: [u8; 32] = [0x44; 32];

/// The control-plane node's "TPM": a software key quoting PCR 4 = `pcr4`.
fn machine(pcr4: [u8; 32]) -> SoftIssuer {
    SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs([(4, pcr4)])
        .unwrap()
}

/// The node's service policy: PCR 4 must be [`GOOD_PCR`], and the AK must be `trusted`'s.
fn policy_for(trusted: &SoftIssuer) -> ServerPolicy {
    let policy = Policy::new(
        [(
            4,
            Measurement {
                expected: GOOD_PCR.to_vec(),
                warn_only: false,
            },
        )]
        .into_iter()
        .collect(),
    )
    .unwrap();
    ServerPolicy::new(Arc::new(QemuVtpmValidator::new(
        policy,
        AkTrust::keys([trusted.ak_public()]),
    )))
}

fn certified(issuer: &dyn Issuer, now: SystemTime) -> ServerCredential {
    ServerKey::generate(Window::for_rotation_at(now))
        .unwrap()
        .certify_with(issuer, now)
        .unwrap()
}

fn node(policy: ServerPolicy) -> (Arc<NodeIssuer>, Connector) {
    let issuer = Arc::new(NodeIssuer::default());
    let connector = Connector::new(issuer.clone()).with_server_policy(policy);
    (issuer, connector)
}

/// Asserts the node refused the server with `check`, and the server got no certificate and
/// no request from it.
fn assert_refused(
    outcome: (Result<Vec<u8>, HandshakeError>, Accepted),
    check: &str,
) -> ServerVerifyError {
    let (client, server) = outcome;
    assert!(
        server.is_err(),
        "the refused server must not complete a handshake (it would hold the node's evidence)"
    );
    match client {
        Err(HandshakeError::ServerRefused {
            certificate,
            source,
        }) => {
            assert!(!certificate.as_ref().is_empty());
            assert_eq!(source.check(), check, "{source}");
            *source
        }
        other => panic!("expected a server refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_service_policy_joins_a_service_that_attests_correctly() {
    let tpm = machine(GOOD_PCR);
    let acceptor = Arc::new(Acceptor::with_credential(certified(
        &tpm,
        SystemTime::now(),
    )));
    let (node_issuer, connector) = node(policy_for(&tpm));
    let (client, server) = join_once(acceptor, &connector).await;
    assert_eq!(client.unwrap(), b"request", "the request went through");
    server.unwrap();
    assert_eq!(node_issuer.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_service_whose_measurements_differ() {
    let tpm = machine([0x66; 32]);
    let acceptor = Arc::new(Acceptor::with_credential(certified(
        &tpm,
        SystemTime::now(),
    )));
    let (_, connector) = node(policy_for(&tpm));
    let error = assert_refused(join_once(acceptor, &connector).await, "measurements");
    let text = attestation::audit::chain(&error);
    assert!(
        text.contains("server's qemu-vtpm evidence rejected"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_service_whose_attestation_key_is_not_trusted() {
    let trusted = machine(GOOD_PCR);
    let other = machine(GOOD_PCR);
    let acceptor = Arc::new(Acceptor::with_credential(certified(
        &other,
        SystemTime::now(),
    )));
    let (_, connector) = node(policy_for(&trusted));
    assert_refused(join_once(acceptor, &connector).await, "ak_untrusted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_service_presenting_no_evidence() {
    let tpm = machine(GOOD_PCR);
    // What attest-proxy serves today.
    let acceptor = Arc::new(Acceptor::new().unwrap());
    let (_, connector) = node(policy_for(&tpm));
    let error = assert_refused(
        join_once(acceptor, &connector).await,
        "server_evidence_missing",
    );
    assert!(
        error
            .to_string()
            .contains("carries no attestation extension at all"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_evidence_made_for_another_key() {
    // The impostor holds genuine evidence, for the real service's key, and puts it into a
    // certificate for its own key (which it can sign handshakes with).
    let tpm = machine(GOOD_PCR);
    let now = SystemTime::now();
    let genuine_key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
    let document = certify(&tpm, genuine_key.spki(), genuine_key.window(), now).unwrap();
    let impostor = ServerKey::generate(genuine_key.window())
        .unwrap()
        .with_evidence(Variant::QemuVtpm, document)
        .unwrap();
    let acceptor = Arc::new(Acceptor::with_credential(impostor));
    let (_, connector) = node(policy_for(&tpm));
    // The nonce covers the key's hash too, so the quote fails before the user data is compared.
    assert_refused(join_once(acceptor, &connector).await, "nonce");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_expired_evidence() {
    let tpm = machine(GOOD_PCR);
    // Certified at a time whose window has passed (the certifier's clock agreed then).
    let then = SystemTime::now() - MAX_SERVER_WINDOW;
    let acceptor = Arc::new(Acceptor::with_credential(certified(&tpm, then)));
    let (_, connector) = node(policy_for(&tpm));
    assert_refused(
        join_once(acceptor, &connector).await,
        "server_evidence_expired",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_man_in_the_middle_with_its_own_key() {
    // The host intercepts the connection and terminates TLS with a key of its own, meaning to
    // forward the request to the real service and edit the answer. The real service's
    // certificate is public (any connection shows it), so the impostor copies its evidence.
    let tpm = machine(GOOD_PCR);
    let real = certified(&tpm, SystemTime::now());
    let (_, parsed) = x509_parser::parse_x509_certificate(real.certificate().as_ref()).unwrap();
    let copied = atls::extension::find_document(&parsed, Variant::QemuVtpm)
        .unwrap()
        .to_vec();
    let (_, connector) = node(policy_for(&tpm));

    // Its own key with the copied evidence: the evidence names the real key (through the nonce
    // the quote signed), so the quote does not verify for this certificate.
    let mitm = ServerKey::generate(real.window())
        .unwrap()
        .with_evidence(Variant::QemuVtpm, copied)
        .unwrap();
    assert_refused(
        join_once(Arc::new(Acceptor::with_credential(mitm)), &connector).await,
        "nonce",
    );
    // Its own key and no evidence.
    assert_refused(
        join_once(Arc::new(Acceptor::new().unwrap()), &connector).await,
        "server_evidence_missing",
    );
    // The real certificate itself verifies; only its key can use it, and TLS demands proof of
    // that key (the handshake signature the client checks against the certificate).
    policy_for(&tpm)
        .verify(real.certificate().as_ref(), SystemTime::now())
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connecting_across_a_rotation_joins() {
    let tpm = machine(GOOD_PCR);
    let start = SystemTime::now();
    let first = certified(&tpm, start);
    let acceptor = Arc::new(Acceptor::with_credential(first.clone()));
    let (_, connector) = node(policy_for(&tpm));

    let (client, _) = join_once(acceptor.clone(), &connector).await;
    client.unwrap();

    // An hour later the server rotates; the node that received the first certificate just
    // before is still inside its window, and new connections get the new key.
    let an_hour_later = start + Duration::from_secs(3600);
    let second = certified(&tpm, an_hour_later);
    acceptor.rotate(second.clone());
    assert_eq!(acceptor.current().certificate(), second.certificate());
    assert_ne!(first.certificate(), second.certificate());
    for moment in [an_hour_later, an_hour_later + Duration::from_secs(60)] {
        policy_for(&tpm)
            .verify(first.certificate().as_ref(), moment)
            .unwrap();
    }

    // And the rotated server serves nodes (this one checks with the real clock, inside both
    // windows: the second starts two hours before its certification).
    let (client, server) = join_once(acceptor, &connector).await;
    assert_eq!(client.unwrap(), b"request");
    server.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_service_policy_joins_any_server_as_before() {
    let issuer = Arc::new(NodeIssuer::default());
    let connector = Connector::new(issuer);
    assert!(!connector.verifies_server());
    for acceptor in [
        Acceptor::new().unwrap(),
        Acceptor::with_credential(certified(&machine([0x66; 32]), SystemTime::now())),
    ] {
        let (client, server) = join_once(Arc::new(acceptor), &connector).await;
        assert_eq!(client.unwrap(), b"request");
        server.unwrap();
    }
}

/// The certifier's rules: it computes user data and nonce itself and certifies only current,
/// bounded windows for well-formed keys.
#[test]
fn the_certifier_binds_key_and_window_and_bounds_the_window() {
    #[derive(Debug, Default)]
    struct Recorder(std::sync::Mutex<Vec<(Vec<u8>, Vec<u8>)>>);
    impl Issuer for Recorder {
        fn variant(&self) -> Variant {
            Variant::QemuVtpm
        }
        fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
            self.0
                .lock()
                .unwrap()
                .push((user_data.to_vec(), nonce.to_vec()));
            Ok(Vec::new())
        }
    }
    let recorder = Recorder::default();
    let now = SystemTime::now();
    let key = ServerKey::generate(Window::for_rotation_at(now)).unwrap();
    certify(&recorder, key.spki(), key.window(), now).unwrap();
    let (user_data, nonce) = recorder.0.lock().unwrap().remove(0);
    let spki_hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.spki());
    assert_eq!(user_data, spki_hash.as_ref());
    // The nonce, recomputed from its definition.
    let mut input = SERVER_EVIDENCE_DOMAIN.to_vec();
    input.extend_from_slice(spki_hash.as_ref());
    input.extend_from_slice(&key.window().not_before.to_be_bytes());
    input.extend_from_slice(&key.window().not_after.to_be_bytes());
    assert_eq!(
        nonce,
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input).as_ref()
    );
    assert_eq!(nonce, server_evidence_nonce(key.spki(), key.window()));

    let window = key.window();
    let too_long = Window {
        not_after: window.not_before + MAX_SERVER_WINDOW.as_secs() as i64 + 1,
        ..window
    };
    assert!(matches!(
        certify(&recorder, key.spki(), too_long, now),
        Err(CertifyError::WindowLength { .. })
    ));
    let inverted = Window {
        not_before: window.not_after,
        not_after: window.not_before,
    };
    assert!(matches!(
        certify(&recorder, key.spki(), inverted, now),
        Err(CertifyError::WindowLength { .. })
    ));
    // Back-dated further than a server does, or starting in the future: not current.
    for shift in [-3 * 3600, 2 * 3600 + 120] {
        let shifted = Window {
            not_before: window.not_before + shift,
            not_after: window.not_after + shift,
        };
        assert!(
            matches!(
                certify(&recorder, key.spki(), shifted, now),
                Err(CertifyError::NotCurrent { .. })
            ),
            "shift {shift}"
        );
    }
    assert!(matches!(
        certify(&recorder, b"not a key", window, now),
        Err(CertifyError::MalformedKey)
    ));
    assert!(
        recorder.0.lock().unwrap().is_empty(),
        "nothing refused reached the device"
    );
}

#[test]
fn a_window_longer_than_a_node_accepts_is_refused_even_if_certified() {
    // Evidence from a certifier that ignored the bound (here: the device asked directly): the
    // node's own rule still holds.
    let tpm = machine(GOOD_PCR);
    let now = SystemTime::now();
    let not_before = Window::for_rotation_at(now).not_before;
    let window = Window {
        not_before,
        not_after: not_before + MAX_SERVER_WINDOW.as_secs() as i64 + 60,
    };
    let key = ServerKey::generate(window).unwrap();
    let document = tpm
        .issue(
            &atls::extension::user_data_for_spki(key.spki()),
            &server_evidence_nonce(key.spki(), window),
        )
        .unwrap();
    let credential = key.with_evidence(Variant::QemuVtpm, document).unwrap();
    let error = policy_for(&tpm)
        .verify(credential.certificate().as_ref(), now)
        .unwrap_err();
    assert_eq!(error.check(), "server_window_too_long", "{error}");

    // The same evidence rules, through the free function, accept a correctly certified key.
    let validator = QemuVtpmValidator::new(
        Policy::new(
            [(
                4,
                Measurement {
                    expected: GOOD_PCR.to_vec(),
                    warn_only: false,
                },
            )]
            .into_iter()
            .collect(),
        )
        .unwrap(),
        AkTrust::AnyKey,
    );
    let good = certified(&tpm, now);
    let verified = verify_server_certificate(good.certificate().as_ref(), &validator, now).unwrap();
    assert_eq!(verified.variant, Variant::QemuVtpm);
    assert_eq!(good.variant(), Some(Variant::QemuVtpm));
}
