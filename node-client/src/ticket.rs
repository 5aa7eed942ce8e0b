//! Writes a join ticket's parts to a directory, secrets readable by the owner only.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use proto::join::{IssueJoinTicketResponse, IssueRejoinTicketResponse};

/// Mode of files holding key material or credentials.
const SECRET: u32 = 0o600;
/// Mode of files anyone on the node may read.
const PUBLIC: u32 = 0o644;

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
    pub kubelet_key_pem: &'a str,
    pub ssh_host_key_pkcs8: &'a [u8],
    pub ssh_host_public_line: &'a str,
}

/// Writes a join ticket and the node's keys into `dir`.
pub fn write_join(
    dir: &Path,
    ticket: &IssueJoinTicketResponse,
    keys: &NodeKeys<'_>,
) -> Result<(), WriteError> {
    write(dir, "state-disk-key", &ticket.state_disk_key, SECRET)?;
    write(
        dir,
        "measurement-secret",
        &ticket.measurement_secret,
        SECRET,
    )?;
    write(dir, "measurement-salt", &ticket.measurement_salt, PUBLIC)?;
    write(dir, "bootstrap-token", ticket.token.as_bytes(), SECRET)?;
    write(dir, "kubelet.crt", &ticket.kubelet_cert, PUBLIC)?;
    write(dir, "kubelet.key", keys.kubelet_key_pem.as_bytes(), SECRET)?;
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
        "ssh_host_ed25519_key.pkcs8",
        keys.ssh_host_key_pkcs8,
        SECRET,
    )?;
    write(
        dir,
        "ssh_host_ed25519_key.pub",
        keys.ssh_host_public_line.as_bytes(),
        PUBLIC,
    )?;
    if !ticket.authorized_ca_public_key.is_empty() {
        write(dir, "ssh_ca.pub", &ticket.authorized_ca_public_key, PUBLIC)?;
    }
    if !ticket.host_certificate.is_empty() {
        write(
            dir,
            "ssh_host_ed25519_key-cert.pub",
            &ticket.host_certificate,
            PUBLIC,
        )?;
    }
    if !ticket.kubernetes_version.is_empty() {
        write(
            dir,
            "kubernetes-version",
            ticket.kubernetes_version.as_bytes(),
            PUBLIC,
        )?;
    }
    for file in &ticket.control_plane_files {
        let name = safe_pki_name(&file.name)?;
        // Everything the control plane gets may include private keys; keep all of it private.
        write(dir, &format!("pki/{name}"), &file.data, SECRET)?;
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

/// What a node learned from its join ticket, one line per part, secrets as fingerprints only.
pub fn summary(ticket: &IssueJoinTicketResponse) -> String {
    let token_id = ticket.token.split('.').next().unwrap_or_default();
    [
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
    let digest = ring::digest::digest(&ring::digest::SHA256, secret);
    format!("sha256:{}", hex::encode(&digest.as_ref()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn secrets_are_owner_only_and_names_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let ticket = IssueJoinTicketResponse {
            state_disk_key: vec![1; 32],
            token: "abcdef.0123456789abcdef".into(),
            control_plane_files: vec![proto::join::ControlPlaneCertOrKey {
                name: "etcd/ca.key".into(),
                data: b"k".to_vec(),
            }],
            ..Default::default()
        };
        let keys = NodeKeys {
            kubelet_key_pem: "pem",
            ssh_host_key_pkcs8: b"x",
            ssh_host_public_line: "ssh-ed25519 AAAA",
        };
        write_join(dir.path(), &ticket, &keys).unwrap();
        for secret in [
            "state-disk-key",
            "bootstrap-token",
            "kubelet.key",
            "pki/etcd/ca.key",
        ] {
            assert_eq!(
                std::fs::metadata(dir.path().join(secret)).unwrap().mode() & 0o777,
                0o600,
                "{secret}"
            );
        }
        assert_eq!(
            std::fs::metadata(dir.path().join("kubelet.crt"))
                .unwrap()
                .mode()
                & 0o777,
            0o644
        );

        for bad in ["../escape", "/etc/passwd", "", "pki/../../x"] {
            let ticket = IssueJoinTicketResponse {
                control_plane_files: vec![proto::join::ControlPlaneCertOrKey {
                    name: bad.into(),
                    data: vec![],
                }],
                ..Default::default()
            };
            assert!(
                matches!(
                    write_join(dir.path(), &ticket, &keys),
                    Err(WriteError::UnsafeName(_))
                ),
                "{bad:?}"
            );
        }
    }
}
