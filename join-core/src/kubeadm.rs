//! The API server's certificate SANs, from kubeadm's ClusterConfiguration.
//!
//! Constellation keeps the cluster's kubeadm configuration in the `kube-system/kubeadm-config`
//! ConfigMap; its `ClusterConfiguration` key is mounted into join-core as a file. The names and
//! addresses under `apiServer.certSANs` are the ones operators reach the control plane by, so
//! every SSH host certificate carries them too (see [`crate::ssh`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::KubeadmConfigError;
use crate::ssh;

/// The part of a kubeadm `ClusterConfiguration` join-core reads. Unknown fields are ignored, so
/// any kubeadm API version (v1beta3, v1beta4) parses.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClusterConfiguration {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    api_server: Option<ApiServer>,
}

#[derive(Debug, Default, Deserialize)]
struct ApiServer {
    #[serde(rename = "certSANs", default)]
    cert_sans: Option<Vec<String>>,
}

/// Reads the kubeadm ClusterConfiguration at a fixed path, anew on each call: the kubelet
/// swaps the mounted ConfigMap's file when the ConfigMap changes, and joins are rare enough
/// that reading a few hundred bytes each time costs nothing.
#[derive(Clone, Debug)]
pub struct KubeadmConfig {
    path: PathBuf,
}

impl KubeadmConfig {
    /// The ClusterConfiguration at `path`; checked at once, so a wrong mount stops startup.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, KubeadmConfigError> {
        let config = Self { path: path.into() };
        config.api_server_cert_sans()?;
        Ok(config)
    }

    /// `apiServer.certSANs`, in file order; empty when the field is absent.
    pub fn api_server_cert_sans(&self) -> Result<Vec<String>, KubeadmConfigError> {
        let text =
            std::fs::read_to_string(&self.path).map_err(|source| KubeadmConfigError::Read {
                path: self.path.clone(),
                source,
            })?;
        parse_cert_sans(&self.path, &text)
    }
}

fn parse_cert_sans(path: &Path, text: &str) -> Result<Vec<String>, KubeadmConfigError> {
    let config: ClusterConfiguration =
        serde_yaml::from_str(text).map_err(|source| KubeadmConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
    match config.kind.as_deref() {
        // kubeadm always writes the kind; a file without it is accepted as the bare
        // ClusterConfiguration some tools write.
        None | Some("ClusterConfiguration") => {}
        Some(other) => {
            return Err(KubeadmConfigError::WrongKind {
                path: path.to_owned(),
                kind: other.to_owned(),
            });
        }
    }
    let sans = config
        .api_server
        .and_then(|api_server| api_server.cert_sans)
        .unwrap_or_default();
    for san in &sans {
        ssh::check_principal_syntax(san).map_err(|reason| KubeadmConfigError::BadSan {
            path: path.to_owned(),
            san: san.clone(),
            reason,
        })?;
    }
    Ok(sans)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBEADM_V1BETA3: &str = "\
apiServer:
  certSANs:
  - 127.0.0.1
  - 10.9.0.1
  - api.cluster.example
  extraArgs:
    audit-log-maxage: \"30\"
  timeoutForControlPlane: 4m0s
apiVersion: kubeadm.k8s.io/v1beta3
certificatesDir: /etc/kubernetes/pki
clusterName: constell
controlPlaneEndpoint: 10.9.0.1:6443
kind: ClusterConfiguration
kubernetesVersion: v1.30.4
networking:
  dnsDomain: cluster.local
  serviceSubnet: 10.96.0.0/12
";

    fn parse(text: &str) -> Result<Vec<String>, KubeadmConfigError> {
        parse_cert_sans(Path::new("ClusterConfiguration"), text)
    }

    #[test]
    fn reads_cert_sans_in_order() {
        assert_eq!(
            parse(KUBEADM_V1BETA3).unwrap(),
            ["127.0.0.1", "10.9.0.1", "api.cluster.example"]
        );
    }

    #[test]
    fn no_sans_is_empty() {
        assert!(parse("kind: ClusterConfiguration\n").unwrap().is_empty());
        assert!(
            parse("kind: ClusterConfiguration\napiServer: {}\n")
                .unwrap()
                .is_empty()
        );
        assert!(
            parse("kind: ClusterConfiguration\napiServer:\n  certSANs: []\n")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn wrong_files_are_refused() {
        assert!(matches!(
            parse("kind: InitConfiguration\n"),
            Err(KubeadmConfigError::WrongKind { kind, .. }) if kind == "InitConfiguration"
        ));
        assert!(matches!(
            parse("apiServer: [1, 2]\n"),
            Err(KubeadmConfigError::Parse { .. })
        ));
        assert!(matches!(
            parse("apiServer:\n  certSANs:\n  - \"a b\"\n"),
            Err(KubeadmConfigError::BadSan { san, .. }) if san == "a b"
        ));
    }

    #[test]
    fn open_checks_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ClusterConfiguration");
        assert!(matches!(
            KubeadmConfig::open(&path),
            Err(KubeadmConfigError::Read { .. })
        ));
        std::fs::write(&path, KUBEADM_V1BETA3).unwrap();
        let config = KubeadmConfig::open(&path).unwrap();
        std::fs::write(&path, "kind: ClusterConfiguration\n").unwrap();
        assert!(config.api_server_cert_sans().unwrap().is_empty());
    }
}
