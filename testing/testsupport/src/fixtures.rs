//! The objects a Constellation cluster holds before the join service arrives, as the tests and
//! the local run apply them to the control plane: the `NodeVersion` and its components ConfigMap,
//! `join-control-plane`, and the Nodes a control-plane gate counts.

use serde_json::{Value, json};

/// The API group of Constellation's node operator (`NodeVersion`, `JoiningNode`).
pub const EDGELESS_GROUP: &str = "update.edgeless.systems";

/// The name of Constellation's `NodeVersion` object.
pub const NODE_VERSION_NAME: &str = "constellation-version";

/// A components list as Constellation's ConfigMap holds it (JSON text).
pub fn components_json() -> String {
    json!([
        {"url": "https://storage.googleapis.com/kubernetes-release/release/v1.31.1/bin/linux/amd64/kubelet",
         "hash": "sha256:50619fbd3d1ab7b0d05b2e6e9cdb6ef20cc09cd42a5a1d2b6b1bf3e7e0bd6cc8",
         "install_path": "/run/state/bin/kubelet"},
        {"url": "https://github.com/containernetworking/plugins/releases/download/v1.5.1/cni-plugins-linux-amd64-v1.5.1.tgz",
         "hash": "sha256:77baa2f669980a82255ffa2f2717de823992480271ee778aa51a9c60ae89ff9b",
         "install_path": "/opt/cni/bin", "extract": true},
        {"url": "data:application/octet-stream;base64,YXBpVmVyc2lvbjoga3ViZWFkbS5rOHMuaW8vdjFiZXRhMwo=",
         "hash": "sha256:0ddb0e7bb2b2e0a1e8a9c1e1f0f7c4c9a2f6c0c1b0e6a1d7b3e5f2a4c6e8d0b2",
         "install_path": "/opt/kubernetes/patches/kube-apiserver+json.json"}
    ])
    .to_string()
}

/// The `NodeVersion` `constellation-version` naming `kubernetes_version` and the ConfigMap
/// `components_ref`, and that ConfigMap (in `kube-system`) holding `components` JSON text.
pub fn constellation_version(
    kubernetes_version: &str,
    components_ref: &str,
    components: &str,
) -> [Value; 2] {
    [
        json!({
            "apiVersion": format!("{EDGELESS_GROUP}/v1alpha1"),
            "kind": "NodeVersion",
            "metadata": {"name": NODE_VERSION_NAME},
            "spec": {
                "image": "ref/v2.20.0/stable/v2.20.0",
                "imageVersion": "v2.20.0",
                "kubernetesClusterVersion": kubernetes_version,
                "kubernetesComponentsReference": components_ref,
                "maxNodeBudget": 1,
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": components_ref, "namespace": "kube-system"},
            "data": {"components": components},
        }),
    ]
}

/// The ConfigMap `kube-system/join-control-plane` saying the cluster should have `expected`
/// control-plane nodes (token-issuer releases the control-plane CA keys only below that).
pub fn control_plane_expectation(expected: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "join-control-plane", "namespace": "kube-system"},
        "data": {"expectedControlPlaneNodes": expected.to_string()},
    })
}

/// A Node as kubeadm registers a control-plane node (with the control-plane role label).
pub fn control_plane_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "node-role.kubernetes.io/control-plane": "",
        }},
        "spec": {},
    })
}

/// A worker Node.
pub fn worker_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
    })
}
