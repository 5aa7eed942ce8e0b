//! `attest-tool tdx verify` on real TDX quotes with Intel's real collateral
//! (`lib/attestation/testdata/tdx`, in this repository).

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

mod common;

fn vector(path: &str) -> String {
    common::testdata(&format!("tdx/{path}"))
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

fn verify(quote: &str, collateral: &str, at: &str, more: &[&str]) -> Output {
    let mut args = vec![
        "tdx",
        "verify",
        "--json",
        "--quote",
        quote,
        "--collateral",
        collateral,
        "--at",
        at,
    ];
    args.extend(more);
    tool(&args)
}

/// The window of the dcap-qvl collateral: 2025-06-19T10:32:27Z .. 2025-07-19T10:00:35Z.
const WINDOW: (i64, i64) = (1_750_329_147, 1_752_919_235);

#[test]
fn a_real_quote_verifies_inside_its_collateral_window_only() {
    let quote = vector("dcap-qvl-uptodate/quote.bin");
    let collateral = vector("dcap-qvl-uptodate");
    for at in [WINDOW.0.to_string(), "2025-07-19T10:00:34Z".to_owned()] {
        let out = verify(&quote, &collateral, &at, &[]);
        assert_eq!(out.status.code(), Some(0), "{at}");
        let out = json(&out);
        assert_eq!(out["verdict"], "accepted");
        assert_eq!(out["quote"]["version"], 4);
        assert_eq!(out["quote"]["fmspc"], "b0c06f000000");
        assert_eq!(out["quote"]["pck_ca"], "platform");
        assert_eq!(
            out["quote"]["mrtd"],
            "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7"
        );
        assert_eq!(out["quote"]["rtmr3"], "00".repeat(48));
        assert_eq!(
            out["quote"]["tee_tcb_svn"],
            "06010300000000000000000000000000"
        );
        assert_eq!(out["tcb"]["status"], "UpToDate");
        assert_eq!(out["tcb"]["advisory_ids"], serde_json::json!([]));
        assert_eq!(
            out["collateral_window"],
            serde_json::json!([WINDOW.0, WINDOW.1])
        );
    }
    for at in [(WINDOW.0 - 1).to_string(), WINDOW.1.to_string()] {
        let out = verify(&quote, &collateral, &at, &[]);
        assert_eq!(out.status.code(), Some(1), "{at}");
        let out = json(&out);
        assert_eq!(out["verdict"], "rejected");
        assert_eq!(out["check"], "tdx_collateral_not_current");
        assert!(
            out["reason"].as_str().unwrap().contains("not current"),
            "{out}"
        );
    }
}

#[test]
fn a_flipped_byte_is_refused_with_the_check_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mut quote = std::fs::read(vector("dcap-qvl-uptodate/quote.bin")).unwrap();
    // REPORT_DATA's first byte: the TD report is no longer what the attestation key signed.
    quote[48 + 520] ^= 1;
    let path = dir.path().join("quote.bin");
    std::fs::write(&path, &quote).unwrap();
    let out = verify(
        path.to_str().unwrap(),
        &vector("dcap-qvl-uptodate"),
        &WINDOW.0.to_string(),
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let out = json(&out);
    assert_eq!(out["verdict"], "rejected");
    assert_eq!(out["check"], "tdx_quote_signature");
    assert!(
        out["reason"]
            .as_str()
            .unwrap()
            .contains("signature does not verify with its attestation key"),
        "{out}"
    );
    // What it claims is still shown: the flipped byte among it.
    assert!(
        out["quote"]["report_data"]
            .as_str()
            .unwrap()
            .starts_with("9b9d48e7"),
        "{out}"
    );
}

#[test]
fn an_out_of_date_platform_is_refused_unless_the_config_accepts_it_with_its_advisories() {
    let dir = tempfile::tempdir().unwrap();
    common::automata_pcs_dir(dir.path());
    let quote = vector("automata-00806f050000/quote_tdx_00806f050000.dat");
    let collateral = dir.path().to_str().unwrap();
    let at = "1739418641";
    let out = verify(&quote, collateral, at, &[]);
    assert_eq!(out.status.code(), Some(1));
    let refused = json(&out);
    assert_eq!(refused["tcb"]["status"], "OutOfDate");
    assert_eq!(refused["check"], "tdx_tcb_status");
    let advisories = refused["tcb"]["advisory_ids"].to_string();
    for id in ["INTEL-SA-00960", "INTEL-SA-00982", "INTEL-SA-00986"] {
        assert!(advisories.contains(id), "{advisories}");
    }

    let config = dir.path().join("config.json");
    std::fs::write(&config, automata_config(&["UpToDate", "OutOfDate"])).unwrap();
    let out = verify(
        &quote,
        collateral,
        at,
        &["--config", config.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0));
    let accepted = json(&out);
    assert_eq!(accepted["verdict"], "accepted");
    assert!(
        accepted["notes"].to_string().contains("INTEL-SA-00960"),
        "{accepted}"
    );
}

const AUTOMATA_MRTD: &str = "935be7742dd89c6a4df6dba8353d89041ae0f052beef993b1e7f4524d3bc57650df20e5582158352e1240b3f1fed55d8";
const AUTOMATA_MRSEAM: &str = "ffc97a88587660fb04e1f7c851300c96ae0b5a463ac46d035d16c2d9f36d0ed1d23775bcbd27deb219e3a3cc28023895";
const AZURE_MRTD: &str = "024a32b070383331181619fa387cb4d55d1e38879f989933055ccad5bc2db795d1737b66205949d15469dc8c1ba7ab7b";
const AZURE_MRSEAM: &str = "360304d34a16aace0a18e09ad2d07d2b9fd3c174378e5bf108388079827f89ff62acc5f8c473dd40706324834e202946";

/// A qemu-tdx config for the automata quote: its MRTD as measurement 0, its MRSEAM.
fn automata_config(statuses: &[&str]) -> String {
    serde_json::json!({
        "measurements": { "0": { "expected": AUTOMATA_MRTD } },
        "mrSeams": [AUTOMATA_MRSEAM],
        "acceptedTcbStatuses": statuses,
    })
    .to_string()
}

#[test]
fn the_firmware_pins_and_sept_ve_disable_apply_as_for_the_variant() {
    let dir = tempfile::tempdir().unwrap();
    common::automata_pcs_dir(dir.path());
    let collateral = dir.path().to_str().unwrap();
    let at = "1739418641";
    let automata = vector("automata-00806f050000/quote_tdx_00806f050000.dat");
    let azure = vector("azure-tdx-vtpm/td-quote.bin");
    let config = dir.path().join("config.json");
    let run = |quote: &str, json: serde_json::Value, variant: &str| {
        std::fs::write(&config, json.to_string()).unwrap();
        verify(
            quote,
            collateral,
            at,
            &["--config", config.to_str().unwrap(), "--variant", variant],
        )
    };
    let statuses = serde_json::json!(["UpToDate", "OutOfDate"]);
    let pcrs = serde_json::json!({ "4": { "expected": "44".repeat(32) } });

    // Another MRTD, another MRSEAM: refused, naming the pin.
    let out = run(
        &automata,
        serde_json::json!({ "measurements": { "0": { "expected": AUTOMATA_MRTD } },
            "mrSeams": [AUTOMATA_MRSEAM], "mrtds": [AZURE_MRTD], "acceptedTcbStatuses": statuses }),
        "qemu-tdx",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["check"], "tdx_mrtd");
    let out = run(
        &automata,
        serde_json::json!({ "measurements": { "0": { "expected": AUTOMATA_MRTD } },
            "mrSeams": [AZURE_MRSEAM], "acceptedTcbStatuses": statuses }),
        "qemu-tdx",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["check"], "tdx_mrseam");

    // A config that pins no MRSEAM, or (azure-tdx) no MRTD, is no config of the variant.
    let out = run(
        &automata,
        serde_json::json!({ "measurements": { "0": { "expected": AUTOMATA_MRTD } } }),
        "qemu-tdx",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs mrSeams"));
    let out = run(
        &azure,
        serde_json::json!({ "measurements": pcrs, "mrSeams": [AZURE_MRSEAM] }),
        "azure-tdx",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs mrtds"));

    // The real Azure TD (no SEPT_VE_DISABLE): accepted as azure-tdx, refused as qemu-tdx.
    let out = run(
        &azure,
        serde_json::json!({ "measurements": pcrs, "mrtds": [AZURE_MRTD],
            "mrSeams": [AZURE_MRSEAM], "acceptedTcbStatuses": statuses }),
        "azure-tdx",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(
        &azure,
        serde_json::json!({ "measurements": { "0": { "expected": AZURE_MRTD } },
            "mrSeams": [AZURE_MRSEAM], "acceptedTcbStatuses": statuses }),
        "qemu-tdx",
    );
    assert_eq!(out.status.code(), Some(1));
    let refused = json(&out);
    assert_eq!(refused["check"], "tdx_attributes");
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("SEPT_VE_DISABLE"),
        "{refused}"
    );
}
