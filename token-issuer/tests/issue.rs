//! token-issuer end to end: in-process `run` on a real Unix socket, a real tonic client, and the
//! Kubernetes API stand-in over HTTPS.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_standin::fixtures::{
    components_json, constellation_version, control_plane_expectation, control_plane_node,
    worker_node,
};
use kube_standin::{Fault, Grant, KubeStandin, PolicyRule, Running, StandinConfig, User};
use plumbing::shutdown::{self, Trigger};
use proto::tokenissuer::IssueNodeCredentialsRequest;
use proto::tokenissuer::token_issuer_client::TokenIssuerClient;
use rcgen::{CertificateParams, DnType, KeyPair};
use token_issuer::Config;
use tonic::Code;
use x509_parser::prelude::*;

const TOKEN: &str = "issuer-sa-token";
/// The evidence digest join-core passes on from attest-proxy.
const EVIDENCE: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}

/// The grants deploy/base/rbac.yaml gives token-issuer's service account.
fn deployed_grants() -> Vec<Grant> {
    deploy::grants_for_service_account("kube-system", "join-token-issuer").unwrap()
}

/// token-issuer's service account with the deployed RBAC, except that on Secrets it may only
/// do `secret_verbs`.
fn issuer_user(secret_verbs: &[&str]) -> User {
    let mut grants: Vec<Grant> = deployed_grants()
        .into_iter()
        .filter(|g| !g.rule.resources.contains(&"secrets".to_owned()))
        .collect();
    grants.push(Grant::namespaced(
        "kube-system",
        PolicyRule::new(secret_verbs, &[""], &["secrets"]),
    ));
    User::service_account(TOKEN, "kube-system", "join-token-issuer", grants)
}

/// The RBAC token-issuer gets in deploy/base/.
fn full_user() -> User {
    User::service_account(TOKEN, "kube-system", "join-token-issuer", deployed_grants())
}

const K8S_VERSION: &str = "v1.31.1";
const COMPONENTS_REF: &str = "k8s-components-sha256-0123abcd";

/// A cluster that expects three control-plane nodes and has none yet, with its version.
fn fresh_cluster() -> Vec<serde_json::Value> {
    let mut seed = constellation_version(K8S_VERSION, COMPONENTS_REF, &components_json()).to_vec();
    seed.push(control_plane_expectation(3));
    seed
}

/// Fills a PKI directory with the eight control-plane files, each holding its own name.
fn write_pki(dir: &Path) {
    std::fs::create_dir_all(dir.join("etcd")).unwrap();
    for name in token_issuer::pki::CONTROL_PLANE_FILES {
        std::fs::write(dir.join(name), format!("-----PEM of {name}-----\n")).unwrap();
    }
}

struct Harness {
    standin: Running,
    socket: PathBuf,
    /// The admin endpoint (`/livez`, `/readyz`, `/metrics`).
    admin: std::net::SocketAddr,
    pki_dir: PathBuf,
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
        Self::start_seeded(user, peer_uid, cert, key, &fresh_cluster()).await
    }

    /// Starts with the stand-in holding exactly `seed`.
    async fn start_seeded(
        user: User,
        peer_uid: u32,
        cert: &str,
        key: &str,
        seed: &[serde_json::Value],
    ) -> Self {
        Self::start_full(
            user,
            peer_uid,
            cert,
            key,
            seed,
            token_issuer::cluster_version::DEFAULT_MAX_AGE,
        )
        .await
    }

    /// Starts with the stand-in holding exactly `seed`, keeping version reads for `max_age`.
    async fn start_full(
        user: User,
        peer_uid: u32,
        cert: &str,
        key: &str,
        seed: &[serde_json::Value],
        version_max_age: Duration,
    ) -> Self {
        let standin = KubeStandin::start(StandinConfig::new(vec![user]))
            .await
            .unwrap();
        for object in seed {
            standin.seed(object.clone()).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let pki_dir = dir.path().join("pki");
        write_pki(&pki_dir);
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, standin.kubeconfig(TOKEN)).unwrap();
        let socket = dir.path().join("token-issuer.sock");
        let ca_cert = Path::new(FIXTURES).join(cert);
        // A free port for the admin endpoint (run() binds it itself).
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = Config {
            socket: socket.clone(),
            socket_mode: 0o600,
            peer_uid,
            ca_cert: ca_cert.clone(),
            ca_key: Path::new(FIXTURES).join(key),
            api_server_endpoint: Some("10.0.0.1:6443".into()),
            api_server_host: None,
            api_server_port: 6443,
            pki_dir: pki_dir.clone(),
            kubeconfig: Some(kubeconfig),
            kube_timeout: Duration::from_secs(5),
            version_max_age,
            admin_listen: Some(admin),
            grace_period: Duration::from_secs(2),
            pod_name: "join-service-test-pod".into(),
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
            admin,
            pki_dir,
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
        self.issue_as(csr, false).await
    }

    async fn issue_as(
        &self,
        csr: Vec<u8>,
        is_control_plane: bool,
    ) -> Result<proto::tokenissuer::IssueNodeCredentialsResponse, tonic::Status> {
        let mut client =
            TokenIssuerClient::new(plumbing::unix::channel(self.socket.clone(), own_uid()));
        client
            .issue_node_credentials(IssueNodeCredentialsRequest {
                certificate_request: csr,
                is_control_plane,
                peer_address: "192.0.2.7:51000".into(),
                attested_evidence_sha256: EVIDENCE.into(),
            })
            .await
            .map(|r| r.into_inner())
    }

    fn secrets(&self) -> Vec<kube_standin::StoredObject> {
        self.standin.secrets("kube-system")
    }

    fn joining_nodes(&self) -> Vec<kube_standin::StoredObject> {
        self.standin.joining_nodes()
    }

    /// No token and no JoiningNode exist.
    fn assert_nothing_created(&self, what: &str) {
        assert!(
            self.secrets().is_empty(),
            "{what}: token left: {:?}",
            self.methods()
        );
        assert!(
            self.joining_nodes().is_empty(),
            "{what}: JoiningNode left: {:?}",
            self.joining_nodes()
        );
    }

    fn methods(&self) -> Vec<String> {
        self.standin
            .requests()
            .into_iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.code))
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
    let h = Harness::start(full_user(), own_uid()).await;
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
    assert_eq!(
        s.object["metadata"]["labels"],
        serde_json::json!({"joinservice.edgeless.systems/issued-by": "token-issuer"}),
        "the admission policy lets token-issuer delete only tokens so labelled"
    );
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
        hex::encode(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
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
    let h = Harness::start(full_user(), own_uid()).await;

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
    h.assert_nothing_created("bad CSRs");
    assert!(
        h.standin.requests().is_empty(),
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
    // The JoiningNode written before the token was refused is gone again.
    h.assert_nothing_created("403 on the token");
    assert!(
        h.methods().iter().any(|m| m
            .starts_with("DELETE /apis/update.edgeless.systems/v1alpha1/joiningnodes/worker-0")
            && m.ends_with(" 200")),
        "{:?}",
        h.methods()
    );
    h.stop().await;
}

#[tokio::test]
async fn a_rollback_that_fails_transiently_is_retried() {
    // The token is refused (403), so the JoiningNode written before it must go; the first
    // DELETE of it fails with a 500.
    let h = Harness::start(issuer_user(&["delete"]), own_uid()).await;
    h.standin.inject(
        Fault::once(500)
            .on("DELETE")
            .at("/apis/update.edgeless.systems/v1alpha1/joiningnodes/"),
    );
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    h.assert_nothing_created("a rollback retried after a 500");
    let deletes: Vec<String> = h
        .methods()
        .into_iter()
        .filter(|m| m.starts_with("DELETE /apis/update.edgeless.systems"))
        .collect();
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    assert!(
        deletes[0].ends_with(" 500") && deletes[1].ends_with(" 200"),
        "{deletes:?}"
    );
    h.stop().await;
}

async fn admin_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    plumbing::admin::get(addr, path).await.unwrap()
}

#[tokio::test]
async fn admin_endpoint_reports_the_api_server_and_counts_calls() {
    let h = Harness::start(issuer_user(&["create", "delete"]), own_uid()).await;
    assert_eq!(admin_get(h.admin, "/livez").await.0, 200);
    let (status, body) = admin_get(h.admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok kubernetes_api\n"));

    h.issue(node_csr("worker-0", &[])).await.unwrap();
    // Metrics are process-wide and tests run in parallel: check the series, not their counts.
    let (_, metrics) = admin_get(h.admin, "/metrics").await;
    for series in [
        r#"token_issuer_credentials_total{result="issued",step="ok"}"#,
        r#"token_issuer_issue_duration_seconds_count"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="get_nodeversion",outcome="ok"}"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="get_configmap",outcome="ok"}"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="apply_joiningnode",outcome="ok"}"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="create_secret",outcome="ok"}"#,
    ] {
        assert!(metrics.contains(series), "missing {series}:\n{metrics}");
    }

    // A refusal by RBAC is counted under the step and the API server's answer.
    let h2 = Harness::start(issuer_user(&["delete"]), own_uid()).await;
    h2.issue(node_csr("worker-1", &[])).await.unwrap_err();
    let (_, metrics) = admin_get(h2.admin, "/metrics").await;
    for series in [
        r#"token_issuer_credentials_total{result="refused",step="create_token"}"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="create_secret",outcome="403"}"#,
    ] {
        assert!(metrics.contains(series), "missing {series}:\n{metrics}");
    }
    h2.stop().await;

    h.stop().await;
}

#[tokio::test]
async fn conflict_is_aborted() {
    let h = Harness::start(full_user(), own_uid()).await;
    h.standin.inject(Fault::once(409).on("POST").at("/secrets"));
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("409"));
    h.assert_nothing_created("409 on the token");
    h.stop().await;
}

#[tokio::test]
async fn server_errors_are_unavailable_and_leave_nothing_behind() {
    let h = Harness::start(full_user(), own_uid()).await;

    // Refused before the write.
    h.standin.inject(Fault::once(500).on("POST").at("/secrets"));
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("creating bootstrap token secret"));
    h.assert_nothing_created("500 before the write");

    // Written, then the answer lost: token-issuer must delete what it cannot know about.
    h.standin
        .inject(Fault::once(500).on("POST").at("/secrets").after_commit());
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    h.assert_nothing_created("500 after the write");
    assert!(
        h.methods().iter().any(
            |m| m.starts_with("DELETE /api/v1/namespaces/kube-system/secrets/")
                && m.ends_with(" 200")
        ),
        "{:?}",
        h.methods()
    );

    // Throttling is retried by the client and then succeeds.
    h.standin.inject(Fault::once(429).on("POST").at("/secrets"));
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    assert_eq!(h.secrets().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn slow_api_server_times_out_as_unavailable_and_is_rolled_back() {
    let h = Harness::start(full_user(), own_uid()).await;
    // Token create and its rollback both take longer than the 5 s kube timeout; the delete,
    // sent after the create, lands after it.
    h.standin.inject(
        Fault::slow(Duration::from_secs(6))
            .at("/api/v1/namespaces/kube-system/secrets")
            .times(2),
    );
    let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // kube-rs's read timeout (the same 5 s) or our deadline, whichever fires first.
    assert!(
        status
            .message()
            .contains("creating bootstrap token secret bootstrap-token-"),
        "{}",
        status.message()
    );
    // The stand-in may still complete the slow create after the client gave up; whatever
    // happened, no token may survive.
    tokio::time::sleep(Duration::from_secs(8)).await;
    h.assert_nothing_created("slow API server");
    h.stop().await;
}

#[tokio::test]
async fn other_uids_are_refused() {
    let h = Harness::start(full_user(), own_uid().wrapping_add(4242)).await;
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
    let h = Harness::start_with_ca(full_user(), own_uid(), "ca-ec.crt", "ca-ec-sec1.key").await;
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

fn rfc3339(s: &str) -> ::time::OffsetDateTime {
    ::time::OffsetDateTime::parse(s, &::time::format_description::well_known::Rfc3339).unwrap()
}

fn spec<'a>(o: &'a kube_standin::StoredObject, field: &str) -> &'a serde_json::Value {
    &o.object["spec"][field]
}

/// Asserts `deadline` lies `ttl` after a moment between `before` and now.
fn assert_deadline(
    deadline: &serde_json::Value,
    before: ::time::OffsetDateTime,
    ttl: ::time::Duration,
) {
    let d = rfc3339(deadline.as_str().unwrap());
    let after = ::time::OffsetDateTime::now_utc();
    assert!(
        d >= before + ttl - ::time::Duration::seconds(1) && d <= after + ttl,
        "deadline {d} not {ttl} after the join"
    );
}

#[tokio::test]
async fn worker_join_gets_version_components_and_a_joining_node() {
    let h = Harness::start(full_user(), own_uid()).await;
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h.issue(node_csr("worker-0", &["10.0.0.5"])).await.unwrap();

    assert_eq!(resp.kubernetes_version, K8S_VERSION);
    let want: Vec<serde_json::Value> = serde_json::from_str(&components_json()).unwrap();
    assert_eq!(resp.kubernetes_components.len(), want.len());
    for (got, want) in resp.kubernetes_components.iter().zip(&want) {
        assert_eq!(got.url, want["url"].as_str().unwrap());
        assert_eq!(got.hash, want["hash"].as_str().unwrap());
        assert_eq!(got.install_path, want["install_path"].as_str().unwrap());
        assert_eq!(got.extract, want["extract"].as_bool().unwrap_or(false));
    }
    assert!(
        resp.control_plane_files.is_empty(),
        "workers get no CA keys"
    );

    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.name, "worker-0");
    assert_eq!(n.object["apiVersion"], "update.edgeless.systems/v1alpha1");
    assert_eq!(n.object["kind"], "JoiningNode");
    assert_eq!(spec(n, "name"), "worker-0");
    assert_eq!(spec(n, "componentsreference"), COMPONENTS_REF);
    assert_eq!(spec(n, "iscontrolplane"), false);
    assert_deadline(spec(n, "deadline"), before, ::time::Duration::hours(48));
    assert!(
        h.methods()
            .iter()
            .any(|m| m == "PATCH /apis/update.edgeless.systems/v1alpha1/joiningnodes/worker-0 201"),
        "workers are recorded by server-side apply: {:?}",
        h.methods()
    );

    // A retried join refreshes the same record by apply.
    let rv = n.object["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.issue(node_csr("worker-0", &["10.0.0.5"])).await.unwrap();
    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    assert_ne!(nodes[0].object["metadata"]["resourceVersion"], rv);
    assert_ne!(spec(&nodes[0], "deadline"), spec(n, "deadline"));
    assert_eq!(h.secrets().len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn control_plane_join_gets_the_pki_and_takes_the_lock() {
    let h = Harness::start(full_user(), own_uid()).await;
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h
        .issue_as(node_csr("cp-1", &["10.0.0.2"]), true)
        .await
        .unwrap();

    let names: Vec<&str> = resp
        .control_plane_files
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "ca.crt",
            "ca.key",
            "etcd/ca.crt",
            "etcd/ca.key",
            "front-proxy-ca.crt",
            "front-proxy-ca.key",
            "sa.key",
            "sa.pub"
        ]
    );
    for f in &resp.control_plane_files {
        assert_eq!(
            f.data,
            std::fs::read(h.pki_dir.join(&f.name)).unwrap(),
            "{}",
            f.name
        );
    }
    assert_eq!(resp.kubernetes_version, K8S_VERSION);
    assert!(!resp.kubernetes_components.is_empty());

    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.name, "control-plane");
    assert_eq!(spec(n, "name"), "cp-1");
    assert_eq!(spec(n, "iscontrolplane"), true);
    assert_eq!(spec(n, "componentsreference"), COMPONENTS_REF);
    assert_deadline(spec(n, "deadline"), before, ::time::Duration::minutes(10));
    assert_eq!(h.secrets().len(), 1);

    // While it is held, the next control-plane node is told to retry; workers still join.
    let busy = h.issue_as(node_csr("cp-2", &[]), true).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert!(
        busy.message().contains("cp-1") && busy.message().contains("retry"),
        "{}",
        busy.message()
    );
    h.issue(node_csr("worker-9", &[])).await.unwrap();
    assert_eq!(
        h.secrets().len(),
        2,
        "the refused control-plane node got no token"
    );
    h.stop().await;
}

#[tokio::test]
async fn two_control_plane_nodes_at_once_one_joins_one_retries() {
    let h = Harness::start(full_user(), own_uid()).await;
    let (a, b) = tokio::join!(
        h.issue_as(node_csr("cp-a", &[]), true),
        h.issue_as(node_csr("cp-b", &[]), true)
    );
    let (winner, loser) = match (a, b) {
        (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
        other => panic!("exactly one control-plane join must succeed: {other:?}"),
    };
    assert_eq!(loser.code(), Code::Aborted, "{loser:?}");
    assert!(
        loser.message().contains("retry later"),
        "{}",
        loser.message()
    );
    assert_eq!(h.secrets().len(), 1);
    let (id, _) = winner.token.split_once('.').unwrap();
    assert_eq!(h.secrets()[0].name, format!("bootstrap-token-{id}"));
    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), winner.node_name.as_str());
    h.stop().await;
}

#[tokio::test]
async fn expired_control_plane_lock_is_replaced() {
    let mut seed = fresh_cluster();
    seed.push(serde_json::json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "JoiningNode",
        "metadata": {"name": "control-plane"},
        "spec": {"name": "cp-dead", "componentsreference": COMPONENTS_REF,
                 "iscontrolplane": true, "deadline": "2020-01-01T00:00:00Z"},
    }));
    let h = Harness::start_seeded(
        full_user(),
        own_uid(),
        "ca-rsa.crt",
        "ca-rsa-pkcs1.key",
        &seed,
    )
    .await;
    h.issue_as(node_csr("cp-new", &[]), true).await.unwrap();
    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), "cp-new");
    h.stop().await;
}

#[tokio::test]
async fn api_server_failures_give_specific_statuses_and_leave_nothing() {
    let h = Harness::start(full_user(), own_uid()).await;
    let joining = "/apis/update.edgeless.systems/v1alpha1/joiningnodes";
    let secrets = "/api/v1/namespaces/kube-system/secrets";
    let cases: Vec<(&str, Fault, bool, Code, &str)> = vec![
        (
            "403 on the NodeVersion",
            Fault::once(403).at("/nodeversions/"),
            false,
            Code::Internal,
            "reading NodeVersion constellation-version: Kubernetes API answered 403",
        ),
        (
            "500 on the ConfigMap",
            Fault::once(500).at("/configmaps/"),
            false,
            Code::Unavailable,
            "reading components ConfigMap kube-system/",
        ),
        (
            "403 on the JoiningNode",
            Fault::once(403).on("PATCH").at(joining),
            false,
            Code::Internal,
            "applying JoiningNode worker-0: Kubernetes API answered 403",
        ),
        (
            "500 after applying the JoiningNode",
            Fault::once(500).on("PATCH").at(joining).after_commit(),
            false,
            Code::Unavailable,
            "applying JoiningNode worker-0",
        ),
        (
            "409 on the token",
            Fault::once(409).on("POST").at(secrets),
            false,
            Code::Aborted,
            "creating bootstrap token secret bootstrap-token-",
        ),
        (
            "500 on the token",
            Fault::once(500).on("POST").at(secrets),
            false,
            Code::Unavailable,
            "creating bootstrap token secret",
        ),
        // kube-rs retries a 503; the retry finds the token the first attempt stored.
        (
            "503 after creating the token",
            Fault::once(503).on("POST").at(secrets).after_commit(),
            false,
            Code::Aborted,
            "already exists",
        ),
        (
            "403 on the control-plane JoiningNode",
            Fault::once(403).on("POST").at(joining),
            true,
            Code::Internal,
            "creating JoiningNode control-plane: Kubernetes API answered 403",
        ),
        (
            "500 after creating the control-plane JoiningNode",
            Fault::once(500).on("POST").at(joining).after_commit(),
            true,
            Code::Unavailable,
            "creating JoiningNode control-plane",
        ),
        (
            "409 on the control-plane token",
            Fault::once(409).on("POST").at(secrets),
            true,
            Code::Aborted,
            "creating bootstrap token secret",
        ),
        (
            "500 on the control-plane token",
            Fault::once(500).on("POST").at(secrets).after_commit(),
            true,
            Code::Unavailable,
            "creating bootstrap token secret",
        ),
    ];
    for (what, fault, cp, code, needle) in cases {
        h.standin.inject(fault);
        let name = if cp { "cp-0" } else { "worker-0" };
        let status = h.issue_as(node_csr(name, &[]), cp).await.unwrap_err();
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{what}: {}",
            status.message()
        );
        h.assert_nothing_created(what);
    }
    // A control-plane create answered 503 after it was stored: kube-rs's retry finds the lock
    // this very join holds, and the join goes on.
    h.standin
        .inject(Fault::once(503).on("POST").at(joining).after_commit());
    h.issue_as(node_csr("cp-0", &[]), true).await.unwrap();
    assert_eq!(h.joining_nodes().len(), 1);
    // And after all that, workers join again.
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn cluster_without_version_is_failed_precondition_and_untouched() {
    let cases: Vec<(&str, Vec<serde_json::Value>, &str)> = vec![
        (
            "no NodeVersion",
            vec![],
            "NodeVersion constellation-version: Kubernetes API answered 404",
        ),
        (
            "no ConfigMap",
            vec![constellation_version(K8S_VERSION, COMPONENTS_REF, "[]")[0].clone()],
            "components ConfigMap kube-system/k8s-components-sha256-0123abcd: Kubernetes API answered 404",
        ),
        (
            "empty components",
            constellation_version(K8S_VERSION, COMPONENTS_REF, "[]").to_vec(),
            "the components list is empty",
        ),
        (
            "no version",
            {
                let mut s = constellation_version("", COMPONENTS_REF, &components_json()).to_vec();
                s[0]["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("kubernetesClusterVersion");
                s
            },
            "has no kubernetesClusterVersion",
        ),
    ];
    for (what, seed, needle) in cases {
        let h = Harness::start_seeded(
            full_user(),
            own_uid(),
            "ca-rsa.crt",
            "ca-rsa-pkcs1.key",
            &seed,
        )
        .await;
        let status = h.issue(node_csr("worker-0", &[])).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{what}: {status:?}"
        );
        assert!(
            status.message().contains(needle),
            "{what}: {}",
            status.message()
        );
        h.assert_nothing_created(what);
        assert!(
            h.standin.requests().iter().all(|r| r.method == "GET"),
            "{what}: only reads: {:?}",
            h.methods()
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn missing_control_plane_file_refuses_control_plane_joins_only() {
    let h = Harness::start(full_user(), own_uid()).await;
    std::fs::remove_file(h.pki_dir.join("front-proxy-ca.key")).unwrap();
    let status = h.issue_as(node_csr("cp-0", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains(
            "reading the control-plane PKI: reading control-plane file front-proxy-ca.key"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("missing PKI file");
    assert!(
        h.standin.requests().iter().all(|r| r.method == "GET"),
        "refused before any write: {:?}",
        h.methods()
    );
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    h.stop().await;
}

/// The `NodeVersion` and ConfigMap are read once for joins close together, read again once the
/// read is older than its max age, and read afresh after a join failed at the API server.
#[tokio::test]
async fn cluster_version_reads_are_kept_for_a_moment_and_dropped_after_a_fault() {
    const MAX_AGE: Duration = Duration::from_secs(30);
    let seed = constellation_version(K8S_VERSION, COMPONENTS_REF, &components_json());
    let h = Harness::start_full(
        full_user(),
        own_uid(),
        "ca-rsa.crt",
        "ca-rsa-pkcs1.key",
        &seed,
        MAX_AGE,
    )
    .await;
    let reads = |h: &Harness| {
        let requests = h.standin.requests();
        let count = |part: &str| {
            requests
                .iter()
                .filter(|r| r.method == "GET" && r.path.contains(part))
                .count()
        };
        (count("/nodeversions/"), count("/configmaps/"))
    };
    let first = h.issue(node_csr("worker-0", &[])).await.unwrap();
    let second = h.issue(node_csr("worker-1", &[])).await.unwrap();
    assert_eq!(reads(&h), (1, 1), "{:?}", h.methods());
    assert_eq!(first.kubernetes_version, second.kubernetes_version);
    assert_eq!(first.kubernetes_components, second.kubernetes_components);

    h.standin.inject(
        Fault::once(500)
            .on("POST")
            .at("/api/v1/namespaces/kube-system/secrets"),
    );
    h.issue(node_csr("worker-2", &[])).await.unwrap_err();
    h.issue(node_csr("worker-3", &[])).await.unwrap();
    assert_eq!(reads(&h), (2, 2), "read afresh after the fault");
    h.stop().await;

    // A read older than its max age is not used.
    let h = Harness::start_full(
        full_user(),
        own_uid(),
        "ca-rsa.crt",
        "ca-rsa-pkcs1.key",
        &seed,
        Duration::from_millis(100),
    )
    .await;
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    h.issue(node_csr("worker-1", &[])).await.unwrap();
    assert_eq!(reads(&h), (2, 2));
    h.stop().await;

    // Max age zero: every join reads.
    let h = Harness::start_full(
        full_user(),
        own_uid(),
        "ca-rsa.crt",
        "ca-rsa-pkcs1.key",
        &seed,
        Duration::ZERO,
    )
    .await;
    for node in ["worker-0", "worker-1", "worker-2"] {
        h.issue(node_csr(node, &[])).await.unwrap();
    }
    assert_eq!(reads(&h), (3, 3));
    h.stop().await;
}

/// Starts with a fresh cluster's version, expecting `expected` control-plane nodes (none if
/// `None`), holding `nodes` and, if `upgrading`, a NodeVersion marking an upgrade in progress.
async fn start_cluster(
    expected: Option<&str>,
    nodes: &[serde_json::Value],
    upgrading: bool,
) -> Harness {
    let mut seed = constellation_version(K8S_VERSION, COMPONENTS_REF, &components_json()).to_vec();
    if upgrading {
        seed[0]["status"] = serde_json::json!({"conditions": [
            {"type": "Outdated", "status": "True", "reason": "NodesOutdated",
             "message": "Some nodes are outdated", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]});
    }
    if let Some(expected) = expected {
        let mut config = control_plane_expectation(0);
        config["data"]["expectedControlPlaneNodes"] = expected.into();
        seed.push(config);
    }
    seed.extend(nodes.iter().cloned());
    Harness::start_seeded(
        full_user(),
        own_uid(),
        "ca-rsa.crt",
        "ca-rsa-pkcs1.key",
        &seed,
    )
    .await
}

fn cp_nodes(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| control_plane_node(&format!("cp-old-{i}")))
        .collect()
}

/// The control-plane CA keys go only to a node the cluster expects: a caller claiming
/// `is_control_plane` while every expected control-plane node is present gets nothing.
#[tokio::test]
async fn control_plane_files_are_refused_when_the_cluster_has_its_control_plane() {
    let mut nodes = cp_nodes(3);
    nodes.push(worker_node("worker-0"));
    let h = start_cluster(Some("3"), &nodes, false).await;
    let status = h
        .issue_as(node_csr("cp-evil", &[]), true)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(
            "the cluster expects no further control-plane node: 3 control-plane Nodes present, 3 expected"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("control plane complete");
    assert!(
        h.standin.requests().iter().all(|r| r.method == "GET"),
        "only reads: {:?}",
        h.methods()
    );
    assert!(
        h.standin
            .requests()
            .iter()
            .any(|r| r.path == "/api/v1/nodes" && r.code == 200),
        "{:?}",
        h.methods()
    );
    // Workers still join, and are not counted as control-plane nodes.
    h.issue(node_csr("worker-1", &[])).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn control_plane_files_are_released_while_fewer_are_present_than_expected() {
    let mut nodes = cp_nodes(2);
    nodes.push(worker_node("worker-0"));
    let h = start_cluster(Some("3"), &nodes, false).await;
    let resp = h.issue_as(node_csr("cp-2", &[]), true).await.unwrap();
    assert_eq!(resp.control_plane_files.len(), 8);
    assert_eq!(h.secrets().len(), 1);
    h.stop().await;
}

/// During an upgrade the node operator adds the replacement before removing the old node: one
/// node beyond the expected count is admitted, and no more.
#[tokio::test]
async fn an_upgrade_admits_one_surge_control_plane_node() {
    let h = start_cluster(Some("3"), &cp_nodes(3), true).await;
    let resp = h.issue_as(node_csr("cp-new", &[]), true).await.unwrap();
    assert_eq!(resp.control_plane_files.len(), 8);
    h.stop().await;

    let h = start_cluster(Some("3"), &cp_nodes(4), true).await;
    let status = h.issue_as(node_csr("cp-new", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(
            "4 control-plane Nodes present, 3 expected (+1 during the upgrade in progress)"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("surge used up");
    h.stop().await;
}

#[tokio::test]
async fn without_an_expected_count_control_plane_files_are_a_failed_precondition() {
    for (expected, needle) in [
        (
            None,
            "reading ConfigMap kube-system/join-control-plane (the expected control-plane node count): Kubernetes API answered 404",
        ),
        (
            Some("three"),
            "expectedControlPlaneNodes is \"three\", not a count of nodes",
        ),
        (Some("-1"), "expectedControlPlaneNodes is \"-1\""),
    ] {
        let h = start_cluster(expected, &[], false).await;
        let status = h.issue_as(node_csr("cp-0", &[]), true).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{expected:?}: {status:?}"
        );
        assert!(
            status.message().contains(needle),
            "{expected:?}: {}",
            status.message()
        );
        h.assert_nothing_created("no expectation");
        h.issue(node_csr("worker-0", &[])).await.unwrap();
        h.stop().await;
    }
}

/// The deployed RBAC must allow listing Nodes: without it the gate fails closed, as a
/// deployment fault.
#[tokio::test]
async fn without_rbac_to_list_nodes_control_plane_files_are_refused() {
    let grants: Vec<Grant> = deployed_grants()
        .into_iter()
        .filter(|g| !g.rule.resources.contains(&"nodes".to_owned()))
        .collect();
    assert!(
        grants.len() < deployed_grants().len(),
        "deploy/base/rbac.yaml grants list nodes"
    );
    let user = User::service_account(TOKEN, "kube-system", "join-token-issuer", grants);
    let h = Harness::start(user, own_uid()).await;
    let status = h.issue_as(node_csr("cp-0", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status
            .message()
            .contains("listing control-plane Nodes: Kubernetes API answered 403"),
        "{}",
        status.message()
    );
    h.assert_nothing_created("no RBAC");
    h.stop().await;
}

/// The cluster CA must not certify a name the node does not own: a kubelet certificate for
/// `kubernetes.default.svc` would let a node impersonate the API server to every pod.
#[tokio::test]
async fn dns_sans_are_refused_and_nothing_is_created() {
    let h = Harness::start(full_user(), own_uid()).await;
    for (sans, needle) in [
        (
            vec!["10.0.0.5", "kubernetes.default.svc"],
            "subject alternative name DNS:kubernetes.default.svc is not allowed",
        ),
        (
            vec!["worker-0"],
            "subject alternative name DNS:worker-0 is not allowed",
        ),
    ] {
        let status = h.issue(node_csr("worker-0", &sans)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{sans:?}: {status:?}");
        assert!(status.message().contains(needle), "{}", status.message());
        h.assert_nothing_created("DNS SAN");
        assert!(
            h.standin.requests().is_empty(),
            "refused before any API call: {:?}",
            h.methods()
        );
    }
    h.stop().await;
}

/// A control-plane node retrying its join holds the lock already: it takes it afresh instead
/// of being told for ten minutes that "another control-plane node" (itself) is joining.
#[tokio::test]
async fn the_control_plane_lock_holder_may_retry_and_others_may_not() {
    let h = Harness::start(full_user(), own_uid()).await;
    h.issue_as(node_csr("cp-1", &[]), true).await.unwrap();
    let first_deadline = spec(&h.joining_nodes()[0], "deadline").clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let again = h.issue_as(node_csr("cp-1", &[]), true).await.unwrap();
    assert_eq!(again.control_plane_files.len(), 8);
    let nodes = h.joining_nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), "cp-1");
    assert_ne!(
        spec(&nodes[0], "deadline"),
        &first_deadline,
        "the retry renews the lock's deadline"
    );

    let busy = h.issue_as(node_csr("cp-2", &[]), true).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert!(
        busy.message().contains("another control-plane node (cp-1)"),
        "{}",
        busy.message()
    );
    assert_eq!(spec(&h.joining_nodes()[0], "name"), "cp-1");
    h.stop().await;
}

/// Every release of the control-plane files is a `ControlPlaneFilesReleased` Event in
/// kube-system naming the node, the requesting uid and the evidence digest; workers get none.
#[tokio::test]
async fn each_control_plane_release_is_recorded_as_an_event() {
    let h = Harness::start(full_user(), own_uid()).await;
    h.issue(node_csr("worker-0", &[])).await.unwrap();
    assert!(
        h.standin.objects_of("events").is_empty(),
        "workers get no event"
    );

    h.issue_as(node_csr("cp-1", &[]), true).await.unwrap();
    let events = h.standin.objects_of("events");
    assert_eq!(events.len(), 1);
    let e = &events[0].object;
    assert_eq!(events[0].namespace.as_deref(), Some("kube-system"));
    assert_eq!(e["reason"], "ControlPlaneFilesReleased");
    assert_eq!(e["type"], "Normal");
    assert_eq!(
        e["involvedObject"],
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "cp-1"})
    );
    assert_eq!(
        e["reportingComponent"],
        "joinservice.edgeless.systems/token-issuer"
    );
    assert_eq!(e["reportingInstance"], "join-service-test-pod");
    let message = e["message"].as_str().unwrap();
    for needle in [
        "node cp-1",
        &format!("requested by uid {}", own_uid()),
        &format!("attestation evidence sha256 {EVIDENCE}"),
        "0 of 3 expected control-plane Nodes present",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    h.stop().await;
}

#[tokio::test]
async fn no_event_no_release() {
    let h = Harness::start(full_user(), own_uid()).await;
    h.standin.inject(
        Fault::once(403)
            .on("POST")
            .at("/api/v1/namespaces/kube-system/events"),
    );
    let status = h.issue_as(node_csr("cp-1", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains(
            "recording the control-plane files release as an Event: Kubernetes API answered 403"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("event refused");

    // Without the evidence digest there is no release either, and no API call is made.
    let mut client = TokenIssuerClient::new(plumbing::unix::channel(h.socket.clone(), own_uid()));
    let before = h.standin.requests().len();
    let status = client
        .issue_node_credentials(IssueNodeCredentialsRequest {
            certificate_request: node_csr("cp-1", &[]),
            is_control_plane: true,
            peer_address: "192.0.2.7:51000".into(),
            attested_evidence_sha256: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("attested_evidence_sha256"),
        "{}",
        status.message()
    );
    assert_eq!(h.standin.requests().len(), before);
    h.stop().await;
}
