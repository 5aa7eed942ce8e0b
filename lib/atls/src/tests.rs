//! End-to-end tests: real TLS handshakes over loopback TCP between our client and server.
//!
//! The issuer/validator pair here is a test-only stand-in that keeps the real binding rules:
//! document = user_data ‖ nonce, and the validator refuses a document made for another nonce.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use attestation::{IssueError, Issuer, Validator, Variant, Verified};
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::client::connect_with;
use crate::extension::{self, AttestedCertificate, attested_certificate};
use crate::{Acceptor, Connector, HandshakeError, PeerEvidence, TlsStream, VerifyError};

const VARIANT: Variant = Variant::QemuVtpm;

/// Issues `user_data ‖ nonce` and remembers every nonce it was asked for.
#[derive(Debug, Default)]
struct TestIssuer {
    variant: Option<Variant>,
    nonces: Mutex<Vec<Vec<u8>>>,
}

impl TestIssuer {
    fn seen(&self) -> Vec<Vec<u8>> {
        self.nonces.lock().unwrap().clone()
    }
}

impl Issuer for TestIssuer {
    fn variant(&self) -> Variant {
        self.variant.unwrap_or(VARIANT)
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.nonces.lock().unwrap().push(nonce.to_vec());
        Ok([user_data, nonce].concat())
    }
}

#[derive(Debug)]
struct TestValidator;

impl Validator for TestValidator {
    fn variant(&self) -> Variant {
        VARIANT
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, attestation::Error> {
        let (user_data, doc_nonce) = document
            .split_at_checked(32)
            .ok_or_else(|| attestation::Error::Malformed("document too short".into()))?;
        if doc_nonce != nonce {
            return Err(attestation::Error::Malformed(
                "document was issued for another nonce".into(),
            ));
        }
        Ok(Verified {
            variant: VARIANT,
            user_data: user_data.to_vec(),
            warnings: Vec::new(),
            notes: Vec::new(),
        })
    }
}

type Accepted = Result<(TlsStream<TcpStream>, PeerEvidence), HandshakeError>;

/// Listens on a loopback port and accepts `count` connections, one after the other.
async fn server(
    acceptor: Arc<Acceptor>,
    count: usize,
) -> (std::net::SocketAddr, JoinHandle<Vec<Accepted>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut results = Vec::new();
        for _ in 0..count {
            let (tcp, _) = listener.accept().await.unwrap();
            let accepted =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
            results.push(accepted.expect("handshake timed out"));
        }
        results
    });
    (addr, task)
}

async fn one_connection(
    connector: &Connector,
) -> (Result<TlsStream<TcpStream>, HandshakeError>, Accepted) {
    let (addr, server) = server(Arc::new(Acceptor::new().unwrap()), 1).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let client = connector.connect(tcp).await;
    let mut accepted = server.await.unwrap();
    (client, accepted.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_attests_and_carries_data() {
    let issuer = Arc::new(TestIssuer::default());
    let connector = Connector::new(issuer.clone());
    let (client, accepted) = one_connection(&connector).await;
    let mut client = client.unwrap();
    let (mut server, evidence) = accepted.unwrap();

    assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));

    let verified = evidence.verify(&TestValidator).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(evidence.peer_certificate()).unwrap();
    assert_eq!(
        verified.user_data,
        extension::user_data_for_spki(cert.tbs_certificate.subject_pki.raw)
    );
    // The client attested over exactly the nonce the server drew.
    assert_eq!(issuer.seen(), vec![evidence.nonce().to_vec()]);

    // Application data both ways, then a clean close in both directions.
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let expected = big.clone();
    let server_task = tokio::spawn(async move {
        let mut got = vec![0u8; expected.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, expected);
        server.write_all(b"pong").await.unwrap();
        server.shutdown().await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    });
    client.write_all(&big).await.unwrap();
    client.flush().await.unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).await.unwrap();
    assert_eq!(reply, b"pong");
    client.shutdown().await.unwrap();
    server_task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_gets_its_own_nonce() {
    let issuer = Arc::new(TestIssuer::default());
    let connector = Connector::new(issuer.clone());
    let (addr, server) = server(Arc::new(Acceptor::new().unwrap()), 3).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        clients.push(connector.connect(tcp).await.unwrap());
    }
    let nonces: Vec<Vec<u8>> = server
        .await
        .unwrap()
        .into_iter()
        .map(|accepted| {
            let (_, evidence) = accepted.unwrap();
            evidence.verify(&TestValidator).unwrap();
            evidence.nonce().to_vec()
        })
        .collect();
    assert_eq!(
        issuer.seen(),
        nonces,
        "the client saw exactly the server's nonces"
    );
    assert!(nonces.iter().all(|n| n.len() == 32));
    assert_ne!(nonces[0], nonces[1]);
    assert_ne!(nonces[1], nonces[2]);
    assert_ne!(nonces[0], nonces[2]);
}

/// Connects with a client that presents whatever `make` builds for the server's nonce, and
/// returns the server's verdict on it.
async fn verdict(
    make: impl Fn(&[u8]) -> Result<AttestedCertificate, HandshakeError> + Send + Sync + 'static,
) -> Result<Verified, VerifyError> {
    let connector = Connector::with_certificate_maker(Arc::new(make));
    let (client, accepted) = one_connection(&connector).await;
    client.unwrap();
    let (_, evidence) = accepted.unwrap();
    evidence.verify(&TestValidator)
}

fn p256() -> rcgen::KeyPair {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
}

fn from_parts(key: &rcgen::KeyPair, certificate: CertificateDer<'static>) -> AttestedCertificate {
    AttestedCertificate {
        certificate,
        private_key: rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_certificate_without_attestation() {
    let err = verdict(|_| {
        let key = p256();
        let cert = extension::self_signed(&key, None, Duration::from_secs(3600)).unwrap();
        Ok(from_parts(&key, cert))
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, VerifyError::MissingAttestation { expected: VARIANT, present } if present.is_empty()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("no attestation extension at all"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_an_attestation_of_another_variant() {
    let issuer = TestIssuer {
        variant: Some(Variant::AzureSevSnp),
        ..TestIssuer::default()
    };
    let err = verdict(move |nonce| attested_certificate(&issuer, nonce))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, VerifyError::MissingAttestation { expected: VARIANT, present } if present == &["1.3.9900.4.1"]),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("qemu-vtpm"), "{message}");
    assert!(
        message.contains("azure-sev-snp (1.3.9900.4.1)"),
        "{message}"
    );
}

/// Issues documents that bind other user data than the certificate key's hash.
#[derive(Debug)]
struct WrongUserData;

impl Issuer for WrongUserData {
    fn variant(&self) -> Variant {
        VARIANT
    }
    fn issue(&self, _user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        Ok([&[0u8; 32][..], nonce].concat())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_user_data_that_is_not_the_key_hash() {
    let err = verdict(|nonce| attested_certificate(&WrongUserData, nonce))
        .await
        .unwrap_err();
    assert!(matches!(err, VerifyError::UserDataMismatch), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_document_issued_for_another_nonce() {
    // A replay: the document is genuine, but was made for an earlier connection's nonce.
    let err = verdict(|_nonce| attested_certificate(&TestIssuer::default(), &[7u8; 32]))
        .await
        .unwrap_err();
    match &err {
        VerifyError::Attestation { variant, source } => {
            assert_eq!(*variant, VARIANT);
            assert!(source.to_string().contains("another nonce"), "{source}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_broken_self_signature() {
    let err = verdict(|nonce| {
        let mut made = attested_certificate(&TestIssuer::default(), nonce)?;
        // The certificate ends with the ECDSA signature's `s`; flipping its last bit keeps the
        // DER intact but breaks the signature.
        let mut der = made.certificate.as_ref().to_vec();
        if let Some(last) = der.last_mut() {
            *last ^= 1;
        }
        made.certificate = CertificateDer::from(der);
        Ok(made)
    })
    .await
    .unwrap_err();
    assert!(matches!(err, VerifyError::BadSelfSignature(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_rejects_a_client_without_the_certificate_key() {
    // The certificate is genuine, but the client signs the handshake with another key: the
    // server must notice during the handshake (CertificateVerify), before any attestation.
    let connector = Connector::with_certificate_maker(Arc::new(|nonce: &[u8]| {
        let made = attested_certificate(&TestIssuer::default(), nonce)?;
        Ok(from_parts(&p256(), made.certificate))
    }));
    let (_client, accepted) = one_connection(&connector).await;
    let err = accepted.unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::Tls(rustls::Error::InvalidCertificate(
                rustls::error::CertificateError::BadSignature
            ))
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issuer_failure_reaches_the_caller() {
    let connector = Connector::with_certificate_maker(Arc::new(|_: &[u8]| {
        Err(HandshakeError::Issue(IssueError {
            variant: VARIANT,
            reason: "TPM unavailable".into(),
            source: None,
        }))
    }));
    let (client, accepted) = one_connection(&connector).await;
    assert!(
        matches!(client, Err(HandshakeError::Issue(_))),
        "{client:?}"
    );
    // The server saw no certificate and refused the handshake.
    assert!(accepted.is_err());
}

/// Connects twice with one client config that *would* resume, and checks that the server
/// forces a full handshake (with a fresh certificate and nonce) both times.
async fn second_handshake_is_full(provider: rustls::crypto::CryptoProvider) {
    let issuer = Arc::new(TestIssuer::default());
    let connector = Connector::new(issuer.clone()).with_provider(Arc::new(provider));
    let failure = Default::default();
    let mut config = connector.config(Arc::clone(&failure)).unwrap();
    config.resumption = rustls::client::Resumption::in_memory_sessions(8);
    let config = Arc::new(config);

    let acceptor = Acceptor::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (tcp, _) = listener.accept().await.unwrap();
            let (mut stream, evidence) = acceptor.accept(tcp).await.unwrap();
            assert_eq!(stream.handshake_kind(), Some(rustls::HandshakeKind::Full));
            evidence.verify(&TestValidator).unwrap();
            stream.write_all(b"ok").await.unwrap();
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.unwrap();
        }
    });
    for _ in 0..2 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut client = connect_with(config.clone(), tcp, &failure).await.unwrap();
        // Reading to the server's close_notify processes anything it sent after the
        // handshake, tickets included.
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).await.unwrap();
        assert_eq!(reply, b"ok");
        client.shutdown().await.unwrap();
        assert_eq!(client.handshake_kind(), Some(rustls::HandshakeKind::Full));
        assert_eq!(client.tls13_tickets_received(), 0);
    }
    server.await.unwrap();
    assert_eq!(issuer.seen().len(), 2, "each connection attested afresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resumption_in_tls13() {
    second_handshake_is_full(rustls_aws_lc_rs::DEFAULT_TLS13_PROVIDER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resumption_in_tls12() {
    second_handshake_is_full(rustls_aws_lc_rs::DEFAULT_TLS12_PROVIDER).await;
}

#[tokio::test(flavor = "current_thread")]
async fn works_on_a_current_thread_runtime() {
    let connector = Connector::new(Arc::new(TestIssuer::default()));
    let (client, accepted) = one_connection(&connector).await;
    client.unwrap();
    accepted.unwrap().1.verify(&TestValidator).unwrap();
}

/// Vectored writes (how HTTP/2 writes a frame's header and payload) carry every byte in order,
/// including slices beyond one call's limit and empty ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_writes_carry_every_slice_in_order() {
    let connector = Connector::new(Arc::new(TestIssuer::default()));
    let (client, accepted) = one_connection(&connector).await;
    let mut client = client.unwrap();
    let (mut server, _) = accepted.unwrap();
    assert!(tokio::io::AsyncWrite::is_write_vectored(&client));

    let parts: Vec<Vec<u8>> = [9usize, 0, 1_015, 40_000, 0, 50_000, 3]
        .iter()
        .enumerate()
        .map(|(i, &len)| (0..len).map(|j| (i * 31 + j) as u8).collect())
        .collect();
    let expected = parts.concat();
    let reader = tokio::spawn(async move {
        let mut got = vec![0u8; expected.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, expected);
    });
    // Write as a caller of `poll_write_vectored` does: resubmit what was not taken.
    let mut sent = 0;
    let total: usize = parts.iter().map(Vec::len).sum();
    while sent < total {
        let mut skip = sent;
        let slices: Vec<std::io::IoSlice<'_>> = parts
            .iter()
            .filter_map(|p| {
                if skip >= p.len() {
                    skip -= p.len();
                    None
                } else {
                    let slice = std::io::IoSlice::new(&p[skip..]);
                    skip = 0;
                    Some(slice)
                }
            })
            .collect();
        let n = client.write_vectored(&slices).await.unwrap();
        assert!(n > 0 && n <= 64 * 1024, "took {n}");
        sent += n;
    }
    client.flush().await.unwrap();
    reader.await.unwrap();
}

/// In both TLS versions a node with a server policy checks the server's evidence before it
/// sends its own certificate: a server without evidence is refused and never completes a
/// handshake (it holds no node evidence), one with evidence is accepted.
async fn server_policy_in(provider: rustls::crypto::CryptoProvider) {
    use crate::server_evidence::{ServerKey, ServerPolicy, Window};
    let provider = Arc::new(provider);
    let connector = Connector::new(Arc::new(TestIssuer::default()))
        .with_provider(provider)
        .with_server_policy(ServerPolicy::new(Arc::new(TestValidator)));

    let (client, accepted) = one_connection(&connector).await;
    assert!(
        matches!(
            &client,
            Err(HandshakeError::ServerRefused { source, .. })
                if source.check() == "server_evidence_missing"
        ),
        "{client:?}"
    );
    assert!(accepted.is_err(), "the refused server got no certificate");

    let now = std::time::SystemTime::now();
    let certified = ServerKey::generate(Window::for_rotation_at(now))
        .unwrap()
        .certify_with(&TestIssuer::default(), now)
        .unwrap();
    let (addr, server) = server(Arc::new(Acceptor::with_credential(certified)), 1).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector.connect(tcp).await.unwrap();
    let (_, evidence) = server.await.unwrap().remove(0).unwrap();
    evidence.verify(&TestValidator).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_policy_in_tls13() {
    server_policy_in(rustls_aws_lc_rs::DEFAULT_TLS13_PROVIDER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_policy_in_tls12() {
    server_policy_in(rustls_aws_lc_rs::DEFAULT_TLS12_PROVIDER).await;
}

#[test]
fn an_unattested_server_certificate_spans_years_either_side_as_before() {
    // Go nodes check the server certificate's dates; a node whose clock is far off must keep
    // joining a service that does not attest itself, as it always did.
    let acceptor = Acceptor::new().unwrap();
    let window = acceptor.current().window();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let nine_years = 9 * 365 * 24 * 60 * 60;
    assert!(window.not_before < now - nine_years, "{window:?}");
    assert!(window.not_after > now + nine_years, "{window:?}");
    assert_eq!(acceptor.current().variant(), None);
}
