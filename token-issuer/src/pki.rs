//! The control-plane PKI a joining control-plane node receives: the cluster-wide CA keys and
//! certificates kubeadm would otherwise copy by hand, read from the mounted kubeadm PKI
//! directory on every control-plane join (so a rotated file is picked up without a restart).

use std::path::{Path, PathBuf};

use proto::tokenissuer::ControlPlaneFile;

/// The files, by path relative to the PKI directory (as kubeadm lays it out and as
/// Constellation's join service sends them).
pub const CONTROL_PLANE_FILES: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
];

/// A PEM key or certificate is a few KiB; more is not one of these files.
pub const MAX_FILE_LEN: u64 = 64 * 1024;

/// Why a control-plane file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Reading failed (missing, unreadable).
    #[error("reading control-plane file {name} ({path}): {source}")]
    Read {
        /// Name relative to the PKI directory.
        name: &'static str,
        /// Full path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("control-plane file {name} ({path}) is empty")]
    Empty {
        /// Name relative to the PKI directory.
        name: &'static str,
        /// Full path.
        path: PathBuf,
    },
    /// The file is larger than [`MAX_FILE_LEN`].
    #[error("control-plane file {name} ({path}) is {len} bytes, more than {MAX_FILE_LEN}")]
    TooLarge {
        /// Name relative to the PKI directory.
        name: &'static str,
        /// Full path.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
}

/// The mounted PKI directory.
#[derive(Clone, Debug)]
pub struct PkiDir {
    root: PathBuf,
}

impl PkiDir {
    /// The directory at `root` (kubeadm's `/etc/kubernetes/pki`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads all [`CONTROL_PLANE_FILES`]; any missing, empty or oversized file fails the whole.
    pub async fn read(&self) -> Result<Vec<ControlPlaneFile>, PkiError> {
        let mut files = Vec::with_capacity(CONTROL_PLANE_FILES.len());
        for name in CONTROL_PLANE_FILES {
            let path = self.root.join(name);
            let read_err = |source| PkiError::Read {
                name,
                path: path.clone(),
                source,
            };
            let len = tokio::fs::metadata(&path).await.map_err(read_err)?.len();
            if len > MAX_FILE_LEN {
                return Err(PkiError::TooLarge { name, path, len });
            }
            let data = tokio::fs::read(&path).await.map_err(read_err)?;
            if data.is_empty() {
                return Err(PkiError::Empty { name, path });
            }
            files.push(ControlPlaneFile {
                name: name.to_owned(),
                data,
            });
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_all_files_and_names_the_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etcd")).unwrap();
        for name in CONTROL_PLANE_FILES {
            std::fs::write(dir.path().join(name), format!("contents of {name}")).unwrap();
        }
        let pki = PkiDir::new(dir.path());
        let files = pki.read().await.unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, CONTROL_PLANE_FILES);
        assert_eq!(files[6].data, b"contents of etcd/ca.crt");

        std::fs::remove_file(dir.path().join("etcd/ca.key")).unwrap();
        let err = pki.read().await.unwrap_err();
        assert!(err.to_string().contains("etcd/ca.key"), "{err}");
        std::fs::write(dir.path().join("etcd/ca.key"), b"").unwrap();
        assert!(matches!(pki.read().await, Err(PkiError::Empty { .. })));
    }
}
