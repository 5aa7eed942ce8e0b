//! `attest-tool policy --document`: the config derived from a node's saved attestation passes
//! `attest-tool verify` with that document and refuses other nodes'; derived from documents
//! around real SEV-SNP reports and TDX quote (`lib/attestation/testdata`), it accepts those
//! reports and quotes when verified offline with their real collateral.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use attestation::Issuer as _;
use attestation::Variant;
use attestation::saved::SavedAttestation;
use attestation::snp::{Product, Tcb};
use base64::Engine as _;
use serde_json::{Value, json};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: [u8; 32] = [0x0a; 32];
const USER_DATA: &[u8] = b"user data";

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

fn testdata(path: &str) -> String {
    format!(
        "{}/../../lib/attestation/testdata/{path}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Saves `document` as `join-client attest` does, issued for [`NONCE`] and [`USER_DATA`].
fn save(dir: &Path, name: &str, variant: Variant, document: Vec<u8>) -> String {
    let path = dir.join(name);
    let saved = SavedAttestation {
        variant,
        nonce: NONCE.to_vec(),
        user_data: USER_DATA.to_vec(),
        document,
    };
    std::fs::write(&path, saved.to_json()).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `attest-tool policy --document` with `extra` options: the config written next to the
/// document (`<document>.policy.json`), and stderr.
fn derive(document: &str, extra: &[&str]) -> (String, Value, String) {
    let mut args = vec!["policy", "--document", document];
    args.extend_from_slice(extra);
    let out = tool(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    let path = format!("{document}.policy.json");
    std::fs::write(&path, &out.stdout).unwrap();
    (path, config, stderr)
}

fn verify(config: &str, document: &str, extra: &[&str]) -> Output {
    let mut args = vec!["verify", "--json", "--config", config];
    args.extend_from_slice(extra);
    args.push(document);
    tool(&args)
}

fn assert_verdict(out: &Output, code: i32, needle: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(needle), "{needle}: {stdout}");
}

/// A software vTPM with a few boot PCRs set: the shipped RSA key, or a fresh P-256 one.
fn soft_ak(key: KeyType, pcr4: u8) -> SoftIssuer {
    SoftIssuer::new(key)
        .unwrap()
        .with_pcrs([(4, [pcr4; 32]), (9, [0x99; 32]), (11, [0x11; 32])])
        .unwrap()
}

#[test]
fn a_qemu_vtpm_policy_admits_its_node_and_refuses_another_key_or_another_image() {
    let dir = tempfile::tempdir().unwrap();
    let node = soft_ak(KeyType::Rsa2048, 0x44);
    let saved = save(
        dir.path(),
        "node.json",
        Variant::QemuVtpm,
        node.issue(USER_DATA, &NONCE).unwrap(),
    );
    let (policy, config, stderr) = derive(&saved, &[]);
    let ak = attestation::ak_digest(node.ak_public());
    assert_eq!(config["trustedAkDigests"], json!([hex::encode(ak)]));
    for (index, value) in node.pcrs() {
        assert_eq!(
            config["measurements"][index.to_string()],
            json!({"expected": hex::encode(value), "warnOnly": false}),
        );
    }
    assert_eq!(
        config["measurements"].as_object().unwrap().len(),
        node.pcrs().len()
    );
    assert!(stderr.contains("add every node's"), "{stderr}");

    // The saved attestation carries its variant, nonce and user data: nothing else to pass.
    assert_verdict(&verify(&policy, &saved, &[]), 0, "\"accepted\"");
    // The printed config is also what `policy --config` reads, with the digest stderr named.
    let described = tool(&["policy", "--config", &policy, "--variant", "qemu-vtpm"]);
    let described = String::from_utf8_lossy(&described.stdout);
    assert!(
        stderr.contains(
            described
                .lines()
                .find_map(|l| l.strip_prefix("policy digest: "))
                .unwrap()
        ),
        "{described}"
    );

    // Another machine (another key) with the same image, and this key with another image.
    let other = save(
        dir.path(),
        "other.json",
        Variant::QemuVtpm,
        soft_ak(KeyType::EcdsaP256, 0x44)
            .issue(USER_DATA, &NONCE)
            .unwrap(),
    );
    assert_verdict(&verify(&policy, &other, &[]), 1, "attestation key");
    let reimaged = save(
        dir.path(),
        "reimaged.json",
        Variant::QemuVtpm,
        soft_ak(KeyType::Rsa2048, 0x45)
            .issue(USER_DATA, &NONCE)
            .unwrap(),
    );
    assert_verdict(&verify(&policy, &reimaged, &[]), 1, "measurement 4");
}
