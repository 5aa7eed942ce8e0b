//! `attest-tool snp` on real reports from real machines.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn vector(path: &str) -> String {
    format!(
        "{}/../../lib/attestation/testdata/snp/{path}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn a_real_vlek_report_verifies_inside_its_window_and_not_after_it() {
    let run = |at: &str| {
        tool(&[
            "snp",
            "verify",
            "--json",
            "--report",
            &vector("constellation-aws/report.bin"),
            "--signer",
            &vector("constellation-aws/vlek.pem"),
            "--chain",
            &vector("azure-vlekcertchain.pem"),
            "--at",
            at,
        ])
    };
    let inside = run("2025-06-01T00:00:00Z");
    assert_eq!(inside.status.code(), Some(0));
    let out = json(&inside);
    assert_eq!(out["verdict"], "accepted");
    assert_eq!(out["report"]["version"], 3);
    assert_eq!(out["report"]["product"], "Milan");
    assert_eq!(out["report"]["reported_tcb"]["microcode"], 217);
    assert_eq!(out["report"]["current_tcb"]["microcode"], 220);
    assert_eq!(out["signer"]["kind"], "VLEK");
    assert!(
        out["signer"]["csp_id"]
            .as_str()
            .unwrap()
            .contains("cc-eu-west-1")
    );
    assert!(out["notes"].to_string().contains("revocation not checked"));

    let after = run("1795564800"); // 2026-11-25, after the VLEK expired
    assert_eq!(after.status.code(), Some(1));
    let out = json(&after);
    assert_eq!(out["verdict"], "rejected");
    assert!(
        out["reason"]
            .as_str()
            .unwrap()
            .contains("not valid at the verification time")
    );
}

#[test]
fn an_azure_hcl_report_verifies_with_a_config_and_tampering_is_named() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        r#"{"bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115}"#,
    )
    .unwrap();
    let out = tool(&[
        "snp",
        "verify",
        "--json",
        "--from-hcl",
        "--report",
        &vector("azure-milan-vtpm/hcl-report.bin"),
        "--signer",
        &vector("azure-milan-vtpm/vcek.pem"),
        "--chain",
        &vector("azure-certchain.pem"),
        "--config",
        config.path().to_str().unwrap(),
    ]);
    // vcek.pem bundles the VCEK with its chain, as Azure serves it.
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = json(&out);
    assert_eq!(out["verdict"], "accepted");
    assert_eq!(out["signer"]["kind"], "VCEK");

    // A chain file is no signer.
    let out = tool(&[
        "snp",
        "verify",
        "--json",
        "--report",
        &vector("milan-virtee/report.bin"),
        "--signer",
        &vector("azure-certchain.pem"),
        "--chain",
        &vector("azure-certchain.pem"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected one VCEK or VLEK"));

    let trustee = tool(&[
        "snp",
        "verify",
        "--json",
        "--report",
        &vector("milan-azure-trustee/test-report.bin"),
        "--signer",
        &vector("milan-azure-trustee/test-vcek.der"),
        "--chain",
        &vector("azure-certchain.pem"),
        "--config",
        config.path().to_str().unwrap(),
    ]);
    assert_eq!(
        trustee.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&trustee.stdout)
    );
    assert_eq!(json(&trustee)["report"]["policy"], "0x3001f");

    let fake = tool(&[
        "snp",
        "verify",
        "--json",
        "--report",
        &vector("milan-azure-trustee/test-report.bin"),
        "--signer",
        &vector("milan-azure-trustee/test-vcek-invalid-new.der"),
        "--chain",
        &vector("azure-certchain.pem"),
    ]);
    assert_eq!(fake.status.code(), Some(1));
    assert!(
        json(&fake)["reason"]
            .as_str()
            .unwrap()
            .contains("signer's signature")
    );
}

#[test]
fn the_kds_url_names_product_chip_and_tcb() {
    let out = tool(&[
        "snp",
        "kds-url",
        "--report",
        &vector("milan-virtee/report.bin"),
        "--product",
        "Milan",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let url = String::from_utf8(out.stdout).unwrap();
    assert!(
        url.starts_with("https://kdsintf.amd.com/vcek/v1/Milan/"),
        "{url}"
    );
    assert!(
        url.trim_end()
            .ends_with("?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115"),
        "{url}"
    );
    // A version 2 report does not name its CPU.
    let out = tool(&[
        "snp",
        "kds-url",
        "--report",
        &vector("milan-virtee/report.bin"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--product"));
}

/// `--config` applies the firmware pins, and `--variant azure-sev-snp` refuses a config without
/// `firmwareSignerConfig`, as the service does.
#[test]
fn the_firmware_pins_apply_and_azure_needs_its_firmware_signer() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let tcb = r#""bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115"#;
    let run = |json: String, variant: Option<&str>| {
        std::fs::write(&config, json).unwrap();
        let mut args = vec![
            "snp".to_owned(),
            "verify".to_owned(),
            "--json".to_owned(),
            "--report".to_owned(),
            vector("milan-azure-trustee/test-report.bin"),
            "--signer".to_owned(),
            vector("milan-azure-trustee/test-vcek.der"),
            "--chain".to_owned(),
            vector("azure-certchain.pem"),
            "--config".to_owned(),
            config.to_str().unwrap().to_owned(),
        ];
        if let Some(variant) = variant {
            args.extend(["--variant".to_owned(), variant.to_owned()]);
        }
        tool(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let accepted = run(format!("{{{tcb}}}"), None);
    assert_eq!(accepted.status.code(), Some(0));
    let report = json(&accepted)["report"].clone();
    let measurement = report["measurement"].as_str().unwrap().to_owned();
    let digest = report["id_key_digest"].as_str().unwrap().to_owned();

    let pinned = |pins: &str| run(format!("{{{tcb},{pins}}}"), None);
    let out = pinned(&format!(r#""launchMeasurements":["{measurement}"]"#));
    assert_eq!(out.status.code(), Some(0));
    for (pins, named) in [
        (
            format!(r#""launchMeasurements":["{}"]"#, "ab".repeat(48)),
            "launchMeasurements",
        ),
        (
            format!(r#""acceptedAuthorKeyDigests":["{}"]"#, "ab".repeat(48)),
            "acceptedAuthorKeyDigests",
        ),
        (format!(r#""hostData":"{}""#, "ab".repeat(32)), "hostData"),
        (
            format!(r#""allowedChipIds":["{}"]"#, "ab".repeat(64)),
            "allowedChipIds",
        ),
    ] {
        let out = pinned(&pins);
        assert_eq!(out.status.code(), Some(1), "{pins}");
        let reason = json(&out)["reason"].as_str().unwrap().to_owned();
        assert!(reason.contains(named), "{pins}: {reason}");
    }

    let out = run(format!("{{{tcb}}}"), Some("azure-sev-snp"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs firmwareSignerConfig"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        format!(r#"{{{tcb},"firmwareSignerConfig":{{"acceptedKeyDigests":["{digest}"]}}}}"#),
        Some("azure-sev-snp"),
    );
    assert_eq!(out.status.code(), Some(0));
}
