//! The system as the pod runs it: attest-proxy, join-core and token-issuer under three distinct
//! uids, each file readable only by the process that needs it, so every peer-uid fence is
//! crossed for real on a join. Starting processes as other uids takes root, so these tests are
//! `#[ignore]`d and `scripts/test.sh` runs them as root, as CI does.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use testsupport::harness::{self, Options, System, Uids, own_uid};

const DISK: &str = "0f3b8a61-2c4d-4e7f-9a1b-3c5d7e9f1a2b";

/// The real uid of a running process.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to run the services as the pod's uids; scripts/test.sh runs it as root"]
async fn as_root_a_join_works_end_to_end_with_distinct_uids() {
    assert_eq!(own_uid().unwrap(), 0, "run as root: scripts/test.sh does");
    let system = System::start(Options::default()).await.unwrap();
    assert_eq!(system.uids, Uids::POD);
    assert_eq!(uid_of(system.proxy.id()), Uids::POD.proxy);
    assert_eq!(uid_of(system.join_core.id()), Uids::POD.join_core);
    assert_eq!(uid_of(system.token_issuer.id()), Uids::POD.token_issuer);
    // The secrets belong to the process that reads them, and to nobody else.
    for (path, owner) in [
        (&system.paths.ca_key, Uids::POD.token_issuer),
        (&system.paths.kubeconfig, Uids::POD.token_issuer),
        (&system.paths.measurement_salt, Uids::POD.join_core),
    ] {
        let meta = std::fs::metadata(path).unwrap();
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777),
            (owner, 0o600),
            "{path:?}"
        );
    }

    let issuer = system.issuer().unwrap();
    let client = system.client(issuer).unwrap();
    let ticket = tokio::time::timeout(
        Duration::from_secs(60),
        client.join(harness::join_request("worker-uids", DISK).unwrap()),
    )
    .await
    .expect("the join was not answered in time")
    .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    assert_eq!(ticket.state_disk_key.len(), 32);
    let rejoin = tokio::time::timeout(Duration::from_secs(60), client.rejoin(DISK))
        .await
        .expect("the rejoin was not answered in time")
        .unwrap_or_else(|e| panic!("rejoin: {e}\n{}", system.logs()));
    assert_eq!(rejoin.state_disk_key, ticket.state_disk_key);
}

/// Replaces the server of `socket` with an impostor running as root (as a container able to
/// write the socket's directory could), and returns how many bytes it was sent while `join`
/// ran, with the node's answer.
async fn impostor_sees(
    socket: &std::path::Path,
    join: impl std::future::Future<Output = Result<(), node_client::ClientError>>,
) -> (usize, Result<(), node_client::ClientError>) {
    use tokio::io::AsyncReadExt;
    let listener = plumbing::unix::bind(socket, 0o666).unwrap();
    let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = received.clone();
    let impostor = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = stream.read(&mut buf).await {
                    counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(60), join)
        .await
        .expect("the join was not answered in time");
    impostor.abort();
    (received.load(std::sync::atomic::Ordering::Relaxed), answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to run the services as the pod's uids; scripts/test.sh runs it as root"]
async fn as_root_a_replaced_socket_gets_nothing_from_its_client() {
    assert_eq!(own_uid().unwrap(), 0, "run as root: scripts/test.sh does");
    let mut system = System::start(Options::default()).await.unwrap();
    let issuer = system.issuer().unwrap();
    let client = system.client(issuer).unwrap();

    // token-issuer replaced: join-core must not send it the node's CSR.
    system.token_issuer.kill();
    let socket = system.paths.token_issuer_socket.clone();
    let (sent, answer) = impostor_sees(&socket, async {
        client
            .join(harness::join_request("worker-a", DISK).unwrap())
            .await
            .map(drop)
    })
    .await;
    assert_eq!(
        sent, 0,
        "join-core sent {sent} bytes to a token-issuer impostor"
    );
    match answer {
        Err(node_client::ClientError::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        system.join_core.log().contains("not the expected uid"),
        "join-core says why:\n{}",
        system.join_core.log()
    );

    // join-core replaced: attest-proxy must not forward the node's request.
    system.join_core.kill();
    let socket = system.paths.join_core_socket.clone();
    let (sent, answer) = impostor_sees(&socket, async {
        client
            .join(harness::join_request("worker-b", DISK).unwrap())
            .await
            .map(drop)
    })
    .await;
    assert_eq!(
        sent, 0,
        "attest-proxy sent {sent} bytes to a join-core impostor"
    );
    match answer {
        Err(node_client::ClientError::Status(status)) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(
                status.message().contains("not the expected uid"),
                "{status:?}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
