//! `attest-tool verify --variant aws-nitro-tpm` run as an operator would, offline: EC2's answer
//! for the document's image comes from `--ec2-tpm-support`, and without it the decision says
//! EC2's word is missing.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use soft_issuer::SoftIssuer;

const NONCE: [u8; 32] = [0x6e; 32];

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

fn verify(config: &Path, document: &Path, extra: &[&str]) -> (bool, String) {
    let nonce = hex(&NONCE);
    let mut args = vec![
        "verify",
        "--config",
        config.to_str().unwrap(),
        "--variant",
        "aws-nitro-tpm",
        "--nonce",
        &nonce,
    ];
    args.extend_from_slice(extra);
    args.push(document.to_str().unwrap());
    let out = tool(&args);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn nitro_documents_verify_offline_with_ec2s_answer_as_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let node = SoftIssuer::rsa_2048().unwrap();
    let identity = br#"{"devpayProductCodes":null,"marketplaceProductCodes":null,"availabilityZone":"us-east-2a","privateIp":"10.0.0.5","version":"2017-09-30","region":"us-east-2","instanceId":"i-0fedcba9876543210","billingProducts":null,"instanceType":"m6a.large","accountId":"123456789012","pendingTime":"2026-11-28T10:00:00Z","imageId":"ami-0a1b2c3d4e5f60718","kernelId":"","ramdiskId":"","architecture":"x86_64"}"#;
    let document = dir.path().join("doc.json");
    std::fs::write(
        &document,
        node.issue_document_with_instance_info(b"u", &NONCE, Some(identity))
            .unwrap(),
    )
    .unwrap();
    let ak = hex(&attestation::ak_digest(node.ak_public()));
    let pcr4 = hex(&node.pcrs()[&4]);
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"measurements": {{"4": {{"expected": "{pcr4}"}}}}, "trustedAkDigests": ["{ak}"]}}"#
        ),
    )
    .unwrap();

    let (ok, out) = verify(&config, &document, &["--ec2-tpm-support", "v2.0"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("ACCEPTED: aws-nitro-tpm"), "{out}");
    let (ok, out) = verify(&config, &document, &["--ec2-tpm-support", "v2.0", "--json"]);
    assert!(ok, "{out}");
    assert!(out.contains("supports TPM v2.0"), "{out}");

    let (ok, out) = verify(&config, &document, &["--ec2-tpm-support", "none"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("image ami-0a1b2c3d4e5f60718 in us-east-2 does not support NitroTPM"),
        "{out}"
    );

    let (ok, out) = verify(&config, &document, &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("--ec2-tpm-support"), "{out}");

    // The flag belongs to aws-nitro-tpm alone.
    let out = tool(&[
        "verify",
        "--config",
        config.to_str().unwrap(),
        "--variant",
        "qemu-vtpm",
        "--nonce",
        &hex(&NONCE),
        "--ec2-tpm-support",
        "v2.0",
        document.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ec2-tpm-support is for aws-nitro-tpm"),
        "{out:?}"
    );
}
