//! Whether the cluster expects a control-plane node to join: the gate in front of the
//! control-plane PKI (the cluster CA, etcd CA, front-proxy CA and service-account keys).
//!
//! `is_control_plane` is the joining node's own claim, passed on by attest-proxy and join-core;
//! either process, taken over, could set it on every request. So the claim alone never releases
//! the keys: token-issuer judges from state it reads from the Kubernetes API itself, which
//! neither of those processes can write.
//!
//! - The operator says how many control-plane nodes the cluster has: the ConfigMap
//!   `kube-system/join-control-plane`, key `expectedControlPlaneNodes` (a decimal count).
//! - token-issuer counts the Nodes labelled `node-role.kubernetes.io/control-plane` (kubeadm
//!   sets the label when a control-plane node joins).
//! - The files are released while fewer are present than expected. During an upgrade
//!   Constellation's node operator adds a replacement control-plane node before it removes the
//!   old one, so the count may then reach `expected + 1`: while the `NodeVersion`
//!   `constellation-version` has the status condition `Outdated` = `True` (the operator's mark of
//!   a running upgrade), one node more is admitted. The `NodeVersion` is only read when the
//!   count alone would refuse.
//!
//! Otherwise the request is refused with [`GateError::Full`] (gRPC `PermissionDenied`) and
//! nothing is read from the PKI directory. A missing or malformed ConfigMap is
//! [`GateError::NotConfigured`]/[`GateError::BadExpected`]: no control-plane join until an
//! operator says how many control-plane nodes there should be.
//!
//! Concurrent control-plane joins are serialised by the `JoiningNode` lock ([`crate::joining`]),
//! so between a release and the new node's registration at most one release is in flight.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::ListParams;
use kube::core::DynamicObject;
use serde_json::Value;

use crate::cluster_version::{NODE_VERSION_NAME, edgeless_resource};
use crate::kube_api::{KubeError, bounded};

/// Namespace of the ConfigMap.
pub const NAMESPACE: &str = "kube-system";
/// The ConfigMap saying how many control-plane nodes the cluster should have.
pub const CONFIG_MAP: &str = "join-control-plane";
/// Its key: the expected number of control-plane nodes, decimal.
pub const EXPECTED_KEY: &str = "expectedControlPlaneNodes";
/// The label kubeadm puts on control-plane Nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// The `NodeVersion` status condition that marks an upgrade in progress.
pub const UPGRADE_CONDITION: &str = "Outdated";
/// Nodes admitted beyond the expected count while an upgrade runs.
pub const UPGRADE_SURGE: u32 = 1;

/// Why the control-plane files are not released.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The ConfigMap could not be read (404: the cluster does not expect control-plane joins).
    #[error(
        "reading ConfigMap {NAMESPACE}/{CONFIG_MAP} (the expected control-plane node count): {0}"
    )]
    NotConfigured(#[source] KubeError),
    /// The ConfigMap lacks the key or holds no count.
    #[error("ConfigMap {NAMESPACE}/{CONFIG_MAP}: {EXPECTED_KEY} is {0:?}, not a count of nodes")]
    BadExpected(String),
    /// Listing the control-plane Nodes failed.
    #[error("listing control-plane Nodes: {0}")]
    ListNodes(#[source] KubeError),
    /// Reading the `NodeVersion` for an upgrade in progress failed.
    #[error("reading NodeVersion {NODE_VERSION_NAME} for an upgrade in progress: {0}")]
    ReadNodeVersion(#[source] KubeError),
    /// The cluster has all the control-plane nodes it expects.
    #[error(
        "the cluster expects no further control-plane node: {present} control-plane Nodes present, {expected} expected{}; control-plane files are not released",
        if *upgrading { " (+1 during the upgrade in progress)" } else { "" }
    )]
    Full {
        /// Control-plane Nodes counted.
        present: u32,
        /// The expected count.
        expected: u32,
        /// Whether an upgrade was in progress (and the surge node already counted).
        upgrading: bool,
    },
}

/// Why a control-plane join was admitted, for the audit record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Control-plane Nodes present.
    pub present: u32,
    /// The expected count.
    pub expected: u32,
    /// Admitted as the one surge node of an upgrade.
    pub surge: bool,
}

/// Reads the cluster's expectation and its control-plane Nodes.
#[derive(Clone, Debug)]
pub struct ControlPlaneGate {
    config_maps: Api<ConfigMap>,
    nodes: Api<Node>,
    node_versions: Api<DynamicObject>,
    timeout: Duration,
}

impl ControlPlaneGate {
    /// Through `client`, each call bounded by `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            config_maps: Api::namespaced(client.clone(), NAMESPACE),
            nodes: Api::all(client.clone()),
            node_versions: Api::all_with(client, &edgeless_resource("NodeVersion", "nodeversions")),
            timeout,
        }
    }

    /// Admits a control-plane join, or says why not. Reads only.
    pub async fn admit(&self) -> Result<Admitted, GateError> {
        let config = bounded(
            "get_configmap",
            self.timeout,
            self.config_maps.get(CONFIG_MAP),
        )
        .await
        .map_err(GateError::NotConfigured)?;
        let text = config
            .data
            .as_ref()
            .and_then(|d| d.get(EXPECTED_KEY))
            .cloned()
            .unwrap_or_default();
        let expected: u32 = text
            .trim()
            .parse()
            .map_err(|_| GateError::BadExpected(text.clone()))?;

        let params = ListParams::default().labels(CONTROL_PLANE_LABEL);
        let nodes = bounded("list_nodes", self.timeout, self.nodes.list(&params))
            .await
            .map_err(GateError::ListNodes)?;
        let present = u32::try_from(nodes.items.len()).unwrap_or(u32::MAX);
        if present < expected {
            return Ok(Admitted {
                present,
                expected,
                surge: false,
            });
        }
        let upgrading = self.upgrading().await?;
        if upgrading && present < expected.saturating_add(UPGRADE_SURGE) {
            return Ok(Admitted {
                present,
                expected,
                surge: true,
            });
        }
        Err(GateError::Full {
            present,
            expected,
            upgrading,
        })
    }

    /// Whether the node operator marks an upgrade as running.
    async fn upgrading(&self) -> Result<bool, GateError> {
        let version = bounded(
            "get_nodeversion",
            self.timeout,
            self.node_versions.get(NODE_VERSION_NAME),
        )
        .await
        .map_err(GateError::ReadNodeVersion)?;
        Ok(upgrade_in_progress(&version.data))
    }
}

/// Whether a `NodeVersion`'s status carries the condition `Outdated` = `True`.
pub fn upgrade_in_progress(node_version: &Value) -> bool {
    node_version
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(UPGRADE_CONDITION)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_an_outdated_true_condition_is_an_upgrade() {
        let with = |conditions: Value| json!({"status": {"conditions": conditions}});
        assert!(upgrade_in_progress(&with(
            json!([{"type": "Outdated", "status": "True"}])
        )));
        assert!(!upgrade_in_progress(&with(
            json!([{"type": "Outdated", "status": "False"}])
        )));
        assert!(!upgrade_in_progress(&with(
            json!([{"type": "Ready", "status": "True"}])
        )));
        assert!(!upgrade_in_progress(&json!({"spec": {}})));
    }
}
