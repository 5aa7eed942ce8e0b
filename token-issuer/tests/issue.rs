//! token-issuer end to end: in-process `run` on a real Unix socket, a real tonic client, and a
//! real kube-apiserver (one per test binary, shared: `testsupport::shared`) behind a fault proxy
//! of the test's own, with deploy/base's RBAC and admission policy.
//!
//! Each test names its nodes under its own prefix (`h.node(...)`) and sees only what carries it;
//! a test that changes what the whole cluster holds (the NodeVersion, the expected control-plane
//! count, Nodes, the single `control-plane` JoiningNode, which every control-plane join takes)
//! runs alone.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use plumbing::shutdown::{self, Trigger};
use proto::tokenissuer::IssueNodeCredentialsRequest;
use proto::tokenissuer::token_issuer_client::TokenIssuerClient;
use rcgen::{CertificateParams, DnType, KeyPair};
use serde_json::{Value, json};
use testsupport::cluster::{COMPONENTS_REF, KUBERNETES_VERSION};
use testsupport::fixtures::{
    NODE_VERSION_NAME, components_json, constellation_version, control_plane_expectation,
    control_plane_node, worker_node,
};
use testsupport::kube_faults::Fault;
use testsupport::shared::{Tenant, alone, tenant};
use token_issuer::Config;
use tonic::Code;
use x509_parser::prelude::*;

/// The evidence digest join-core passes on from attest-proxy.
const EVIDENCE: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const JOINING: &str = "/apis/update.edgeless.systems/v1alpha1/joiningnodes";
const SECRETS: &str = "/api/v1/namespaces/kube-system/secrets";

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}

/// token-issuer on `kube` with a ServiceAccount of deploy/base's RBAC for it, except that on
/// Secrets it may only `delete`.
async fn may_not_create_secrets(kube: Tenant) -> Harness {
    let token = kube
        .token_issuer_like("delete-only", |_, rules| {
            for rule in rules.iter_mut() {
                if rule["resources"] == json!(["secrets"]) {
                    rule["verbs"] = json!(["delete"]);
                }
            }
        })
        .await;
    let setup = Setup {
        token: Some(token),
        ..Setup::default()
    };
    Harness::on(kube, setup).await
}

/// Fills a PKI directory with the eight control-plane files, each holding its own name.
fn write_pki(dir: &Path) {
    std::fs::create_dir_all(dir.join("etcd")).unwrap();
    for name in token_issuer::pki::CONTROL_PLANE_FILES {
        std::fs::write(dir.join(name), format!("-----PEM of {name}-----\n")).unwrap();
    }
}

/// How token-issuer is started.
struct Setup {
    /// Its cluster CA, from the fixtures.
    ca_cert: &'static str,
    ca_key: &'static str,
    /// The uid allowed on its socket.
    peer_uid: u32,
    version_max_age: Duration,
    /// Its Kubernetes token (token-issuer's own ServiceAccount's when `None`).
    token: Option<String>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            ca_cert: "ca-rsa.crt",
            ca_key: "ca-rsa-pkcs1.key",
            peer_uid: own_uid(),
            version_max_age: token_issuer::cluster_version::DEFAULT_MAX_AGE,
            token: None,
        }
    }
}

struct Harness {
    kube: Tenant,
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
    /// token-issuer as deployed, beside other tests.
    async fn start() -> Self {
        Self::on(tenant().await, Setup::default()).await
    }

    /// token-issuer as deployed, on a cluster this test has to itself.
    async fn alone() -> Self {
        Self::on(alone().await, Setup::default()).await
    }

    async fn on(kube: Tenant, setup: Setup) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki_dir = dir.path().join("pki");
        write_pki(&pki_dir);
        let token = match setup.token {
            Some(token) => token,
            None => kube.token_issuer_token().await,
        };
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kube.kubeconfig_via_proxy(&token_file)).unwrap();
        let socket = dir.path().join("token-issuer.sock");
        let ca_cert = Path::new(FIXTURES).join(setup.ca_cert);
        // A free port for the admin endpoint (run() binds it itself).
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = Config {
            socket: socket.clone(),
            socket_mode: 0o600,
            peer_uid: setup.peer_uid,
            ca_cert: ca_cert.clone(),
            ca_key: Path::new(FIXTURES).join(setup.ca_key),
            api_server_endpoint: Some("10.0.0.1:6443".into()),
            api_server_host: None,
            api_server_port: 6443,
            pki_dir: pki_dir.clone(),
            kubeconfig: Some(kubeconfig),
            kube_timeout: Duration::from_secs(5),
            version_max_age: setup.version_max_age,
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
            kube,
            socket,
            admin,
            pki_dir,
            trigger,
            task,
            ca_cert,
            _dir: dir,
        }
    }

    /// `base` as this test names its nodes.
    fn node(&self, base: &str) -> String {
        self.kube.name(base)
    }

    /// The CSR of this test's node `base`, for `ips`.
    fn csr(&self, base: &str, ips: &[&str]) -> Vec<u8> {
        node_csr(&self.node(base), ips)
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

    async fn secrets(&self) -> Vec<Secret> {
        self.kube.bootstrap_tokens().await
    }

    async fn joining_nodes(&self) -> Vec<DynamicObject> {
        self.kube.joining_nodes().await
    }

    /// No token and no JoiningNode of this test's exist.
    async fn assert_nothing_created(&self, what: &str) {
        let secrets = self.secrets().await;
        assert!(
            secrets.is_empty(),
            "{what}: token left: {:?}",
            self.methods()
        );
        let nodes = self.joining_nodes().await;
        assert!(nodes.is_empty(), "{what}: JoiningNode left: {nodes:?}");
    }

    fn methods(&self) -> Vec<String> {
        self.kube
            .requests()
            .into_iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.code))
            .collect()
    }

    /// Whether every request so far only read.
    fn only_reads(&self) -> bool {
        self.kube.requests().iter().all(|r| r.method == "GET")
    }

    /// Stops token-issuer and hands back the test's place in the cluster.
    async fn stop(self) -> Tenant {
        self.trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("run returns after shutdown")
            .unwrap()
            .unwrap();
        self.kube
    }
}

/// The text under `key` of a Secret's data.
fn data(secret: &Secret, key: &str) -> String {
    let bytes = &secret.data.as_ref().unwrap()[key].0;
    String::from_utf8(bytes.clone()).unwrap()
}

fn name(object: &DynamicObject) -> &str {
    object.metadata.name.as_deref().unwrap()
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
    let h = Harness::start().await;
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h
        .issue(h.csr("worker-0", &["10.0.0.5", "fd00::5"]))
        .await
        .unwrap();

    // Token and Secret, field by field, as the API server stored them.
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
    let secrets = h.secrets().await;
    assert_eq!(secrets.len(), 1);
    let s = &secrets[0];
    assert_eq!(
        s.metadata.name.as_deref(),
        Some(format!("bootstrap-token-{id}").as_str())
    );
    assert_eq!(s.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
    assert_eq!(
        serde_json::to_value(&s.metadata.labels).unwrap(),
        json!({"joinservice.edgeless.systems/issued-by": "token-issuer"}),
        "the admission policy lets token-issuer delete only tokens so labelled"
    );
    assert_eq!(data(s, "token-id"), id);
    assert_eq!(data(s, "token-secret"), secret);
    assert_eq!(data(s, "usage-bootstrap-authentication"), "true");
    assert_eq!(data(s, "usage-bootstrap-signing"), "true");
    assert_eq!(
        data(s, "auth-extra-groups"),
        "system:bootstrappers:kubeadm:default-node-token"
    );
    assert!(data(s, "description").contains(&h.node("worker-0")));
    let expiration = data(s, "expiration");
    let exp = rfc3339(&expiration);
    let ttl = exp - before;
    assert!(
        ttl > ::time::Duration::minutes(14)
            && ttl <= ::time::Duration::minutes(15) + ::time::Duration::seconds(5),
        "{expiration}"
    );
    assert!(expiration.ends_with('Z') && !expiration.contains('.'));
    let keys: Vec<&str> = s
        .data
        .as_ref()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
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
    assert_eq!(resp.node_name, h.node("worker-0"));
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
    assert_eq!(cn, [format!("system:node:{}", h.node("worker-0"))]);
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
    let again = h.issue(h.csr("worker-1", &["10.0.0.6"])).await.unwrap();
    assert_ne!(again.token, resp.token);
    assert_eq!(h.secrets().await.len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn bad_csrs_are_invalid_argument_and_create_nothing() {
    let h = Harness::start().await;
    let worker = h.node("worker-0");

    let mut bad_sig = h.csr("worker-0", &["10.0.0.5"]);
    let last = bad_sig.len() - 1;
    bad_sig[last] ^= 0x01;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "wrong O",
            csr_with("system:masters", &format!("system:node:{worker}"), &[]).0,
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
                    .push(DnType::CommonName, format!("system:node:{worker}"));
                p.serialize_request(&key).unwrap().der().to_vec()
            },
            "organization",
        ),
        (
            "CN without prefix",
            csr_with("system:nodes", &worker, &[]).0,
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
    h.assert_nothing_created("bad CSRs").await;
    assert!(
        h.kube.requests().is_empty(),
        "a refused CSR never reaches Kubernetes: {:?}",
        h.methods()
    );
    h.stop().await;
}

#[tokio::test]
async fn forbidden_by_rbac_is_internal_and_names_the_step() {
    // The service account may delete but not create.
    let h = may_not_create_secrets(tenant().await).await;
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status
            .message()
            .contains("creating bootstrap token secret bootstrap-token-"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("403"), "{}", status.message());
    assert!(
        status.message().contains("cannot create resource"),
        "RBAC's reason: {}",
        status.message()
    );
    // The JoiningNode written before the token was refused is gone again.
    h.assert_nothing_created("403 on the token").await;
    let delete = format!("DELETE {JOINING}/{} 200", h.node("worker-0"));
    assert!(h.methods().contains(&delete), "{:?}", h.methods());
    h.stop().await;
}

#[tokio::test]
async fn a_rollback_that_fails_transiently_is_retried() {
    // The token is refused (403), so the JoiningNode written before it must go; the first
    // DELETE of it fails with a 500.
    let h = may_not_create_secrets(tenant().await).await;
    h.kube
        .inject(Fault::once(500).on("DELETE").at(&format!("{JOINING}/")));
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    h.assert_nothing_created("a rollback retried after a 500")
        .await;
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
    let h = Harness::start().await;
    assert_eq!(admin_get(h.admin, "/livez").await.0, 200);
    let (status, body) = admin_get(h.admin, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok kubernetes_api\n"));

    h.issue(h.csr("worker-0", &[])).await.unwrap();
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
    let h2 = may_not_create_secrets(h.stop().await).await;
    h2.issue(h2.csr("worker-1", &[])).await.unwrap_err();
    let (_, metrics) = admin_get(h2.admin, "/metrics").await;
    for series in [
        r#"token_issuer_credentials_total{result="refused",step="create_token"}"#,
        r#"token_issuer_kubernetes_api_call_duration_seconds_count{call="create_secret",outcome="403"}"#,
    ] {
        assert!(metrics.contains(series), "missing {series}:\n{metrics}");
    }
    h2.stop().await;
}

#[tokio::test]
async fn conflict_is_aborted() {
    let h = Harness::start().await;
    h.kube.inject(Fault::once(409).on("POST").at(SECRETS));
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("409"));
    h.assert_nothing_created("409 on the token").await;
    h.stop().await;
}

#[tokio::test]
async fn server_errors_are_unavailable_and_leave_nothing_behind() {
    let h = Harness::start().await;

    // Refused before the write.
    h.kube.inject(Fault::once(500).on("POST").at(SECRETS));
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("creating bootstrap token secret"));
    h.assert_nothing_created("500 before the write").await;

    // Written, then the answer lost: token-issuer must delete what it cannot know about.
    h.kube
        .inject(Fault::once(500).on("POST").at(SECRETS).after_commit());
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    h.assert_nothing_created("500 after the write").await;
    assert!(
        h.methods()
            .iter()
            .any(|m| m.starts_with(&format!("DELETE {SECRETS}/")) && m.ends_with(" 200")),
        "{:?}",
        h.methods()
    );

    // Throttling is retried by the client and then succeeds.
    h.kube.inject(Fault::once(429).on("POST").at(SECRETS));
    h.issue(h.csr("worker-0", &[])).await.unwrap();
    assert_eq!(h.secrets().await.len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn slow_api_server_times_out_as_unavailable_and_is_rolled_back() {
    let h = Harness::start().await;
    // Token create and its rollback both take longer than the 5 s kube timeout; the delete,
    // sent after the create, lands after it.
    h.kube
        .inject(Fault::slow(Duration::from_secs(6)).at(SECRETS).times(2));
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // kube-rs's read timeout (the same 5 s) or our deadline, whichever fires first.
    assert!(
        status
            .message()
            .contains("creating bootstrap token secret bootstrap-token-"),
        "{}",
        status.message()
    );
    // The proxy still forwards the slow create after the client gave up; whatever happened, no
    // token may survive.
    tokio::time::sleep(Duration::from_secs(8)).await;
    h.assert_nothing_created("slow API server").await;
    h.stop().await;
}

#[tokio::test]
async fn other_uids_are_refused() {
    let setup = Setup {
        peer_uid: own_uid().wrapping_add(4242),
        ..Setup::default()
    };
    let h = Harness::on(tenant().await, setup).await;
    let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
    // The listener closes the connection unanswered; depending on timing tonic reports that
    // as Unavailable (connect) or a transport error (broken pipe mid-request).
    assert!(
        status.code() == Code::Unavailable
            || (status.code() == Code::Unknown && status.message().contains("transport error")),
        "{status:?}"
    );
    assert!(h.kube.requests().is_empty(), "nothing reached Kubernetes");
    h.stop().await;
}

#[tokio::test]
async fn sec1_ec_ca_key_works() {
    let setup = Setup {
        ca_cert: "ca-ec.crt",
        ca_key: "ca-ec-sec1.key",
        ..Setup::default()
    };
    let h = Harness::on(tenant().await, setup).await;
    let resp = h.issue(h.csr("worker-0", &["10.0.0.5"])).await.unwrap();
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

fn spec<'a>(o: &'a DynamicObject, field: &str) -> &'a Value {
    &o.data["spec"][field]
}

/// Asserts `deadline` lies `ttl` after a moment between `before` and now.
fn assert_deadline(deadline: &Value, before: ::time::OffsetDateTime, ttl: ::time::Duration) {
    let d = rfc3339(deadline.as_str().unwrap());
    let after = ::time::OffsetDateTime::now_utc();
    // The API server stores the deadline in whole seconds.
    assert!(
        d >= before + ttl - ::time::Duration::seconds(1) && d <= after + ttl,
        "deadline {d} not {ttl} after the join"
    );
}

#[tokio::test]
async fn worker_join_gets_version_components_and_a_joining_node() {
    let h = Harness::start().await;
    let worker = h.node("worker-0");
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h.issue(h.csr("worker-0", &["10.0.0.5"])).await.unwrap();

    assert_eq!(resp.kubernetes_version, KUBERNETES_VERSION);
    let want: Vec<Value> = serde_json::from_str(&components_json()).unwrap();
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

    let nodes = h.joining_nodes().await;
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(name(n), worker);
    let types = n.types.as_ref().unwrap();
    assert_eq!(types.api_version, "update.edgeless.systems/v1alpha1");
    assert_eq!(types.kind, "JoiningNode");
    assert_eq!(spec(n, "name"), worker.as_str());
    assert_eq!(spec(n, "componentsreference"), COMPONENTS_REF);
    assert_eq!(spec(n, "iscontrolplane"), false);
    assert_deadline(spec(n, "deadline"), before, ::time::Duration::hours(48));
    assert!(
        h.methods()
            .contains(&format!("PATCH {JOINING}/{worker} 201")),
        "workers are recorded by server-side apply: {:?}",
        h.methods()
    );

    // A retried join refreshes the same record by apply.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.issue(h.csr("worker-0", &["10.0.0.5"])).await.unwrap();
    let again = h.joining_nodes().await;
    assert_eq!(again.len(), 1);
    assert_ne!(
        again[0].metadata.resource_version,
        n.metadata.resource_version
    );
    assert_ne!(spec(&again[0], "deadline"), spec(n, "deadline"));
    assert_eq!(h.secrets().await.len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn control_plane_join_gets_the_pki_and_takes_the_lock() {
    let h = Harness::alone().await;
    let before = ::time::OffsetDateTime::now_utc();
    let resp = h
        .issue_as(h.csr("cp-1", &["10.0.0.2"]), true)
        .await
        .unwrap();

    let mut names: Vec<&str> = resp
        .control_plane_files
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
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
    assert_eq!(resp.kubernetes_version, KUBERNETES_VERSION);
    assert!(!resp.kubernetes_components.is_empty());

    let nodes = h.joining_nodes().await;
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(name(n), "control-plane");
    assert_eq!(spec(n, "name"), h.node("cp-1").as_str());
    assert_eq!(spec(n, "iscontrolplane"), true);
    assert_eq!(spec(n, "componentsreference"), COMPONENTS_REF);
    assert_deadline(spec(n, "deadline"), before, ::time::Duration::minutes(10));
    assert_eq!(h.secrets().await.len(), 1);

    // While it is held, the next control-plane node is told to retry; workers still join.
    let busy = h.issue_as(h.csr("cp-2", &[]), true).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert!(
        busy.message().contains(&h.node("cp-1")) && busy.message().contains("retry"),
        "{}",
        busy.message()
    );
    h.issue(h.csr("worker-9", &[])).await.unwrap();
    assert_eq!(
        h.secrets().await.len(),
        2,
        "the refused control-plane node got no token"
    );
    h.stop().await;
}

#[tokio::test]
async fn two_control_plane_nodes_at_once_one_joins_one_retries() {
    let h = Harness::alone().await;
    let (a, b) = tokio::join!(
        h.issue_as(h.csr("cp-a", &[]), true),
        h.issue_as(h.csr("cp-b", &[]), true)
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
    let secrets = h.secrets().await;
    assert_eq!(secrets.len(), 1);
    let (id, _) = winner.token.split_once('.').unwrap();
    assert_eq!(
        secrets[0].metadata.name.as_deref(),
        Some(format!("bootstrap-token-{id}").as_str())
    );
    let nodes = h.joining_nodes().await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), winner.node_name.as_str());
    h.stop().await;
}

/// A `JoiningNode` as the node operator's CRD stores it.
fn joining_node(name: &str, node: &str, deadline: &str) -> Value {
    json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "JoiningNode",
        "metadata": {"name": name},
        "spec": {"name": node, "componentsreference": COMPONENTS_REF,
                 "iscontrolplane": true, "deadline": deadline},
    })
}

#[tokio::test]
async fn expired_control_plane_lock_is_replaced() {
    let kube = alone().await;
    let dead = kube.name("cp-dead");
    kube.plane()
        .apply(joining_node("control-plane", &dead, "2020-01-01T00:00:00Z"))
        .await
        .unwrap();
    let h = Harness::on(kube, Setup::default()).await;
    h.issue_as(h.csr("cp-new", &[]), true).await.unwrap();
    let nodes = h.joining_nodes().await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), h.node("cp-new").as_str());
    h.stop().await;
}

#[tokio::test]
async fn api_server_failures_give_specific_statuses_and_leave_nothing() {
    let h = Harness::alone().await;
    let worker = h.node("worker-0");
    let cases: Vec<(&str, Fault, bool, Code, String)> = vec![
        (
            "403 on the NodeVersion",
            Fault::once(403).at("/nodeversions/"),
            false,
            Code::Internal,
            "reading NodeVersion constellation-version: Kubernetes API answered 403".into(),
        ),
        (
            "500 on the ConfigMap",
            Fault::once(500).at("/configmaps/"),
            false,
            Code::Unavailable,
            "reading components ConfigMap kube-system/".into(),
        ),
        (
            "403 on the JoiningNode",
            Fault::once(403).on("PATCH").at(JOINING),
            false,
            Code::Internal,
            format!("applying JoiningNode {worker}: Kubernetes API answered 403"),
        ),
        (
            "500 after applying the JoiningNode",
            Fault::once(500).on("PATCH").at(JOINING).after_commit(),
            false,
            Code::Unavailable,
            format!("applying JoiningNode {worker}"),
        ),
        (
            "409 on the token",
            Fault::once(409).on("POST").at(SECRETS),
            false,
            Code::Aborted,
            "creating bootstrap token secret bootstrap-token-".into(),
        ),
        (
            "500 on the token",
            Fault::once(500).on("POST").at(SECRETS),
            false,
            Code::Unavailable,
            "creating bootstrap token secret".into(),
        ),
        // kube-rs retries a 503; the retry finds the token the first attempt stored.
        (
            "503 after creating the token",
            Fault::once(503).on("POST").at(SECRETS).after_commit(),
            false,
            Code::Aborted,
            "already exists".into(),
        ),
        (
            "403 on the control-plane JoiningNode",
            Fault::once(403).on("POST").at(JOINING),
            true,
            Code::Internal,
            "creating JoiningNode control-plane: Kubernetes API answered 403".into(),
        ),
        (
            "500 after creating the control-plane JoiningNode",
            Fault::once(500).on("POST").at(JOINING).after_commit(),
            true,
            Code::Unavailable,
            "creating JoiningNode control-plane".into(),
        ),
        (
            "409 on the control-plane token",
            Fault::once(409).on("POST").at(SECRETS),
            true,
            Code::Aborted,
            "creating bootstrap token secret".into(),
        ),
        (
            "500 on the control-plane token",
            Fault::once(500).on("POST").at(SECRETS).after_commit(),
            true,
            Code::Unavailable,
            "creating bootstrap token secret".into(),
        ),
    ];
    for (what, fault, cp, code, needle) in cases {
        h.kube.inject(fault);
        let node = if cp { "cp-0" } else { "worker-0" };
        let status = h.issue_as(h.csr(node, &[]), cp).await.unwrap_err();
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(
            status.message().contains(&needle),
            "{what}: {}",
            status.message()
        );
        h.assert_nothing_created(what).await;
    }
    // A control-plane create answered 503 after it was stored: kube-rs's retry finds the lock
    // this very join holds, and the join goes on.
    h.kube
        .inject(Fault::once(503).on("POST").at(JOINING).after_commit());
    h.issue_as(h.csr("cp-0", &[]), true).await.unwrap();
    assert_eq!(h.joining_nodes().await.len(), 1);
    // And after all that, workers join again.
    h.issue(h.csr("worker-0", &[])).await.unwrap();
    h.stop().await;
}

/// The `NodeVersion` API of the cluster.
async fn node_versions(kube: &Tenant) -> kube::Api<DynamicObject> {
    let gvk =
        kube::core::GroupVersionKind::gvk("update.edgeless.systems", "v1alpha1", "NodeVersion");
    kube.plane().dynamic_api(&gvk, None).await.unwrap()
}

#[tokio::test]
async fn cluster_without_version_is_failed_precondition_and_untouched() {
    let no_configmap =
        format!("components ConfigMap kube-system/{COMPONENTS_REF}: Kubernetes API answered 404");
    let cases: [(&str, &str); 4] = [
        (
            "no NodeVersion",
            "NodeVersion constellation-version: Kubernetes API answered 404",
        ),
        ("no ConfigMap", &no_configmap),
        ("empty components", "the components list is empty"),
        ("no version", "has no kubernetesClusterVersion"),
    ];
    let mut kube = alone().await;
    for (what, needle) in cases {
        kube.reset().await;
        let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(kube.admin(), "kube-system");
        match what {
            "no NodeVersion" => {
                node_versions(&kube)
                    .await
                    .delete(NODE_VERSION_NAME, &Default::default())
                    .await
                    .unwrap();
            }
            "no ConfigMap" => {
                configmaps
                    .delete(COMPONENTS_REF, &Default::default())
                    .await
                    .unwrap();
            }
            "empty components" => {
                let [_, configmap] =
                    constellation_version(KUBERNETES_VERSION, COMPONENTS_REF, "[]");
                kube.plane().apply(configmap).await.unwrap();
            }
            _ => {
                // Applied again without the field by the manager that set it: the API server
                // removes it.
                let [mut version, _] =
                    constellation_version(KUBERNETES_VERSION, COMPONENTS_REF, &components_json());
                version["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("kubernetesClusterVersion");
                kube.plane().apply(version).await.unwrap();
            }
        }
        let h = Harness::on(kube, Setup::default()).await;
        let status = h.issue(h.csr("worker-0", &[])).await.unwrap_err();
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
        h.assert_nothing_created(what).await;
        assert!(h.only_reads(), "{what}: only reads: {:?}", h.methods());
        kube = h.stop().await;
    }
}

#[tokio::test]
async fn missing_control_plane_file_refuses_control_plane_joins_only() {
    let h = Harness::start().await;
    std::fs::remove_file(h.pki_dir.join("front-proxy-ca.key")).unwrap();
    let status = h.issue_as(h.csr("cp-0", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains(
            "reading the control-plane PKI: reading control-plane file front-proxy-ca.key"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("missing PKI file").await;
    assert!(
        h.only_reads(),
        "refused before any write: {:?}",
        h.methods()
    );
    h.issue(h.csr("worker-0", &[])).await.unwrap();
    h.stop().await;
}

/// How many times the `NodeVersion` and the components ConfigMap were read.
fn reads(h: &Harness) -> (usize, usize) {
    let requests = h.kube.requests();
    let count = |part: &str| {
        requests
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains(part))
            .count()
    };
    (count("/nodeversions/"), count("/configmaps/"))
}

/// The `NodeVersion` and ConfigMap are read once for joins close together, read again once the
/// read is older than its max age, and read afresh after a join failed at the API server.
#[tokio::test]
async fn cluster_version_reads_are_kept_for_a_moment_and_dropped_after_a_fault() {
    let keeping = |version_max_age| Setup {
        version_max_age,
        ..Setup::default()
    };
    let h = Harness::on(tenant().await, keeping(Duration::from_secs(30))).await;
    let first = h.issue(h.csr("worker-0", &[])).await.unwrap();
    let second = h.issue(h.csr("worker-1", &[])).await.unwrap();
    assert_eq!(reads(&h), (1, 1), "{:?}", h.methods());
    assert_eq!(first.kubernetes_version, second.kubernetes_version);
    assert_eq!(first.kubernetes_components, second.kubernetes_components);

    h.kube.inject(Fault::once(500).on("POST").at(SECRETS));
    h.issue(h.csr("worker-2", &[])).await.unwrap_err();
    h.issue(h.csr("worker-3", &[])).await.unwrap();
    assert_eq!(reads(&h), (2, 2), "read afresh after the fault");
    let kube = h.stop().await;

    // A read older than its max age is not used.
    let h = Harness::on(kube, keeping(Duration::from_millis(100))).await;
    let before = reads(&h);
    h.issue(h.csr("worker-4", &[])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    h.issue(h.csr("worker-5", &[])).await.unwrap();
    assert_eq!(reads(&h), (before.0 + 2, before.1 + 2));
    let kube = h.stop().await;

    // Max age zero: every join reads.
    let h = Harness::on(kube, keeping(Duration::ZERO)).await;
    let before = reads(&h);
    for node in ["worker-6", "worker-7", "worker-8"] {
        h.issue(h.csr(node, &[])).await.unwrap();
    }
    assert_eq!(reads(&h), (before.0 + 3, before.1 + 3));
    h.stop().await;
}

/// A Node to create: its name under the test's prefix, and how the Node is made from it.
type NodeOf = (&'static str, fn(&str) -> Value);

/// A cluster this test has alone, expecting `expected` control-plane nodes (no
/// `join-control-plane` if `None`), holding `nodes` (made by `make` from this test's names) and,
/// if `upgrading`, a NodeVersion marking an upgrade in progress.
async fn start_cluster(expected: Option<&str>, nodes: &[NodeOf], upgrading: bool) -> Harness {
    let kube = alone().await;
    let plane = kube.plane();
    if upgrading {
        node_versions(&kube)
            .await
            .patch_status(
                NODE_VERSION_NAME,
                &Default::default(),
                &kube::api::Patch::Merge(json!({"status": {"conditions": [
                    {"type": "Outdated", "status": "True", "reason": "NodesOutdated",
                     "message": "Some nodes are outdated",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}
                ]}})),
            )
            .await
            .unwrap();
    }
    match expected {
        Some(expected) => {
            let mut config = control_plane_expectation(0);
            config["data"]["expectedControlPlaneNodes"] = expected.into();
            plane.apply(config).await.unwrap();
        }
        None => {
            let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube::Api::namespaced(kube.admin(), "kube-system");
            configmaps
                .delete("join-control-plane", &Default::default())
                .await
                .unwrap();
        }
    }
    for (base, make) in nodes {
        plane.apply(make(&kube.name(base))).await.unwrap();
    }
    Harness::on(kube, Setup::default()).await
}

const CP_OLD: [&str; 4] = ["cp-old-0", "cp-old-1", "cp-old-2", "cp-old-3"];

fn cp_nodes(n: usize) -> Vec<NodeOf> {
    CP_OLD[..n]
        .iter()
        .map(|&base| (base, control_plane_node as fn(&str) -> Value))
        .collect()
}

/// The control-plane CA keys go only to a node the cluster expects: a caller claiming
/// `is_control_plane` while every expected control-plane node is present gets nothing.
#[tokio::test]
async fn control_plane_files_are_refused_when_the_cluster_has_its_control_plane() {
    let mut nodes = cp_nodes(3);
    nodes.push(("worker-0", worker_node));
    let h = start_cluster(Some("3"), &nodes, false).await;
    let status = h.issue_as(h.csr("cp-evil", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(
            "the cluster expects no further control-plane node: 3 control-plane Nodes present, 3 expected"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("control plane complete").await;
    assert!(h.only_reads(), "only reads: {:?}", h.methods());
    assert!(
        h.kube
            .requests()
            .iter()
            .any(|r| r.path == "/api/v1/nodes" && r.code == 200),
        "{:?}",
        h.methods()
    );
    // Workers still join, and are not counted as control-plane nodes.
    h.issue(h.csr("worker-1", &[])).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn control_plane_files_are_released_while_fewer_are_present_than_expected() {
    let mut nodes = cp_nodes(2);
    nodes.push(("worker-0", worker_node));
    let h = start_cluster(Some("3"), &nodes, false).await;
    let resp = h.issue_as(h.csr("cp-2", &[]), true).await.unwrap();
    assert_eq!(resp.control_plane_files.len(), 8);
    assert_eq!(h.secrets().await.len(), 1);
    h.stop().await;
}

/// During an upgrade the node operator adds the replacement before removing the old node: one
/// node beyond the expected count is admitted, and no more.
#[tokio::test]
async fn an_upgrade_admits_one_surge_control_plane_node() {
    let h = start_cluster(Some("3"), &cp_nodes(3), true).await;
    let resp = h.issue_as(h.csr("cp-new", &[]), true).await.unwrap();
    assert_eq!(resp.control_plane_files.len(), 8);
    drop(h.stop().await);

    let h = start_cluster(Some("3"), &cp_nodes(4), true).await;
    let status = h.issue_as(h.csr("cp-new", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(
            "4 control-plane Nodes present, 3 expected (+1 during the upgrade in progress)"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("surge used up").await;
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
        let status = h.issue_as(h.csr("cp-0", &[]), true).await.unwrap_err();
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
        h.assert_nothing_created("no expectation").await;
        h.issue(h.csr("worker-0", &[])).await.unwrap();
        drop(h.stop().await);
    }
}

/// The deployed RBAC must allow listing Nodes: without it the gate fails closed, as a
/// deployment fault.
#[tokio::test]
async fn without_rbac_to_list_nodes_control_plane_files_are_refused() {
    let kube = alone().await;
    let token = kube
        .token_issuer_like("no-nodes", |kind, rules| {
            if kind == "ClusterRole" {
                let before = rules.len();
                rules.retain(|rule| rule["resources"] != json!(["nodes"]));
                assert_eq!(rules.len(), before - 1, "deploy/base/rbac.yaml lists nodes");
            }
        })
        .await;
    let setup = Setup {
        token: Some(token),
        ..Setup::default()
    };
    let h = Harness::on(kube, setup).await;
    let status = h.issue_as(h.csr("cp-0", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status
            .message()
            .contains("listing control-plane Nodes: Kubernetes API answered 403"),
        "{}",
        status.message()
    );
    h.assert_nothing_created("no RBAC").await;
    h.stop().await;
}

/// The cluster CA must not certify a name the node does not own: a kubelet certificate for
/// `kubernetes.default.svc` would let a node impersonate the API server to every pod.
#[tokio::test]
async fn dns_sans_are_refused_and_nothing_is_created() {
    let h = Harness::start().await;
    let worker = h.node("worker-0");
    for (sans, needle) in [
        (
            vec!["10.0.0.5", "kubernetes.default.svc"],
            "subject alternative name DNS:kubernetes.default.svc is not allowed".to_owned(),
        ),
        (
            vec![worker.as_str()],
            format!("subject alternative name DNS:{worker} is not allowed"),
        ),
    ] {
        let status = h.issue(h.csr("worker-0", &sans)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{sans:?}: {status:?}");
        assert!(status.message().contains(&needle), "{}", status.message());
        h.assert_nothing_created("DNS SAN").await;
        assert!(
            h.kube.requests().is_empty(),
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
    let h = Harness::alone().await;
    let holder = h.node("cp-1");
    h.issue_as(h.csr("cp-1", &[]), true).await.unwrap();
    let first_deadline = spec(&h.joining_nodes().await[0], "deadline").clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let again = h.issue_as(h.csr("cp-1", &[]), true).await.unwrap();
    assert_eq!(again.control_plane_files.len(), 8);
    let nodes = h.joining_nodes().await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(spec(&nodes[0], "name"), holder.as_str());
    assert_ne!(
        spec(&nodes[0], "deadline"),
        &first_deadline,
        "the retry renews the lock's deadline"
    );

    let busy = h.issue_as(h.csr("cp-2", &[]), true).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert!(
        busy.message()
            .contains(&format!("another control-plane node ({holder})")),
        "{}",
        busy.message()
    );
    assert_eq!(spec(&h.joining_nodes().await[0], "name"), holder.as_str());
    h.stop().await;
}

/// Every release of the control-plane files is a `ControlPlaneFilesReleased` Event in
/// kube-system naming the node, the requesting uid and the evidence digest; workers get none.
#[tokio::test]
async fn each_control_plane_release_is_recorded_as_an_event() {
    let h = Harness::alone().await;
    h.issue(h.csr("worker-0", &[])).await.unwrap();
    assert!(h.kube.events().await.is_empty(), "workers get no event");

    let node = h.node("cp-1");
    h.issue_as(h.csr("cp-1", &[]), true).await.unwrap();
    let events = h.kube.events().await;
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(e.reason.as_deref(), Some("ControlPlaneFilesReleased"));
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(
        serde_json::to_value(&e.involved_object).unwrap(),
        json!({"apiVersion": "v1", "kind": "Node", "name": node})
    );
    assert_eq!(
        e.reporting_component.as_deref(),
        Some("joinservice.edgeless.systems/token-issuer")
    );
    assert_eq!(
        e.reporting_instance.as_deref(),
        Some("join-service-test-pod")
    );
    let message = e.message.as_deref().unwrap();
    for needle in [
        format!("node {node}"),
        format!("requested by uid {}", own_uid()),
        format!("attestation evidence sha256 {EVIDENCE}"),
        "0 of 3 expected control-plane Nodes present".to_owned(),
    ] {
        assert!(message.contains(&needle), "{needle:?} in {message}");
    }
    h.stop().await;
}

#[tokio::test]
async fn no_event_no_release() {
    let h = Harness::alone().await;
    h.kube.inject(
        Fault::once(403)
            .on("POST")
            .at("/api/v1/namespaces/kube-system/events"),
    );
    let status = h.issue_as(h.csr("cp-1", &[]), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains(
            "recording the control-plane files release as an Event: Kubernetes API answered 403"
        ),
        "{}",
        status.message()
    );
    h.assert_nothing_created("event refused").await;

    // Without the evidence digest there is no release either, and no API call is made.
    let mut client = TokenIssuerClient::new(plumbing::unix::channel(h.socket.clone(), own_uid()));
    let before = h.kube.requests().len();
    let status = client
        .issue_node_credentials(IssueNodeCredentialsRequest {
            certificate_request: h.csr("cp-1", &[]),
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
    assert_eq!(h.kube.requests().len(), before);
    h.stop().await;
}
