//! Dry run before reload, end to end: two nodes join through the real processes (one attests
//! with its TPM's RSA key, the other with its ECC key), attest-proxy keeps their evidence, and
//! a tightened policy that trusts only the RSA key is tried before it is enforced:
//! `attest-tool dry-run` on the evidence directory and `POST /dry-run` on the admin endpoint
//! both name exactly the ECC node, by check; the same policy written to the ConfigMap is held
//! (the ECC node still joins; `policy_held` and `/readyz` say so); forcing it applies it, and
//! the ECC node is refused.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::AkTrust;
use serde_json::Value;
use testsupport::harness::{self, Options, System};
use tpm_issuer::{AkSpec, TpmIssuer, TpmIssuerConfig};

const DISK: &str = "0c7c3c52-4b1e-4a0c-9d51-3f7d2c1b0a99";

fn issuer(system: &System, ak: AkSpec) -> Arc<dyn attestation::Issuer> {
    let mut config = TpmIssuerConfig::new(system.swtpm.tcti());
    config.ak = ak;
    Arc::new(TpmIssuer::open(&config).unwrap())
}

/// The attestation key's public area (`TPMT_PUBLIC`).
fn ak_public(system: &System, ak: AkSpec) -> Vec<u8> {
    let mut config = TpmIssuerConfig::new(system.swtpm.tcti());
    config.ak = ak;
    TpmIssuer::open(&config).unwrap().ak_public().unwrap()
}

async fn join(system: &System, ak: AkSpec, name: &str) -> Result<(), tonic::Status> {
    let client = system.client(issuer(system, ak)).unwrap();
    match client
        .join(harness::join_request(name, DISK).unwrap())
        .await
    {
        Ok(_) => Ok(()),
        Err(node_client::ClientError::Status(status)) => Err(status),
        Err(other) => panic!("{name}: {other}\n{}", system.logs()),
    }
}

async fn metric(system: &System, name: &str) -> f64 {
    harness::metric(system.admin.proxy, name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_policy_is_tried_held_and_forced() {
    let system = System::start(Options {
        keep_evidence: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let (rsa, ecc) = (AkSpec::RSA_DEFAULT, AkSpec::ECC_DEFAULT);
    join(&system, rsa, "worker-rsa").await.unwrap();
    join(&system, ecc, "worker-ecc").await.unwrap();
    let audit = system.proxy_audit_records();
    assert_eq!(audit.len(), 2, "{audit:#?}");
    let (rsa_peer, ecc_peer) = (
        audit[0]["peer"].as_str().unwrap().to_owned(),
        audit[1]["peer"].as_str().unwrap().to_owned(),
    );
    // Written off the join path: wait for the writer.
    system.wait_for_kept_evidence(2).await.unwrap();
    // attest-proxy's uid alone can read the records (as root, the pod's uid 10001).
    {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = std::fs::metadata(&system.paths.evidence).unwrap();
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
        assert_eq!(dir.uid(), system.uids.proxy);
        let files: Vec<_> = std::fs::read_dir(&system.paths.evidence)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap())
            .collect();
        assert!(!files.is_empty());
        for file in files {
            assert_eq!(file.permissions().mode() & 0o777, 0o600);
            assert_eq!(file.uid(), system.uids.proxy);
        }
        let kept = attestation::evidence::read_dir(&system.paths.evidence).unwrap();
        assert_eq!(kept.records.len(), 2);
        assert!(kept.skipped.is_empty(), "{:?}", kept.skipped);
    }
    assert_eq!(metric(&system, "attest_proxy_evidence_records").await, 2.0);

    // The policy pinning the RSA key alone.
    let rsa_only = AkTrust::keys([ak_public(&system, rsa).as_slice()]);
    let tightened = harness::attestation_config(&rsa_only, &[]);
    let tightened_digest =
        attestation::QemuVtpmConfig::from_attestation_config(tightened.as_bytes())
            .unwrap()
            .digest();
    let ecc_digest = hex::encode(attestation::ak_digest(&ak_public(&system, ecc)));
    let config_file = system.paths.root.join("tightened.json");
    std::fs::write(&config_file, &tightened).unwrap();

    // attest-tool on the evidence directory, as an operator runs it on a copy.
    let out = std::process::Command::new(testsupport::process::bin("attest-tool").unwrap())
        .arg("dry-run")
        .arg("--config")
        .arg(&config_file)
        .arg("--evidence")
        .arg(&system.paths.evidence)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!(
            "WOULD BE REJECTED by check ak_untrusted: qemu-vtpm node {ecc_peer}"
        )) && text.contains(&format!(
            "attestation key sha256:{ecc_digest} is not trusted"
        )),
        "{text}"
    );
    assert!(!text.contains(&format!("node {rsa_peer}")), "{text}");
    assert!(
        text.contains("summary: 2 seen, 1 would be refused (1 of them accepted before, of 2 accepted before), 1 would be accepted"),
        "{text}"
    );

    // The admin endpoint answers the same for the posted config.
    let (status, body) = plumbing::admin::post(
        system.admin.proxy,
        "/dry-run?format=json",
        tightened.as_bytes(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["policy"], tightened_digest.as_str());
    assert_eq!(
        (report["seen"].as_u64(), report["accepted_before"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        harness::dry_run_refusals(&report),
        [(ecc_peer.clone(), "ak_untrusted".to_owned())]
    );
    // A config that is not one is answered 400, naming why; the proxy keeps serving.
    let (status, body) = plumbing::admin::post(
        system.admin.proxy,
        "/dry-run",
        br#"{"measurements": {}}"#,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not a valid qemu-vtpm policy"), "{body}");

    // Written to the ConfigMap: held, since it would refuse half the nodes accepted today.
    let dir = system.paths.attestation_config.parent().unwrap();
    harness::project_config_map(dir, &[("attestationConfig", tightened.as_bytes())]).unwrap();
    system
        .wait_for_proxy_log(&["measurement policy held back", &tightened_digest])
        .await
        .unwrap();
    assert_eq!(metric(&system, "attest_proxy_policy_held").await, 1.0);
    assert_eq!(
        metric(
            &system,
            "attest_proxy_policy_reloads_total{result=\"held\"}"
        )
        .await,
        1.0
    );
    let (status, readyz) = plumbing::admin::get(system.admin.proxy, "/readyz")
        .await
        .unwrap();
    assert_eq!(
        status, 200,
        "a held policy does not take the proxy out of the Service: {readyz}"
    );
    assert!(
        readyz.contains("warn policy-held: enforcing policy ")
            && readyz.contains(&format!("holding back {tightened_digest}")),
        "{readyz}"
    );
    // The policy in force still admits the ECC node.
    join(&system, ecc, "worker-ecc-2").await.unwrap();

    // Forced: the config names its own digest, and it applies.
    let forced = {
        let mut config: Value = serde_json::from_str(&tightened).unwrap();
        config["forceReload"] = tightened_digest.clone().into();
        config.to_string()
    };
    harness::project_config_map(dir, &[("attestationConfig", forced.as_bytes())]).unwrap();
    system
        .wait_for_proxy_log(&["measurement policy reloaded", &tightened_digest])
        .await
        .unwrap();
    assert_eq!(metric(&system, "attest_proxy_policy_held").await, 0.0);
    let (_, readyz) = plumbing::admin::get(system.admin.proxy, "/readyz")
        .await
        .unwrap();
    assert!(!readyz.contains("policy-held"), "{readyz}");
    let status = join(&system, ecc, "worker-ecc-3").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("is not trusted"), "{status:?}");
    join(&system, rsa, "worker-rsa-2").await.unwrap();
}
