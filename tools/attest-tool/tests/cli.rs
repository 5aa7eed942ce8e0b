//! The `attest-tool` binary run as an operator would: on the real RHEL 8 event log, and on
//! documents a software attestation key issued for a node that booted what that log records.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use attestation::QemuVtpmConfig;
use soft_issuer::{KeyType, SoftIssuer};

const NONCE_HEX: &str = "6e6f6e63652d6f662d7468652d68616e647368616b652d3031323334353637";
const USER_DATA: [u8; 32] = [0x42; 32];

fn rhel8_log_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../lib/attestation/testdata/eventlogs/rhel8-uefi.bin")
}

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

/// `attest-tool verify --config <config> --variant qemu-vtpm --nonce <nonce> <extra> <document>`.
fn verify(config: &Path, nonce: &str, extra: &[&str], document: &Path) -> Output {
    let mut args = vec![
        "verify",
        "--config",
        path_str(config),
        "--variant",
        "qemu-vtpm",
        "--nonce",
        nonce,
    ];
    args.extend_from_slice(extra);
    args.push(path_str(document));
    tool(&args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `replay-eventlog --bank sha256` of the RHEL 8 log, written as a config file that trusts any
/// attestation key: the software nodes of these tests each make a new one.
fn rhel8_config(dir: &Path) -> PathBuf {
    let out = tool(&[
        "replay-eventlog",
        "--bank",
        "sha256",
        path_str(&rhel8_log_path()),
    ]);
    assert!(out.status.success(), "{out:?}");
    let mut config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    config["trustAnyAk"] = true.into();
    let path = dir.join("attestation-config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn config_digest(json: &[u8]) -> String {
    QemuVtpmConfig::from_attestation_config(json)
        .unwrap()
        .digest()
}

fn write_document(dir: &Path, issuer: &SoftIssuer) -> PathBuf {
    let doc = issuer
        .issue_document(&USER_DATA, &hex::decode(NONCE_HEX).unwrap())
        .unwrap();
    let path = dir.join("document.json");
    std::fs::write(&path, doc).unwrap();
    path
}

fn rhel8_node(key: KeyType) -> SoftIssuer {
    SoftIssuer::new(key)
        .unwrap()
        .with_event_log(std::fs::read(rhel8_log_path()).unwrap())
        .unwrap()
}

#[test]
fn replay_prints_every_bank_with_the_known_pcrs() {
    let out = tool(&["replay-eventlog", path_str(&rhel8_log_path())]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let banks = json.as_object().unwrap();
    assert_eq!(
        banks.keys().collect::<Vec<_>>(),
        ["sha1", "sha256", "sha384"]
    );
    assert_eq!(json["sha384"]["7"]["expected"].as_str().unwrap().len(), 96);
    assert_eq!(
        json["sha256"]["7"]["expected"],
        "5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da"
    );
    assert_eq!(json["sha256"]["7"]["warnOnly"], false);
    assert_eq!(
        json["sha256"]["14"]["expected"],
        "d8f57ebcc1a23cc46832696e1a657f720e1be8f5b405bb7204682114e363b455"
    );
    assert_eq!(
        json["sha1"]["14"]["expected"],
        "1f5149668c40524e01be9cbc3ad527645943f148"
    );
    assert_eq!(json["sha256"].as_object().unwrap().len(), 11);
    // Registers in numeric order, as an operator reads them.
    let text = stdout(&out);
    assert!(text.find("\"9\"").unwrap() < text.find("\"14\"").unwrap());
}

#[test]
fn replay_of_a_legacy_log_and_of_garbage() {
    let legacy = rhel8_log_path().with_file_name("debian-10.bin");
    let out = tool(&["replay-eventlog", path_str(&legacy)]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["sha1"]
    );

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, [1, 2, 3]).unwrap();
    let out = tool(&["replay-eventlog", path_str(&junk)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot parse the event log"));
}

#[test]
fn policy_prints_what_the_service_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let config = rhel8_config(dir.path());
    let out = tool(&[
        "policy",
        "--config",
        path_str(&config),
        "--variant",
        "qemu-vtpm",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let digest = config_digest(&std::fs::read(&config).unwrap());
    assert!(text.contains(&format!("policy digest: {digest}")), "{text}");
    assert!(
        text.contains("measurements: 11 (11 enforced, 0 warn-only)"),
        "{text}"
    );
    assert!(text.contains("attestation keys: ANY"), "{text}");
    assert!(
        text.contains(
            "PCR  7  enforced   5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da"
        ),
        "{text}"
    );

    let out = tool(&[
        "policy",
        "--config",
        path_str(&config),
        "--variant",
        "aws-sev-snp",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, r#"{"measurements": {"4": {"expected": "zz"}}}"#).unwrap();
    let out = tool(&[
        "policy",
        "--config",
        path_str(&broken),
        "--variant",
        "qemu-vtpm",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid hex"));
}

#[test]
fn verify_accepts_a_node_that_booted_what_the_log_records() {
    let dir = tempfile::tempdir().unwrap();
    let config = rhel8_config(dir.path());
    for key in [KeyType::EcdsaP256, KeyType::Rsa2048] {
        let doc = write_document(dir.path(), &rhel8_node(key));
        let user_data = hex::encode(USER_DATA);
        let out = verify(&config, NONCE_HEX, &["--user-data", &user_data], &doc);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(
            stdout(&out).starts_with("ACCEPTED: qemu-vtpm node"),
            "{}",
            stdout(&out)
        );
    }
}

#[test]
fn verify_explains_rejections_like_the_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = rhel8_config(dir.path());
    // A node whose PCR 4 (boot loader) differs and PCR 9 too; the policy only warns about 9.
    let node = rhel8_node(KeyType::EcdsaP256)
        .with_pcrs([(4, [0xee; 32]), (9, [0x99; 32])])
        .unwrap();
    // The log no longer matches the PCRs, so drop it from the picture: issue without the log.
    let node = SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs(
            node.pcrs()
                .iter()
                .map(|(&i, v)| (i, <[u8; 32]>::try_from(v.as_slice()).unwrap())),
        )
        .unwrap();
    let doc = write_document(dir.path(), &node);
    let mut policy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    policy["measurements"]["9"]["warnOnly"] = true.into();
    let warn_config = dir.path().join("warn.json");
    std::fs::write(&warn_config, policy.to_string()).unwrap();

    let out = verify(&warn_config, NONCE_HEX, &[], &doc);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.starts_with("REJECTED by check measurements"), "{text}");
    assert!(text.contains("measurement 4 (enforced):"), "{text}");
    assert!(
        text.contains(&format!("actual   {}", "ee".repeat(32))),
        "{text}"
    );
    assert!(
        text.contains("expected 758a3d35f1b0ff5b135dacd07db0c8132c0ac665d944090d4bf96e66447a245c"),
        "{text}"
    );
    assert!(text.contains("measurement 9 (warn-only):"), "{text}");

    // The same decision as the JSON line attest-proxy logs.
    let out = verify(&warn_config, NONCE_HEX, &["--json"], &doc);
    assert_eq!(out.status.code(), Some(1));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["result"], "rejected");
    assert_eq!(line["check"], "measurements");
    assert_eq!(line["measurements"].as_array().unwrap().len(), 2);
    let digest = config_digest(policy.to_string().as_bytes());
    assert_eq!(line["policy"], digest);

    // A wrong nonce and wrong user data are named as such.
    let good = write_document(dir.path(), &rhel8_node(KeyType::Rsa2048));
    let out = verify(&config, "00", &[], &good);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).starts_with("REJECTED by check nonce"),
        "{}",
        stdout(&out)
    );
    let out = verify(&config, NONCE_HEX, &["--user-data", "01"], &good);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).starts_with("REJECTED by check user_data"),
        "{}",
        stdout(&out)
    );
    let out = verify(&config, "xyz", &[], &good);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn ak_digest_pins_a_machine_and_the_pinned_config_refuses_other_keys() {
    let dir = tempfile::tempdir().unwrap();
    let machine = rhel8_node(KeyType::Rsa2048);
    let doc = write_document(dir.path(), &machine);
    let out = tool(&["ak-digest", "--document", path_str(&doc)]);
    assert!(out.status.success(), "{out:?}");
    let digest = stdout(&out).trim().to_owned();
    assert_eq!(
        digest,
        hex::encode(attestation::ak_digest(machine.ak_public()))
    );

    // The digest goes into the config replay-eventlog writes, which the service then loads.
    let out = tool(&[
        "replay-eventlog",
        "--bank",
        "sha256",
        "--trusted-ak-digest",
        &digest,
        path_str(&rhel8_log_path()),
    ]);
    assert!(out.status.success(), "{out:?}");
    let pinned = dir.path().join("pinned.json");
    std::fs::write(&pinned, &out.stdout).unwrap();
    let out = tool(&[
        "policy",
        "--config",
        path_str(&pinned),
        "--variant",
        "qemu-vtpm",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("attestation keys: 1 trusted"), "{text}");
    assert!(text.contains(&format!("AK sha256:{digest}")), "{text}");

    let out = verify(&pinned, NONCE_HEX, &[], &doc);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Another key with the same boot measurements: a forgery, named as such.
    let forger = rhel8_node(KeyType::EcdsaP256);
    let forged = dir.path().join("forged.json");
    std::fs::write(
        &forged,
        forger
            .issue_document(&USER_DATA, &hex::decode(NONCE_HEX).unwrap())
            .unwrap(),
    )
    .unwrap();
    let out = verify(&pinned, NONCE_HEX, &[], &forged);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.starts_with("REJECTED by check ak_untrusted"), "{text}");
    let forged_digest = hex::encode(attestation::ak_digest(forger.ak_public()));
    assert!(text.contains(&forged_digest), "{text}");
}

#[test]
fn configs_the_service_refuses_are_refused_here_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = tool(&[
        "replay-eventlog",
        "--bank",
        "sha256",
        path_str(&rhel8_log_path()),
    ]);
    let unpinned = dir.path().join("unpinned.json");
    std::fs::write(&unpinned, &out.stdout).unwrap();
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, r#"{"measurements": {}, "trustAnyAk": true}"#).unwrap();
    for (config, reason) in [
        (&unpinned, "trusts no attestation key"),
        (&empty, "enforces no measurement"),
    ] {
        let out = tool(&[
            "policy",
            "--config",
            path_str(config),
            "--variant",
            "qemu-vtpm",
        ]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{stderr}");
    }

    let out = tool(&["ak-digest", "--document", path_str(&empty)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = tool(&[
        "replay-eventlog",
        "--bank",
        "sha256",
        "--trusted-ak-digest",
        "abcd",
        path_str(&rhel8_log_path()),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
