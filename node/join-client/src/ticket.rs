//! Writes a join ticket's parts where a node needs them, secrets readable by the owner only, and
//! derives the cluster ID.
//!
//! Layout of the output directory after a join (`0600` = owner only):
//!
//! | file | mode | what |
//! |---|---|---|
//! | `state-disk-key` | 0600 | the state disk's LUKS passphrase |
//! | `measurement-secret` | 0600 | the cluster's measurement secret |
//! | `measurement-salt` | 0644 | the cluster's measurement salt |
//! | `cluster-id` | 0644 | the cluster ID, standard base64, as Constellation prints it |
//! | `kubelet.crt`, `kubelet.key` | 0644, 0600 | the kubelet's client certificate and key |
//! | `bootstrap-token` | 0600 | `<id>.<secret>` |
//! | `api-server-endpoint`, `discovery-token-ca-cert-hash` | 0644 | for `kubeadm join` |
//! | `kubeadm-join.yaml` | 0600 | a kubeadm `JoinConfiguration` (it holds the token) |
//! | `kubernetes-version`, `components.json` | 0644 | what to install, from the cluster's NodeVersion |
//! | `pki/<name>` | 0600 for `*.key`, else 0644 | control-plane joiners: the shared CAs, names relative to `/etc/kubernetes/pki` |
//! | `ssh/ssh_host_ed25519_key` | 0600 | the host key in OpenSSH format, for sshd's `HostKey` |
//! | `ssh/ssh_host_ed25519_key.pub` | 0644 | its public half |
//! | `ssh/ssh_host_ed25519_key-cert.pub` | 0644 | the host certificate, for sshd's `HostCertificate` |
//! | `ssh/ssh_ca.pub` | 0644 | the emergency SSH CA, for `TrustedUserCAKeys` / `@cert-authority` |

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use base64::Engine;
use proto::join::{IssueJoinTicketResponse, IssueRejoinTicketResponse};
use serde::Serialize;

use crate::keys::{self, KeyError};

/// Mode of files holding key material or credentials.
const SECRET: u32 = 0o600;
/// Mode of files anyone on the node may read.
const PUBLIC: u32 = 0o644;
/// The kubeadm API version of the JoinConfiguration written, the one Constellation uses.
const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta3";
/// HKDF info for the cluster ID: Constellation's key-derivation prefix `key-` and `clusterID`.
pub const CLUSTER_ID_INFO: &[u8] = b"key-clusterID";

/// Why the ticket could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A file could not be written.
    #[error("cannot write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The service named a control-plane file outside the PKI directory.
    #[error("refusing control-plane file name {0:?}: not a relative path inside pki/")]
    UnsafeName(String),
    /// The SSH host key could not be written in OpenSSH's format.
    #[error("cannot encode the SSH host key")]
    HostKey(#[source] KeyError),
    /// The kubeadm JoinConfiguration could not be encoded.
    #[error("cannot encode the kubeadm JoinConfiguration")]
    JoinConfiguration(#[source] serde_yaml::Error),
    /// The components list could not be encoded.
    #[error("cannot encode the components list")]
    Components(#[source] serde_json::Error),
}

/// The cluster ID a Constellation node derives from its ticket: HKDF-SHA256 with the measurement
/// secret as input key material, the measurement salt as salt and `key-clusterID` as info,
/// 32 bytes. Every node of a cluster derives the same ID, and only nodes that got the secret can.
pub fn cluster_id(measurement_secret: &[u8], measurement_salt: &[u8]) -> [u8; 32] {
    hkdf_sha256_32(measurement_secret, measurement_salt, CLUSTER_ID_INFO)
}

/// HKDF-SHA256 (RFC 5869) with a 32-byte output.
fn hkdf_sha256_32(ikm: &[u8], salt: &[u8], info: &[u8]) -> [u8; 32] {
    let prk = aws_lc_rs::hkdf::Salt::new(aws_lc_rs::hkdf::HKDF_SHA256, salt).extract(ikm);
    let mut okm = [0u8; 32];
    // HKDF_SHA256 as the output type asks for exactly one hash length (32 bytes), far below
    // HKDF's 255-block limit, so neither step can fail.
    if let Ok(expanded) = prk.expand(&[info], aws_lc_rs::hkdf::HKDF_SHA256) {
        let _ = expanded.fill(&mut okm);
    }
    okm
}

/// The cluster ID as Constellation prints it (`constellation-state.yaml`, the CLI): standard
/// base64.
pub fn cluster_id_base64(measurement_secret: &[u8], measurement_salt: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(cluster_id(measurement_secret, measurement_salt))
}

/// Writes `contents` to `dir/name` with `mode`, replacing an older file.
fn write(dir: &Path, name: &str, contents: &[u8], mode: u32) -> Result<PathBuf, WriteError> {
    let path = dir.join(name);
    let io = |source| WriteError::Io {
        path: path.clone(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&path)
        .map_err(io)?;
    // The mode given at creation is masked by the umask and ignored for existing files.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io)?;
    file.write_all(contents).map_err(io)?;
    Ok(path)
}

/// The node's own keys that go with a ticket.
#[derive(Debug)]
pub struct NodeKeys<'a> {
    /// The kubelet's private key, PEM.
    pub kubelet_key_pem: &'a str,
    /// The SSH host key as [`keys::SshHostKey`] holds it (PKCS#8 v2); written in OpenSSH's
    /// format.
    pub ssh_host_key_pkcs8: &'a [u8],
    /// The SSH host public key as an OpenSSH `.pub` line.
    pub ssh_host_public_line: &'a str,
}

/// kubeadm's `JoinConfiguration`, the fields a bootstrap-token join needs.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinConfiguration<'a> {
    api_version: &'static str,
    kind: &'static str,
    discovery: Discovery<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane: Option<ControlPlane>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Discovery<'a> {
    bootstrap_token: BootstrapTokenDiscovery<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapTokenDiscovery<'a> {
    api_server_endpoint: &'a str,
    token: &'a str,
    ca_cert_hashes: [&'a str; 1],
}

/// Present (and empty: kubeadm's defaults) for a control-plane join; the shared CAs are
/// already in the PKI directory, so no certificate key is needed.
#[derive(Serialize)]
struct ControlPlane {}

/// A component as Constellation's components JSON writes it.
#[derive(Serialize)]
struct ComponentJson<'a> {
    url: &'a str,
    hash: &'a str,
    install_path: &'a str,
    extract: bool,
}

/// The kubeadm JoinConfiguration for this ticket, YAML.
fn join_configuration(ticket: &IssueJoinTicketResponse) -> Result<String, WriteError> {
    let config = JoinConfiguration {
        api_version: KUBEADM_API_VERSION,
        kind: "JoinConfiguration",
        discovery: Discovery {
            bootstrap_token: BootstrapTokenDiscovery {
                api_server_endpoint: &ticket.api_server_endpoint,
                token: &ticket.token,
                ca_cert_hashes: [&ticket.discovery_token_ca_cert_hash],
            },
        },
        // Only control-plane joiners get the control-plane files.
        control_plane: (!ticket.control_plane_files.is_empty()).then_some(ControlPlane {}),
    };
    serde_yaml::to_string(&config).map_err(WriteError::JoinConfiguration)
}

fn components_json(ticket: &IssueJoinTicketResponse) -> Result<Vec<u8>, WriteError> {
    let components: Vec<ComponentJson<'_>> = ticket
        .kubernetes_components
        .iter()
        .map(|c| ComponentJson {
            url: &c.url,
            hash: &c.hash,
            install_path: &c.install_path,
            extract: c.extract,
        })
        .collect();
    let mut json = serde_json::to_vec_pretty(&components).map_err(WriteError::Components)?;
    json.push(b'\n');
    Ok(json)
}

/// Writes a join ticket and the node's keys into `dir` (layout in the module docs).
pub fn write_join(
    dir: &Path,
    ticket: &IssueJoinTicketResponse,
    keys: &NodeKeys<'_>,
) -> Result<(), WriteError> {
    // Checked before anything is written, so a bad name leaves no half-written ticket.
    let pki_files = ticket
        .control_plane_files
        .iter()
        .map(|file| Ok((safe_pki_name(&file.name)?, &file.data)))
        .collect::<Result<Vec<_>, WriteError>>()?;
    let ssh_private_key =
        keys::openssh_private_key(keys.ssh_host_key_pkcs8).map_err(WriteError::HostKey)?;

    write(dir, "state-disk-key", &ticket.state_disk_key, SECRET)?;
    write(
        dir,
        "measurement-secret",
        &ticket.measurement_secret,
        SECRET,
    )?;
    write(dir, "measurement-salt", &ticket.measurement_salt, PUBLIC)?;
    let cluster_id = cluster_id_base64(&ticket.measurement_secret, &ticket.measurement_salt);
    write(
        dir,
        "cluster-id",
        format!("{cluster_id}\n").as_bytes(),
        PUBLIC,
    )?;

    write(dir, "kubelet.crt", &ticket.kubelet_cert, PUBLIC)?;
    write(dir, "kubelet.key", keys.kubelet_key_pem.as_bytes(), SECRET)?;
    write(dir, "bootstrap-token", ticket.token.as_bytes(), SECRET)?;
    write(
        dir,
        "api-server-endpoint",
        ticket.api_server_endpoint.as_bytes(),
        PUBLIC,
    )?;
    write(
        dir,
        "discovery-token-ca-cert-hash",
        ticket.discovery_token_ca_cert_hash.as_bytes(),
        PUBLIC,
    )?;
    write(
        dir,
        "kubeadm-join.yaml",
        join_configuration(ticket)?.as_bytes(),
        SECRET,
    )?;
    if !ticket.kubernetes_version.is_empty() {
        write(
            dir,
            "kubernetes-version",
            ticket.kubernetes_version.as_bytes(),
            PUBLIC,
        )?;
    }
    write(dir, "components.json", &components_json(ticket)?, PUBLIC)?;
    for (name, data) in pki_files {
        // kubeadm's own modes: private keys owner-only, certificates and public keys readable.
        let mode = if name.ends_with(".key") {
            SECRET
        } else {
            PUBLIC
        };
        write(dir, &format!("pki/{name}"), data, mode)?;
    }

    write(
        dir,
        "ssh/ssh_host_ed25519_key",
        ssh_private_key.as_bytes(),
        SECRET,
    )?;
    write(
        dir,
        "ssh/ssh_host_ed25519_key.pub",
        format!("{}\n", keys.ssh_host_public_line).as_bytes(),
        PUBLIC,
    )?;
    if !ticket.host_certificate.is_empty() {
        write(
            dir,
            "ssh/ssh_host_ed25519_key-cert.pub",
            &ticket.host_certificate,
            PUBLIC,
        )?;
    }
    if !ticket.authorized_ca_public_key.is_empty() {
        write(
            dir,
            "ssh/ssh_ca.pub",
            &ticket.authorized_ca_public_key,
            PUBLIC,
        )?;
    }
    Ok(())
}

/// Writes a rejoin ticket into `dir`.
pub fn write_rejoin(dir: &Path, ticket: &IssueRejoinTicketResponse) -> Result<(), WriteError> {
    write(dir, "state-disk-key", &ticket.state_disk_key, SECRET)?;
    write(
        dir,
        "measurement-secret",
        &ticket.measurement_secret,
        SECRET,
    )?;
    Ok(())
}

/// A control-plane file name must stay inside `pki/`: no absolute paths, no `..`.
fn safe_pki_name(name: &str) -> Result<&str, WriteError> {
    let path = Path::new(name);
    let safe = !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if safe {
        Ok(name)
    } else {
        Err(WriteError::UnsafeName(name.to_owned()))
    }
}

/// The principals of the ticket's SSH host certificate, for the summary.
fn host_certificate_principals(ticket: &IssueJoinTicketResponse) -> String {
    if ticket.host_certificate.is_empty() {
        return "none issued".to_owned();
    }
    match std::str::from_utf8(&ticket.host_certificate)
        .ok()
        .and_then(|line| ssh_key::Certificate::from_openssh(line).ok())
    {
        Some(cert) => format!("for {}", cert.valid_principals().join(", ")),
        None => "unreadable".to_owned(),
    }
}

/// What a node learned from its join ticket, one line per part, secrets as fingerprints only.
pub fn summary(ticket: &IssueJoinTicketResponse) -> String {
    let token_id = ticket.token.split('.').next().unwrap_or_default();
    [
        format!(
            "  cluster id          {}",
            cluster_id_base64(&ticket.measurement_secret, &ticket.measurement_salt)
        ),
        format!("  api server          {}", ticket.api_server_endpoint),
        format!("  bootstrap token id  {token_id}"),
        format!(
            "  discovery hash      {}",
            ticket.discovery_token_ca_cert_hash
        ),
        format!(
            "  kubelet cert        {} bytes PEM",
            ticket.kubelet_cert.len()
        ),
        format!(
            "  kubernetes          {} ({} components)",
            if ticket.kubernetes_version.is_empty() {
                "version not given"
            } else {
                &ticket.kubernetes_version
            },
            ticket.kubernetes_components.len()
        ),
        format!("  control-plane files {}", ticket.control_plane_files.len()),
        format!(
            "  ssh host cert       {}",
            host_certificate_principals(ticket)
        ),
        format!(
            "  state disk key      {} ({} bytes)",
            fingerprint(&ticket.state_disk_key),
            ticket.state_disk_key.len()
        ),
        format!(
            "  measurement secret  {}",
            fingerprint(&ticket.measurement_secret)
        ),
    ]
    .join("\n")
}

/// A short fingerprint of secret material for summaries: never the secret itself.
pub fn fingerprint(secret: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, secret);
    format!("sha256:{}", hex::encode(&digest.as_ref()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// HKDF-SHA256(IKM = 00..1f, salt = 20..3f, info = "key-clusterID", 32), computed with an
    /// independent HKDF (Python's hmac/hashlib, RFC 5869 by hand).
    const CLUSTER_ID_VECTOR: &str =
        "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6";

    fn sequence(start: u8) -> Vec<u8> {
        (start..start + 32).collect()
    }

    #[test]
    fn cluster_id_matches_the_test_vector() {
        let id = cluster_id(&sequence(0), &sequence(32));
        assert_eq!(hex::encode(id), CLUSTER_ID_VECTOR);
        assert_eq!(
            cluster_id_base64(&sequence(0), &sequence(32)),
            "EowWQ3j+h2f5mPvf5LTWRj7FrhtmTqWZm8J0F2B66bY="
        );
        // Secret and salt are not interchangeable.
        assert_ne!(cluster_id(&sequence(32), &sequence(0)), id);
    }

    #[test]
    fn hkdf_matches_rfc_5869_a1() {
        // RFC 5869 A.1 asks for 42 bytes; the first 32 are T(1), which does not depend on L.
        let ikm = [0x0b; 22];
        let salt: Vec<u8> = (0x00..=0x0c).collect();
        let info: Vec<u8> = (0xf0..=0xf9).collect();
        let okm = hkdf_sha256_32(&ikm, &salt, &info);
        assert_eq!(
            hex::encode(okm),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
        );
    }

    #[test]
    fn bad_pki_names_write_nothing() {
        let key = keys::SshHostKey::generate().unwrap();
        let line = key.public_line();
        let node_keys = NodeKeys {
            kubelet_key_pem: "pem",
            ssh_host_key_pkcs8: &key.pkcs8,
            ssh_host_public_line: &line,
        };
        for bad in ["../escape", "/etc/passwd", "", "pki/../../x"] {
            let dir = tempfile::tempdir().unwrap();
            let ticket = IssueJoinTicketResponse {
                state_disk_key: vec![1; 32],
                control_plane_files: vec![proto::join::ControlPlaneCertOrKey {
                    name: bad.into(),
                    data: vec![],
                }],
                ..Default::default()
            };
            assert!(
                matches!(
                    write_join(dir.path(), &ticket, &node_keys),
                    Err(WriteError::UnsafeName(_))
                ),
                "{bad:?}"
            );
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "{bad:?}: nothing written"
            );
        }
    }

    #[test]
    fn rejoin_writes_the_keys_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let ticket = IssueRejoinTicketResponse {
            state_disk_key: vec![3; 32],
            measurement_secret: vec![4; 32],
        };
        write_rejoin(dir.path(), &ticket).unwrap();
        for name in ["state-disk-key", "measurement-secret"] {
            let path = dir.path().join(name);
            assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        }
        assert_eq!(
            std::fs::read(dir.path().join("state-disk-key")).unwrap(),
            [3; 32]
        );
    }
}
