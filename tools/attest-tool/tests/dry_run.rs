//! `attest-tool dry-run` as an operator runs it on a copy of attest-proxy's evidence directory:
//! which kept nodes a tightened config would refuse, by check, and the summary.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use attestation::audit::{Decision, Evidence, Subject};
use attestation::evidence::{Bounds, Record, Store};
use attestation::{QemuVtpmConfig, QemuVtpmValidator, Validator, Variant};
use soft_issuer::SoftIssuer;

/// `attest-tool dry-run --config <config> --evidence <evidence> <extra>`.
fn dry_run(config: &str, evidence: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(["dry-run", "--config", config, "--evidence"])
        .arg(evidence)
        .args(extra)
        .output()
        .unwrap()
}

/// PCR 4 enforced at `pcr4`, the keys of `nodes` trusted.
fn config(pcr4: u8, nodes: &[&SoftIssuer]) -> String {
    let digests: Vec<String> = nodes
        .iter()
        .map(|n| hex::encode(attestation::ak_digest(n.ak_public())))
        .collect();
    serde_json::json!({
        "measurements": {"4": {"expected": hex::encode([pcr4; 32]), "warnOnly": false}},
        "trustedAkDigests": digests,
    })
    .to_string()
}

/// Decides `node`'s connection under `config` and keeps it as attest-proxy does.
fn join(store: &mut Store, node: &SoftIssuer, peer: &str, config: &str) {
    let config = QemuVtpmConfig::from_attestation_config(config.as_bytes()).unwrap();
    let validator = QemuVtpmValidator::from_config(config.clone());
    let (nonce, user_data) = ([7u8; 32], [9u8; 32]);
    let document = node.issue_document(&user_data, &nonce).unwrap();
    let subject = Subject::now(
        peer,
        Variant::QemuVtpm,
        config.digest(),
        Evidence::Certificate(&document),
    );
    let decision = match validator.validate(&document, &nonce) {
        Ok(verified) => Decision::accepted(subject, &verified),
        Err(error) => Decision::rejected(subject, &error),
    };
    store
        .put(&Record::new(decision, &nonce, &user_data, &document))
        .unwrap();
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_tightened_config_names_the_nodes_it_would_refuse_and_a_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let evidence = tmp.path().join("evidence");
    let node = || {
        SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(4, [4; 32])])
            .unwrap()
    };
    let (a, b) = (node(), node());
    let other_boot = SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_pcrs([(4, [5; 32])])
        .unwrap();
    let in_force = config(4, &[&a, &b, &other_boot]);
    let mut store = Store::open(
        &evidence,
        Bounds {
            max_records: 100,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(86_400),
        },
    )
    .unwrap();
    join(&mut store, &a, "10.0.0.1:40000", &in_force);
    join(&mut store, &b, "10.0.0.2:40000", &in_force);
    join(&mut store, &other_boot, "10.0.0.3:40000", &in_force);

    // The config in force would refuse only the node it refused.
    let same = write(tmp.path(), "same", &in_force);
    let out = dry_run(&same, &evidence, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("summary: 3 seen, 1 would be refused (0 of them accepted before, of 2 accepted before), 2 would be accepted"),
        "{text}"
    );

    // Pinning a's key alone: b would be refused by its key, as the audit line names it.
    let tightened = write(tmp.path(), "tightened", &config(4, &[&a]));
    let out = dry_run(&tightened, &evidence, &["--variant", "qemu-vtpm"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("WOULD BE REJECTED by check ak_untrusted: qemu-vtpm node 10.0.0.2:40000"),
        "{text}"
    );
    assert!(!text.contains("node 10.0.0.1:40000"), "{text}");
    assert!(
        text.contains("summary: 3 seen, 2 would be refused (1 of them accepted before, of 2 accepted before), 1 would be accepted"),
        "{text}"
    );

    // JSON, for scripts: the same refusals, by check.
    let out = dry_run(&tightened, &evidence, &["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks: Vec<(&str, &str, &str)> = report["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["decision"]["peer"].as_str().unwrap(),
                r["decision"]["check"].as_str().unwrap(),
                r["before"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        checks,
        [
            ("10.0.0.2:40000", "ak_untrusted", "accepted"),
            ("10.0.0.3:40000", "ak_untrusted", "rejected"),
        ]
    );
}

#[test]
fn bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let evidence = tmp.path().join("evidence");
    std::fs::create_dir(&evidence).unwrap();
    let invalid = write(tmp.path(), "invalid", r#"{"measurements": {}}"#);
    let out = dry_run(&invalid, &evidence, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("holds no kept decision"), "{err}");
    let out = dry_run(&invalid, &evidence, &["--variant", "qemu-vtpm"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("is not a valid qemu-vtpm attestation config"),
        "{err}"
    );
    let out = dry_run(&invalid, &tmp.path().join("missing"), &[]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("cannot read the evidence directory"), "{err}");
    let out = dry_run(&invalid, &evidence, &["--variant", "qemu-tdx"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("POST the config to attest-proxy's /dry-run"),
        "{err}"
    );
}
