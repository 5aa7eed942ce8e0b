//! kms.API end to end: a real key service on loopback port 0 and a real tonic client.

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

use std::net::SocketAddr;

use keyservice::derive::MAX_KEY_LEN;
use keyservice::{Config, KeyServer};
use plumbing::shutdown;
use proto::kms::GetDataKeyRequest;
use proto::kms::api_client::ApiClient;
use tonic::Code;
use tonic::transport::Channel;

const SECRET: [u8; 32] = [0x42; 32];
const SALT: [u8; 32] = [0x17; 32];

async fn start() -> (
    ApiClient<Channel>,
    shutdown::Trigger,
    tokio::task::JoinHandle<()>,
) {
    let config = Config::local("127.0.0.1:0".parse().unwrap(), &SECRET, &SALT);
    let server = KeyServer::bind(config).await.unwrap();
    let addr: SocketAddr = server.local_addr();
    assert_ne!(addr.port(), 0);
    let (trigger, shutdown) = shutdown::channel();
    let task = tokio::spawn(async move { server.serve(shutdown).await.unwrap() });
    let client = ApiClient::connect(format!("http://{addr}")).await.unwrap();
    (client, trigger, task)
}

fn request(id: &str, length: u32) -> GetDataKeyRequest {
    GetDataKeyRequest {
        data_key_id: id.to_owned(),
        length,
    }
}

#[tokio::test]
async fn serves_constellation_derived_keys() {
    let (mut client, trigger, task) = start().await;

    let key = client
        .get_data_key(request("measurementSecret", 32))
        .await
        .unwrap()
        .into_inner()
        .data_key;
    // Independent of the server: HKDF-SHA256 with info "key-" + id.
    let expected = keyservice::derive::hkdf_derive(
        aws_lc_rs::hkdf::HKDF_SHA256,
        &SECRET,
        &SALT,
        b"key-measurementSecret",
        32,
    )
    .unwrap();
    assert_eq!(key, *expected);

    let again = client
        .get_data_key(request("measurementSecret", 32))
        .await
        .unwrap()
        .into_inner()
        .data_key;
    assert_eq!(key, again, "the same id must always give the same key");

    let other = client
        .get_data_key(request("2f5c1bd6-2f3e-4b8e-9d1a-0c6f1e0f7a11", 32))
        .await
        .unwrap()
        .into_inner()
        .data_key;
    assert_ne!(key, other);

    let longest = client
        .get_data_key(request("x", MAX_KEY_LEN as u32))
        .await
        .unwrap()
        .into_inner()
        .data_key;
    assert_eq!(longest.len(), MAX_KEY_LEN);

    trigger.fire();
    task.await.unwrap();
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() {
    let (mut client, trigger, task) = start().await;

    for (req, reason) in [
        (request("", 32), "data_key_id"),
        (request("disk", 0), "length"),
        (request("disk", MAX_KEY_LEN as u32 + 1), "maximum"),
        (request("disk", u32::MAX), "maximum"),
    ] {
        let status = client.get_data_key(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{req:?}: {status:?}");
        assert!(
            status.message().contains(reason),
            "{req:?}: {:?} should mention {reason}",
            status.message()
        );
    }

    // Refusals do not take the service down.
    client.get_data_key(request("disk", 32)).await.unwrap();

    trigger.fire();
    task.await.unwrap();
}
