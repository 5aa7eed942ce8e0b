//! A real, in-process attest-proxy serving qemu-tdx: at start it builds its PCS cache from the
//! flags, fetches what every platform shares and the TCB info of `--tdx-fmspc` from the PCS
//! stand-in (serving Intel's real collateral, `testdata/tdx/collateral.json`, copied from the
//! attestation crate's test data), persists it in `--collateral-dir`, and its metrics and
//! readiness note name Intel's PCS.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use attestation::Variant;
use clap::Parser as _;
use pcs_standin::{PckCa, PcsStandin};

const FMSPC: &str = "b0c06f000000";
/// The real UpToDate quote's MRTD as measurement 0, and its TDX module's MRSEAM.
const POLICY: &str = r#"{"measurements": {"0": {"expected": "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7"}}, "mrSeams": ["5b38e33a6487958b72c3c12a938eaa5e3fd4510c51aeeab58c7d5ecee41d7c436489d6c8e4f92f160b7cad34207b00c1"]}"#;

/// Intel's real collateral, as Intel's PCS serves it.
fn serve_real(pcs: &PcsStandin) {
    let path = format!(
        "{}/testdata/tdx/collateral.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let fmspc = pcs
        .put_dcap_collateral(&std::fs::read(path).unwrap(), PckCa::Platform)
        .unwrap();
    assert_eq!(fmspc, FMSPC);
}

async fn wait_for_metric(addr: SocketAddr, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = plumbing::admin::get(addr, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        if body.lines().any(|l| l == line) {
            return body;
        }
        assert!(Instant::now() < deadline, "no {line:?} in\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_tdx_is_served_with_intel_collateral_warmed_from_the_pcs() {
    let pcs = PcsStandin::start().await.unwrap();
    serve_real(&pcs);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("attestationConfig");
    let socket = dir.path().join("join-core.sock");
    let ca = dir.path().join("pcs-ca.pem");
    let cache = dir.path().join("collateral");
    std::fs::write(&policy, POLICY).unwrap();
    std::fs::write(&ca, pcs.ca_pem()).unwrap();
    let uid = testsupport::harness::own_uid().unwrap().to_string();
    let config = attest_proxy::Config::try_parse_from([
        "attest-proxy",
        "--variant",
        "qemu-tdx",
        "--upstream-uid",
        &uid,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream-socket",
        socket.to_str().unwrap(),
        "--attestation-config",
        policy.to_str().unwrap(),
        "--pcs-url",
        pcs.url(),
        "--intel-root-crl-url",
        &pcs.root_crl_url(),
        "--pcs-ca-file",
        ca.to_str().unwrap(),
        "--tdx-fmspc",
        &FMSPC.to_ascii_uppercase(),
        "--collateral-dir",
        cache.to_str().unwrap(),
        // Intel's real collateral expired in 2025: kept servable, to see it reported stale.
        "--collateral-max-stale",
        "87600h",
    ])
    .unwrap();
    let proxy = attest_proxy::Proxy::bind(config).await.unwrap();
    assert_eq!(proxy.policy().get().validator.variant(), Variant::QemuTdx);
    let admin = proxy.admin_addr().unwrap();
    let (trigger, shutdown) = plumbing::shutdown::channel();
    let serving = tokio::spawn(proxy.serve(shutdown));
    let _join_core = tokio::net::UnixListener::bind(&socket).unwrap();

    // The QE identity, both PCK CRLs (the processor CA's is a 404 here, remembered as such), the
    // root CA CRL and the warmed TCB info: five fetches, and nothing failed.
    let body = wait_for_metric(
        admin,
        r#"attest_proxy_collateral_fetches_total{result="ok"} 5"#,
    )
    .await;
    assert!(
        body.contains(r#"attest_proxy_collateral_fetches_total{result="failed"} 0"#),
        "{body}"
    );
    assert!(body.contains("from the Intel PCS"), "{body}");
    // What every join shares (QE identity, both PCK CRLs, root CA CRL) and the warmed platform.
    assert!(
        body.contains(r#"attest_proxy_collateral_items{class="shared"} 4"#),
        "{body}"
    );
    assert!(
        body.contains(r#"attest_proxy_collateral_items{class="node_named"} 1"#),
        "{body}"
    );
    let mut paths = pcs.paths();
    paths.sort();
    assert_eq!(
        paths,
        [
            pcs_standin::ROOT_CRL_PATH,
            "/sgx/certification/v4/pckcrl?ca=platform&encoding=der",
            "/sgx/certification/v4/pckcrl?ca=processor&encoding=der",
            "/tdx/certification/v4/qe/identity",
            "/tdx/certification/v4/tcb?fmspc=b0c06f000000",
        ]
    );
    // Each item and its metadata on disk, for a restarted proxy.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 10);

    let (status, body) = plumbing::admin::get(admin, "/readyz").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("serving stale collateral while the Intel PCS cannot refresh it:"),
        "{body}"
    );
    assert!(body.contains("tcb/b0c06f000000"), "{body}");

    trigger.fire();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
