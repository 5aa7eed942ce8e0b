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

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use atls::{Acceptor, ServerKey, VerifyError, Window};
use attestation::{Validator, Variant, Verified};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use tokio::net::TcpListener;
use tokio::process::Command;

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

/// An SNI exactly like a Go node's: base64 of 32 bytes, chosen to contain `+`, `/` and `=`.
fn go_style_sni() -> String {
    let mut nonce = [0u8; 32];
    nonce[..3].copy_from_slice(&[0xfb, 0xff, 0xbf]);
    let sni = STANDARD.encode(nonce);
    assert!(
        sni.contains('+') && sni.contains('/') && sni.ends_with('='),
        "{sni}"
    );
    sni
}

/// A client key and certificate for openssl (the server requires one, as aTLS does): the
/// certificate's path, the key's path, and the certificate's DER.
fn client_identity(dir: &Path) -> (PathBuf, PathBuf, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (dir.join("client.pem"), dir.join("client.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path, cert.der().to_vec())
}

/// Runs `openssl s_client` against `addr` with a Go node's SNI, a client certificate made in
/// `dir`, and `args`; returns its output and the client certificate's DER.
async fn s_client(addr: SocketAddr, dir: &Path, args: &[&OsStr]) -> (Output, Vec<u8>) {
    let (cert_path, key_path, der) = client_identity(dir);
    let output = Command::new("openssl")
        .arg("s_client")
        .arg("-connect")
        .arg(addr.to_string())
        .arg("-servername")
        .arg(go_style_sni())
        .arg("-cert")
        .arg(&cert_path)
        .arg("-key")
        .arg(&key_path)
        .args(args)
        // End of stdin makes s_client close the connection right after the handshake.
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("openssl s_client timed out")
        .expect("cannot run openssl (apt-get install openssl)");
    (output, der)
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

/// PEM of one certificate, for openssl's `-CAfile`.
fn certificate_pem(der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// What `openssl s_client` prints when it connects to a server presenting `credential`, trusting
/// only that certificate and aborting the handshake if it does not verify: a Go node's check
/// (`x509.Certificate.Verify` with the certificate itself as the only root) done by a foreign
/// X.509 implementation.
async fn go_style_check(credential: atls::ServerCredential, version_flag: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let anchor = dir.path().join("server.pem");
    std::fs::write(&anchor, certificate_pem(credential.certificate())).unwrap();

    let acceptor = Arc::new(Acceptor::with_credential(credential));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The server's side may fail (a client that refuses the certificate aborts); only the
    // client's verdict is under test.
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = acceptor.accept(tcp).await;
    });
    let (output, _) = s_client(
        addr,
        dir.path(),
        &[
            "-alpn".as_ref(),
            "h2".as_ref(),
            "-CAfile".as_ref(),
            anchor.as_os_str(),
            "-verify_return_error".as_ref(),
            version_flag.as_ref(),
        ],
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
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
