//! `attest-tool verify --variant gcp-sev-es` on a saved document of a simulated GCE confidential
//! VM, with the GCE API's answers from files: accepted when they vouch for the AK and call the
//! instance confidential, refused by name when they do not, and "the API could not be asked"
//! without them.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use attestation::Issuer as _;
use attestation::gce::InstanceRef;
use soft_issuer::gce::{GceSevEsNode, technology};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &str = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a";

fn pem(spki: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(spki)
    )
}

/// The document of a node on `my-project-1/us-central1-a/worker-1`, its config, and the API's
/// answers: its key vouched for, the instance `confidential`.
fn write_case(dir: &Path, confidential: &str) {
    let instance = InstanceRef {
        project: "my-project-1".to_owned(),
        zone: "us-central1-a".to_owned(),
        instance: "worker-1".to_owned(),
    };
    let node = GceSevEsNode::new(
        SoftIssuer::new(KeyType::EcdsaP256).unwrap(),
        &instance,
        1,
        technology::AMD_SEV,
    )
    .unwrap();
    let pcr0 = hex::encode(&node.ak().pcrs()[&0]);
    let config = serde_json::json!({
        "measurements": {"0": {"expected": pcr0, "warnOnly": false}},
        "allowedGcpProjects": ["my-project-1"],
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("document.json"),
        node.issue(b"user", &[0x0a; 32]).unwrap(),
    )
    .unwrap();
    let identity = serde_json::json!({
        "kind": "compute#shieldedInstanceIdentity",
        "signingKey": {"ekPub": pem(&node.ak_spki_der().unwrap())},
    });
    std::fs::write(dir.join("identity.json"), identity.to_string()).unwrap();
    std::fs::write(dir.join("instance.json"), confidential).unwrap();
}

fn verify(dir: &Path, with_api: bool, extra: &[&str]) -> Output {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (config, document, identity, instance) = (
        p("config.json"),
        p("document.json"),
        p("identity.json"),
        p("instance.json"),
    );
    let mut args = vec![
        "verify",
        "--config",
        &config,
        "--variant",
        "gcp-sev-es",
        "--nonce",
        NONCE,
    ];
    if with_api {
        args.extend_from_slice(&["--gce-identity", &identity, "--gce-instance", &instance]);
    }
    args.extend_from_slice(extra);
    args.push(&document);
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(&args)
        .output()
        .unwrap()
}

#[test]
fn a_gcp_sev_es_document_verifies_with_the_apis_answers_from_files() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        r#"{"kind":"compute#instance","name":"worker-1","confidentialInstanceConfig":{"enableConfidentialCompute":true}}"#,
    );
    let out = verify(dir.path(), true, &["--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["result"], "accepted", "{line}");
    assert_eq!(line["variant"], "gcp-sev-es");
    assert!(
        text.contains(
            "AK vouched for by the GCE API for projects/my-project-1/zones/us-central1-a/instances/worker-1"
        ),
        "{text}"
    );
    assert!(text.contains("GCE firmware v1, AMD SEV"), "{text}");

    // Offline without the API's answers: nothing vouches for the key, and the tool says why.
    let out = verify(dir.path(), false, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("--gce-identity and --gce-instance"), "{text}");
}

#[test]
fn an_instance_the_api_calls_not_confidential_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        r#"{"kind":"compute#instance","name":"worker-1"}"#,
    );
    let out = verify(dir.path(), true, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("not a confidential VM"), "{text}");
    assert!(text.contains("gce_platform"), "{text}");
}
