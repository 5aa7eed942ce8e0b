//! `openssl s_client` as a foreign TLS client: with the SNI a Go Constellation node sends, and,
//! for [`go_style_check`], checking the server's certificate as a Go node does.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use atls::{Acceptor, ServerCredential};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use tokio::net::TcpListener;
use tokio::process::Command;

/// An SNI exactly like a Go node's: base64 of 32 bytes, chosen to contain `+`, `/` and `=`.
pub fn go_style_sni() -> String {
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
pub fn client_identity(dir: &Path) -> (PathBuf, PathBuf, Vec<u8>) {
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
pub async fn s_client(addr: SocketAddr, dir: &Path, args: &[&OsStr]) -> (Output, Vec<u8>) {
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

/// PEM of one certificate, for openssl's `-CAfile`.
pub fn certificate_pem(der: &[u8]) -> String {
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
pub async fn go_style_check(credential: ServerCredential, version_flag: &str) -> String {
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
