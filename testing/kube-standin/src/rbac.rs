//! Authentication by bearer token and an RBAC-shaped allow-list.
//!
//! [`PolicyRule`] has the fields and JSON names of `rbac.authorization.k8s.io/v1` PolicyRule,
//! and a [`Grant`] is one rule bound either in one namespace (what a RoleBinding does) or
//! cluster-wide (a ClusterRoleBinding), so Role/ClusterRole objects map onto this directly.
//! Matching follows the RBAC authorizer: `*` wildcards, and `resourceNames` never match a
//! request without a name (create, list), exactly as in a real cluster.

use serde::{Deserialize, Serialize};

/// `rbac.authorization.k8s.io/v1` PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, `*`.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// API groups; `""` is the core group.
    #[serde(default)]
    pub api_groups: Vec<String>,
    /// Resources, e.g. `secrets`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// If non-empty, only these object names.
    #[serde(default)]
    pub resource_names: Vec<String>,
    /// Non-resource paths (`/healthz`, `/metrics*`), only meaningful cluster-wide.
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

impl PolicyRule {
    /// A resource rule; `verbs`, `api_groups`, `resources` as in YAML.
    pub fn new(verbs: &[&str], api_groups: &[&str], resources: &[&str]) -> Self {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        Self {
            verbs: own(verbs),
            api_groups: own(api_groups),
            resources: own(resources),
            ..Self::default()
        }
    }

    /// Restricts the rule to these object names.
    pub fn with_names(mut self, names: &[&str]) -> Self {
        self.resource_names = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }
}

/// One rule and where it applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `Some(ns)`: like a RoleBinding in `ns`; `None`: like a ClusterRoleBinding.
    pub namespace: Option<String>,
    /// The rule.
    pub rule: PolicyRule,
}

impl Grant {
    /// A rule granted in one namespace.
    pub fn namespaced(namespace: &str, rule: PolicyRule) -> Self {
        Self {
            namespace: Some(namespace.to_owned()),
            rule,
        }
    }

    /// A rule granted cluster-wide.
    pub fn cluster(rule: PolicyRule) -> Self {
        Self {
            namespace: None,
            rule,
        }
    }
}

/// A user the stand-in knows: the token it presents, its identity and its grants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bearer token.
    pub token: String,
    /// User name, e.g. `system:serviceaccount:kube-system:join-token-issuer`.
    pub name: String,
    /// Groups; `system:masters` bypasses authorization as in a real cluster.
    #[serde(default)]
    pub groups: Vec<String>,
    /// What the user may do.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

impl User {
    /// A cluster admin (`system:masters`).
    pub fn admin(token: &str) -> Self {
        Self {
            token: token.to_owned(),
            name: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            grants: Vec::new(),
        }
    }

    /// A service account `system:serviceaccount:<ns>:<name>` with the given grants.
    pub fn service_account(token: &str, namespace: &str, name: &str, grants: Vec<Grant>) -> Self {
        Self {
            token: token.to_owned(),
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            grants,
        }
    }
}

/// What a resource request asks for, as the authorizer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attributes<'a> {
    /// RBAC verb.
    pub verb: &'a str,
    /// API group (`""` for core).
    pub api_group: &'a str,
    /// Resource, e.g. `secrets`.
    pub resource: &'a str,
    /// Namespace, `None` for cluster-scoped or all-namespace requests.
    pub namespace: Option<&'a str>,
    /// Object name, `""` for create and collection requests.
    pub name: &'a str,
}

fn matches(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Grant {
    fn allows(&self, a: &Attributes<'_>) -> bool {
        if let Some(ns) = &self.namespace {
            // A RoleBinding never covers cluster-scope or all-namespace requests.
            if a.namespace != Some(ns.as_str()) {
                return false;
            }
        }
        let r = &self.rule;
        matches(&r.verbs, a.verb)
            && matches(&r.api_groups, a.api_group)
            && matches(&r.resources, a.resource)
            && (r.resource_names.is_empty() || r.resource_names.iter().any(|n| n == a.name))
    }
}

impl User {
    /// Whether the user may do `a`; on denial, the authorizer's sentence for the 403 message.
    pub fn authorize(&self, a: &Attributes<'_>) -> Result<(), String> {
        if self.groups.iter().any(|g| g == "system:masters")
            || self.grants.iter().any(|g| g.allows(a))
        {
            return Ok(());
        }
        let scope = match a.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        Err(format!(
            "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.name, a.verb, a.resource, a.api_group
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(verb: &'a str, ns: Option<&'a str>, name: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            api_group: "",
            resource: "secrets",
            namespace: ns,
            name,
        }
    }

    #[test]
    fn role_binding_is_confined_to_its_namespace() {
        let u = User::service_account(
            "t",
            "kube-system",
            "x",
            vec![Grant::namespaced(
                "kube-system",
                PolicyRule::new(&["create"], &[""], &["secrets"]),
            )],
        );
        assert!(
            u.authorize(&attrs("create", Some("kube-system"), ""))
                .is_ok()
        );
        let err = u
            .authorize(&attrs("create", Some("default"), ""))
            .unwrap_err();
        assert_eq!(
            err,
            r#"User "system:serviceaccount:kube-system:x" cannot create resource "secrets" in API group "" in the namespace "default""#
        );
        assert!(u.authorize(&attrs("create", None, "")).is_err());
        assert!(
            u.authorize(&attrs("delete", Some("kube-system"), "a"))
                .is_err()
        );
    }

    #[test]
    fn resource_names_never_match_unnamed_requests() {
        let u = User::service_account(
            "t",
            "ns",
            "x",
            vec![Grant::cluster(
                PolicyRule::new(&["*"], &[""], &["secrets"]).with_names(&["a"]),
            )],
        );
        assert!(u.authorize(&attrs("get", Some("ns"), "a")).is_ok());
        assert!(u.authorize(&attrs("get", Some("ns"), "b")).is_err());
        assert!(u.authorize(&attrs("create", Some("ns"), "")).is_err());
    }

    #[test]
    fn rules_deserialize_from_rbac_json() {
        let r: PolicyRule = serde_json::from_str(
            r#"{"apiGroups":[""],"resources":["secrets"],"verbs":["create","delete"],"resourceNames":[]}"#,
        )
        .unwrap();
        assert_eq!(r.verbs, ["create", "delete"]);
    }
}
