//! ConfigMaps, the Constellation custom resources, preconditions, server-side apply and per-path
//! faults, through a kube-rs client as token-issuer uses them.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

mod common;

use std::time::{Duration, Instant};

use common::{api_error, client};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};
use kube_standin::fixtures::{components_json, constellation_version, token_issuer_grants};
use kube_standin::{Fault, KubeStandin, Running, StandinConfig, User};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token";
const ISSUER: &str = "issuer-token";

async fn standin() -> Running {
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    let issuer = User::service_account(
        ISSUER,
        "kube-system",
        "join-token-issuer",
        token_issuer_grants(),
    );
    let mut config = StandinConfig::new(vec![User::admin(ADMIN), issuer]);
    config.admin_api = true;
    KubeStandin::start(config).await.unwrap()
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "update.edgeless.systems".into(),
        version: "v1alpha1".into(),
        api_version: "update.edgeless.systems/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn joining(c: Client) -> Api<DynamicObject> {
    Api::all_with(c, &resource("JoiningNode", "joiningnodes"))
}

fn joining_node(name: &str, node: &str, deadline: &str) -> Value {
    json!({"apiVersion": "update.edgeless.systems/v1alpha1", "kind": "JoiningNode",
           "metadata": {"name": name},
           "spec": {"name": node, "componentsreference": "c", "iscontrolplane": false, "deadline": deadline}})
}

#[tokio::test]
async fn seeded_node_version_and_components_read_back() {
    let s = standin().await;
    for o in constellation_version("v1.31.1", "k8s-components-1", &components_json()) {
        s.seed(o).unwrap();
    }
    let c = client(&s, ISSUER).await;
    let nv: Api<DynamicObject> = Api::all_with(c.clone(), &resource("NodeVersion", "nodeversions"));
    let got = nv.get("constellation-version").await.unwrap();
    assert_eq!(got.data["spec"]["kubernetesClusterVersion"], "v1.31.1");
    let meta = &got.metadata;
    assert!(meta.uid.is_some() && meta.resource_version.is_some());
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));

    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    let cm = cms.get("k8s-components-1").await.unwrap();
    assert_eq!(cm.data.unwrap()["components"], components_json());

    // RBAC as deployed: the NodeVersion by name only; no ConfigMaps elsewhere.
    let e = api_error(nv.get("other").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "nodeversions.update.edgeless.systems \"other\" is forbidden: User \"system:serviceaccount:kube-system:join-token-issuer\" cannot get resource \"nodeversions\" in API group \"update.edgeless.systems\" at the cluster scope"
    );
    let e = api_error(
        Api::<ConfigMap>::namespaced(c.clone(), "default")
            .get("x")
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    let e = api_error(cms.get("missing").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "configmaps \"missing\" not found");

    // Seeding twice is a create of an existing name.
    let again = constellation_version("v1.31.1", "k8s-components-1", "[]");
    assert_eq!(s.seed(again[0].clone()).unwrap_err().code, 409);

    // Out of process, the admin endpoint seeds the same way.
    let req = http::Request::post("/__standin/objects")
        .body(
            serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "seeded", "namespace": "kube-system"}, "data": {"a": "b"}}))
            .unwrap(),
        )
        .unwrap();
    let resp = c.send(req.map(Into::into)).await.unwrap();
    assert_eq!(resp.status(), 201);
    let _ = resp.into_body().collect().await;
    assert!(cms.get("seeded").await.is_ok());
}

#[tokio::test]
async fn create_conflicts_and_preconditioned_deletes() {
    let s = standin().await;
    let api = joining(client(&s, ISSUER).await);
    let obj: DynamicObject = serde_json::from_value(joining_node(
        "control-plane",
        "cp-1",
        "2030-01-01T00:00:00Z",
    ))
    .unwrap();
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    let e = api_error(api.create(&PostParams::default(), &obj).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        e.message,
        "joiningnodes.update.edgeless.systems \"control-plane\" already exists"
    );

    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    let e = api_error(api.delete("control-plane", &stale).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.starts_with("Operation cannot be fulfilled on joiningnodes.update.edgeless.systems \"control-plane\": Precondition failed: ResourceVersion in precondition: 1"),
        "{}",
        e.message
    );
    let other_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-4000-8000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("control-plane", &other_uid).await.unwrap_err()).code,
        409
    );
    assert_eq!(s.joining_nodes().len(), 1);

    let exact = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: created.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    api.delete("control-plane", &exact).await.unwrap();
    assert!(s.joining_nodes().is_empty());
    let e = api_error(api.delete("control-plane", &exact).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn server_side_apply_owns_fields_and_force_takes_them() {
    let s = standin().await;
    let api = joining(client(&s, ISSUER).await);
    let ours = PatchParams::apply("join-service");
    let first = joining_node("worker-0", "worker-0", "2030-01-01T00:00:00Z");
    let created = api
        .patch("worker-0", &ours, &Patch::Apply(&first))
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["deadline"], "2030-01-01T00:00:00Z");
    assert!(
        s.requests()
            .iter()
            .any(|r| r.method == "PATCH" && r.code == 201),
        "apply of a missing object creates it"
    );

    // Same manager, new value: no conflict, new resourceVersion and generation.
    let second = joining_node("worker-0", "worker-0", "2030-01-02T00:00:00Z");
    let updated = api
        .patch("worker-0", &ours, &Patch::Apply(&second))
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(updated.metadata.uid, created.metadata.uid);

    // Another manager changing our field conflicts, unless it forces.
    let theirs = PatchParams::apply("node-operator");
    let third = joining_node("worker-0", "worker-0", "2031-01-01T00:00:00Z");
    let e = api_error(
        api.patch("worker-0", &theirs, &Patch::Apply(&third))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("conflict with \"join-service\" using update.edgeless.systems/v1alpha1"),
        "{}",
        e.message
    );
    assert!(e.message.contains(".spec.deadline"), "{}", e.message);
    let forced = api
        .patch("worker-0", &theirs.clone().force(), &Patch::Apply(&third))
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["deadline"], "2031-01-01T00:00:00Z");

    // A stale resourceVersion in the applied object is a conflict.
    let mut pinned = joining_node("worker-0", "worker-0", "2032-01-01T00:00:00Z");
    pinned["metadata"]["resourceVersion"] = json!("1");
    let e = api_error(
        api.patch("worker-0", &theirs.clone().force(), &Patch::Apply(&pinned))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);

    // Apply needs a field manager; a mismatched name is refused.
    let e = api_error(
        api.patch("worker-0", &PatchParams::default(), &Patch::Apply(&first))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let e = api_error(
        api.patch("worker-1", &ours, &Patch::Apply(&first))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);

    // Merge patch works on existing objects.
    let merged = api
        .patch(
            "worker-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"componentsreference": "d"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data["spec"]["componentsreference"], "d");
    assert_eq!(merged.data["spec"]["name"], "worker-0");
}

#[tokio::test]
async fn faults_by_path_and_slowness() {
    let s = standin().await;
    let api = joining(client(&s, ADMIN).await);
    let cms: Api<ConfigMap> = Api::namespaced(client(&s, ADMIN).await, "kube-system");
    let obj: DynamicObject =
        serde_json::from_value(joining_node("a", "a", "2030-01-01T00:00:00Z")).unwrap();

    s.inject(Fault::once(403).on("POST").at("/joiningnodes"));
    // Other paths are untouched by the fault.
    assert_eq!(api_error(cms.get("x").await.unwrap_err()).code, 404);
    let e = api_error(api.create(&PostParams::default(), &obj).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(s.joining_nodes().is_empty());

    s.inject(Fault::once(409).at("/joiningnodes/a"));
    api.create(&PostParams::default(), &obj).await.unwrap();
    let e = api_error(api.get("a").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    s.inject(Fault::slow(Duration::from_millis(400)).at("/joiningnodes/a"));
    let t = Instant::now();
    api.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(400));
    let t = Instant::now();
    api.get("a").await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "slowness is used up"
    );
}
