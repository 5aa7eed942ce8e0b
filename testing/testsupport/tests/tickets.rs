//! Complete join tickets, end to end: a node attesting with a real swtpm joins through
//! attest-proxy, join-core, token-issuer (against a real kube-apiserver) and the key
//! service, all real processes. Every part of the ticket is checked the way its consumer would
//! check it: the kubelet certificate against the cluster CA and by the API server (as
//! `system:node:<name>`, which the Node authorizer confines to its own Node), the token by the API
//! server's bootstrap-token authenticator (and its TLS bootstrap CSR), the SSH host certificate
//! against the CA key, the
//! components and control-plane files against what the cluster holds. And every refusal and
//! API server failure is checked to leave no token and no `JoiningNode` behind.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use base64::Engine as _;
use kube::api::DynamicObject;
use node_client::{ClientError, keys};
use proto::join::{IssueJoinTicketRequest, IssueJoinTicketResponse};
use testsupport::harness::{
    API_SERVER_CERT_SANS, API_SERVER_ENDPOINT, COMPONENTS_REF, KUBERNETES_VERSION, Options, System,
};
use testsupport::kube_faults::Fault;
use tonic::Code;
use x509_parser::prelude::*;

const NODE_IP: [u8; 4] = [10, 0, 0, 7];

/// A join request with a fresh kubelet CSR and SSH host key; returns the host key's wire form.
fn request(
    node: &str,
    control_plane: bool,
    principals: &[&str],
) -> (IssueJoinTicketRequest, Vec<u8>) {
    let kubelet = keys::kubelet_request(node, &[IpAddr::from(NODE_IP)]).unwrap();
    let ssh = keys::SshHostKey::generate().unwrap();
    let req = IssueJoinTicketRequest {
        disk_uuid: "3f1e9c7a-2b4d-4e6f-8a1c-5d7e9f0b2c4a".to_owned(),
        certificate_request: kubelet.csr_der,
        is_control_plane: control_plane,
        host_public_key: ssh.public_wire.clone(),
        host_certificate_principals: principals.iter().map(|p| (*p).to_owned()).collect(),
    };
    (req, ssh.public_wire)
}

fn refusal(result: Result<IssueJoinTicketResponse, ClientError>) -> tonic::Status {
    match result {
        Err(ClientError::Status(status)) => status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

// ---- What the API server makes of the ticket's credentials ----

/// Who the real API server says `token` is: its user name and groups, or why it refused.
async fn authenticate(system: &System, token: &str) -> Result<(String, Vec<String>), String> {
    match system.kube.authenticate(token).await {
        Ok(user) => Ok((
            user.username.unwrap_or_default(),
            user.groups.unwrap_or_default(),
        )),
        Err(error) => Err(error.to_string()),
    }
}

// ---- Ticket checks ----

fn pem_cert(pem: &[u8]) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    pem.contents
}

/// The kubelet certificate chains to the cluster CA and carries the CSR's subject and IP.
fn check_kubelet_cert(system: &System, ticket: &IssueJoinTicketResponse, node: &str) {
    let ca_der = pem_cert(&std::fs::read(&system.paths.ca_cert).unwrap());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let der = pem_cert(&ticket.kubelet_cert);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(cert.issuer(), ca.subject());
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    let o: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cn, [format!("system:node:{node}")]);
    assert_eq!(o, ["system:nodes"]);
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert!(
        san.value
            .general_names
            .iter()
            .any(|n| matches!(n, GeneralName::IPAddress(ip) if *ip == NODE_IP)),
        "{:?}",
        san.value.general_names
    );
    // The discovery hash pins this CA's public key.
    let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, ca.public_key().raw);
    assert_eq!(
        ticket.discovery_token_ca_cert_hash,
        format!("sha256:{}", hex::encode(hash))
    );
}

/// The SSH host certificate is signed by the CA the ticket names, for the node's host key, with
/// the requested principals and the API server's cert SANs.
fn check_ssh(ticket: &IssueJoinTicketResponse, host_key_wire: &[u8], requested: &[&str]) {
    let ca_line = std::str::from_utf8(&ticket.authorized_ca_public_key).unwrap();
    let ca = ssh_key::PublicKey::from_openssh(ca_line.trim()).unwrap();
    let ca_raw = ca
        .key_data()
        .ed25519()
        .expect("the emergency CA is Ed25519")
        .0;

    let line = std::str::from_utf8(&ticket.host_certificate).unwrap();
    let cert = ssh_key::Certificate::from_openssh(line.trim()).unwrap();
    assert_eq!(cert.cert_type(), ssh_key::certificate::CertType::Host);
    assert_eq!(cert.signature_key(), ca.key_data());
    // Ed25519 signature over everything before the signature field (PROTOCOL.certkeys).
    let blob = base64::engine::general_purpose::STANDARD
        .decode(line.split(' ').nth(1).unwrap().trim())
        .unwrap();
    let tail = 4 + (4 + 11) + (4 + 64);
    let (signed, sig_field) = blob.split_at(blob.len() - tail);
    aws_lc_rs::signature::UnparsedPublicKey::new(&aws_lc_rs::signature::ED25519, ca_raw)
        .verify(signed, &sig_field[23..])
        .expect("host certificate verifies with the emergency SSH CA key");

    let host_key = ssh_key::PublicKey::from_bytes(host_key_wire).unwrap();
    assert_eq!(cert.public_key(), host_key.key_data());
    let principals = cert.valid_principals();
    for p in requested.iter().chain(API_SERVER_CERT_SANS.iter()) {
        assert!(
            principals.iter().any(|q| q == p),
            "{p} missing from {principals:?}"
        );
    }
}

fn spec<'a>(o: &'a DynamicObject, field: &str) -> &'a serde_json::Value {
    &o.data["spec"][field]
}

async fn check_common(system: &System, ticket: &IssueJoinTicketResponse, node: &str) {
    check_kubelet_cert(system, ticket, node);
    assert_eq!(ticket.api_server_endpoint, API_SERVER_ENDPOINT);
    let (name, mut groups) = authenticate(system, &ticket.token)
        .await
        .unwrap_or_else(|why| panic!("token does not authenticate: {why}"));
    let (id, _) = ticket.token.split_once('.').unwrap();
    assert_eq!(name, format!("system:bootstrap:{id}"));
    groups.sort();
    assert_eq!(
        groups,
        [
            "system:authenticated",
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token"
        ]
    );
    assert_eq!(ticket.kubernetes_version, KUBERNETES_VERSION);
    let want: Vec<serde_json::Value> =
        serde_json::from_str(&testsupport::fixtures::components_json()).unwrap();
    let got: Vec<(&str, &str, &str, bool)> = ticket
        .kubernetes_components
        .iter()
        .map(|c| {
            (
                c.url.as_str(),
                c.hash.as_str(),
                c.install_path.as_str(),
                c.extract,
            )
        })
        .collect();
    let want: Vec<(&str, &str, &str, bool)> = want
        .iter()
        .map(|c| {
            (
                c["url"].as_str().unwrap(),
                c["hash"].as_str().unwrap(),
                c["install_path"].as_str().unwrap(),
                c["extract"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(ticket.state_disk_key.len(), 32);
    assert_eq!(ticket.measurement_secret.len(), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_join_gets_a_complete_ticket() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let (req, host_key) = request("worker-1", false, &["worker-1.internal"]);
    let ticket = client
        .join(req)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));

    check_common(&system, &ticket, "worker-1").await;
    check_ssh(&ticket, &host_key, &["worker-1.internal"]);
    assert!(
        ticket.control_plane_files.is_empty(),
        "workers get no CA keys"
    );

    let nodes = system.kube.joining_nodes().await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let n = &nodes[0];
    assert_eq!(n.metadata.name.as_deref(), Some("worker-1"));
    assert_eq!(spec(n, "name"), "worker-1");
    assert_eq!(spec(n, "componentsreference"), COMPONENTS_REF);
    assert_eq!(spec(n, "iscontrolplane"), false);
    let deadline = ::time::OffsetDateTime::parse(
        spec(n, "deadline").as_str().unwrap(),
        &::time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let left = deadline - ::time::OffsetDateTime::now_utc();
    assert!(left > ::time::Duration::hours(47) && left <= ::time::Duration::hours(48));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_join_gets_a_complete_ticket() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let (req, host_key) = request("cp-1", true, &[]);
    let ticket = client
        .join(req)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));

    check_common(&system, &ticket, "cp-1").await;
    check_ssh(&ticket, &host_key, &[]);
    let mut names: Vec<&str> = ticket
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
    for f in &ticket.control_plane_files {
        assert_eq!(
            f.data,
            std::fs::read(system.paths.pki_dir.join(&f.name)).unwrap(),
            "{}",
            f.name
        );
    }

    let nodes = system.kube.joining_nodes().await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].metadata.name.as_deref(), Some("control-plane"));
    assert_eq!(spec(&nodes[0], "name"), "cp-1");
    assert_eq!(spec(&nodes[0], "iscontrolplane"), true);

    // The release is recorded as an Event naming the node and the digest of the evidence
    // attest-proxy verified: the digest its own audit line records for this connection.
    let events: Vec<_> = system
        .kube
        .events()
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ControlPlaneFilesReleased"))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(event["reason"], "ControlPlaneFilesReleased");
    assert_eq!(event["involvedObject"]["name"], "cp-1");
    let message = event["message"].as_str().unwrap();
    let digest = message
        .split("attestation evidence sha256 ")
        .nth(1)
        .and_then(|rest| rest.get(..64))
        .unwrap_or_else(|| panic!("no evidence digest in {message}"));
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()), "{message}");
    assert!(
        system.logs().contains(&format!("\"sha256\":\"{digest}\"")),
        "attest-proxy's audit line names the same evidence digest {digest}:\n{}",
        system.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_plane_nodes_at_once_one_joins_the_other_is_told_to_retry() {
    let system = System::start(Options::default()).await.unwrap();
    let issuer = system.issuer().unwrap();
    let (a, b) = (
        system.client(issuer.clone()).unwrap(),
        system.client(issuer).unwrap(),
    );
    let (ra, rb) = tokio::join!(
        a.join(request("cp-a", true, &[]).0),
        b.join(request("cp-b", true, &[]).0)
    );
    let (ticket, refused) = match (ra, rb) {
        (Ok(t), Err(e)) | (Err(e), Ok(t)) => (t, e),
        other => panic!("exactly one must join: {other:?}\n{}", system.logs()),
    };
    let refused = refusal(Err(refused));
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("only one control-plane node joins at a time, retry later"),
        "{}",
        refused.message()
    );
    assert_eq!(
        system.kube.bootstrap_tokens().await.len(),
        1,
        "the refused node got no token"
    );
    authenticate(&system, &ticket.token).await.unwrap();
    assert_eq!(system.kube.joining_nodes().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_kubelet_csrs_are_refused_before_anything_is_created() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let csr = |org: &str, cn: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["10.0.0.7".to_owned()]).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.serialize_request(&key).unwrap().der().to_vec()
    };
    let mut bad_signature = keys::kubelet_request("worker-1", &[IpAddr::from(NODE_IP)])
        .unwrap()
        .csr_der;
    let last = bad_signature.len() - 1;
    bad_signature[last] ^= 0x01;
    let cases = [
        (
            "wrong organisation",
            csr("system:masters", "system:node:worker-1"),
            "organization",
        ),
        (
            "CN without system:node:",
            csr("system:nodes", "worker-1"),
            "does not start with \"system:node:\"",
        ),
        ("bad signature", bad_signature, "signature does not verify"),
        (
            "invalid node name",
            csr("system:nodes", "system:node:Worker_1"),
            "not a valid Kubernetes name",
        ),
    ];
    for (what, der, needle) in cases {
        let (mut req, _) = request("worker-1", false, &[]);
        req.certificate_request = der;
        let status = refusal(client.join(req).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{what}: {}",
            status.message()
        );
        assert!(
            system.join_objects().await.is_empty(),
            "{what}: {:?}",
            system.join_objects().await
        );
    }
    assert!(
        system.kube.requests().iter().all(|r| r.method == "GET"),
        "a refused CSR writes nothing: {:?}",
        system.kube.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_failures_reach_the_node_as_specific_statuses_and_leave_nothing() {
    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let secrets = "/api/v1/namespaces/kube-system/secrets";
    let joining = "/apis/update.edgeless.systems/v1alpha1/joiningnodes";
    let cases = [
        (
            "403 on the token",
            Fault::once(403).on("POST").at(secrets),
            false,
            Code::Internal,
            "creating bootstrap token secret",
        ),
        (
            "409 on the token",
            Fault::once(409).on("POST").at(secrets),
            false,
            Code::Aborted,
            "409",
        ),
        (
            "500 on the token, after it was stored",
            Fault::once(500).on("POST").at(secrets).after_commit(),
            false,
            Code::Unavailable,
            "500",
        ),
        (
            "403 on the JoiningNode",
            Fault::once(403).on("PATCH").at(joining),
            false,
            Code::Internal,
            "applying JoiningNode worker-1",
        ),
        (
            "500 on the NodeVersion",
            Fault::once(500).at("/nodeversions/"),
            false,
            Code::Unavailable,
            "reading NodeVersion constellation-version",
        ),
        (
            "409 on the control-plane token",
            Fault::once(409).on("POST").at(secrets),
            true,
            Code::Aborted,
            "409",
        ),
        (
            "500 on the control-plane JoiningNode, after it was stored",
            Fault::once(500).on("POST").at(joining).after_commit(),
            true,
            Code::Unavailable,
            "creating JoiningNode control-plane",
        ),
    ];
    for (what, fault, control_plane, code, needle) in cases {
        system.kube.inject(fault);
        let node = if control_plane { "cp-1" } else { "worker-1" };
        let status = refusal(client.join(request(node, control_plane, &[]).0).await);
        assert_eq!(status.code(), code, "{what}: {status:?}\n{}", system.logs());
        assert!(
            status.message().contains(needle),
            "{what}: {}",
            status.message()
        );
        assert!(
            system.join_objects().await.is_empty(),
            "{what}: left behind {:?}",
            system.join_objects().await
        );
    }
    // The service keeps serving: the next joins succeed.
    client
        .join(request("worker-1", false, &[]).0)
        .await
        .unwrap();
    client.join(request("cp-1", true, &[]).0).await.unwrap();
}

/// Whether the caller of `client` may `verb` the Node `name` (SelfSubjectAccessReview).
async fn may(client: &kube::Client, verb: &str, name: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                resource: Some("nodes".to_owned()),
                verb: Some(verb.to_owned()),
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    kube::Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&Default::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ticket_works_the_way_kubernetes_uses_it() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use testsupport::control_plane::client_from_kubeconfig;

    let system = System::start(Options::default()).await.unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let kubelet = keys::kubelet_request("worker-7", &[IpAddr::from(NODE_IP)]).unwrap();
    let (mut req, _) = request("worker-7", false, &[]);
    req.certificate_request = kubelet.csr_der.clone();
    let ticket = client
        .join(req)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
    let plane = &system.kube.plane();

    // The TLS bootstrap: the bootstrap token may ask for a kubelet client certificate.
    let bootstrap = client_from_kubeconfig(&plane.token_kubeconfig(&ticket.token))
        .await
        .unwrap();
    let tls_bootstrap = keys::kubelet_request("worker-7", &[]).unwrap();
    let csr: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
            "request": base64::engine::general_purpose::STANDARD
                .encode(pem_rfc7468::encode_string(
                    "CERTIFICATE REQUEST",
                    pem_rfc7468::LineEnding::LF,
                    &tls_bootstrap.csr_der,
                )
                .unwrap()),
        },
    }))
    .unwrap();
    let created = kube::Api::<CertificateSigningRequest>::all(bootstrap)
        .create(&Default::default(), &csr)
        .await
        .unwrap_or_else(|e| panic!("the bootstrap token cannot create a kubelet CSR: {e}"));
    let (id, _) = ticket.token.split_once('.').unwrap();
    assert_eq!(
        created.spec.username.as_deref(),
        Some(format!("system:bootstrap:{id}").as_str())
    );

    // The kubelet certificate authenticates as the node; the Node authorizer lets it read its
    // own Node and no other.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (
        dir.path().join("kubelet.crt"),
        dir.path().join("kubelet.key"),
    );
    std::fs::write(&cert, &ticket.kubelet_cert).unwrap();
    std::fs::write(&key, &kubelet.key_pem).unwrap();
    let node = client_from_kubeconfig(&plane.certificate_kubeconfig(&cert, &key))
        .await
        .unwrap();
    let review =
        kube::Api::<k8s_openapi::api::authentication::v1::SelfSubjectReview>::all(node.clone())
            .create(&Default::default(), &Default::default())
            .await
            .unwrap_or_else(|e| panic!("the kubelet certificate does not authenticate: {e}"));
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some("system:node:worker-7"));
    let mut groups = user.groups.unwrap_or_default();
    groups.sort();
    assert_eq!(groups, ["system:authenticated", "system:nodes"]);
    assert!(
        may(&node, "get", "worker-7").await,
        "a node reads its own Node"
    );
    assert!(
        !may(&node, "get", "worker-8").await,
        "a node reads no other Node"
    );
    assert!(!may(&node, "delete", "worker-8").await);

    // The discovery hash is that of the CA the API server's certificate chains to (the clients
    // above trusted only it).
    let ca_der = pem_cert(plane.ca_pem().as_bytes());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let spki = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, ca.public_key().raw);
    assert_eq!(
        ticket.discovery_token_ca_cert_hash,
        format!("sha256:{}", hex::encode(spki.as_ref()))
    );

    // An expired token no longer authenticates.
    let expired = (::time::OffsetDateTime::now_utc() - ::time::Duration::minutes(1))
        .replace_nanosecond(0)
        .unwrap()
        .format(&::time::format_description::well_known::Rfc3339)
        .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(plane.admin(), "kube-system")
        .patch(
            &format!("bootstrap-token-{id}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"stringData": {"expiration": expired}})),
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match authenticate(&system, &ticket.token).await {
            Err(why) if why.contains("401") || why.contains("Unauthorized") => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "an expired token still authenticates: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
