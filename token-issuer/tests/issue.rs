//! token-issuer end to end: in-process `run` on a real Unix socket, a real tonic client, and the
//! Kubernetes API stand-in over HTTPS.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_standin::{Fault, Grant, KubeStandin, PolicyRule, Running, StandinConfig, User};
use plumbing::shutdown::{self, Trigger};
use proto::tokenissuer::IssueNodeCredentialsRequest;
use proto::tokenissuer::token_issuer_client::TokenIssuerClient;
use rcgen::{CertificateParams, DnType, KeyPair};
use token_issuer::Config;
use tonic::Code;
use x509_parser::prelude::*;

const TOKEN: &str = "issuer-sa-token";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}

/// The RBAC token-issuer gets in deploy/: create and delete Secrets in kube-system, nothing else.
fn issuer_user(verbs: &[&str]) -> User {
    User::service_account(
        TOKEN,
        "kube-system",
        "join-token-issuer",
        vec![Grant::namespaced(
            "kube-system",
            PolicyRule::new(verbs, &[""], &["secrets"]),
        )],
    )
}

struct Harness {
    standin: Running,
    socket: PathBuf,
    trigger: Trigger,
    task: tokio::task::JoinHandle<Result<(), token_issuer::Error>>,
    ca_cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn start(user: User, peer_uid: u32) -> Self {
        Self::start_with_ca(user, peer_uid, "ca-rsa.crt", "ca-rsa-pkcs1.key").await
    }

    async fn start_with_ca(user: User, peer_uid: u32, cert: &str, key: &str) -> Self {
        let standin = KubeStandin::start(StandinConfig::new(vec![user]))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, standin.kubeconfig(TOKEN)).unwrap();
        let socket = dir.path().join("token-issuer.sock");
        let ca_cert = Path::new(FIXTURES).join(cert);
        let config = Config {
            socket: socket.clone(),
            socket_mode: 0o600,
            peer_uid,
            ca_cert: ca_cert.clone(),
            ca_key: Path::new(FIXTURES).join(key),
            api_server_endpoint: "10.0.0.1:6443".into(),
            kubeconfig: Some(kubeconfig),
            kube_timeout: Duration::from_secs(5),
            grace_period: Duration::from_secs(2),
            log_format: Default::default(),
        };
        let (trigger, stop) = shutdown::channel();
        let task = tokio::spawn(token_issuer::run(config, stop));
        for _ in 0..200 {
            if socket.exists() {
                break;
            }
            assert!(!task.is_finished(), "token-issuer exited early");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Self {
            standin,
            socket,
            trigger,
            task,
            ca_cert,
            _dir: dir,
        }
    }

    async fn issue(
        &self,
        csr: Vec<u8>,
    ) -> Result<proto::tokenissuer::IssueNodeCredentialsResponse, tonic::Status> {
        let mut client = TokenIssuerClient::new(plumbing::unix::channel(self.socket.clone()));
        client
            .issue_node_credentials(IssueNodeCredentialsRequest {
                certificate_request: csr,
                is_control_plane: false,
                peer_address: "192.0.2.7:51000".into(),
            })
            .await
            .map(|r| r.into_inner())
    }

    fn secrets(&self) -> Vec<kube_standin::StoredObject> {
        self.standin.secrets("kube-system")
    }

    fn methods(&self) -> Vec<String> {
        self.standin
            .requests()
            .into_iter()
            .map(|r| format!("{} {}", r.method, r.code))
            .collect()
    }

    async fn stop(self) {
        self.trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("run returns after shutdown")
            .unwrap()
            .unwrap();
    }
}

fn csr_with(org: &str, cn: &str, sans: &[&str]) -> (Vec<u8>, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.distinguished_name.push(DnType::CommonName, cn);
    let der = params.serialize_request(&key).unwrap().der().to_vec();
    (der, key)
}

fn node_csr(node: &str, ips: &[&str]) -> Vec<u8> {
    csr_with("system:nodes", &format!("system:node:{node}"), ips).0
}

fn pem_der(pem: &[u8]) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem)
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn valid_csr_gets_token_certificate_and_hash() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h
        .issue(node_csr("worker-0", &["10.0.0.5", "fd00::5"]))
        .await
        .unwrap();

    // Token and Secret, field by field.
    let (id, secret) = resp.token.split_once('.').unwrap();
    assert!(
        id.len() == 6
            && id
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert!(
        secret.len() == 16
            && secret
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    let secrets = h.secrets();
    assert_eq!(secrets.len(), 1);
    let s = &secrets[0];
    assert_eq!(s.name, format!("bootstrap-token-{id}"));
    assert_eq!(s.secret_type(), Some("bootstrap.kubernetes.io/token"));
    assert_eq!(s.secret_string("token-id").unwrap(), id);
    assert_eq!(s.secret_string("token-secret").unwrap(), secret);
    assert_eq!(
        s.secret_string("usage-bootstrap-authentication").unwrap(),
        "true"
    );
    assert_eq!(s.secret_string("usage-bootstrap-signing").unwrap(), "true");
    assert_eq!(
        s.secret_string("auth-extra-groups").unwrap(),
        "system:bootstrappers:kubeadm:default-node-token"
    );
    assert!(s.secret_string("description").unwrap().contains("worker-0"));
    let expiration = s.secret_string("expiration").unwrap();
    let exp = ::time::OffsetDateTime::parse(
        &expiration,
        &::time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let ttl = exp - before;
    assert!(
        ttl > ::time::Duration::minutes(14)
            && ttl <= ::time::Duration::minutes(15) + ::time::Duration::seconds(5),
        "{expiration}"
    );
    assert!(expiration.ends_with('Z') && !expiration.contains('.'));
    let mut keys = s.secret_keys();
    keys.sort();
    assert_eq!(
        keys,
        [
            "auth-extra-groups",
            "description",
            "expiration",
            "token-id",
            "token-secret",
            "usage-bootstrap-authentication",
            "usage-bootstrap-signing"
        ]
    );

    // Endpoint, node name, discovery hash over the CA's SPKI.
    assert_eq!(resp.api_server_endpoint, "10.0.0.1:6443");
    assert_eq!(resp.node_name, "worker-0");
    let ca_der = pem_der(&std::fs::read(&h.ca_cert).unwrap());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let want = format!(
        "sha256:{}",
        hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            ca.tbs_certificate.subject_pki.raw
        ))
    );
    assert_eq!(resp.discovery_token_ca_cert_hash, want);

    // The kubelet certificate chains to the CA and says what the CSR asked for.
    let cert_der = pem_der(&resp.kubelet_cert);
    let (_, cert) = X509Certificate::from_der(&cert_der).unwrap();
    cert.verify_signature(Some(&ca.tbs_certificate.subject_pki))
        .unwrap();
    assert_eq!(cert.issuer(), ca.subject());
    let org: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(org, ["system:nodes"]);
    assert_eq!(cn, ["system:node:worker-0"]);
    let san = cert.subject_alternative_name().unwrap().unwrap();
    let ips: Vec<IpAddr> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::IPAddress(b) if b.len() == 4 => {
                IpAddr::from(<[u8; 4]>::try_from(*b).unwrap())
            }
            GeneralName::IPAddress(b) => IpAddr::from(<[u8; 16]>::try_from(*b).unwrap()),
            other => panic!("unexpected SAN {other}"),
        })
        .collect();
    assert_eq!(
        ips,
        [
            "10.0.0.5".parse::<IpAddr>().unwrap(),
            "fd00::5".parse().unwrap()
        ]
    );
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && eku.server_auth);
    let bc = cert.basic_constraints().unwrap().map(|b| b.value.ca);
    assert_ne!(bc, Some(true));
    let validity = cert.validity().time_to_expiration().unwrap();
    assert!(validity > ::time::Duration::days(364) && validity <= ::time::Duration::days(365));
    assert!(cert.raw_serial().len() <= 20 && cert.raw_serial()[0] & 0x80 == 0);

    // A second node gets a different token.
    let again = h.issue(node_csr("worker-1", &["10.0.0.6"])).await.unwrap();
    assert_ne!(again.token, resp.token);
    assert_eq!(h.secrets().len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn bad_csrs_are_invalid_argument_and_create_nothing() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;

    let mut bad_sig = node_csr("worker-0", &["10.0.0.5"]);
    let last = bad_sig.len() - 1;
    bad_sig[last] ^= 0x01;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "wrong O",
            csr_with("system:masters", "system:node:worker-0", &[]).0,
            "organization",
        ),
        (
            "two Os",
            {
                let key = KeyPair::generate().unwrap();
                let mut p = CertificateParams::default();
                p.distinguished_name
                    .push(DnType::OrganizationName, "system:nodes");
                p.distinguished_name
                    .push(DnType::OrganizationName, "system:masters");
                p.distinguished_name
                    .push(DnType::CommonName, "system:node:worker-0");
                p.serialize_request(&key).unwrap().der().to_vec()
            },
            "organization",
        ),
        (
            "CN without prefix",
            csr_with("system:nodes", "worker-0", &[]).0,
            "does not start with",
        ),
        ("bad signature", bad_sig, "signature"),
        (
            "upper-case node name",
            node_csr("Worker_0", &[]),
            "not a valid Kubernetes name",
        ),
        (
            "empty node name",
            node_csr("", &[]),
            "not a valid Kubernetes name",
        ),
        (
            "too long node name",
            node_csr(&"a".repeat(254), &[]),
            "not a valid Kubernetes name",
        ),
        ("not DER", b"hello".to_vec(), "not a DER PKCS#10"),
        ("empty", Vec::new(), "empty"),
    ];
    for (what, csr, needle) in cases {
        let status = h.issue(csr).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{what}: {}",
            status.message()
        );
    }
    assert!(h.standin.objects().is_empty());
    assert!(
        h.standin.requests().iter().all(|r| r.method != "POST"),
        "a refused CSR never reaches Kubernetes: {:?}",
        h.methods()
    );
    h.stop().await;
}

#[tokio::test]
async fn forbidden_by_rbac_is_internal_and_names_the_step() {
    // The service account may delete but not create.
    let h = Harness::start(issuer_user(&["delete"]), own_uid()).await;
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status
            .message()
            .contains("creating bootstrap token secret bootstrap-token-"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("403"), "{}", status.message());
    assert!(h.secrets().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn conflict_is_aborted() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;
    h.standin.inject(Fault::once(409).on("POST"));
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("409"));
    assert!(h.secrets().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn server_errors_are_unavailable_and_leave_nothing_behind() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;

    // Refused before the write.
    h.standin.inject(Fault::once(500).on("POST"));
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("creating bootstrap token secret"));
    assert!(h.secrets().is_empty());

    // Written, then the answer lost: token-issuer must delete what it cannot know about.
    h.standin.inject(Fault::once(500).on("POST").after_commit());
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(h.secrets().is_empty(), "rolled back: {:?}", h.methods());
    assert!(
        h.methods().contains(&"DELETE 200".to_owned()),
        "{:?}",
        h.methods()
    );

    // Throttling is retried by the client and then succeeds.
    h.standin.inject(Fault::once(429).on("POST"));
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    assert_eq!(h.secrets().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn slow_api_server_times_out_as_unavailable_and_is_rolled_back() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;
    h.standin.set_delay(Duration::from_secs(6)); // beyond the 5 s kube timeout
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    h.standin.set_delay(Duration::ZERO);
    // The stand-in may still complete the slow create after the client gave up; whatever
    // happened, no token may survive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(h.secrets().is_empty(), "{:?}", h.methods());
    h.stop().await;
}

#[tokio::test]
async fn other_uids_are_refused() {
    let h = Harness::start(
        issuer_user(&["create", "delete"]),
        own_uid().wrapping_add(4242),
    )
    .await;
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    // The listener closes the connection unanswered; depending on timing tonic reports that
    // as Unavailable (connect) or a transport error (broken pipe mid-request).
    assert!(
        status.code() == Code::Unavailable
            || (status.code() == Code::Unknown && status.message().contains("transport error")),
        "{status:?}"
    );
    assert!(
        h.standin.requests().is_empty(),
        "nothing reached Kubernetes"
    );
    h.stop().await;
}

#[tokio::test]
async fn sec1_ec_ca_key_works() {
    let h = Harness::start_with_ca(
        issuer_user(&["create", "delete"]),
        own_uid(),
        "ca-ec.crt",
        "ca-ec-sec1.key",
    )
    .await;
    let resp = h.issue(node_csr("worker-0", &["10.0.0.5"])).await.unwrap();
    let ca_der = pem_der(&std::fs::read(&h.ca_cert).unwrap());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let cert_der = pem_der(&resp.kubelet_cert);
    let (_, cert) = X509Certificate::from_der(&cert_der).unwrap();
    cert.verify_signature(Some(&ca.tbs_certificate.subject_pki))
        .unwrap();
    h.stop().await;
}

#[test]
fn pkcs8_ca_key_and_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "kubernetes");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let (crt, k) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&crt, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    let ca = token_issuer::ca::ClusterCa::load(&crt, &k).unwrap();
    let req = token_issuer::csr::validate(&node_csr("n", &[])).unwrap();
    let pem = ca.sign_kubelet(&req).unwrap();
    let der = pem_der(pem.as_bytes());
    let (_, signed) = X509Certificate::from_der(&der).unwrap();
    let (_, parsed_ca) = X509Certificate::from_der(cert.der()).unwrap();
    signed
        .verify_signature(Some(&parsed_ca.tbs_certificate.subject_pki))
        .unwrap();

    // Another CA's key is refused at startup.
    let other = Path::new(FIXTURES).join("ca-ec-sec1.key");
    let err = token_issuer::ca::ClusterCa::load(&crt, &other).unwrap_err();
    assert!(
        matches!(err, token_issuer::ca::LoadError::Mismatch { .. }),
        "{err}"
    );
}
