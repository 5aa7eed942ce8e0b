//! The deployed ValidatingAdmissionPolicy (`deploy/base/admission-policy.yaml`), evaluated by the
//! stand-in: what token-issuer writes passes, anything else is refused with the API server's
//! Status, and other users are not matched.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

mod common;

use std::path::Path;

use common::{api_error, client};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_standin::admission::AdmissionPolicy;
use kube_standin::fixtures::token_issuer_grants;
use kube_standin::{Grant, KubeStandin, PolicyRule, Running, StandinConfig, User};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token";
const ISSUER: &str = "issuer-token";
const POLICY: &str = "join-token-issuer-bootstrap-tokens-only";
const LABEL: &str = "joinservice.edgeless.systems/issued-by";

async fn standin() -> Running {
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    // Patch too, so that the policy's own refusal of UPDATE shows (deploy/base/rbac.yaml has none).
    let mut grants = token_issuer_grants();
    grants.push(Grant::namespaced(
        "kube-system",
        PolicyRule::new(&["patch"], &[""], &["secrets"]),
    ));
    let issuer = User::service_account(ISSUER, "kube-system", "join-token-issuer", grants);
    let mut config = StandinConfig::new(vec![User::admin(ADMIN), issuer]);
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/admission-policy.yaml");
    config.admission = AdmissionPolicy::from_file(&manifest).unwrap();
    assert_eq!(config.admission.len(), 1);
    KubeStandin::start(config).await.unwrap()
}

fn rfc3339(offset: time::Duration) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    (time::OffsetDateTime::now_utc() + offset)
        .format(&f)
        .unwrap()
}

/// A bootstrap token as token-issuer writes it, expiring `lifetime` from now.
fn token(id: &str, lifetime: time::Duration) -> Value {
    json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "labels": {LABEL: "token-issuer"}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": "0123456789abcdef",
            "expiration": rfc3339(lifetime),
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
            "description": "join service",
        },
    })
}

fn secret(v: Value) -> Secret {
    serde_json::from_value(v).unwrap()
}

/// Asserts the validating dispatcher's denial: 403 Forbidden with the validation's message.
fn assert_denied(status: &kube::core::Status, name: &str, message: &str) {
    assert_eq!(status.code, 403, "{status:?}");
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "secrets \"{name}\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding \
             '{POLICY}' denied request: {message}"
        )
    );
}

#[tokio::test]
async fn token_issuer_creates_bootstrap_tokens_only() {
    let s = standin().await;
    let secrets: Api<Secret> = Api::namespaced(client(&s, ISSUER).await, "kube-system");
    let pp = PostParams::default();

    let created = secrets
        .create(&pp, &secret(token("abc123", time::Duration::minutes(30))))
        .await
        .unwrap();
    assert!(created.metadata.creation_timestamp.is_some());

    let half_hour = time::Duration::minutes(30);
    let mut opaque = token("opaq00", half_hour);
    opaque["type"] = json!("Opaque");
    let mut misnamed = token("abc124", half_hour);
    misnamed["metadata"]["name"] = json!("kubeconfig");
    let mut extra = token("abc126", half_hour);
    extra["stringData"]["kubeconfig"] = json!("x");
    let refused = [
        (
            opaque,
            "bootstrap-token-opaq00",
            "created Secrets must be of type bootstrap.kubernetes.io/token",
        ),
        (
            misnamed,
            "kubeconfig",
            "created Secrets must be named bootstrap-token-<6 characters [a-z0-9]>",
        ),
        (
            token("abc125", time::Duration::hours(2)),
            "bootstrap-token-abc125",
            "bootstrap tokens must carry an RFC 3339 expiration at most 1h ahead",
        ),
        (
            extra,
            "bootstrap-token-abc126",
            "bootstrap token Secrets may carry only the kubeadm bootstrap token keys",
        ),
    ];
    for (object, name, message) in refused {
        let e = api_error(secrets.create(&pp, &secret(object)).await.unwrap_err());
        assert_denied(&e, name, message);
    }

    // A malformed expiration cannot be evaluated: failurePolicy Fail denies (422 Invalid).
    let mut garbled = token("abc127", time::Duration::minutes(30));
    garbled["stringData"]["expiration"] = json!("tomorrow");
    let e = api_error(secrets.create(&pp, &secret(garbled)).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    assert!(e.message.contains("denied request: expression '"), "{e:?}");

    let names: Vec<String> = s
        .secrets("kube-system")
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(names, ["bootstrap-token-abc123"]);
}

#[tokio::test]
async fn token_issuer_deletes_only_its_own_tokens_and_updates_none() {
    let s = standin().await;
    let admin: Api<Secret> = Api::namespaced(client(&s, ADMIN).await, "kube-system");
    let issuer: Api<Secret> = Api::namespaced(client(&s, ISSUER).await, "kube-system");
    let pp = PostParams::default();
    let dp = DeleteParams::default();

    // The admin is not matched (matchConditions): it may create an unlabelled token and Opaque
    // Secrets the policy would refuse token-issuer.
    let mut kubeadm = token("kubadm", time::Duration::hours(24));
    kubeadm["metadata"]["labels"] = json!({});
    admin.create(&pp, &secret(kubeadm)).await.unwrap();
    let opaque = json!({"metadata": {"name": "other"}, "type": "Opaque", "data": {}});
    admin.create(&pp, &secret(opaque)).await.unwrap();
    issuer
        .create(&pp, &secret(token("mine00", time::Duration::hours(1))))
        .await
        .unwrap();

    let e = api_error(
        issuer
            .delete("bootstrap-token-kubadm", &dp)
            .await
            .unwrap_err(),
    );
    assert_denied(
        &e,
        "bootstrap-token-kubadm",
        "join-token-issuer may only delete bootstrap-token-* Secrets labelled \
         joinservice.edgeless.systems/issued-by=token-issuer",
    );
    let e = api_error(issuer.delete("other", &dp).await.unwrap_err());
    assert_eq!(e.code, 403);
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    let e = api_error(
        issuer
            .patch(
                "bootstrap-token-mine00",
                &PatchParams::default(),
                &Patch::Merge(&label),
            )
            .await
            .unwrap_err(),
    );
    assert_denied(
        &e,
        "bootstrap-token-mine00",
        "join-token-issuer may only create and delete bootstrap token Secrets",
    );
    issuer.delete("bootstrap-token-mine00", &dp).await.unwrap();
    admin.delete("bootstrap-token-kubadm", &dp).await.unwrap();

    let mut names: Vec<String> = s
        .secrets("kube-system")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    assert_eq!(names, ["other"]);
}
