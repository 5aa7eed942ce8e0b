//! token-issuer's least privilege, judged by the real kube-apiserver: the rules the API server
//! reports for its ServiceAccount are the table in deploy/README.md, every call outside it is
//! refused with RBAC's or the admission policy's reason, the calls inside it are admitted, and the
//! admission policy type-checks on the real server.
//!
//! The cluster is the one the join path meets: deploy/base's ServiceAccount, RBAC and admission
//! policy applied unchanged, and a token the API server issued for
//! `kube-system/join-token-issuer`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testsupport::control_plane::{ControlPlane, Options, Pki, client_from_kubeconfig};

const ISSUER: &str = "system:serviceaccount:kube-system:join-token-issuer";
const POLICY: &str = "join-token-issuer-bootstrap-tokens-only";

/// A control plane with deploy/base applied, and a client holding token-issuer's token.
struct Cluster {
    plane: ControlPlane,
    issuer: kube::Client,
    _dir: tempfile::TempDir,
}

async fn cluster(options: Options) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&dir.path().join("pki")).unwrap();
    let plane = ControlPlane::start(&pki, dir.path(), &options)
        .await
        .unwrap();
    plane.prepare_constellation([]).await.unwrap();
    plane.apply_deploy_base(None).await.unwrap();
    let token = plane
        .service_account_token(
            "kube-system",
            "join-token-issuer",
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    plane.wait_admission_enforced(&token).await.unwrap();
    let issuer = client_from_kubeconfig(&plane.token_kubeconfig(&token))
        .await
        .unwrap();
    Cluster {
        plane,
        issuer,
        _dir: dir,
    }
}

/// One permission: (API group, resource, verb, name or `*`).
type Permission = (String, String, String, String);

/// The table "token-issuer's Kubernetes permissions" in deploy/README.md, expanded to one
/// permission per verb, for the rows that apply in `namespace` (`kube-system` rows and
/// cluster-wide rows, which apply in every namespace).
fn documented(namespace: &str) -> BTreeSet<Permission> {
    let readme =
        std::fs::read_to_string(Path::new(deploy::MANIFEST_DIR).join("../README.md")).unwrap();
    let heading = "### token-issuer's Kubernetes permissions";
    let section = &readme[readme
        .find(heading)
        .expect("the permissions table's heading")..];
    let mut rows = BTreeSet::new();
    for line in section.lines().skip(1).skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        if cells[0] == "API group" || cells[0].starts_with("---") {
            continue;
        }
        let [group, resource, verbs, names, scope] = cells[..] else {
            panic!("a row of five cells: {line}")
        };
        if scope != "cluster-wide" && scope != namespace {
            continue;
        }
        let group = if group == "core" { "" } else { group };
        let name = if names.starts_with("any") { "*" } else { names };
        for verb in verbs.split(',') {
            rows.insert((
                group.to_owned(),
                resource.to_owned(),
                verb.trim().to_owned(),
                name.to_owned(),
            ));
        }
    }
    assert!(!rows.is_empty(), "the table has rows");
    rows
}

/// What the default `system:basic-user` ClusterRole lets every authenticated user do: ask who
/// it is and what it may do. Not granted by deploy/, so not in its table.
fn every_authenticated_user(p: &Permission) -> bool {
    matches!(
        (p.0.as_str(), p.1.as_str()),
        (
            "authorization.k8s.io",
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        ) | ("authentication.k8s.io", "selfsubjectreviews")
    )
}

/// The rules the API server reports for the caller of `client` in `namespace`
/// (SelfSubjectRulesReview), expanded as [`documented`].
async fn reported(client: &kube::Client, namespace: &str) -> BTreeSet<Permission> {
    let reviews: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_owned()),
        },
        ..Default::default()
    };
    let status = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!status.incomplete, "{status:?}");
    let mut rows = BTreeSet::new();
    for rule in status.resource_rules {
        let names = rule.resource_names.unwrap_or_default();
        let names = if names.is_empty() {
            vec!["*".to_owned()]
        } else {
            names
        };
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    for name in &names {
                        rows.insert((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
    }
    rows.into_iter()
        .filter(|p| !every_authenticated_user(p))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_the_api_server_reports_for_token_issuer_are_the_documented_table() {
    let cluster = cluster(Options::default()).await;
    for namespace in ["kube-system", "default", "kube-public"] {
        assert_eq!(
            reported(&cluster.issuer, namespace).await,
            documented(namespace),
            "token-issuer's rules in {namespace}"
        );
    }

    // The same, asked of the authorizer one permission at a time: each documented one allowed,
    // and each neighbour of it (another verb, another namespace) refused.
    let reviews: Api<SubjectAccessReview> = Api::all(cluster.plane.admin());
    let allowed = |group: &str, resource: &str, verb: &str, name: &str, namespace: Option<&str>| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(ISSUER.to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    "system:serviceaccounts:kube-system".to_owned(),
                    "system:authenticated".to_owned(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    verb: Some(verb.to_owned()),
                    name: (name != "*").then(|| name.to_owned()),
                    namespace: namespace.map(str::to_owned),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviews = reviews.clone();
        async move {
            reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        }
    };
    let cluster_wide = documented("default");
    for (group, resource, verb, name) in documented("kube-system") {
        let scope = (!cluster_wide.contains(&(
            group.clone(),
            resource.clone(),
            verb.clone(),
            name.clone(),
        )))
        .then_some("kube-system");
        assert!(
            allowed(&group, &resource, &verb, &name, scope).await,
            "{verb} {group}/{resource} {name} in {scope:?}"
        );
        if let Some(namespace) = scope {
            assert_ne!(namespace, "default");
            assert!(
                !allowed(&group, &resource, &verb, &name, Some("default")).await,
                "{verb} {group}/{resource} outside kube-system"
            );
        }
    }
    for (group, resource, verb) in [
        ("", "secrets", "get"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
        ("", "secrets", "update"),
        ("", "secrets", "patch"),
        ("", "configmaps", "list"),
        ("", "configmaps", "update"),
        ("", "nodes", "get"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("rbac.authorization.k8s.io", "rolebindings", "create"),
        ("update.edgeless.systems", "nodeversions", "update"),
        ("update.edgeless.systems", "joiningnodes", "list"),
    ] {
        assert!(
            !allowed(group, resource, verb, "*", Some("kube-system")).await,
            "{verb} {group}/{resource} is not token-issuer's"
        );
    }
    assert!(
        !allowed(
            "update.edgeless.systems",
            "nodeversions",
            "get",
            "another",
            None
        )
        .await,
        "get of another NodeVersion"
    );
}

/// A bootstrap token Secret as token-issuer writes it, expiring `lifetime` from now.
fn bootstrap_token(id: &str, lifetime: time::Duration) -> serde_json::Value {
    let expiration = (time::OffsetDateTime::now_utc() + lifetime)
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("bootstrap-token-{id}"),
            "namespace": "kube-system",
            "labels": {"joinservice.edgeless.systems/issued-by": "token-issuer"},
        },
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": "0123456789abcdef",
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
            "description": "test",
        },
    })
}

/// Asserts `result` is the API server's 403 and that its message contains `reason`.
fn refused<T: std::fmt::Debug>(case: &str, result: Result<T, kube::Error>, reason: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{case}: {status:?}");
            assert!(
                status.message.contains(reason),
                "{case}: expected {reason:?} in {:?}",
                status.message
            );
        }
        other => panic!("{case}: expected a 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_call_outside_the_table_is_refused_with_its_reason() {
    let cluster = cluster(Options::default()).await;
    let secrets: Api<Secret> = Api::namespaced(cluster.issuer.clone(), "kube-system");
    let admin_secrets: Api<Secret> = Api::namespaced(cluster.plane.admin(), "kube-system");
    let post = PostParams::default();
    let create = |object: serde_json::Value| {
        let secrets = secrets.clone();
        async move {
            let secret: Secret = serde_json::from_value(object).unwrap();
            secrets.create(&PostParams::default(), &secret).await
        }
    };
    let rbac = |verb: &str, resource: &str| {
        format!("User \"{ISSUER}\" cannot {verb} resource \"{resource}\"")
    };
    let policy = format!("ValidatingAdmissionPolicy '{POLICY}'");

    // Inside the table: a token as token-issuer writes it is admitted, and deleted again.
    create(bootstrap_token("aaaaaa", time::Duration::minutes(15)))
        .await
        .expect("a bootstrap token as token-issuer writes it is admitted");

    // A token kubeadm made: no joinservice label.
    let mut kubeadm = bootstrap_token("kkkkkk", time::Duration::hours(23));
    kubeadm["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    admin_secrets
        .create(&post, &serde_json::from_value(kubeadm).unwrap())
        .await
        .unwrap();

    refused(
        "get a Secret",
        secrets.get("bootstrap-token-kkkkkk").await,
        &rbac("get", "secrets"),
    );
    refused(
        "list Secrets",
        secrets.list(&Default::default()).await,
        &rbac("list", "secrets"),
    );
    refused(
        "watch Secrets",
        secrets.watch(&Default::default(), "0").await.map(|_| ()),
        &rbac("watch", "secrets"),
    );

    let mut opaque = bootstrap_token("bbbbbb", time::Duration::minutes(15));
    opaque["type"] = json!("Opaque");
    refused(
        "create a Secret of another type",
        create(opaque).await,
        "created Secrets must be of type bootstrap.kubernetes.io/token",
    );
    let mut renamed = bootstrap_token("cccccc", time::Duration::minutes(15));
    renamed["metadata"]["name"] = json!("join-config-copy");
    refused(
        "create a Secret of another name",
        create(renamed).await,
        "created Secrets must be named bootstrap-token-",
    );
    let mut groups = bootstrap_token("dddddd", time::Duration::minutes(15));
    groups["stringData"]["auth-extra-groups"] = json!("system:masters");
    refused(
        "create a token with other groups",
        create(groups).await,
        "auth-extra-groups must be exactly system:bootstrappers:kubeadm:default-node-token",
    );
    refused(
        "create a token expiring past one hour",
        create(bootstrap_token("eeeeee", time::Duration::minutes(61))).await,
        "bootstrap tokens must carry an RFC 3339 expiration at most 1h ahead",
    );
    let mut unlabelled = bootstrap_token("ffffff", time::Duration::minutes(15));
    unlabelled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    refused(
        "create a token without the label",
        create(unlabelled).await,
        "created Secrets must carry the label joinservice.edgeless.systems/issued-by=token-issuer",
    );
    refused(
        "update a Secret",
        secrets
            .replace(
                "bootstrap-token-aaaaaa",
                &post,
                &serde_json::from_value(bootstrap_token("aaaaaa", time::Duration::minutes(5)))
                    .unwrap(),
            )
            .await,
        &rbac("update", "secrets"),
    );
    refused(
        "delete a bootstrap token kubeadm made",
        secrets
            .delete("bootstrap-token-kkkkkk", &DeleteParams::default())
            .await,
        &format!(
            "{policy} with binding '{POLICY}' denied request: join-token-issuer may only delete bootstrap-token-* Secrets labelled"
        ),
    );
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "escalate", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "join-token-issuer", "namespace": "kube-system"}],
    }))
    .unwrap();
    refused(
        "create a RoleBinding",
        Api::<RoleBinding>::namespaced(cluster.issuer.clone(), "kube-system")
            .create(&post, &binding)
            .await,
        &rbac("create", "rolebindings"),
    );
    refused(
        "patch a Node",
        Api::<Node>::all(cluster.issuer.clone())
            .patch(
                "worker-0",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
                ),
            )
            .await,
        &rbac("patch", "nodes"),
    );
    let mut elsewhere = bootstrap_token("gggggg", time::Duration::minutes(15));
    elsewhere["metadata"]["namespace"] = json!("default");
    refused(
        "create a token in another namespace",
        Api::<Secret>::namespaced(cluster.issuer.clone(), "default")
            .create(&post, &serde_json::from_value(elsewhere).unwrap())
            .await,
        &rbac("create", "secrets"),
    );
    refused(
        "read a ConfigMap in another namespace",
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(cluster.issuer.clone(), "default")
            .get("kube-root-ca.crt")
            .await,
        &rbac("get", "configmaps"),
    );

    // Its own token is deleted (rollback); kubeadm's is still there.
    secrets
        .delete("bootstrap-token-aaaaaa", &DeleteParams::default())
        .await
        .expect("token-issuer deletes a token it issued");
    admin_secrets.get("bootstrap-token-kkkkkk").await.unwrap();
}

/// The admission policy's `status.typeChecking`, once the API server has checked the current
/// generation.
async fn type_checking(plane: &ControlPlane, name: &str) -> serde_json::Value {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(plane.admin());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let policy = policies.get(name).await.unwrap();
        let generation = policy.metadata.generation;
        let status = policy.status.unwrap_or_default();
        if status.observed_generation.is_some() && status.observed_generation == generation {
            return serde_json::to_value(status.type_checking).unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} not type-checked after 30 s:\n{}",
            plane.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admission_policy_type_checks_on_the_real_api_server_without_a_warning() {
    let cluster = cluster(Options {
        type_checking: true,
        ..Options::default()
    })
    .await;
    let checked = type_checking(&cluster.plane, POLICY).await;
    assert!(
        checked.is_object(),
        "{POLICY} has no typeChecking: {checked}"
    );
    let warnings = checked["expressionWarnings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(warnings.is_empty(), "{POLICY}: {warnings:#?}");

    // The check above can see a broken expression: the same policy with a field Secrets do not
    // have is reported.
    let deployed = std::fs::read_to_string(
        Path::new(deploy::MANIFEST_DIR).join(deploy::ADMISSION_POLICY_FILE),
    )
    .unwrap();
    let first = deployed.split("\n---\n").next().unwrap();
    let broken = first
        .replace(&format!("name: {POLICY}"), "name: broken-copy")
        .replace("has(object.type) && object.type ==", "object.stringType ==");
    assert_ne!(broken, first);
    cluster.plane.apply_yaml(&broken).await.unwrap();
    let checked = type_checking(&cluster.plane, "broken-copy").await;
    let warnings = checked["expressionWarnings"].to_string();
    assert!(warnings.contains("stringType"), "{warnings}");
}
