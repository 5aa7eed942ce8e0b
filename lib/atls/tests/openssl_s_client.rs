//! A foreign TLS client against our server: the real `openssl s_client` binary, sending the SNI
//! a Go Constellation node sends (standard base64 of 32 random bytes, so with `+`, `/`, `=`).
//!
//! Checks that the server accepts that ClientHello, negotiates `h2`, asks for a client
//! certificate with exactly one acceptable CA name `CN=<base64 of a 32-byte nonce>`, and hands
//! out that nonce and the presented certificate as evidence; and that a client checking the
//! server's certificate as a Go node does (its own self-signature as the only root, its dates, no
//! unknown critical extension) accepts an attested service's certificate, as it does an
//! unattested one, and refuses an expired one.

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use atls::{Acceptor, ServerKey, VerifyError, Window};
use attestation::{Validator, Variant, Verified};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::openssl::{go_style_check, s_client};
use tokio::net::TcpListener;

/// Never reached: the certificate openssl presents carries no attestation.
#[derive(Debug)]
struct NeverCalled;

impl Validator for NeverCalled {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }
    fn validate(&self, _: &[u8], _: &[u8]) -> Result<Verified, attestation::Error> {
        panic!("a certificate without attestation reached the validator")
    }
}

async fn handshake_with_openssl(version_flag: &str) {
    let dir = tempfile::tempdir().unwrap();
    let acceptor = Arc::new(Acceptor::new().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let (stream, evidence) = acceptor.accept(tcp).await.unwrap();
        (stream.alpn_protocol().map(<[u8]>::to_vec), evidence)
    });

    let (output, client_der) = s_client(
        addr,
        dir.path(),
        &[
            "-alpn".as_ref(),
            "h2,http/1.1".as_ref(),
            version_flag.as_ref(),
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    let (alpn, evidence) = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server handshake timed out")
        .unwrap();

    assert!(
        stdout.contains("ALPN protocol: h2"),
        "no h2 negotiated:\n{stdout}\n{stderr}"
    );
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));

    // The acceptable CA names openssl received: exactly one, CN=<base64 nonce>.
    let names: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Acceptable client certificate CA names"))
        .skip(1)
        .take_while(|l| l.starts_with("CN"))
        .collect();
    assert_eq!(names.len(), 1, "acceptable CA names: {names:?}\n{stdout}");
    let printed = names[0]
        .trim_start_matches("CN")
        .trim_start()
        .trim_start_matches('=')
        .trim()
        // openssl quotes values that contain '+' (an RDN separator in its notation).
        .trim_matches('"');
    let nonce = STANDARD.decode(printed).unwrap();
    assert_eq!(nonce.len(), 32);
    assert_eq!(
        nonce,
        evidence.nonce(),
        "the hinted nonce is the connection's nonce"
    );

    // The server kept what openssl presented, and rejects it for want of attestation.
    assert_eq!(evidence.peer_certificate().as_ref(), client_der.as_slice());
    let err = evidence.verify(&NeverCalled).unwrap_err();
    assert!(
        matches!(err, VerifyError::MissingAttestation { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_tls13_with_base64_sni() {
    handshake_with_openssl("-tls1_3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_tls12_with_base64_sni() {
    handshake_with_openssl("-tls1_2").await;
}

/// A key certified with real qemu-vtpm evidence (soft-issuer's software TPM key) for the window
/// a rotation at `at` asks for.
fn attested_at(at: SystemTime) -> atls::ServerCredential {
    let machine = soft_issuer::SoftIssuer::ecdsa_p256().unwrap();
    let credential = ServerKey::generate(Window::for_rotation_at(at))
        .unwrap()
        .certify_with(&machine, at)
        .unwrap();
    assert_eq!(credential.variant(), Some(Variant::QemuVtpm));
    credential
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_style_check_accepts_the_attested_service_certificate() {
    for version in ["-tls1_3", "-tls1_2"] {
        let printed = go_style_check(attested_at(SystemTime::now()), version).await;
        assert!(
            printed.contains("Verify return code: 0 (ok)") && printed.contains("ALPN protocol: h2"),
            "{version}: {printed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_style_check_accepts_an_unattested_service_certificate() {
    let unattested = ServerKey::generate(Window::for_rotation_at(SystemTime::now()))
        .unwrap()
        .unattested()
        .unwrap();
    let printed = go_style_check(unattested, "-tls1_3").await;
    assert!(printed.contains("Verify return code: 0 (ok)"), "{printed}");
}

/// The check above is live: the same client refuses a certificate whose window has passed, as a
/// Go node would (`x509: certificate has expired or is not yet valid`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_style_check_refuses_an_expired_service_certificate() {
    let six_hours_ago = SystemTime::now() - Duration::from_secs(6 * 60 * 60);
    let printed = go_style_check(attested_at(six_hours_ago), "-tls1_3").await;
    assert!(
        printed.contains("certificate has expired") && !printed.contains("Verify return code: 0"),
        "{printed}"
    );
}
