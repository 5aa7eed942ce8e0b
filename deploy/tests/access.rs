//! What the join service may do in the cluster and on the network: RBAC, the admission policy
//! that narrows it, the Service and the NetworkPolicy.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{Value, json};

#[test]
fn rbac_is_exactly_the_calls_token_issuer_makes() {
    let role = one_of("Role");
    assert_eq!(role["metadata"]["namespace"], "kube-system");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ]),
        "in kube-system: bootstrap-token Secrets (create, delete on rollback), the components \
         and join-control-plane ConfigMaps (get), the audit Events of control-plane key \
         releases (create); no list, watch or update"
    );
    let cluster_role = one_of("ClusterRole");
    assert_eq!(
        cluster_role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
            {"apiGroups": ["update.edgeless.systems"], "resources": ["nodeversions"],
             "resourceNames": ["constellation-version"], "verbs": ["get"]},
            {"apiGroups": ["update.edgeless.systems"], "resources": ["joiningnodes"],
             "verbs": ["create", "get", "patch", "delete"]},
        ]),
        "cluster-wide: counting control-plane Nodes (list only), and Constellation's \
         node-operator resources token-issuer reads and records"
    );
    for r in [&role, &cluster_role] {
        assert!(
            r.get("aggregationRule").is_none(),
            "aggregation would widen the role"
        );
    }

    // Each role is bound to token-issuer's service account alone.
    let subjects = json!([{"kind": "ServiceAccount", "name": pod_spec()["serviceAccountName"], "namespace": "kube-system"}]);
    let binding = one_of("RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "kube-system");
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]})
    );
    assert_eq!(binding["subjects"], subjects);
    let cluster_binding = one_of("ClusterRoleBinding");
    assert_eq!(
        cluster_binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role["metadata"]["name"]})
    );
    assert_eq!(cluster_binding["subjects"], subjects);

    let sa = one_of("ServiceAccount");
    assert_eq!(
        format!(
            "system:serviceaccount:{}:{}",
            sa["metadata"]["namespace"].as_str().expect("namespace"),
            sa["metadata"]["name"].as_str().expect("name")
        ),
        TOKEN_ISSUER_USER
    );
}

fn expressions(policy: &Value) -> Vec<String> {
    array(&policy["spec"]["validations"])
        .iter()
        .map(|v| {
            assert!(v["message"].is_string(), "each validation says what failed");
            v["expression"].as_str().expect("expression").to_owned()
        })
        .collect()
}

#[test]
fn admission_policy_narrows_the_role_to_bootstrap_tokens() {
    let policy = one_of("ValidatingAdmissionPolicy");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert!(
        policy["metadata"].get("namespace").is_none(),
        "the policy is cluster-scoped"
    );
    let spec = &policy["spec"];
    assert_eq!(
        spec["failurePolicy"], "Fail",
        "an unevaluable check must deny"
    );
    assert!(spec.get("paramKind").is_none());

    // It covers every verb the role grants (and UPDATE), on core Secrets.
    let rules = array(&spec["matchConstraints"]["resourceRules"]);
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiGroups"], json!([""]));
    // One version, not "*": the API server type-checks only a policy whose types it can name.
    assert_eq!(rules[0]["apiVersions"], json!(["v1"]));
    assert_eq!(rules[0]["resources"], json!(["secrets"]));
    let ops = str_set(array(&rules[0]["operations"]).iter().collect::<Vec<_>>());
    for op in ["CREATE", "DELETE", "UPDATE"] {
        assert!(ops.contains(op), "{op} not covered");
    }
    assert!(rules[0].get("resourceNames").is_none());

    // It applies to token-issuer's service account, and only to it.
    let conditions = array(&spec["matchConditions"]);
    assert_eq!(conditions.len(), 1);
    assert_eq!(
        conditions[0]["expression"],
        format!("request.userInfo.username == '{TOKEN_ISSUER_USER}'")
    );

    // The checks, each present as written (what they admit and refuse on a real API server:
    // testing/testsupport/tests/least_privilege.rs).
    let exprs = expressions(&policy).join("\n");
    for needle in [
        "request.operation in ['CREATE', 'DELETE']",
        "object.type == 'bootstrap.kubernetes.io/token'",
        "object.metadata.name.matches('^bootstrap-token-[a-z0-9]{6}$')",
        "string(object.data['auth-extra-groups']) in [",
        "'system:bootstrappers:kubeadm:default-node-token',",
        "timestamp(variables.expirationText) <=",
        "timestamp(object.metadata.creationTimestamp) + duration('1h')",
        "oldObject.metadata.name.startsWith('bootstrap-token-')",
        "oldObject.metadata.labels['joinservice.edgeless.systems/issued-by'] == 'token-issuer'",
        "object.metadata.labels['joinservice.edgeless.systems/issued-by'] == 'token-issuer'",
        "request.namespace == 'kube-system'",
    ] {
        assert!(exprs.contains(needle), "policy lacks `{needle}`");
    }
    // Every CREATE check is skipped only for other operations, never for CREATE itself; and
    // the DELETE check likewise. (An expression without a guard would break the other verb.)
    for e in expressions(&policy) {
        let e = e.trim().to_owned();
        if e.contains("object.") && !e.contains("oldObject") {
            assert!(e.starts_with("request.operation != 'CREATE' ||"), "{e}");
        }
        if e.contains("oldObject") {
            assert!(e.starts_with("request.operation != 'DELETE' ||"), "{e}");
        }
    }

    let binding = one_of("ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(binding["spec"].get("paramRef").is_none());
}

/// token-issuer's Secret must pass the policy: its data keys and groups are the ones the policy
/// allows (checked against the source, so a change there shows up here).
#[test]
fn admission_policy_matches_what_token_issuer_writes() {
    let source = std::fs::read_to_string(deploy_dir().join("../token-issuer/src/bootstrap.rs"))
        .expect("token-issuer source");
    let policy = expressions(&one_of("ValidatingAdmissionPolicy")).join("\n");
    // The label that lets token-issuer delete its own tokens (and only those) is the one it sets.
    assert!(
        source.contains("\"joinservice.edgeless.systems/issued-by\"")
            && source.contains("\"token-issuer\""),
        "token-issuer labels its tokens"
    );
    for key in [
        "token-id",
        "token-secret",
        "expiration",
        "usage-bootstrap-authentication",
        "usage-bootstrap-signing",
        "auth-extra-groups",
        "description",
    ] {
        assert!(
            source.contains(&format!("\"{key}\"")),
            "token-issuer no longer writes {key}"
        );
        assert!(
            policy.contains(&format!("'{key}'")),
            "policy does not allow {key}"
        );
    }
    assert!(source.contains("system:bootstrappers:kubeadm:default-node-token"));
    assert!(source.contains("bootstrap.kubernetes.io/token"));
    assert!(source.contains("format!(\"bootstrap-token-{}\", self.id)"));
}

#[test]
fn service_exposes_only_the_proxy_on_node_port_30090() {
    let svc = one_of("Service");
    assert_eq!(svc["spec"]["type"], "NodePort");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "atls", "protocol": "TCP", "port": 9090, "targetPort": 9090, "nodePort": 30090}])
    );
    let labels = &daemonset()["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&labels[k], v, "the Service selects the join service pods");
    }
}

fn ports(rule: &Value) -> BTreeSet<(String, u64)> {
    array(&rule["ports"])
        .iter()
        .map(|p| {
            (
                p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                p["port"].as_u64().expect("numeric port"),
            )
        })
        .collect()
}

#[test]
fn network_policy_allows_only_join_metrics_kms_api_server_and_dns() {
    let np = one_of("NetworkPolicy");
    let spec = &np["spec"];
    let labels = &daemonset()["spec"]["template"]["metadata"]["labels"];
    let selector = spec["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(
        !selector.is_empty(),
        "the policy must select the pod, not everything"
    );
    for (k, v) in selector {
        assert_eq!(&labels[k], v);
    }
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));

    let ingress = array(&spec["ingress"]);
    assert_eq!(ingress.len(), 2);
    // Anyone may reach the aTLS port: joining nodes are not in the cluster yet.
    assert_eq!(ports(&ingress[0]), [("TCP".to_owned(), 9090)].into());
    assert!(ingress[0].get("from").is_none());
    // The admin endpoints (metrics) only from the monitoring namespace, and exactly the ports
    // the containers serve them on.
    let admin_ports: BTreeSet<(String, u64)> = containers()
        .iter()
        .flat_map(|c| array(&c["ports"]))
        .filter(|p| p["name"].as_str().is_some_and(|n| n.ends_with("-admin")))
        .map(|p| ("TCP".to_owned(), p["containerPort"].as_u64().expect("port")))
        .collect();
    assert_eq!(admin_ports.len(), 3);
    assert_eq!(ports(&ingress[1]), admin_ports);
    let from = array(&ingress[1]["from"]);
    assert_eq!(from.len(), 1);
    assert_eq!(
        from[0],
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
    );

    let egress = array(&spec["egress"]);
    let mut allowed = BTreeSet::new();
    for rule in &egress {
        let p = ports(rule);
        assert!(
            !p.is_empty(),
            "an egress rule without ports allows everything: {rule}"
        );
        allowed.extend(p);
    }
    let expected: BTreeSet<(String, u64)> = [
        ("TCP".to_owned(), 9000),
        ("TCP".to_owned(), 6443),
        ("UDP".to_owned(), 53),
        ("TCP".to_owned(), 53),
    ]
    .into();
    assert_eq!(allowed, expected);

    // The KMS port goes to the key service in kube-system only.
    let kms = egress
        .iter()
        .find(|r| ports(r).contains(&("TCP".to_owned(), 9000)))
        .expect("KMS rule");
    let to = array(&kms["to"]);
    assert_eq!(to.len(), 1);
    assert_eq!(
        to[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kube-system"
    );
    assert_eq!(
        to[0]["podSelector"]["matchLabels"]["k8s-app"],
        "key-service"
    );
    // DNS goes to cluster DNS only.
    let dns = egress
        .iter()
        .find(|r| ports(r).contains(&("UDP".to_owned(), 53)))
        .expect("DNS rule");
    assert_eq!(
        array(&dns["to"])[0]["podSelector"]["matchLabels"]["k8s-app"],
        "kube-dns"
    );
}
