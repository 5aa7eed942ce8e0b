//! Several control-plane nodes, as the DaemonSet runs them: instances of the service (each its
//! own attest-proxy, join-core, token-issuer and key service, with the cluster's CAs, salt and
//! key service secrets) against one real kube-apiserver.
//!
//! Two control-plane nodes joining at once through two instances take turns: the API server's
//! create of the one `control-plane` JoiningNode decides, the other node is told to retry and
//! joins once the first has. An instance killed amid a stream of joins costs its nodes one
//! attempt: they join through the others, every node keeps one state disk key whichever instance
//! it asks, and no token outlives its expiry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, PostParams};
use node_client::{Client, ClientError};
use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{self, Options, System, join_request};
use tonic::Code;

/// A node with a software key quoting the harness's boot measurements (the systems trust any key).
fn node_issuer() -> Arc<SoftIssuer> {
    Arc::new(
        SoftIssuer::new(KeyType::EcdsaP256)
            .unwrap()
            .with_pcrs(harness::boot_pcrs())
            .unwrap(),
    )
}

/// Systems trusting any attestation key, whose attest-proxies admit any number of attestations
/// from one address: every node here connects from 127.0.0.1, where the per-source bound (4 at a
/// time) would turn the retries of one storm into refusals.
fn soft_keys(cluster: Option<harness::SharedCluster>) -> Options {
    Options {
        trust_any_ak: true,
        cluster,
        proxy_args: vec!["--max-attestations-per-peer".into(), "0".into()],
        ..Options::default()
    }
}

fn client(system: &System) -> Client {
    system.client(node_issuer()).unwrap()
}

fn code(result: &Result<proto::join::IssueJoinTicketResponse, ClientError>) -> Option<Code> {
    match result {
        Err(ClientError::Status(status)) => Some(status.code()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_plane_nodes_through_two_instances_take_turns() {
    let a = System::start(soft_keys(None)).await.unwrap();
    let b = System::start(soft_keys(Some(a.shared_cluster())))
        .await
        .unwrap();
    let mut request_1 = join_request("cp-1", "0f0e0d0c-0b0a-4908-8706-050403020101").unwrap();
    request_1.is_control_plane = true;
    let mut request_2 = join_request("cp-2", "0f0e0d0c-0b0a-4908-8706-050403020102").unwrap();
    request_2.is_control_plane = true;
    let (via_a, via_b) = (client(&a), client(&b));
    let (one, two) = tokio::join!(via_a.join(request_1.clone()), via_b.join(request_2.clone()));
    let (joined, refused, retry, retry_via) = match (&one, &two) {
        (Ok(_), Err(_)) => ("cp-1", &two, request_2, &via_b),
        (Err(_), Ok(_)) => ("cp-2", &one, request_1, &via_a),
        _ => panic!(
            "exactly one must join: {one:?} {two:?}\n{}\n{}",
            a.logs(),
            b.logs()
        ),
    };
    assert_eq!(code(refused), Some(Code::Aborted), "{refused:?}");
    let nodes = a.kube.joining_nodes().await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].data["spec"]["name"], joined);

    // Constellation's node operator, once the node has registered: the Node exists with its
    // role, and the JoiningNode is removed. Then the other node joins.
    let admin = a.kube.plane().admin();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": joined, "labels": {"node-role.kubernetes.io/control-plane": ""}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let joining = a
        .kube
        .plane()
        .dynamic_api(
            &kube::core::GroupVersionKind::gvk(
                "update.edgeless.systems",
                "v1alpha1",
                "JoiningNode",
            ),
            None,
        )
        .await
        .unwrap();
    joining
        .delete("control-plane", &DeleteParams::default())
        .await
        .unwrap();
    let ticket = retry_via
        .join(retry.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", a.logs(), b.logs()));
    assert!(!ticket.control_plane_files.is_empty());
    let nodes = a.kube.joining_nodes().await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_ne!(nodes[0].data["spec"]["name"], joined);
}

/// Joins `node` asking the instances in turn from `first` until one answers; the attempts that
/// failed, and the ticket.
async fn join_somewhere(
    clients: &[Client],
    first: usize,
    node: &str,
    disk: &str,
) -> (Vec<usize>, proto::join::IssueJoinTicketResponse) {
    let request = join_request(node, disk).unwrap();
    let mut failed = Vec::new();
    for attempt in 0..clients.len() * 2 {
        let index = (first + attempt) % clients.len();
        match clients[index].join(request.clone()).await {
            Ok(ticket) => return (failed, ticket),
            Err(error) => {
                eprintln!("{node} through instance {index}: {error}");
                failed.push(index);
            }
        }
    }
    panic!("{node} joined through no instance: failed at {failed:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_amid_joins_costs_its_nodes_one_attempt_and_no_key() {
    const NODES: usize = 18;
    let first = System::start(soft_keys(None)).await.unwrap();
    let shared = first.shared_cluster();
    let mut instances = vec![first];
    for _ in 0..2 {
        instances.push(
            System::start(soft_keys(Some(shared.clone())))
                .await
                .unwrap(),
        );
    }
    let clients: Arc<Vec<Client>> = Arc::new(instances.iter().map(client).collect());

    // Three nodes at a time, each starting with "its" instance; the second instance goes away
    // (as its control-plane node would) while joins through it are in flight.
    let mut joins = tokio::task::JoinSet::new();
    for i in 0..NODES {
        let clients = clients.clone();
        joins.spawn(async move {
            tokio::time::sleep(Duration::from_millis(150) * u32::try_from(i / 3).unwrap()).await;
            let node = format!("worker-{i}");
            let disk = format!("0f0e0d0c-0b0a-4908-8706-0504030202{i:02}");
            let (failed, ticket) = join_somewhere(&clients, i % 3, &node, &disk).await;
            (node, disk, failed, ticket.state_disk_key)
        });
    }
    // Halfway through the stream.
    tokio::time::sleep(Duration::from_millis(150) * u32::try_from(NODES / 6).unwrap()).await;
    let killed = &mut instances[1];
    killed.proxy.kill();
    killed.join_core.kill();
    killed.token_issuer.kill();
    let mut joined = Vec::new();
    while let Some(result) = joins.join_next().await {
        joined.push(result.unwrap());
    }
    let failed: Vec<usize> = joined.iter().flat_map(|(_, _, f, _)| f.clone()).collect();
    assert!(!failed.is_empty(), "no node met the killed instance");
    assert!(
        failed.iter().all(|&index| index == 1),
        "only the killed instance may fail: {failed:?}"
    );

    // Every node keeps one disk key, whichever live instance it asks again; no two disks share.
    let mut keys = std::collections::BTreeSet::new();
    for (node, disk, _, key) in &joined {
        for index in [0, 2] {
            let rejoined = clients[index].rejoin(disk).await.unwrap();
            assert_eq!(
                &rejoined.state_disk_key, key,
                "{node}: another key through instance {index}"
            );
        }
        keys.insert(key.clone());
    }
    assert_eq!(keys.len(), NODES, "disks share keys");

    // Every node that joined holds a token; a token the killed instance wrote for a join it did
    // not finish stays until its expiry, which is no more than token-issuer's 15 minutes away.
    let tokens = instances[0].kube.bootstrap_tokens().await;
    assert!(tokens.len() >= NODES, "{tokens:?}");
    let latest = time::OffsetDateTime::now_utc() + time::Duration::minutes(15);
    for token in tokens {
        let data = token.data.unwrap_or_default();
        let expiration = String::from_utf8_lossy(&data["expiration"].0).into_owned();
        let at = time::OffsetDateTime::parse(
            &expiration,
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        assert!(at <= latest, "{expiration}");
    }
}
