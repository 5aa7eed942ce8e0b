//! What the cluster runs: the Kubernetes version and the components a joining node installs.
//!
//! Constellation's node operator keeps them in the cluster-scoped `NodeVersion` object
//! `constellation-version` (`update.edgeless.systems/v1alpha1`): `spec.kubernetesClusterVersion`
//! names the version and `spec.kubernetesComponentsReference` a ConfigMap in `kube-system` whose
//! `components` key holds the components as JSON, a list of `{url, hash, install_path, extract}`
//! (Go's encoding/json of the `components.Component` protobuf struct, so all fields may be
//! absent). Both are read on every join, so an upgrade takes effect without a restart.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::core::{ApiResource, DynamicObject};
use proto::components::Component;
use serde::Deserialize;

use crate::kube_api::{KubeError, bounded};

/// Constellation's API group for node lifecycle objects.
pub const GROUP: &str = "update.edgeless.systems";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// The `NodeVersion` object the node operator maintains.
pub const NODE_VERSION_NAME: &str = "constellation-version";
/// Namespace of the components ConfigMap.
pub const COMPONENTS_NAMESPACE: &str = "kube-system";
/// The ConfigMap key holding the components JSON.
pub const COMPONENTS_KEY: &str = "components";
/// A ConfigMap is at most 1 MiB; a components list is a few KiB. Anything near the limit is
/// not a components list.
const MAX_COMPONENTS: usize = 256;

/// The `ApiResource` of a cluster-scoped kind in [`GROUP`]/[`VERSION`].
pub fn edgeless_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

/// The cluster's version as a joining node needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterVersion {
    /// `spec.kubernetesClusterVersion`, e.g. `v1.31.1`.
    pub kubernetes_version: String,
    /// `spec.kubernetesComponentsReference`: the ConfigMap's name, recorded in `JoiningNode`s.
    pub components_reference: String,
    /// The parsed components list.
    pub components: Vec<Component>,
}

/// Why the cluster version could not be read. Each variant names the object involved.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// Reading the `NodeVersion` failed.
    #[error("reading NodeVersion {NODE_VERSION_NAME}: {0}")]
    ReadNodeVersion(#[source] KubeError),
    /// The `NodeVersion` lacks a field.
    #[error("NodeVersion {NODE_VERSION_NAME} has no {0}")]
    MissingField(&'static str),
    /// Reading the ConfigMap failed.
    #[error("reading components ConfigMap {COMPONENTS_NAMESPACE}/{name}: {source}")]
    ReadComponents {
        /// The ConfigMap.
        name: String,
        /// The Kubernetes failure.
        #[source]
        source: KubeError,
    },
    /// The ConfigMap lacks the `components` key.
    #[error("components ConfigMap {COMPONENTS_NAMESPACE}/{name} has no key {COMPONENTS_KEY:?}")]
    MissingKey {
        /// The ConfigMap.
        name: String,
    },
    /// The components JSON does not parse or is unusable.
    #[error("components ConfigMap {COMPONENTS_NAMESPACE}/{name}: {why}")]
    BadComponents {
        /// The ConfigMap.
        name: String,
        /// What is wrong.
        why: String,
    },
}

/// One entry of the components JSON, as Go's encoding/json writes `components.Component`.
#[derive(Debug, Deserialize)]
struct ComponentJson {
    #[serde(default)]
    url: String,
    #[serde(default)]
    hash: String,
    #[serde(default)]
    install_path: String,
    #[serde(default)]
    extract: bool,
}

/// Parses the components JSON. Every component must name where it comes from, its digest and
/// where it goes: a node cannot install (or verify) one without them.
pub fn parse_components(json: &str) -> Result<Vec<Component>, String> {
    let list: Vec<ComponentJson> =
        serde_json::from_str(json).map_err(|e| format!("components are not a JSON list: {e}"))?;
    if list.is_empty() {
        return Err("the components list is empty".to_owned());
    }
    if list.len() > MAX_COMPONENTS {
        return Err(format!(
            "{} components, more than the {MAX_COMPONENTS} allowed",
            list.len()
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, c)| {
            for (field, value) in [
                ("url", &c.url),
                ("hash", &c.hash),
                ("install_path", &c.install_path),
            ] {
                if value.is_empty() {
                    return Err(format!("component {i} has no {field}"));
                }
            }
            Ok(Component {
                url: c.url,
                hash: c.hash,
                install_path: c.install_path,
                extract: c.extract,
            })
        })
        .collect()
}

/// Reads the `NodeVersion` and its components ConfigMap.
#[derive(Clone, Debug)]
pub struct VersionReader {
    node_versions: Api<DynamicObject>,
    config_maps: Api<ConfigMap>,
    timeout: Duration,
}

impl VersionReader {
    /// Reads through `client`, each call bounded by `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            node_versions: Api::all_with(
                client.clone(),
                &edgeless_resource("NodeVersion", "nodeversions"),
            ),
            config_maps: Api::namespaced(client, COMPONENTS_NAMESPACE),
            timeout,
        }
    }

    /// The cluster's current version and components.
    pub async fn read(&self) -> Result<ClusterVersion, VersionError> {
        let node_version = bounded(
            "get_nodeversion",
            self.timeout,
            self.node_versions.get(NODE_VERSION_NAME),
        )
        .await
        .map_err(VersionError::ReadNodeVersion)?;
        let spec_field = |field: &'static str| {
            node_version
                .data
                .get("spec")
                .and_then(|s| s.get(field))
                .and_then(|v| v.as_str())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .ok_or(VersionError::MissingField(field))
        };
        let kubernetes_version = spec_field("kubernetesClusterVersion")?;
        let name = spec_field("kubernetesComponentsReference")?;
        let config_map = bounded("get_configmap", self.timeout, self.config_maps.get(&name))
            .await
            .map_err(|source| VersionError::ReadComponents {
                name: name.clone(),
                source,
            })?;
        let json = config_map
            .data
            .as_ref()
            .and_then(|d| d.get(COMPONENTS_KEY))
            .ok_or_else(|| VersionError::MissingKey { name: name.clone() })?;
        let components = parse_components(json).map_err(|why| VersionError::BadComponents {
            name: name.clone(),
            why,
        })?;
        Ok(ClusterVersion {
            kubernetes_version,
            components_reference: name,
            components,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_parse_with_go_field_names() {
        let c = parse_components(
            r#"[{"url":"https://example.com/kubelet","hash":"sha256:ab","install_path":"/run/state/bin/kubelet"},
                {"url":"https://example.com/cni.tgz","hash":"sha256:cd","install_path":"/opt/cni/bin","extract":true}]"#,
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].install_path, "/run/state/bin/kubelet");
        assert!(!c[0].extract && c[1].extract);
    }

    #[test]
    fn unusable_components_are_refused() {
        assert!(parse_components("[]").unwrap_err().contains("empty"));
        assert!(parse_components("{}").unwrap_err().contains("JSON list"));
        assert!(
            parse_components(r#"[{"url":"u","hash":"h"}]"#)
                .unwrap_err()
                .contains("install_path")
        );
    }
}
