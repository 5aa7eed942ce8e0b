//! `attest-tool verify` on whole aws-sev-snp and azure-sev-snp documents (from simulated AMD
//! hardware), against a config, at a given time, with collateral from a directory: the
//! explanation attest-proxy's audit line gives.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use attestation::Issuer as _;
use attestation::snp::{Product, Tcb};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};

const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
/// 2026-01-01T00:00:00Z; the CRL below is current from a day before to a week after.
const AT: u64 = 1_767_225_600;

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attest-tool"))
        .args(args)
        .output()
        .unwrap()
}

fn ak() -> SoftIssuer {
    SoftIssuer::new(KeyType::Rsa2048)
        .unwrap()
        .with_pcrs([(4, [0x44; 32])])
        .unwrap()
}

fn write_case(dir: &Path, amd: &SimulatedAmd, node: &SnpDocumentIssuer) {
    let config = serde_json::json!({
        "measurements": {"4": {"expected": "44".repeat(32), "warnOnly": false}},
        "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
        "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
        "amdRootKey": amd.ark_pem(),
        // The simulated reports' ID key digest, which azure-sev-snp's config must pin.
        "firmwareSignerConfig": {"acceptedKeyDigests": ["00".repeat(48)]},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let collateral = dir.join("collateral");
    std::fs::create_dir_all(&collateral).unwrap();
    for name in ["crl-Milan.der", "vlek-crl-Milan.der"] {
        std::fs::write(
            collateral.join(name),
            amd.crl(&[], AT - 86_400, AT + 7 * 86_400).unwrap(),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("document.json"),
        node.issue(b"user", &[0x0a; 32]).unwrap(),
    )
    .unwrap();
}

fn verify(dir: &Path, variant: &str, at: &str, extra: &[&str]) -> Output {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let (config, collateral, document) = (p("config.json"), p("collateral"), p("document.json"));
    let mut args = vec![
        "verify",
        "--config",
        &config,
        "--variant",
        variant,
        "--nonce",
        "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a",
        "--at",
        at,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--collateral-dir", &collateral, &document]);
    tool(&args)
}

#[test]
fn an_aws_document_is_explained_as_the_audit_line_does_and_fails_once_the_crl_is_stale() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    let node = SnpDocumentIssuer::aws(ak(), &vlek, &amd.vlek_chain_pem(), ReportFields::default())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), &amd, &node);

    let out = verify(
        dir.path(),
        "aws-sev-snp",
        "2026-01-01T00:00:00Z",
        &["--json"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(line["result"], "accepted", "{line}");
    assert_eq!(line["variant"], "aws-sev-snp");
    assert!(
        stdout.contains("VLEK of CN=cc-eu-west-1.amazonaws.com"),
        "{stdout}"
    );

    // Two weeks later AMD's CRL is past its nextUpdate.
    let out = verify(
        dir.path(),
        "aws-sev-snp",
        &(AT + 14 * 86_400).to_string(),
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("AMD CRL: not current"), "{stdout}");

    // The same document is no azure-sev-snp document.
    let out = verify(dir.path(), "azure-sev-snp", "2026-01-01T00:00:00Z", &[]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn an_azure_document_verifies_and_without_collateral_the_crl_is_named() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([3; 64], TCB, 0).unwrap();
    let node =
        SnpDocumentIssuer::azure(ak(), &vcek, &amd.vcek_chain_pem(), ReportFields::default())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), &amd, &node);
    let out = verify(dir.path(), "azure-sev-snp", &AT.to_string(), &["--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("SEV-SNP Milan") && stdout.contains("VCEK of chip 0303"),
        "{stdout}"
    );

    std::fs::remove_file(dir.path().join("collateral/crl-Milan.der")).unwrap();
    let out = verify(dir.path(), "azure-sev-snp", &AT.to_string(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("no Milan CRL for VCEK chains"), "{stdout}");
}

#[test]
fn snp_options_are_refused_for_qemu_vtpm() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("d");
    std::fs::write(&doc, b"{}").unwrap();
    let out = tool(&[
        "verify",
        "--config",
        doc.to_str().unwrap(),
        "--variant",
        "qemu-vtpm",
        "--nonce",
        "00",
        "--at",
        "0",
        doc.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--at and --collateral-dir are for the SEV-SNP and TDX variants")
    );
}

/// A document as Azure's nodes send it, without VCEK and ASK: verified with both from the
/// collateral directory, and refused by name without the VCEK.
#[test]
fn an_azure_document_without_certificates_verifies_with_the_vcek_from_the_directory() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([3; 64], TCB, 0).unwrap();
    let full =
        SnpDocumentIssuer::azure(ak(), &vcek, &amd.vcek_chain_pem(), ReportFields::default())
            .unwrap();
    let bare = SnpDocumentIssuer::from_parts(
        attestation::Variant::AzureSevSnp,
        ak(),
        full.instance_info_without_certificates().unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), &amd, &bare);
    std::fs::write(
        dir.path().join("collateral/ask-Milan.pem"),
        amd.vcek_chain_pem(),
    )
    .unwrap();

    let out = verify(dir.path(), "azure-sev-snp", &AT.to_string(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("no vcek-Milan.der"), "{stdout}");

    std::fs::write(
        dir.path().join("collateral/vcek-Milan.der"),
        vcek.cert_der(),
    )
    .unwrap();
    let out = verify(dir.path(), "azure-sev-snp", &AT.to_string(), &["--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("VCEK of chip 0303"), "{stdout}");
}
