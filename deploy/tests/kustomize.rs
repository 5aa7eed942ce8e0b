//! `kubectl apply -k deploy/` applies every manifest, and every manifest is well-formed.

mod common;

use std::collections::BTreeSet;

use common::*;

#[test]
fn kustomization_lists_every_manifest_once() {
    let listed = resource_files();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "a file listed twice: {listed:?}"
    );

    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(base_dir()).expect("deploy/base/") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8");
        if (name.ends_with(".yaml") || name.ends_with(".yml")) && name != "kustomization.yaml" {
            on_disk.insert(name);
        }
    }
    assert_eq!(
        unique, on_disk,
        "kustomization resources vs. manifests in deploy/base/"
    );
}

#[test]
fn every_object_is_complete_and_in_kube_system() {
    const CLUSTER_SCOPED: [&str; 4] = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let objects = objects();
    assert!(!objects.is_empty());
    let mut seen = BTreeSet::new();
    for o in &objects {
        let kind = o["kind"].as_str().expect("kind");
        assert!(o["apiVersion"].is_string(), "{kind} without apiVersion");
        let name = o["metadata"]["name"].as_str().expect("name").to_owned();
        assert!(
            seen.insert((kind.to_owned(), name.clone())),
            "{kind}/{name} twice"
        );
        if CLUSTER_SCOPED.contains(&kind) {
            assert!(o["metadata"].get("namespace").is_none(), "{kind}/{name}");
        } else {
            assert_eq!(o["metadata"]["namespace"], "kube-system", "{kind}/{name}");
        }
    }
    let kinds: BTreeSet<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_owned())
        .collect();
    assert_eq!(
        kinds,
        names(&[
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "DaemonSet",
            "Service",
            "NetworkPolicy",
        ])
    );
    // kustomize must not force a namespace onto the cluster-scoped objects.
    assert!(kustomization().get("namespace").is_none());
}

#[test]
fn dockerfile_builds_the_three_binaries_the_pod_runs() {
    let dockerfile =
        std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    for c in containers() {
        let bin = c["name"].as_str().expect("name");
        assert!(
            dockerfile.contains(&format!("--bin {bin}")),
            "image lacks {bin}"
        );
        assert!(dockerfile.contains(&format!("target/release/{bin}")));
    }
    assert!(dockerfile.contains("/usr/local/bin/"));
    assert!(
        dockerfile.contains(":nonroot"),
        "runtime image runs as non-root"
    );
    assert!(dockerfile.contains("--locked"));
}
