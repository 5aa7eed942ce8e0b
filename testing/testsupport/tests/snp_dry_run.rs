//! Dry run of a minimum-TCB raise on SEV-SNP nodes (simulated AMD hardware, the KDS stand-in):
//! two aws-sev-snp nodes join, one on firmware at the old minimum TCB and one above it; a config
//! raising the minimum is tried on attest-proxy's kept evidence, through `POST /dry-run` (the
//! live collateral cache) and offline with `attest-tool dry-run --collateral-dir` on what the
//! cache persisted; both name exactly the older node, by check, and a reload of it is held.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use attestation::snp::{Product, Tcb};
use kds_standin::KdsStandin;
use serde_json::Value;
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{self, Options, SiteDir, System, Uids};

const DISK: &str = "8e1f0a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
const MIN: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
const RAISED: Tcb = Tcb { snp: 9, ..MIN };

/// An attest-proxy config for aws-sev-snp with minimum TCB `min`, trusting `amd`'s root.
fn config(amd: &SimulatedAmd, min: Tcb) -> String {
    serde_json::json!({
        "measurements": {
            "4": {"expected": "44".repeat(32), "warnOnly": false},
            "9": {"expected": "99".repeat(32), "warnOnly": false},
        },
        "bootloaderVersion": min.bootloader, "teeVersion": min.tee,
        "snpVersion": min.snp, "microcodeVersion": min.microcode,
        "amdRootKey": amd.ark_pem(),
    })
    .to_string()
}

/// An aws-sev-snp node whose VLEK (and so its report) is at `tcb`.
fn node(amd: &SimulatedAmd, tcb: Tcb) -> Arc<dyn attestation::Issuer> {
    let ak = SoftIssuer::new(KeyType::EcdsaP256)
        .unwrap()
        .with_pcrs([(4, [0x44; 32]), (9, [0x99; 32])])
        .unwrap();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", tcb).unwrap();
    Arc::new(
        SnpDocumentIssuer::aws(ak, &vlek, &amd.vlek_chain_pem(), ReportFields::default()).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_tcb_raise_names_the_older_nodes() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let kds = KdsStandin::start().await.unwrap();
    kds.put_vlek_chain("Milan", &amd.vlek_chain_pem());
    kds.put_vcek_chain("Milan", &amd.vcek_chain_pem());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for put in [KdsStandin::put_vlek_crl, KdsStandin::put_vcek_crl] {
        put(
            &kds,
            "Milan",
            amd.crl(&[], now - 3600, now + 7 * 86_400).unwrap(),
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let proxy_uid = (harness::own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = SiteDir::prepare(
        tmp.path(),
        &[
            ("attestationConfig", config(&amd, MIN)),
            ("kds-ca.pem", kds.ca_pem().to_owned()),
        ],
        proxy_uid,
    )
    .unwrap();
    let system = System::start(Options {
        variant: Some(Variant::AwsSevSnp),
        attestation_config: Some(site.attestation_config_path()),
        keep_evidence: true,
        proxy_args: [
            "--kds-url",
            kds.url(),
            "--kds-ca-file",
            site.file("kds-ca.pem").to_str().unwrap(),
            "--collateral-dir",
            site.collateral_dir().to_str().unwrap(),
            "--collateral-wait",
            "3s",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect(),
        ..Options::default()
    })
    .await
    .unwrap();

    for (tcb, name) in [
        (MIN, "worker-old-firmware"),
        (RAISED, "worker-new-firmware"),
    ] {
        system
            .client(node(&amd, tcb))
            .unwrap()
            .join(harness::join_request(name, DISK).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", system.logs()));
    }
    let audit = system.proxy_audit_records();
    assert_eq!(audit.len(), 2, "{audit:#?}");
    let old_peer = audit[0]["peer"].as_str().unwrap().to_owned();
    system.wait_for_kept_evidence(2).await.unwrap();

    let raised = config(&amd, RAISED);
    let expected = vec![(old_peer.clone(), "snp_tcb_minimum".to_owned())];

    // attest-proxy, over its live collateral cache.
    let (status, body) = plumbing::admin::post(
        system.admin.proxy,
        "/dry-run?format=json",
        raised.as_bytes(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(harness::dry_run_refusals(&report), expected, "{report:#}");
    assert_eq!(report["accepted_before"], 2);

    // Offline, on the evidence and the collateral attest-proxy persisted.
    let raised_file = tmp.path().join("raised.json");
    std::fs::write(&raised_file, &raised).unwrap();
    let out = std::process::Command::new(testsupport::process::bin("attest-tool").unwrap())
        .arg("dry-run")
        .arg("--config")
        .arg(&raised_file)
        .arg("--evidence")
        .arg(&system.paths.evidence)
        .arg("--collateral-dir")
        .arg(site.collateral_dir())
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offline: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(harness::dry_run_refusals(&offline), expected, "{offline:#}");
    // Without the collateral the offline run says what it lacks rather than guessing.
    let out = std::process::Command::new(testsupport::process::bin("attest-tool").unwrap())
        .arg("dry-run")
        .arg("--config")
        .arg(&raised_file)
        .arg("--evidence")
        .arg(&system.paths.evidence)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("is not in the collateral directory"),
        "{text}"
    );

    // Rolled out through the ConfigMap, the raise is held: half the nodes of today run older
    // firmware.
    // (The harness copied the site's config to where attest-proxy reads it.)
    std::fs::write(&system.paths.attestation_config, &raised).unwrap();
    system
        .wait_for_proxy_log(&["measurement policy held back"])
        .await
        .unwrap();
    assert_eq!(
        harness::metric(system.admin.proxy, "attest_proxy_policy_held")
            .await
            .unwrap(),
        1.0
    );
    let log = system.proxy.log();
    assert!(log.contains("snp_tcb_minimum"), "{log}");
}
