//! What one join asks of the real API server, as the fault proxy every request of token-issuer
//! passes through records it: no more than Constellation's join service asks for the same join,
//! and nothing that changes once per upgrade (the `NodeVersion`, its components ConfigMap) read
//! again while token-issuer's bounded cache holds it.
//!
//! Constellation's join service (`joinservice/internal/server/server.go`, `kubernetes/`,
//! `kubeadm/`) asks, for every join, worker or control plane, and caches nothing: GET the
//! `NodeVersion`, GET the components ConfigMap it names, GET then POST the bootstrap token's
//! Secret (kubeadm's `UpdateOrCreateTokens`), and apply (worker) or create (control plane) the
//! `JoiningNode`: five requests. Its control-plane files come from its own disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use soft_issuer::{KeyType, SoftIssuer};
use testsupport::cluster::COMPONENTS_REF;
use testsupport::harness::{self, Options, System, join_request};
use testsupport::kube_faults::RequestRecord;

/// The requests Constellation's join service makes per join (see the module's doc).
const CONSTELLATION_REQUESTS_PER_JOIN: usize = 5;

const JOINING_NODES: &str = "/apis/update.edgeless.systems/v1alpha1/joiningnodes";
const SECRETS: &str = "/api/v1/namespaces/kube-system/secrets";

fn node_issuer() -> Arc<SoftIssuer> {
    Arc::new(
        SoftIssuer::new(KeyType::EcdsaP256)
            .unwrap()
            .with_pcrs(harness::boot_pcrs())
            .unwrap(),
    )
}

/// The requests after the first `seen`, as `METHOD path[?query] code`.
fn since(requests: &[RequestRecord], seen: usize) -> Vec<String> {
    requests[seen..]
        .iter()
        .map(|r| match &r.query {
            Some(query) => format!("{} {}?{query} {}", r.method, r.path, r.code),
            None => format!("{} {} {}", r.method, r.path, r.code),
        })
        .collect()
}

/// Requests without their query (the field manager, the label selector), for comparison.
fn without_queries(requests: &[String]) -> Vec<String> {
    requests
        .iter()
        .map(|r| match r.split_once('?') {
            Some((head, rest)) => {
                let code = rest.rsplit_once(' ').map_or("", |(_, code)| code);
                format!("{head} {code}")
            }
            None => r.clone(),
        })
        .collect()
}

#[tokio::test]
async fn a_join_asks_the_api_server_no_more_than_constellation_does() {
    let system = System::start(Options {
        trust_any_ak: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = system.client(node_issuer()).unwrap();
    let join = |node: &'static str, disk: &'static str, control_plane: bool| {
        let (client, system) = (&client, &system);
        async move {
            let mut request = join_request(node, disk).unwrap();
            request.is_control_plane = control_plane;
            client
                .join(request)
                .await
                .unwrap_or_else(|e| panic!("{node}: {e}\n{}", system.logs()))
        }
    };

    // The first worker: the cluster's version is read once.
    join("worker-1", "disk-1", false).await;
    let first = since(&system.kube.requests(), 0);
    assert_eq!(
        without_queries(&first),
        [
            "GET /apis/update.edgeless.systems/v1alpha1/nodeversions/constellation-version 200"
                .to_owned(),
            format!("GET /api/v1/namespaces/kube-system/configmaps/{COMPONENTS_REF} 200"),
            format!("PATCH {JOINING_NODES}/worker-1 201"),
            format!("POST {SECRETS} 201"),
        ],
        "{first:#?}"
    );
    assert!(
        first[2].contains("fieldManager="),
        "the worker's JoiningNode is applied: {first:#?}"
    );

    // The next workers: only what each join writes.
    let mut seen = first.len();
    for (node, disk) in [("worker-2", "disk-2"), ("worker-3", "disk-3")] {
        join(node, disk, false).await;
        let requests = since(&system.kube.requests(), seen);
        assert_eq!(
            without_queries(&requests),
            [
                format!("PATCH {JOINING_NODES}/{node} 201"),
                format!("POST {SECRETS} 201"),
            ],
            "the NodeVersion and its components come from the cache: {requests:#?}"
        );
        seen += requests.len();
    }

    // A control-plane node: the gate's count of control-plane Nodes, the lock, the token, and
    // the audit Event of the release.
    join("cp-1", "disk-cp-1", true).await;
    let control_plane = since(&system.kube.requests(), seen);
    assert_eq!(
        without_queries(&control_plane),
        [
            "GET /api/v1/namespaces/kube-system/configmaps/join-control-plane 200".to_owned(),
            "GET /api/v1/nodes 200".to_owned(),
            format!("POST {JOINING_NODES} 201"),
            format!("POST {SECRETS} 201"),
            "POST /api/v1/namespaces/kube-system/events 201".to_owned(),
        ],
        "{control_plane:#?}"
    );
    assert!(
        control_plane[1].contains("labelSelector=node-role.kubernetes.io"),
        "only control-plane Nodes are listed: {control_plane:#?}"
    );

    for (what, requests) in [
        ("the first worker", &first),
        ("a control-plane node", &control_plane),
    ] {
        assert!(
            requests.len() <= CONSTELLATION_REQUESTS_PER_JOIN,
            "{what} costs {} requests, Constellation's join service {CONSTELLATION_REQUESTS_PER_JOIN}",
            requests.len()
        );
    }
}
