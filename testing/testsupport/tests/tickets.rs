//! Complete join tickets, end to end: a node attesting with a real swtpm joins through
//! attest-proxy, join-core, token-issuer (against the Kubernetes API stand-in) and the key
//! service, all real processes. Every part of the ticket is checked the way its consumer would
//! check it: the kubelet certificate against the cluster CA, the token under the rules of the
//! Kubernetes bootstrap-token authenticator, the SSH host certificate against the CA key, the
//! components and control-plane files against what the cluster holds. And every refusal and
//! API server failure is checked to leave no token and no `JoiningNode` behind.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use base64::Engine as _;
use kube_standin::{Fault, StoredObject};
use node_client::{ClientError, keys};
use proto::join::{IssueJoinTicketRequest, IssueJoinTicketResponse};
use testsupport::harness::{
    API_SERVER_CERT_SANS, API_SERVER_ENDPOINT, COMPONENTS_REF, KUBERNETES_VERSION, Options, System,
};
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

// ---- The Kubernetes bootstrap-token authenticator, as the API server applies it ----

/// What the authenticator yields for a valid token: the user name and groups.
#[derive(Debug, PartialEq, Eq)]
struct BootstrapUser {
    name: String,
    groups: Vec<String>,
}

fn lower_alnum(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// `\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\z`
fn valid_bootstrap_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    let Some(last) = rest.bytes().last() else {
        return false;
    };
    let body = &rest[..rest.len() - 1];
    body.len() <= 255
        && body
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b':' || c == b'-')
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
}

/// Authenticates `token` against the Secrets in kube-system the way kube-apiserver's
/// bootstrap-token authenticator does; `Err` says which rule failed.
fn authenticate(token: &str, secrets: &[StoredObject]) -> Result<BootstrapUser, String> {
    let (id, secret) = token.split_once('.').ok_or("token is not <id>.<secret>")?;
    if !lower_alnum(id, 6) || !lower_alnum(secret, 16) {
        return Err(format!(
            "token {token:?} is not [a-z0-9]{{6}}.[a-z0-9]{{16}}"
        ));
    }
    let name = format!("bootstrap-token-{id}");
    let s = secrets
        .iter()
        .find(|s| s.name == name)
        .ok_or(format!("no Secret {name} in kube-system"))?;
    if s.object["metadata"].get("deletionTimestamp").is_some() {
        return Err("Secret is being deleted".into());
    }
    if s.secret_type() != Some("bootstrap.kubernetes.io/token") {
        return Err(format!("Secret type {:?}", s.secret_type()));
    }
    let stored = s.secret_data("token-secret").unwrap_or_default();
    // The authenticator compares in constant time; a test only needs the verdict.
    if stored != secret.as_bytes() {
        return Err("token-secret does not match".into());
    }
    if s.secret_string("token-id").as_deref() != Some(id) {
        return Err("token-id does not match".into());
    }
    if let Some(expiration) = s.secret_string("expiration") {
        let at = ::time::OffsetDateTime::parse(
            &expiration,
            &::time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| format!("expiration {expiration:?} is not RFC 3339: {e}"))?;
        if at <= ::time::OffsetDateTime::now_utc() {
            return Err(format!("expired at {expiration}"));
        }
    }
    if s.secret_string("usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err("usage-bootstrap-authentication is not \"true\"".into());
    }
    let mut groups = vec!["system:bootstrappers".to_owned()];
    if let Some(extra) = s.secret_string("auth-extra-groups") {
        for g in extra.split(',') {
            if !valid_bootstrap_group(g) {
                return Err(format!("auth-extra-groups entry {g:?} is invalid"));
            }
            groups.push(g.to_owned());
        }
    }
    Ok(BootstrapUser {
        name: format!("system:bootstrap:{id}"),
        groups,
    })
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

fn spec<'a>(o: &'a StoredObject, field: &str) -> &'a serde_json::Value {
    &o.object["spec"][field]
}

fn check_common(system: &System, ticket: &IssueJoinTicketResponse, node: &str) {
    check_kubelet_cert(system, ticket, node);
    assert_eq!(ticket.api_server_endpoint, API_SERVER_ENDPOINT);
    let user = authenticate(&ticket.token, &system.kube.secrets("kube-system"))
        .unwrap_or_else(|why| panic!("token does not authenticate: {why}"));
    let (id, _) = ticket.token.split_once('.').unwrap();
    assert_eq!(user.name, format!("system:bootstrap:{id}"));
    assert_eq!(
        user.groups,
        [
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token"
        ]
    );
    assert_eq!(ticket.kubernetes_version, KUBERNETES_VERSION);
    let want: Vec<serde_json::Value> =
        serde_json::from_str(&kube_standin::fixtures::components_json()).unwrap();
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

    check_common(&system, &ticket, "worker-1");
    check_ssh(&ticket, &host_key, &["worker-1.internal"]);
    assert!(
        ticket.control_plane_files.is_empty(),
        "workers get no CA keys"
    );

    let nodes = system.kube.joining_nodes();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let n = &nodes[0];
    assert_eq!(n.name, "worker-1");
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

    check_common(&system, &ticket, "cp-1");
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

    let nodes = system.kube.joining_nodes();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].name, "control-plane");
    assert_eq!(spec(&nodes[0], "name"), "cp-1");
    assert_eq!(spec(&nodes[0], "iscontrolplane"), true);

    // The release is recorded as an Event naming the node and the digest of the evidence
    // attest-proxy verified: the digest its own audit line records for this connection.
    let events = system.kube.objects_of("events");
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0].object;
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
        system.kube.secrets("kube-system").len(),
        1,
        "the refused node got no token"
    );
    authenticate(&ticket.token, &system.kube.secrets("kube-system")).unwrap();
    assert_eq!(system.kube.joining_nodes().len(), 1);
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
            system.join_objects().is_empty(),
            "{what}: {:?}",
            system.join_objects()
        );
    }
    assert!(
        system
            .kube
            .requests()
            .iter()
            .all(|r| r.method == "GET" || r.path.starts_with("/__standin")),
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
            system.join_objects().is_empty(),
            "{what}: left behind {:?}",
            system.join_objects()
        );
    }
    // The service keeps serving: the next joins succeed.
    client
        .join(request("worker-1", false, &[]).0)
        .await
        .unwrap();
    client.join(request("cp-1", true, &[]).0).await.unwrap();
}
