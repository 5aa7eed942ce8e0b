//! What the cluster runs: the Kubernetes version and the components a joining node installs.
//!
//! Constellation's node operator keeps them in the cluster-scoped `NodeVersion` object
//! `constellation-version` (`update.edgeless.systems/v1alpha1`): `spec.kubernetesClusterVersion`
//! names the version and `spec.kubernetesComponentsReference` a ConfigMap in `kube-system` whose
//! `components` key holds the components as JSON, a list of `{url, hash, install_path, extract}`
//! (Go's encoding/json of the `components.Component` protobuf struct, so all fields may be
//! absent).
//!
//! ## Reads are kept for a moment
//!
//! Both objects are read afresh at most every `max_age` (default 1 s; 0 reads on every join),
//! not on every join: in a storm of hundreds of joins a second, two of a join's four Kubernetes
//! calls were these reads, about a tenth of the join service's CPU per join (token-issuer's
//! client and the API server's TLS and JSON). An upgrade still takes effect without a restart,
//! at most `max_age` later.
//!
//! A stale read never creates anything wrong. What is kept is one consistent snapshot: the
//! version, the components and the ConfigMap name they came from, read together. A node that
//! joins within `max_age` after the node operator changed the `NodeVersion` gets the previous
//! snapshot, and its `JoiningNode` records that snapshot's components reference, so the node
//! operator sees exactly what the node installed and upgrades it like a node that joined a
//! moment before the change (which any read-then-write join can race with anyway; reading on
//! every join only narrows that window from ~1 s to the length of one join). The Secret, the
//! kubelet certificate and the `JoiningNode` name do not depend on the snapshot. A failed read
//! is never kept, and [`VersionReader::forget`] drops the snapshot when a join fails at the
//! API server, so the next join reads afresh instead of trusting an answer from before a fault.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How long a read of the `NodeVersion` and its ConfigMap is kept by default (see the module
/// docs for why a stale read is safe).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(1);

/// Reads the `NodeVersion` and its components ConfigMap, and keeps what it read for a moment.
#[derive(Clone, Debug)]
pub struct VersionReader {
    node_versions: Api<DynamicObject>,
    config_maps: Api<ConfigMap>,
    timeout: Duration,
    max_age: Duration,
    /// The last successful read and when it started.
    kept: Arc<Mutex<Option<(Instant, ClusterVersion)>>>,
}

impl VersionReader {
    /// Reads through `client`, each call bounded by `timeout`; a read is kept for
    /// [`DEFAULT_MAX_AGE`].
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            node_versions: Api::all_with(
                client.clone(),
                &edgeless_resource("NodeVersion", "nodeversions"),
            ),
            config_maps: Api::namespaced(client, COMPONENTS_NAMESPACE),
            timeout,
            max_age: DEFAULT_MAX_AGE,
            kept: Arc::default(),
        }
    }

    /// Keeps a read for `max_age` instead (zero: read on every call).
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The cluster's version and components as read at most `max_age` ago.
    pub async fn read(&self) -> Result<ClusterVersion, VersionError> {
        if let Some(version) = self.fresh() {
            return Ok(version);
        }
        // Timed from before the read, so a slow answer is not kept longer than `max_age` past
        // the moment it could have been read.
        let started = Instant::now();
        let result = self.read_now().await;
        match &result {
            Ok(version) if !self.max_age.is_zero() => {
                *self.lock() = Some((started, version.clone()));
            }
            _ => self.forget(),
        }
        result
    }

    /// Drops the kept read: the next call reads afresh.
    pub fn forget(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, ClusterVersion)>> {
        // Only plain assignments happen under the lock; a poisoned one holds a whole value.
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fresh(&self) -> Option<ClusterVersion> {
        match &*self.lock() {
            Some((read_at, version)) if read_at.elapsed() < self.max_age => Some(version.clone()),
            _ => None,
        }
    }

    /// Reads both objects from the API server.
    async fn read_now(&self) -> Result<ClusterVersion, VersionError> {
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
