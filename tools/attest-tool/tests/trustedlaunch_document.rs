//! `attest-tool verify --variant azure-trustedlaunch` on a saved document (a software AK certified
//! by the simulated Azure vTPM CA), offline: accepted with the config's root at a time the AK
//! certificate is valid, refused by name after it expired (`--at`), and with a config that does
//! not trust its root.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use attestation::variants::azure_trustedlaunch::InstanceInfo;
use soft_issuer::SoftIssuer;
use soft_issuer::azure_vtpm::{SimulatedAzureVtpmCa, Window};

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_saved_document_is_verified_at_the_time_given_and_refused_by_name() {
    let azure = SimulatedAzureVtpmCa::new().unwrap();
    let ak = SoftIssuer::rsa_2048()
        .unwrap()
        .with_pcrs([(4, [0x44; 32])])
        .unwrap();
    let window = Window::current();
    let info = InstanceInfo {
        ak_cert: azure
            .ak_cert(ak.ak_public(), "saved-vm", window, &[])
            .unwrap(),
        ca: azure.ca_der().to_vec(),
    }
    .to_json();
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("document.json");
    std::fs::write(
        &doc,
        ak.issue_document_with_instance_info(b"user", &[0x0a; 32], Some(&info))
            .unwrap(),
    )
    .unwrap();
    let config = |root: String, name: &str| {
        let path = dir.path().join(name);
        let json = serde_json::json!({
            "measurements": {"4": {"expected": "44".repeat(32), "warnOnly": false}},
            "azureVtpmRoots": [root],
        });
        std::fs::write(&path, json.to_string()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let trusting = config(azure.root_pem(), "config.json");
    let verify = |config: &str, at: u64| {
        tool(&[
            "verify",
            "--config",
            config,
            "--variant",
            "azure-trustedlaunch",
            "--nonce",
            &"0a".repeat(32),
            "--user-data",
            &hex::encode(b"user"),
            "--at",
            &at.to_string(),
            doc.to_str().unwrap(),
        ])
    };

    let out = verify(&trusting, window.not_before + 3600);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("ACCEPTED: azure-trustedlaunch"), "{text}");

    let out = verify(&trusting, window.not_after + 60);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("ak_cert_expired"), "{text}");

    let other = config(
        SimulatedAzureVtpmCa::impostor().unwrap().root_pem(),
        "other.json",
    );
    let out = verify(&other, window.not_before + 3600);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("ak_cert_untrusted_root"), "{text}");
}
