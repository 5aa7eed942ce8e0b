//! The join service's deployment manifests live next to this crate: the base in `base/`, which
//! `kubectl apply -k deploy/` applies, and the overlays in `examples/`.
//!
//! The crate's integration tests (`tests/`) read the manifests and check their least-privilege
//! properties, so a change that widens what a container may do fails `cargo test -p deploy`.
//! [`grants_for_service_account`] turns the RBAC objects into the grants of the Kubernetes API
//! stand-in token-issuer's own tests use, so they run token-issuer with exactly the permissions
//! an operator deploys; the end-to-end tests apply the manifests to a real kube-apiserver.

use std::path::{Path, PathBuf};

use kube_standin::{Grant, PolicyRule};
use serde::Deserialize;

/// The directory holding the base manifests and their `kustomization.yaml` (`deploy/base`).
pub const MANIFEST_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/base");

/// The manifest that holds every Role, ClusterRole and binding of the join service.
pub const RBAC_FILE: &str = "rbac.yaml";

/// The manifest that holds the ValidatingAdmissionPolicy narrowing token-issuer's Secrets.
pub const ADMISSION_POLICY_FILE: &str = "admission-policy.yaml";

/// Why the RBAC manifests could not be turned into grants.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// The manifest file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML or not a valid RBAC object.
    #[error("{path}: document {index} is not a valid RBAC object")]
    Parse {
        path: PathBuf,
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    /// A binding refers to a role the manifests do not define.
    #[error("{binding} refers to {kind} {name}, which {path} does not define")]
    MissingRole {
        path: PathBuf,
        binding: String,
        kind: String,
        name: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    rules: Vec<PolicyRule>,
    role_ref: Option<RoleRef>,
    #[serde(default)]
    subjects: Vec<Subject>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    name: String,
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RoleRef {
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
struct Subject {
    kind: String,
    name: String,
    namespace: Option<String>,
}

/// The grants the RBAC objects in `deploy/base/rbac.yaml` give the service account
/// `namespace/name`, resolved the way the RBAC authorizer resolves them: a RoleBinding grants
/// its Role's (or a ClusterRole's) rules in the binding's namespace, a ClusterRoleBinding
/// grants its ClusterRole's rules cluster-wide.
pub fn grants_for_service_account(namespace: &str, name: &str) -> Result<Vec<Grant>, RbacError> {
    grants_from_file(&Path::new(MANIFEST_DIR).join(RBAC_FILE), namespace, name)
}

/// [`grants_for_service_account`] for the RBAC objects in `path`.
pub fn grants_from_file(path: &Path, namespace: &str, name: &str) -> Result<Vec<Grant>, RbacError> {
    let text = std::fs::read_to_string(path).map_err(|source| RbacError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let object = Object::deserialize(document).map_err(|source| RbacError::Parse {
            path: path.to_owned(),
            index,
            source,
        })?;
        objects.push(object);
    }

    let mut grants = Vec::new();
    for binding in &objects {
        let cluster_wide = match binding.kind.as_str() {
            "RoleBinding" => false,
            "ClusterRoleBinding" => true,
            _ => continue,
        };
        let binding_ns = binding.metadata.namespace.as_deref();
        let bound = binding.subjects.iter().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == name
                // A ServiceAccount subject of a RoleBinding without a namespace means the
                // binding's own namespace.
                && s.namespace.as_deref().or(binding_ns) == Some(namespace)
        });
        let Some(role_ref) = binding.role_ref.as_ref().filter(|_| bound) else {
            continue;
        };
        let role = objects.iter().find(|o| {
            o.kind == role_ref.kind
                && o.metadata.name == role_ref.name
                // A RoleBinding's Role is in the binding's namespace; ClusterRoles have none.
                && (o.kind == "ClusterRole" || o.metadata.namespace.as_deref() == binding_ns)
        });
        let Some(role) = role else {
            return Err(RbacError::MissingRole {
                path: path.to_owned(),
                binding: format!("{} {}", binding.kind, binding.metadata.name),
                kind: role_ref.kind.clone(),
                name: role_ref.name.clone(),
            });
        };
        for rule in &role.rules {
            let grant = match (cluster_wide, binding_ns) {
                (false, Some(ns)) => Grant::namespaced(ns, rule.clone()),
                // A RoleBinding without a namespace is invalid; kubectl would refuse it. Treat
                // it as granting nothing rather than everything.
                (false, None) => continue,
                (true, _) => Grant::cluster(rule.clone()),
            };
            grants.push(grant);
        }
    }
    Ok(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<Vec<Grant>, RbacError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rbac.yaml");
        std::fs::write(&path, yaml).unwrap();
        grants_from_file(&path, "kube-system", "issuer")
    }

    const ROLES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: r, namespace: kube-system}
rules:
  - {apiGroups: [""], resources: [secrets], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: c}
rules:
  - {apiGroups: [g], resources: [things], verbs: [get], resourceNames: [one]}
"#;

    #[test]
    fn role_and_cluster_role_bindings_resolve_to_namespaced_and_cluster_grants() {
        let yaml = format!(
            r#"{ROLES}
---
kind: RoleBinding
metadata: {{name: rb, namespace: kube-system}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}
subjects: [{{kind: ServiceAccount, name: issuer, namespace: kube-system}}]
---
kind: ClusterRoleBinding
metadata: {{name: crb}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: c}}
subjects: [{{kind: ServiceAccount, name: issuer, namespace: kube-system}}]
"#
        );
        let grants = load(&yaml).unwrap();
        assert_eq!(
            grants,
            vec![
                Grant::namespaced(
                    "kube-system",
                    PolicyRule::new(&["create"], &[""], &["secrets"])
                ),
                Grant::cluster(PolicyRule::new(&["get"], &["g"], &["things"]).with_names(&["one"])),
            ]
        );
    }

    #[test]
    fn a_cluster_role_bound_by_a_role_binding_applies_in_that_namespace_only() {
        let yaml = format!(
            r#"{ROLES}
---
kind: RoleBinding
metadata: {{name: rb, namespace: kube-system}}
roleRef: {{kind: ClusterRole, name: c}}
subjects: [{{kind: ServiceAccount, name: issuer}}]
"#
        );
        let grants = load(&yaml).unwrap();
        assert_eq!(
            grants,
            vec![Grant::namespaced(
                "kube-system",
                PolicyRule::new(&["get"], &["g"], &["things"]).with_names(&["one"])
            )]
        );
    }

    #[test]
    fn other_subjects_get_nothing_and_a_missing_role_is_an_error() {
        let other = format!(
            r#"{ROLES}
---
kind: RoleBinding
metadata: {{name: rb, namespace: kube-system}}
roleRef: {{kind: Role, name: r}}
subjects: [{{kind: ServiceAccount, name: someone-else, namespace: kube-system}},
           {{kind: ServiceAccount, name: issuer, namespace: default}}]
"#
        );
        assert_eq!(load(&other).unwrap(), vec![]);

        let missing = r#"
kind: ClusterRoleBinding
metadata: {name: crb}
roleRef: {kind: ClusterRole, name: nowhere}
subjects: [{kind: ServiceAccount, name: issuer, namespace: kube-system}]
"#;
        let error = load(missing).unwrap_err();
        assert!(
            error.to_string().contains("refers to ClusterRole nowhere"),
            "{error}"
        );
    }

    #[test]
    fn the_deployed_rbac_loads() {
        let grants = grants_for_service_account("kube-system", "join-token-issuer").unwrap();
        assert!(!grants.is_empty());
    }
}
