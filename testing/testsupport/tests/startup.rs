//! Starting the system fails with a clear error, never a panic, when a port it needs is taken.

#![allow(clippy::unwrap_used)]

use std::net::TcpListener;

use testsupport::harness::{Options, System};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_proxy_port_is_a_clear_start_up_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let options = Options {
        proxy_listen: Some(addr),
        ..Options::default()
    };
    let error = match System::start(options).await {
        Ok(_) => panic!("attest-proxy cannot serve on {addr}, which this test holds"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("attest-proxy exited"), "{error}");
    assert!(error.contains("ddress already in use"), "{error}");
}
