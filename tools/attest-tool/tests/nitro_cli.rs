//! `attest-tool verify --variant aws-nitro-tpm` run as an operator would, offline: EC2's answer
//! for the document's image comes from `--ec2-tpm-support`, and without it the decision says
//! EC2's word is missing; a saved document with AWS's NitroTPM attestation document is checked
//! as of `--at`, since the certificates AWS signs it with live hours.

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

#[test]
fn a_saved_aws_document_verifies_as_of_its_time_and_not_after_its_certificate_expired() {
    use base64::Engine as _;
    use soft_issuer::nitro::{NitroPki, NitroRequest};

    let dir = tempfile::tempdir().unwrap();
    let pcr4 = [0x44u8; 48];
    let node = SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_sha384_pcrs([(4, pcr4)])
        .unwrap();
    // A leaf that lived three hours and expired yesterday, as AWS's are short-lived (within
    // the simulated intermediates' lifetime, which begins a day ago).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let made = now - 20 * 3600;
    let pki = NitroPki::with_leaf_validity("aws", made - 600, made + 3 * 3600).unwrap();
    let user_data = b"u";
    let mut pcrs = std::collections::BTreeMap::new();
    pcrs.insert(4, pcr4.to_vec());
    let nitro = pki
        .document(&NitroRequest {
            pcrs,
            user_data: Some(attestation::ak_digest(node.ak_public()).to_vec()),
            nonce: Some(attestation::vtpm::make_extra_data(user_data, &NONCE).to_vec()),
            timestamp_ms: made as u64 * 1000,
            ..NitroRequest::default()
        })
        .unwrap();
    let identity = format!(
        r#"{{"availabilityZone":"us-east-2a","region":"us-east-2","instanceId":"i-0fedcba9876543210","instanceType":"m6a.large","accountId":"123456789012","imageId":"ami-0a1b2c3d4e5f60718","nitroTpmAttestationDocument":"{}"}}"#,
        base64::engine::general_purpose::STANDARD.encode(&nitro)
    );
    let document = dir.path().join("doc.json");
    std::fs::write(
        &document,
        node.issue_document_with_instance_info(user_data, &NONCE, Some(identity.as_bytes()))
            .unwrap(),
    )
    .unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "measurements": {"4": {"expected": hex(&pcr4)}},
            "requireNitroTpmAttestation": true,
            "nitroTpmRoots": pki.root_pem(),
        })
        .to_string(),
    )
    .unwrap();

    let user_data_hex = hex(user_data);
    let base = ["--ec2-tpm-support", "v2.0", "--user-data", &user_data_hex];
    let at = |t: &str| {
        let mut args = base.to_vec();
        args.extend_from_slice(&["--at", t]);
        verify(&config, &document, &args)
    };
    let (ok, out) = at(&(made + 60).to_string());
    assert!(ok, "{out}");
    assert!(out.starts_with("ACCEPTED: aws-nitro-tpm"), "{out}");
    let rfc3339 = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs((made + 3600) as u64),
    )
    .to_string();
    let (ok, out) = at(&rfc3339);
    assert!(ok, "{rfc3339}: {out}");
    // Now, after the leaf expired, the same document is refused by name.
    let (ok, out) = verify(&config, &document, &base);
    assert!(!ok, "{out}");
    assert!(
        out.starts_with("REJECTED by check nitro_document_validity"),
        "{out}"
    );
    assert!(out.contains("not valid"), "{out}");
}
