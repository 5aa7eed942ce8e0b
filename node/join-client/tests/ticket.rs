//! join-client's output directory for a complete ticket: every part where a node needs it, with
//! the right modes, readable by the tools that consume it (kubeadm's YAML, OpenSSH's key and
//! certificate formats), and the cluster ID a Constellation node would derive.
//!
//! The SSH parts are real: the host certificate is signed by join-core's emergency SSH CA code
//! for this host key, and OpenSSH's own `ssh-keygen` reads the files when it is installed.

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use join_core::ssh::{HostKey, SshCa};
use node_client::keys::SshHostKey;
use node_client::ticket::{self, NodeKeys};
use proto::join::{ControlPlaneCertOrKey, IssueJoinTicketResponse};

const MEASUREMENT_SECRET: [u8; 32] = [0x11; 32];
const MEASUREMENT_SALT: [u8; 32] = [0x22; 32];
/// HKDF-SHA256(IKM = 0x11 * 32, salt = 0x22 * 32, info = "key-clusterID", 32), standard
/// base64, computed independently (Python's hmac/hashlib).
const CLUSTER_ID: &str = "M5CpXC4mEeu3D8/UtZZEJT48XLKbe7wdmosJUkUkfNA=";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o777
}

fn ticket(host_key: &SshHostKey, control_plane: bool) -> IssueJoinTicketResponse {
    let ca = SshCa::from_seed(&[0x44; 32]).unwrap();
    let host_certificate = ca
        .host_certificate(
            &HostKey::parse(&host_key.public_wire).unwrap(),
            &["10.0.0.7".to_owned(), "worker-7".to_owned()],
            "disk-7",
            Duration::from_secs(3600),
        )
        .unwrap();
    let control_plane_files = if control_plane {
        [
            ("ca.crt", "cert"),
            ("ca.key", "key"),
            ("sa.pub", "pub"),
            ("sa.key", "key"),
            ("etcd/ca.crt", "cert"),
            ("etcd/ca.key", "key"),
        ]
        .into_iter()
        .map(|(name, data)| ControlPlaneCertOrKey {
            name: name.into(),
            data: data.into(),
        })
        .collect()
    } else {
        Vec::new()
    };
    IssueJoinTicketResponse {
        state_disk_key: vec![0x33; 32],
        measurement_salt: MEASUREMENT_SALT.to_vec(),
        measurement_secret: MEASUREMENT_SECRET.to_vec(),
        kubelet_cert: b"-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n".to_vec(),
        api_server_endpoint: "10.0.0.1:6443".into(),
        token: "abcdef.0123456789abcdef".into(),
        discovery_token_ca_cert_hash: format!("sha256:{}", "ab".repeat(32)),
        control_plane_files,
        kubernetes_version: "v1.30.4".into(),
        kubernetes_components: vec![proto::components::Component {
            url: "https://example.invalid/kubeadm.tar.gz".into(),
            hash: format!("sha256:{}", "cd".repeat(32)),
            install_path: "/run/state/bin".into(),
            extract: true,
        }],
        authorized_ca_public_key: ca.authorized_key_line(),
        host_certificate,
    }
}

fn write(dir: &Path, ticket: &IssueJoinTicketResponse, host_key: &SshHostKey) {
    let line = host_key.public_line();
    let keys = NodeKeys {
        kubelet_key_pem: "-----BEGIN PRIVATE KEY-----\nkubelet\n-----END PRIVATE KEY-----\n",
        ssh_host_key_pkcs8: &host_key.pkcs8,
        ssh_host_public_line: &line,
    };
    ticket::write_join(dir, ticket, &keys).unwrap();
}

#[test]
fn a_worker_ticket_is_written_where_a_node_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let host_key = SshHostKey::generate().unwrap();
    let ticket = ticket(&host_key, false);
    write(dir.path(), &ticket, &host_key);
    let path = |name: &str| dir.path().join(name);
    let read = |name: &str| std::fs::read(path(name)).unwrap();

    let cluster_id_line = format!("{CLUSTER_ID}\n");
    let public_line = format!("{}\n", host_key.public_line());
    let expected: [(&str, u32, &[u8]); 13] = [
        ("state-disk-key", 0o600, &[0x33; 32]),
        ("measurement-secret", 0o600, &MEASUREMENT_SECRET),
        ("measurement-salt", 0o644, &MEASUREMENT_SALT),
        ("cluster-id", 0o644, cluster_id_line.as_bytes()),
        ("kubelet.crt", 0o644, &ticket.kubelet_cert),
        (
            "kubelet.key",
            0o600,
            b"-----BEGIN PRIVATE KEY-----\nkubelet\n-----END PRIVATE KEY-----\n",
        ),
        ("bootstrap-token", 0o600, b"abcdef.0123456789abcdef"),
        ("api-server-endpoint", 0o644, b"10.0.0.1:6443"),
        (
            "discovery-token-ca-cert-hash",
            0o644,
            ticket.discovery_token_ca_cert_hash.as_bytes(),
        ),
        ("kubernetes-version", 0o644, b"v1.30.4"),
        (
            "ssh/ssh_host_ed25519_key.pub",
            0o644,
            public_line.as_bytes(),
        ),
        (
            "ssh/ssh_host_ed25519_key-cert.pub",
            0o644,
            &ticket.host_certificate,
        ),
        ("ssh/ssh_ca.pub", 0o644, &ticket.authorized_ca_public_key),
    ];
    for (name, file_mode, contents) in expected {
        assert_eq!(read(name), contents, "{name}");
        assert_eq!(mode(&path(name)), file_mode, "{name}");
    }
    assert!(!path("pki").exists(), "workers get no control-plane files");

    // kubeadm's JoinConfiguration, owner-only because it holds the token.
    assert_eq!(mode(&path("kubeadm-join.yaml")), 0o600);
    let join: serde_yaml::Value = serde_yaml::from_slice(&read("kubeadm-join.yaml")).unwrap();
    assert_eq!(join["apiVersion"], "kubeadm.k8s.io/v1beta3");
    assert_eq!(join["kind"], "JoinConfiguration");
    let discovery = &join["discovery"]["bootstrapToken"];
    assert_eq!(discovery["apiServerEndpoint"], "10.0.0.1:6443");
    assert_eq!(discovery["token"], "abcdef.0123456789abcdef");
    assert_eq!(
        discovery["caCertHashes"][0].as_str().unwrap(),
        ticket.discovery_token_ca_cert_hash
    );
    assert!(join.get("controlPlane").is_none());

    // Constellation's components JSON.
    let components: serde_json::Value = serde_json::from_slice(&read("components.json")).unwrap();
    assert_eq!(
        components,
        serde_json::json!([{
            "url": "https://example.invalid/kubeadm.tar.gz",
            "hash": format!("sha256:{}", "cd".repeat(32)),
            "install_path": "/run/state/bin",
            "extract": true,
        }])
    );

    // The host key in OpenSSH's format is the key the certificate is for.
    let private_key = path("ssh/ssh_host_ed25519_key");
    assert_eq!(mode(&private_key), 0o600);
    let parsed = ssh_key::PrivateKey::read_openssh_file(&private_key).unwrap();
    assert_eq!(
        parsed.public_key().to_bytes().unwrap(),
        host_key.public_wire
    );
    let cert = ssh_key::Certificate::read_file(&path("ssh/ssh_host_ed25519_key-cert.pub")).unwrap();
    assert_eq!(cert.public_key(), parsed.public_key().key_data());
    assert_eq!(cert.valid_principals(), ["10.0.0.7", "worker-7"]);

    // The summary names the cluster ID as Constellation prints it, and no secret.
    let summary = ticket::summary(&ticket);
    assert!(
        summary.contains(&format!("cluster id          {CLUSTER_ID}")),
        "{summary}"
    );
    assert!(summary.contains("for 10.0.0.7, worker-7"), "{summary}");
    assert!(summary.contains("v1.30.4 (1 components)"), "{summary}");
    assert!(
        !summary.contains("0123456789abcdef"),
        "no token secret: {summary}"
    );
}

#[test]
fn a_control_plane_ticket_adds_the_pki() {
    let dir = tempfile::tempdir().unwrap();
    let host_key = SshHostKey::generate().unwrap();
    let ticket = ticket(&host_key, true);
    write(dir.path(), &ticket, &host_key);
    for (name, file_mode) in [
        ("ca.crt", 0o644),
        ("ca.key", 0o600),
        ("sa.pub", 0o644),
        ("sa.key", 0o600),
        ("etcd/ca.crt", 0o644),
        ("etcd/ca.key", 0o600),
    ] {
        let path = dir.path().join("pki").join(name);
        assert_eq!(mode(&path), file_mode, "{name}");
        let expected = ticket
            .control_plane_files
            .iter()
            .find(|f| f.name == name)
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected.data, "{name}");
    }
    let join: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(dir.path().join("kubeadm-join.yaml")).unwrap())
            .unwrap();
    assert!(join["controlPlane"].is_mapping(), "{join:?}");
}

#[test]
fn rewriting_tightens_modes_of_existing_files() {
    let dir = tempfile::tempdir().unwrap();
    let loose = dir.path().join("state-disk-key");
    std::fs::write(&loose, b"old").unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let host_key = SshHostKey::generate().unwrap();
    write(dir.path(), &ticket(&host_key, false), &host_key);
    assert_eq!(mode(&loose), 0o600);
    assert_eq!(std::fs::read(&loose).unwrap(), [0x33; 32]);
}

/// OpenSSH itself reads what was written: `ssh-keygen -L` parses the certificate and checks
/// its CA signature, `ssh-keygen -y` derives the public key from the private key file.
#[test]
fn openssh_reads_the_ssh_files() {
    if Command::new("ssh-keygen").arg("-?").output().is_err() {
        eprintln!("ssh-keygen not installed; OpenSSH cross-check skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host_key = SshHostKey::generate().unwrap();
    let ticket = ticket(&host_key, false);
    write(dir.path(), &ticket, &host_key);
    let ssh = dir.path().join("ssh");

    let listed = Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(ssh.join("ssh_host_ed25519_key-cert.pub"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        text.contains("ssh-ed25519-cert-v01@openssh.com host certificate"),
        "{text}"
    );
    assert!(text.contains("Key ID: \"disk-7\""), "{text}");
    assert!(
        text.contains("10.0.0.7") && text.contains("worker-7"),
        "{text}"
    );
    let ca_line = String::from_utf8(ticket.authorized_ca_public_key.clone()).unwrap();
    let ca_fingerprint = ssh_key::PublicKey::from_openssh(ca_line.trim_end())
        .unwrap()
        .fingerprint(ssh_key::HashAlg::Sha256)
        .to_string();
    assert!(text.contains(&ca_fingerprint), "signed by the CA: {text}");

    // A certificate with a flipped signature byte is refused by OpenSSH.
    let cert_line = String::from_utf8(ticket.host_certificate.clone()).unwrap();
    let (kind, blob) = cert_line.trim_end().split_once(' ').unwrap();
    let mut bytes =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let tampered = ssh.join("tampered-cert.pub");
    std::fs::write(
        &tampered,
        format!(
            "{kind} {}\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes)
        ),
    )
    .unwrap();
    let refused = Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(&tampered)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "OpenSSH must refuse a bad CA signature"
    );

    let derived = Command::new("ssh-keygen")
        .arg("-y")
        .arg("-f")
        .arg(ssh.join("ssh_host_ed25519_key"))
        .output()
        .unwrap();
    assert!(
        derived.status.success(),
        "{}",
        String::from_utf8_lossy(&derived.stderr)
    );
    let derived = String::from_utf8(derived.stdout).unwrap();
    assert!(
        derived.starts_with(&host_key.public_line()),
        "{derived} vs {}",
        host_key.public_line()
    );
}
