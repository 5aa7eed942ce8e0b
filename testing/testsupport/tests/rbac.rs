//! The real kube-apiserver enforces the deployed RBAC (`deploy/base/rbac.yaml`) for token-issuer's
//! token, so the end-to-end joins pass only because the manifests allow exactly what the code
//! does. This test takes one verb out of a copy of the manifest and shows the join then fails
//! where the API server refuses it: with a 403, named in the node's status, and nothing left.

#![allow(clippy::unwrap_used)]

use testsupport::harness::{Options, System, join_request};
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_deployed_rbac_does_not_allow_fails_with_the_api_servers_403() {
    let deployed =
        std::fs::read_to_string(std::path::Path::new(deploy::MANIFEST_DIR).join(deploy::RBAC_FILE))
            .unwrap();
    // Without `patch` on joiningnodes, a worker's server-side apply is forbidden.
    let narrowed = deployed.replace(
        r#"verbs: ["create", "get", "patch", "delete"]"#,
        r#"verbs: ["create", "get", "delete"]"#,
    );
    assert_ne!(
        narrowed, deployed,
        "the JoiningNode rule is where the test expects it"
    );
    let dir = tempfile::tempdir().unwrap();
    let rbac = dir.path().join("rbac.yaml");
    std::fs::write(&rbac, narrowed).unwrap();

    let system = System::start(Options {
        rbac: Some(rbac),
        ..Options::default()
    })
    .await
    .unwrap();
    let client = system.client(system.issuer().unwrap()).unwrap();
    let request = join_request("worker-0", "2d5c1a7e-0000-4000-8000-00000000000a").unwrap();
    let status = match client.join(request).await {
        Err(node_client::ClientError::Status(status)) => status,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains("applying JoiningNode worker-0")
            && status.message().contains("403"),
        "{}",
        status.message()
    );
    let forbidden: Vec<_> = system
        .kube
        .requests()
        .into_iter()
        .filter(|r| r.code == 403)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        forbidden,
        ["PATCH /apis/update.edgeless.systems/v1alpha1/joiningnodes/worker-0"]
    );
    assert!(
        system.kube.bootstrap_tokens().await.is_empty(),
        "no token for a join that failed"
    );
}
