//! End to end: a node attesting with a real swtpm joins through attest-proxy, join-core,
//! token-issuer and the key service, all real processes over real sockets.
//!
//! The node side runs in this test process (so refusals can be checked by status code); every
//! service runs as its own process started by the harness.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::{IssueError, Issuer, Variant};
use node_client::{ClientError, keys};
use testsupport::harness::{Options, System};
use tonic::Code;

fn join_request(node_name: &str, disk_uuid: &str) -> proto::join::IssueJoinTicketRequest {
    let kubelet = keys::kubelet_request(node_name, &["10.0.0.7".parse().unwrap()]).unwrap();
    let ssh = keys::SshHostKey::generate().unwrap();
    proto::join::IssueJoinTicketRequest {
        disk_uuid: disk_uuid.to_owned(),
        certificate_request: kubelet.csr_der,
        is_control_plane: false,
        host_public_key: ssh.public_wire,
        host_certificate_principals: vec![],
    }
}

fn status(result: Result<impl std::fmt::Debug, ClientError>) -> tonic::Status {
    match result {
        Err(ClientError::Status(status)) => status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// Asserts a join was refused as unauthenticated for `reason`, and that nothing was created.
async fn assert_refused(system: &System, issuer: Arc<dyn Issuer>, reason: &str) {
    let client = system.client(issuer).unwrap();
    let refused = status(
        client
            .join(join_request(
                "worker-bad",
                "0b7a57a4-bad0-4c6e-9d1e-000000000001",
            ))
            .await,
    );
    assert_eq!(
        refused.code(),
        Code::Unauthenticated,
        "{refused:?}\n{}",
        system.logs()
    );
    assert!(
        refused.message().contains(reason),
        "expected {reason:?} in {:?}",
        refused.message()
    );
    assert!(
        system.join_objects().await.is_empty(),
        "a refused node must create nothing: {:?}",
        system.join_objects().await
    );
    assert!(
        !system.join_core.log().contains("worker-bad"),
        "a refused request must not reach join-core"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_joins_and_rejoins_with_the_same_disk_key() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let disk_uuid = "5d1c2b3a-0f4e-4c6d-8b7a-9e8f7a6b5c4d";
    let request = join_request("worker-1", disk_uuid);
    let ticket = client
        .join(request.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));

    assert_eq!(ticket.state_disk_key.len(), 32);
    assert_eq!(ticket.measurement_secret.len(), 32);
    assert_eq!(
        ticket.measurement_salt,
        std::fs::read(&system.paths.measurement_salt).unwrap()
    );
    assert_eq!(
        ticket.api_server_endpoint,
        testsupport::harness::API_SERVER_ENDPOINT
    );

    // The token is "<id>.<secret>" and its Secret exists in kube-system.
    let (id, secret) = ticket.token.split_once('.').unwrap();
    assert_eq!((id.len(), secret.len()), (6, 16));
    let secrets = system.kube.bootstrap_tokens().await;
    assert_eq!(secrets.len(), 1);
    assert_eq!(
        secrets[0].metadata.name.as_deref(),
        Some(format!("bootstrap-token-{id}").as_str())
    );

    // The discovery hash pins the cluster CA's public key.
    let ca_pem = std::fs::read(&system.paths.ca_cert).unwrap();
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(&ca_pem).unwrap();
    let ca = ca_pem.parse_x509().unwrap();
    let spki_hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, ca.public_key().raw);
    assert_eq!(
        ticket.discovery_token_ca_cert_hash,
        format!("sha256:{}", hex::encode(spki_hash))
    );

    // The kubelet certificate is signed by that CA for the CSR's subject.
    let (_, kubelet_pem) = x509_parser::pem::parse_x509_pem(&ticket.kubelet_cert).unwrap();
    let kubelet = kubelet_pem.parse_x509().unwrap();
    kubelet.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(
        kubelet
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        "system:node:worker-1"
    );

    let rejoined = client.rejoin(disk_uuid).await.unwrap();
    assert_eq!(rejoined.state_disk_key, ticket.state_disk_key);
    assert_eq!(rejoined.measurement_secret, ticket.measurement_secret);

    // Another disk gets another key.
    let other = client
        .rejoin("5d1c2b3a-0f4e-4c6d-8b7a-000000000000")
        .await
        .unwrap();
    assert_ne!(other.state_disk_key, ticket.state_disk_key);

    // Every process logs to a file here, not a terminal: plain text, no colour codes.
    let logs = system.logs();
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escape codes in logs written to a file:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_whose_enforced_pcr_differs_is_refused() {
    let system = System::start(Options::default()).await.unwrap();
    // Something unexpected ran: PCR 9 now differs from the policy.
    system.swtpm.extend_pcr(9, &[0xee; 32]).unwrap();
    assert_refused(&system, system.issuer().unwrap(), "measurement 9").await;
}

/// Issues documents through a real TPM, but tampers with what gets bound.
#[derive(Debug)]
struct Tampering {
    inner: Arc<dyn Issuer>,
    variant: Variant,
    other_nonce: bool,
    other_user_data: bool,
}

impl Tampering {
    fn new(inner: Arc<dyn Issuer>) -> Self {
        Self {
            variant: inner.variant(),
            inner,
            other_nonce: false,
            other_user_data: false,
        }
    }
}

impl Issuer for Tampering {
    fn variant(&self) -> Variant {
        self.variant
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        let nonce = if self.other_nonce {
            [0x42; 32].to_vec()
        } else {
            nonce.to_vec()
        };
        let user_data = if self.other_user_data {
            [0x17; 32].to_vec()
        } else {
            user_data.to_vec()
        };
        self.inner.issue(&user_data, &nonce)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_attestation_is_refused() {
    let system = System::start(Options::default()).await.unwrap();
    // A genuine quote, but for a nonce this connection never issued: what a replay looks like.
    let replay = Tampering {
        other_nonce: true,
        ..Tampering::new(system.issuer().unwrap())
    };
    assert_refused(&system, Arc::new(replay), "nonce").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_key_not_matching_attested_user_data_is_refused() {
    let system = System::start(Options::default()).await.unwrap();
    let swapped = Tampering {
        other_user_data: true,
        ..Tampering::new(system.issuer().unwrap())
    };
    assert_refused(&system, Arc::new(swapped), "user data").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attestation_under_another_variant_oid_is_refused() {
    let system = System::start(Options::default()).await.unwrap();
    // A valid vTPM document, filed under the azure-sev-snp OID: the proxy expects qemu-vtpm's.
    let wrong_oid = Tampering {
        variant: Variant::AzureSevSnp,
        ..Tampering::new(system.issuer().unwrap())
    };
    assert_refused(
        &system,
        Arc::new(wrong_oid),
        Variant::AzureSevSnp.oid_string().as_str(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_identity_headers_do_not_reach_join_core() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let mut request = tonic::Request::new(join_request(
        "worker-2",
        "9a8b7c6d-1111-4222-8333-944455566677",
    ));
    request
        .metadata_mut()
        .insert("x-attested-variant", "aws-sev-snp".parse().unwrap());
    request
        .metadata_mut()
        .insert("x-attested-peer-addr", "203.0.113.66:4444".parse().unwrap());
    request
        .metadata_mut()
        .insert("x-forwarded-for", "203.0.113.66".parse().unwrap());
    client
        .join_with(request)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));

    let join_core = system.join_core.log();
    let line = join_core
        .lines()
        .find(|l| l.contains("worker-2"))
        .expect("join-core logs the request");
    assert!(
        line.contains("qemu-vtpm") && line.contains("127.0.0.1"),
        "join-core saw the proxy's identity: {line}"
    );
    assert!(
        !join_core.contains("203.0.113.66"),
        "a client-claimed identity reached join-core:\n{join_core}"
    );
    assert!(
        !join_core.contains("aws-sev-snp"),
        "a client-claimed variant reached join-core:\n{join_core}"
    );
    assert!(
        system
            .proxy
            .log()
            .contains("removed an identity header sent by the client")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_outside_the_join_api_are_not_forwarded() {
    let system = System::start(Options::default()).await.unwrap();
    // A genuinely attested node calling the key service API through the proxy: refused there.
    let issuer = system.issuer().unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", system.proxy_addr))
        .unwrap()
        .connect_with_connector({
            let connector = Arc::new(atls::Connector::new(issuer));
            let addr = system.proxy_addr;
            tower::service_fn(move |_| {
                let connector = connector.clone();
                async move {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    let tls = connector
                        .connect(tcp)
                        .await
                        .map_err(std::io::Error::other)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
                }
            })
        })
        .await
        .unwrap();
    let mut kms = proto::kms::api_client::ApiClient::new(channel);
    let refused = kms
        .get_data_key(proto::kms::GetDataKeyRequest {
            data_key_id: "measurementSecret".into(),
            length: 32,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
    assert!(refused.message().contains("/kms.API/GetDataKey"));
}

/// attest-proxy's audit records form a hash chain from its start record, in text and in JSON
/// logs (where each record is an object, not an escaped string); `attest-tool audit verify`
/// finds the chain intact, and names the line after a record changed in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_chain_and_a_changed_one_is_found() {
    for format in ["text", "json"] {
        let system = System::start(Options {
            proxy_args: vec!["--log-format".into(), format.into()],
            ..Options::default()
        })
        .await
        .unwrap();
        let client = system.client(system.issuer().unwrap()).unwrap();
        let disk = "5d1c2b3a-0f4e-4c6d-8b7a-9e8f7a6b5c4d";
        client
            .join(join_request("worker-1", disk))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
        client.rejoin(disk).await.unwrap();

        let log = system.proxy.log();
        let audit_lines: Vec<&str> = log
            .lines()
            .filter(|l| attestation::audit_trail::record_in_line(l).is_some())
            .collect();
        assert_eq!(
            audit_lines.len(),
            3,
            "{format}: start and two decisions\n{log}"
        );
        if format == "json" {
            let line: serde_json::Value = serde_json::from_str(audit_lines[1]).unwrap();
            assert_eq!(line["target"], "audit", "{line}");
            assert_eq!(line["audit"]["result"], "accepted", "{line}");
            assert_eq!(line["audit"]["seq"], 1, "{line}");
        }

        let dir = tempfile::tempdir().unwrap();
        let verify = |text: &str| {
            let file = dir.path().join("proxy.log");
            std::fs::write(&file, text).unwrap();
            let output =
                std::process::Command::new(testsupport::process::bin("attest-tool").unwrap())
                    .args(["audit", "verify"])
                    .arg(&file)
                    .output()
                    .unwrap();
            (
                output.status.code(),
                String::from_utf8_lossy(&output.stdout).into_owned(),
            )
        };
        let (code, out) = verify(&log);
        assert_eq!(code, Some(0), "{format}: {out}");
        assert!(
            out.contains("chain of attest-proxy") && out.contains("2 record(s)"),
            "{format}: {out}"
        );

        // The first decision rewritten as a refusal: the chain breaks at the record after it.
        let first = audit_lines[1];
        let tampered = log.replacen(first, &first.replacen("\"accepted\"", "\"rejected\"", 1), 1);
        let line_of_second = log.lines().position(|l| l == audit_lines[2]).unwrap() + 1;
        let (code, out) = verify(&tampered);
        assert_eq!(code, Some(1), "{format}: {out}");
        assert!(
            out.contains(&format!(
                "BROKEN at line {line_of_second}: prev is not the SHA-256"
            )),
            "{format}: {out}"
        );
    }
}
