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

mod common;
use common::testdata;

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
    assert!(stderr.contains("add every other node's"), "{stderr}");

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

const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
/// 2026-01-01T00:00:00Z; the simulated AMD's CRLs are current from a day before to a week after.
const AT: u64 = 1_767_225_600;

/// The simulated AMD's root (for --amd-root-key) and CRLs (for verify --collateral-dir).
fn amd_files(dir: &Path, amd: &SimulatedAmd) -> (String, String) {
    let root = dir.join("ark.pem");
    std::fs::write(&root, amd.ark_pem()).unwrap();
    let collateral = dir.join("amd");
    std::fs::create_dir_all(&collateral).unwrap();
    for name in ["crl-Milan.der", "vlek-crl-Milan.der"] {
        std::fs::write(
            collateral.join(name),
            amd.crl(&[], AT - 86_400, AT + 7 * 86_400).unwrap(),
        )
        .unwrap();
    }
    (
        root.to_str().unwrap().to_owned(),
        collateral.to_str().unwrap().to_owned(),
    )
}

fn fields(measurement: u8) -> ReportFields {
    ReportFields {
        measurement: [measurement; 48],
        id_key_digest: [0x1d; 48],
        ..ReportFields::default()
    }
}

#[test]
fn sev_snp_policies_pin_the_tcb_and_firmware_and_admit_their_node_only() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (root, collateral) = amd_files(dir.path(), &amd);
    let at = AT.to_string();
    let offline = ["--at", at.as_str(), "--collateral-dir", collateral.as_str()];
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    let vcek = amd.chip([3; 64], TCB, 0).unwrap();
    let newer = Tcb { snp: 9, ..TCB };
    let newer_vcek = amd.chip([3; 64], newer, 0).unwrap();
    let newer_vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", newer).unwrap();
    let node = |variant: Variant, signer: &_, measurement: u8| {
        let ak = soft_ak(KeyType::Rsa2048, 0x44);
        let issuer = match variant {
            Variant::AwsSevSnp => {
                SnpDocumentIssuer::aws(ak, signer, &amd.vlek_chain_pem(), fields(measurement))
            }
            _ => SnpDocumentIssuer::azure(ak, signer, &amd.vcek_chain_pem(), fields(measurement)),
        }
        .unwrap();
        issuer.issue(USER_DATA, &NONCE).unwrap()
    };
    for (variant, signer, newer_signer) in [
        (Variant::AwsSevSnp, &vlek, &newer_vlek),
        (Variant::AzureSevSnp, &vcek, &newer_vcek),
    ] {
        // The node the policy is derived from runs on newer firmware than the fleet's oldest.
        let saved = save(
            dir.path(),
            &format!("{variant}.json"),
            variant,
            node(variant, newer_signer, 0x4d),
        );
        let (policy, config, stderr) = derive(&saved, &["--amd-root-key", &root]);
        assert_eq!(config["snpVersion"], 9, "{variant}: {config}");
        assert_eq!(config["bootloaderVersion"], 3);
        assert_eq!(config["microcodeVersion"], 115);
        assert_eq!(config["launchMeasurements"], json!(["4d".repeat(48)]));
        assert_eq!(config["hostData"], json!("00".repeat(32)));
        assert_eq!(config["smtAllowed"], true);
        assert_eq!(
            config["firmwareSignerConfig"],
            json!({"acceptedKeyDigests": ["1d".repeat(48)], "enforcementPolicy": "Equal"})
        );
        assert!(config.get("allowedChipIds").is_none(), "{config}");
        assert!(config.get("minimumTcb").is_none(), "{config}");
        assert_eq!(config["amdRootKey"], json!(amd.ark_pem()));
        assert!(config["measurements"]["4"].is_object(), "{config}");
        assert!(
            stderr.contains("the minimum TCB of each product is the lowest"),
            "{stderr}"
        );

        assert_verdict(&verify(&policy, &saved, &offline), 0, "\"accepted\"");
        // A node on older firmware, and one of another launch measurement, are refused.
        let older = save(
            dir.path(),
            "older.json",
            variant,
            node(variant, signer, 0x4d),
        );
        assert_verdict(
            &verify(&policy, &older, &offline),
            1,
            "below the configured minimum",
        );
        let other = save(
            dir.path(),
            "other.json",
            variant,
            node(variant, newer_signer, 0x4e),
        );
        assert_verdict(&verify(&policy, &other, &offline), 1, "launch MEASUREMENT");
    }

    // Chips are pinned only on request.
    let saved = save(
        dir.path(),
        "chip.json",
        Variant::AzureSevSnp,
        node(Variant::AzureSevSnp, &vcek, 0x4d),
    );
    let (policy, config, _) = derive(&saved, &["--amd-root-key", &root, "--pin-chip-id"]);
    assert_eq!(config["allowedChipIds"], json!(["03".repeat(64)]));
    assert_verdict(&verify(&policy, &saved, &offline), 0, "\"accepted\"");
    let elsewhere = amd.chip([4; 64], TCB, 0).unwrap();
    let moved = save(
        dir.path(),
        "moved.json",
        Variant::AzureSevSnp,
        node(Variant::AzureSevSnp, &elsewhere, 0x4d),
    );
    assert_verdict(&verify(&policy, &moved, &offline), 1, "allowedChipIds");
}

#[test]
fn a_gcp_policy_names_projects_only_when_told_and_a_gcp_service_policy_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([3; 64], TCB, 0).unwrap();
    let node = SnpDocumentIssuer::gcp(
        soft_ak(KeyType::Rsa2048, 0x44),
        std::sync::Arc::new(vcek),
        &amd.vcek_chain_pem(),
        ReportFields::default(),
        Some(attestation::snp::gce::InstanceRef {
            project: "fleet-project".to_owned(),
            zone: "europe-west3-a".to_owned(),
            instance: "node-1".to_owned(),
        }),
        soft_issuer::snp::GcpReportData::Bound,
    );
    let dir = tempfile::tempdir().unwrap();
    let saved = save(
        dir.path(),
        "gcp.json",
        Variant::GcpSevSnp,
        node.issue(USER_DATA, &NONCE).unwrap(),
    );
    let (_, config, stderr) = derive(&saved, &[]);
    assert!(config.get("allowedGcpProjects").is_none(), "{config}");
    assert!(
        stderr.contains("pass --gcp-project") && stderr.contains("\"fleet-project\""),
        "{stderr}"
    );
    let (_, config, _) = derive(&saved, &["--gcp-project", "fleet-project"]);
    assert_eq!(config["allowedGcpProjects"], json!(["fleet-project"]));

    let out = tool(&["policy", "--document", &saved, "--service-policy"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a gcp-sev-snp service cannot be verified by nodes"),
        "{stderr}"
    );
}

/// The variable data of an Azure HCL report (at 1236): Azure's runtime data JSON.
fn hcl_runtime_data(hcl: &[u8]) -> Vec<u8> {
    let mut values = serde_json::Deserializer::from_slice(&hcl[1236..]).into_iter::<Value>();
    values.next().unwrap().unwrap();
    hcl[1236..1236 + values.byte_offset()].to_vec()
}

/// An SNP InstanceInfo around a real report, as Constellation's issuers write it.
fn snp_instance_info(report: &[u8], signer: &[u8], chain: &[u8], azure: Option<&[u8]>) -> Vec<u8> {
    json!({
        "ReportSigner": b64(signer),
        "CertChain": b64(chain),
        "AttestationReport": b64(report),
        "Azure": azure.map(|runtime| json!({"RuntimeData": b64(runtime), "MAAToken": ""})),
        "GCP": null,
    })
    .to_string()
    .into_bytes()
}

/// A document around real hardware evidence. Its vTPM quote is a software key's, which the
/// real report does not bind: what is derived from it is checked against the real report alone.
fn real_document(instance_info: &[u8]) -> Vec<u8> {
    soft_ak(KeyType::Rsa2048, 0x44)
        .issue_document_with_instance_info(USER_DATA, &NONCE, Some(instance_info))
        .unwrap()
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(testdata(path)).unwrap()
}

fn snp_verify(
    report: &str,
    signer: &str,
    chain: &str,
    policy: &str,
    variant: &str,
    more: &[&str],
) -> Output {
    let mut args = vec![
        "snp",
        "verify",
        "--json",
        "--report",
        report,
        "--signer",
        signer,
        "--chain",
        chain,
        "--config",
        policy,
        "--variant",
        variant,
    ];
    args.extend_from_slice(more);
    tool(&args)
}

#[test]
fn policies_derived_around_real_snp_reports_accept_those_reports() {
    let dir = tempfile::tempdir().unwrap();

    // AWS: Constellation's test vector, VLEK-signed, version 3 (names its CPU).
    let report = read("snp/constellation-aws/report.bin");
    let info = snp_instance_info(
        &report,
        &read("snp/constellation-aws/vlek.pem"),
        &read("snp/azure-vlekcertchain.pem"),
        None,
    );
    let saved = save(
        dir.path(),
        "aws.json",
        Variant::AwsSevSnp,
        real_document(&info),
    );
    let (policy, config, _) = derive(&saved, &[]);
    // The lowest of reported 4/0/24/217, committed and launch 4/0/24/219.
    assert_eq!(
        (
            &config["bootloaderVersion"],
            &config["teeVersion"],
            &config["snpVersion"],
            &config["microcodeVersion"]
        ),
        (&json!(4), &json!(0), &json!(24), &json!(217)),
        "{config}"
    );
    assert_eq!(
        config["launchMeasurements"],
        json!([
            "5a5cdbad8f540ce4abca0120faec86f62ef7128a4ac711add34d468b5957c82aa2f24e8f111dadc3689b787b88ed0715"
        ])
    );
    let out = snp_verify(
        &testdata("snp/constellation-aws/report.bin"),
        &testdata("snp/constellation-aws/vlek.pem"),
        &testdata("snp/azure-vlekcertchain.pem"),
        &policy,
        "aws-sev-snp",
        &["--at", "2025-06-01T00:00:00Z"],
    );
    assert_verdict(&out, 0, "\"accepted\"");

    // Azure on Milan: a version 2 report, its product named by the ASK in CertChain; the ID key
    // digest is Constellation's default accepted one.
    let hcl = read("snp/azure-milan-vtpm/hcl-report.bin");
    let info = snp_instance_info(
        &hcl[0x20..0x20 + 1184],
        b"",
        &read("snp/azure-certchain.pem"),
        Some(&hcl_runtime_data(&hcl)),
    );
    let saved = save(
        dir.path(),
        "azure.json",
        Variant::AzureSevSnp,
        real_document(&info),
    );
    let (policy, config, _) = derive(&saved, &[]);
    assert!(config.get("minimumTcb").is_none(), "{config}");
    let out = snp_verify(
        &testdata("snp/azure-milan-vtpm/hcl-report.bin"),
        &testdata("snp/azure-milan-vtpm/vcek.pem"),
        &testdata("snp/azure-certchain.pem"),
        &policy,
        "azure-sev-snp",
        &["--from-hcl"],
    );
    assert_verdict(&out, 0, "\"accepted\"");

    // Azure on Genoa: the minimum goes to minimumTcb.Genoa.
    let evidence: Value =
        serde_json::from_slice(&read("snp/azure-genoa-vtpm/evidence-genoa.json")).unwrap();
    let hcl: Vec<u8> = evidence["report"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect();
    let report = &hcl[0x20..0x20 + 1184];
    let report_path = dir.path().join("genoa-report.bin");
    std::fs::write(&report_path, report).unwrap();
    let info = snp_instance_info(report, b"", b"", Some(&hcl_runtime_data(&hcl)));
    let saved = save(
        dir.path(),
        "genoa.json",
        Variant::AzureSevSnp,
        real_document(&info),
    );
    let (policy, config, stderr) = derive(&saved, &[]);
    assert_eq!(
        config["minimumTcb"],
        json!({"Genoa": {"bootloaderVersion": 10, "teeVersion": 0, "snpVersion": 23, "microcodeVersion": 84}}),
        "{config}"
    );
    assert!(stderr.contains("from a Genoa CPU"), "{stderr}");
    assert_eq!(
        config["firmwareSignerConfig"]["acceptedKeyDigests"][0]
            .as_str()
            .unwrap()
            .get(..8),
        Some("942fd93e")
    );
    let out = snp_verify(
        report_path.to_str().unwrap(),
        &testdata("snp/azure-genoa-vtpm/vcek-genoa.pem"),
        &testdata("snp/amd-roots/genoa-ask-ark.pem"),
        &policy,
        "azure-sev-snp",
        &["--at", "2026-01-01T00:00:00Z"],
    );
    assert_verdict(&out, 0, "\"accepted\"");
}

/// Intel's real collateral for FMSPC 00806f050000 laid out as PCS answers.
fn automata_collateral(dir: &Path) -> String {
    let out = dir.join("intel");
    std::fs::create_dir_all(&out).unwrap();
    common::automata_pcs_dir(&out);
    out.to_str().unwrap().to_owned()
}

fn tdx_verify(quote: &str, collateral: &str, policy: &str, variant: &str, at: &str) -> Output {
    tool(&[
        "tdx",
        "verify",
        "--json",
        "--quote",
        quote,
        "--collateral",
        collateral,
        "--config",
        policy,
        "--variant",
        variant,
        "--at",
        at,
    ])
}

#[test]
fn policies_derived_around_real_tdx_quotes_accept_those_quotes() {
    let dir = tempfile::tempdir().unwrap();

    // azure-tdx: the TD quote and the HCL runtime data it binds; Intel's collateral says the
    // platform is OutOfDate, which the operator decides to accept or not.
    let hcl = read("tdx/azure-tdx-vtpm/hcl-report.bin");
    let quote = read("tdx/azure-tdx-vtpm/td-quote.bin");
    let info =
        json!({"AttestationReport": b64(&quote), "RuntimeData": b64(&hcl_runtime_data(&hcl))})
            .to_string()
            .into_bytes();
    let saved = save(
        dir.path(),
        "azure-tdx.json",
        Variant::AzureTdx,
        real_document(&info),
    );
    let collateral = automata_collateral(dir.path());
    let quote_path = testdata("tdx/azure-tdx-vtpm/td-quote.bin");
    let (strict, config, stderr) = derive(&saved, &[]);
    assert_eq!(
        config["mrtds"],
        json!([
            "024a32b070383331181619fa387cb4d55d1e38879f989933055ccad5bc2db795d1737b66205949d15469dc8c1ba7ab7b"
        ])
    );
    assert_eq!(config["xfam"], "e718060000000000");
    assert_eq!(config["qeVendorID"], "939a7233f79c4ca9940a0db3957f0607");
    assert_eq!(config["acceptedTcbStatuses"], json!(["UpToDate"]));
    assert!(stderr.contains("acceptedTcbStatuses"), "{stderr}");
    let out = tdx_verify(&quote_path, &collateral, &strict, "azure-tdx", "1739418641");
    assert_verdict(&out, 1, "tdx_tcb_status");
    let (lenient, _, _) = derive(
        &saved,
        &[
            "--accept-tcb-status",
            "UpToDate",
            "--accept-tcb-status",
            "OutOfDate",
        ],
    );
    let out = tdx_verify(
        &quote_path,
        &collateral,
        &lenient,
        "azure-tdx",
        "1739418641",
    );
    assert_verdict(&out, 0, "\"accepted\"");

    // qemu-tdx: a real quote as the document's RawQuote; MRTD and RTMRs become measurements.
    let quote = read("tdx/dcap-qvl-uptodate/quote.bin");
    let document = json!({"RawQuote": b64(&quote), "UserData": b64(USER_DATA)})
        .to_string()
        .into_bytes();
    let saved = save(dir.path(), "qemu-tdx.json", Variant::QemuTdx, document);
    let (policy, config, _) = derive(&saved, &[]);
    assert_eq!(
        config["measurements"]["0"]["expected"],
        "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7"
    );
    assert_eq!(config["measurements"]["4"]["warnOnly"], true);
    let out = tdx_verify(
        &testdata("tdx/dcap-qvl-uptodate/quote.bin"),
        &testdata("tdx/dcap-qvl-uptodate"),
        &policy,
        "qemu-tdx",
        "1750329148",
    );
    assert_verdict(&out, 0, "\"accepted\"");
}

/// What the simulated `intel` publishes for `machine`'s platform, as the PCS files `verify
/// --collateral-dir` reads, current from an hour ago for a day.
fn simulated_intel_collateral(
    dir: &Path,
    intel: &pcs_standin::SimulatedIntel,
    machine: &soft_issuer::tdx::TdxMachine,
) -> String {
    let now = std::time::SystemTime::now();
    let issued = now - std::time::Duration::from_secs(3600);
    let next = now + std::time::Duration::from_secs(86_400);
    let ca = machine.pck().ca;
    let chain = intel.tcb_issuer_chain_pem();
    let out = dir.join("simulated-intel");
    std::fs::create_dir_all(&out).unwrap();
    for (name, bytes) in [
        (
            "tcb_info.json",
            intel
                .signed_tcb_info(&machine.fmspc_hex(), issued, next)
                .unwrap()
                .into_bytes(),
        ),
        (
            "qe_identity.json",
            intel
                .sign_qe_identity(&intel.qe_identity_json(issued, next).unwrap())
                .unwrap()
                .into_bytes(),
        ),
        ("tcb_info_issuer_chain.pem", chain.clone().into_bytes()),
        ("qe_identity_issuer_chain.pem", chain.into_bytes()),
        ("pck_crl.der", intel.pck_crl(ca, &[], issued, next).unwrap()),
        (
            "pck_crl_issuer_chain.pem",
            intel.pck_issuer_chain_pem(ca).into_bytes(),
        ),
        (
            "root_ca_crl.der",
            intel.root_crl(&[], issued, next).unwrap(),
        ),
    ] {
        std::fs::write(out.join(name), bytes).unwrap();
    }
    out.to_str().unwrap().to_owned()
}

#[test]
fn tdx_policies_admit_their_simulated_node_and_refuse_another_firmware() {
    use soft_issuer::tdx::{ReportData, TdFields, TdxDocumentIssuer, TdxMachine};
    let intel = pcs_standin::SimulatedIntel::new().unwrap();
    let machine = std::sync::Arc::new(TdxMachine::new(&intel, Default::default()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let collateral = simulated_intel_collateral(dir.path(), &intel, &machine);
    let root = dir.path().join("intel-root.pem");
    std::fs::write(&root, intel.root_pem()).unwrap();
    let root = root.to_str().unwrap().to_owned();
    let offline = ["--collateral-dir", collateral.as_str()];
    let other_firmware = TdFields {
        mr_td: [0x7e; 48],
        ..TdFields::default()
    };
    for variant in [Variant::QemuTdx, Variant::AzureTdx] {
        let node = |td: TdFields| match variant {
            Variant::QemuTdx => TdxDocumentIssuer::qemu(machine.clone(), td, ReportData::Bound),
            _ => TdxDocumentIssuer::azure(
                soft_ak(KeyType::Rsa2048, 0x44),
                machine.clone(),
                td,
                ReportData::Bound,
            )
            .unwrap(),
        };
        let saved = save(
            dir.path(),
            &format!("{variant}.json"),
            variant,
            node(TdFields::default())
                .document(USER_DATA, &NONCE)
                .unwrap(),
        );
        let (policy, config, _) = derive(&saved, &["--intel-root-key", &root]);
        assert_eq!(config["mrSeams"], json!(["5e".repeat(48)]), "{config}");
        assert_eq!(config["intelRootKey"], json!(intel.root_pem()));
        match variant {
            Variant::QemuTdx => {
                assert_eq!(config["measurements"]["0"]["expected"], "7d".repeat(48));
                assert_eq!(config["measurements"]["1"]["expected"], "a0".repeat(48));
            }
            _ => {
                assert_eq!(config["mrtds"], json!(["7d".repeat(48)]));
                assert!(config["measurements"]["4"].is_object(), "{config}");
            }
        }
        assert_verdict(&verify(&policy, &saved, &offline), 0, "\"accepted\"");
        let other = save(
            dir.path(),
            "other.json",
            variant,
            node(other_firmware.clone())
                .document(USER_DATA, &NONCE)
                .unwrap(),
        );
        let needle = match variant {
            Variant::QemuTdx => "measurement 0",
            _ => "MRTD",
        };
        assert_verdict(&verify(&policy, &other, &offline), 1, needle);
    }
}

#[test]
fn what_cannot_be_derived_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let document = soft_ak(KeyType::Rsa2048, 0x44)
        .issue(USER_DATA, &NONCE)
        .unwrap();
    let bare = dir.path().join("bare.json");
    std::fs::write(&bare, &document).unwrap();
    let bare = bare.to_str().unwrap();
    let saved = save(dir.path(), "saved.json", Variant::QemuVtpm, document);
    let refused = |args: &[&str], needle: &str| {
        let out = tool(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(&["policy", "--document", bare], "--variant is required: ");
    refused(&["policy", "--config", bare], "--config needs --variant");
    // A bare document names its variant by its shape when only one variant has it.
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([3; 64], TCB, 0).unwrap();
    let azure_snp = SnpDocumentIssuer::azure(
        soft_ak(KeyType::Rsa2048, 0x44),
        &vcek,
        &amd.vcek_chain_pem(),
        fields(0x4d),
    )
    .unwrap();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    let aws_snp = SnpDocumentIssuer::aws(
        soft_ak(KeyType::Rsa2048, 0x44),
        &vlek,
        &amd.vlek_chain_pem(),
        fields(0x4d),
    )
    .unwrap();
    for (variant, document) in [
        ("azure-sev-snp", azure_snp.issue(USER_DATA, &NONCE).unwrap()),
        ("aws-sev-snp", aws_snp.issue(USER_DATA, &NONCE).unwrap()),
    ] {
        let path = dir.path().join(format!("bare-{variant}.json"));
        std::fs::write(&path, document).unwrap();
        let (_, _, stderr) = derive(path.to_str().unwrap(), &[]);
        assert!(
            stderr.starts_with(&format!("attest-tool: {variant} attestation config")),
            "{stderr}"
        );
    }
    refused(
        &["policy", "--document", &saved, "--variant", "qemu-tdx"],
        "--variant qemu-tdx differs from the variant qemu-vtpm saved in",
    );
    refused(
        &["policy", "--document", &saved, "--pin-chip-id"],
        "--pin-chip-id is for the SEV-SNP variants, not qemu-vtpm",
    );
    refused(
        &["policy", "--document", &saved, "--gcp-project", "p"],
        "--gcp-project is for gcp-sev-snp, not qemu-vtpm",
    );
    refused(
        &["policy", "--document", bare, "--variant", "aws-sev-snp"],
        "the document has no InstanceInfo (SNP evidence)",
    );
    refused(
        &["policy", "--document", bare, "--variant", "qemu-tdx"],
        "not a qemu-tdx document",
    );
    refused(
        &[
            "policy",
            "--document",
            bare,
            "--variant",
            "azure-trustedlaunch",
        ],
        "not azure-trustedlaunch",
    );
    // A bare document derives with --variant, but verifying it needs the nonce.
    let (policy, _, _) = derive(bare, &["--variant", "qemu-vtpm"]);
    refused(
        &[
            "verify",
            "--config",
            &policy,
            "--variant",
            "qemu-vtpm",
            bare,
        ],
        "--nonce is required: ",
    );
    let out = verify(
        &policy,
        bare,
        &["--variant", "qemu-vtpm", "--nonce", &hex::encode(NONCE)],
    );
    assert_verdict(&out, 0, "\"accepted\"");
    refused(
        &["verify", "--config", &policy, "--nonce", "00", &saved],
        "--nonce differs from the nonce saved in",
    );
    // The saved user data is checked.
    let out = verify(&policy, &saved, &["--user-data", "00"]);
    assert_verdict(&out, 1, "user_data");
}

#[test]
fn a_service_policy_from_a_control_plane_node_is_the_attestation_config_join_client_reads() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = soft_ak(KeyType::Rsa2048, 0x44);
    let saved = save(
        dir.path(),
        "control-plane.json",
        Variant::QemuVtpm,
        control_plane.issue(USER_DATA, &NONCE).unwrap(),
    );
    let (policy, config, stderr) = derive(&saved, &["--service-policy"]);
    assert_eq!(
        config["trustedAkDigests"],
        json!([hex::encode(attestation::ak_digest(
            control_plane.ak_public()
        ))])
    );
    assert!(
        stderr.contains("--service-policy FILE --service-variant qemu-vtpm")
            && stderr.contains("every control-plane node's"),
        "{stderr}"
    );
    assert_verdict(&verify(&policy, &saved, &[]), 0, "\"accepted\"");
}

#[test]
fn a_policy_from_several_nodes_admits_each_and_refuses_nodes_of_another_image() {
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<String> = [KeyType::Rsa2048, KeyType::EcdsaP256]
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            save(
                dir.path(),
                &format!("node-{i}.json"),
                Variant::QemuVtpm,
                soft_ak(key, 0x44).issue(USER_DATA, &NONCE).unwrap(),
            )
        })
        .collect();
    let (policy, config, stderr) = derive(&nodes[0], &["--document", &nodes[1]]);
    assert_eq!(config["trustedAkDigests"].as_array().unwrap().len(), 2);
    assert!(
        stderr.contains("node-0.json, ") && stderr.contains("node-1.json"),
        "{stderr}"
    );
    for node in &nodes {
        assert_verdict(&verify(&policy, node, &[]), 0, "\"accepted\"");
    }
    let third = save(
        dir.path(),
        "node-2.json",
        Variant::QemuVtpm,
        soft_ak(KeyType::EcdsaP256, 0x44)
            .issue(USER_DATA, &NONCE)
            .unwrap(),
    );
    assert_verdict(&verify(&policy, &third, &[]), 1, "attestation key");

    // Another image's node cannot be folded into the same config.
    let reimaged = save(
        dir.path(),
        "reimaged.json",
        Variant::QemuVtpm,
        soft_ak(KeyType::EcdsaP256, 0x45)
            .issue(USER_DATA, &NONCE)
            .unwrap(),
    );
    let out = tool(&["policy", "--document", &nodes[0], "--document", &reimaged]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "measurement 4 differs between {} ({})",
            nodes[0],
            hex::encode([0x44; 32])
        )) && stderr.contains(&format!("and {reimaged} ({})", hex::encode([0x45; 32]))),
        "{stderr}"
    );
    // Nor another variant's.
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    let aws = save(
        dir.path(),
        "aws.json",
        Variant::AwsSevSnp,
        SnpDocumentIssuer::aws(
            soft_ak(KeyType::Rsa2048, 0x44),
            &vlek,
            &amd.vlek_chain_pem(),
            fields(0x4d),
        )
        .unwrap()
        .issue(USER_DATA, &NONCE)
        .unwrap(),
    );
    let out = tool(&["policy", "--document", &nodes[0], "--document", &aws]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is a qemu-vtpm document and") && stderr.contains("a aws-sev-snp one"),
        "{stderr}"
    );
}

#[test]
fn an_snp_policy_from_several_machines_takes_the_lowest_tcb_and_every_launch_and_chip() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (root, collateral) = amd_files(dir.path(), &amd);
    let at = AT.to_string();
    let offline = ["--at", at.as_str(), "--collateral-dir", collateral.as_str()];
    let machines = [
        (amd.chip([3; 64], TCB, 0).unwrap(), 0x4d),
        (amd.chip([4; 64], Tcb { snp: 9, ..TCB }, 0).unwrap(), 0x4e),
    ];
    let nodes: Vec<String> = machines
        .iter()
        .enumerate()
        .map(|(i, (vcek, measurement))| {
            let node = SnpDocumentIssuer::azure(
                soft_ak(KeyType::Rsa2048, 0x44),
                vcek,
                &amd.vcek_chain_pem(),
                fields(*measurement),
            )
            .unwrap();
            save(
                dir.path(),
                &format!("machine-{i}.json"),
                Variant::AzureSevSnp,
                node.issue(USER_DATA, &NONCE).unwrap(),
            )
        })
        .collect();
    let (policy, config, _) = derive(
        &nodes[1],
        &[
            "--document",
            &nodes[0],
            "--amd-root-key",
            &root,
            "--pin-chip-id",
        ],
    );
    assert_eq!(config["snpVersion"], 8, "{config}");
    assert_eq!(
        config["launchMeasurements"],
        json!(["4e".repeat(48), "4d".repeat(48)])
    );
    assert_eq!(
        config["allowedChipIds"],
        json!(["04".repeat(64), "03".repeat(64)])
    );
    for node in &nodes {
        assert_verdict(&verify(&policy, node, &offline), 0, "\"accepted\"");
    }
}

#[test]
fn an_azure_tdx_policy_from_two_firmwares_admits_both_and_qemu_tdx_refuses_to_mix_them() {
    use soft_issuer::tdx::{ReportData, TdFields, TdxDocumentIssuer, TdxMachine};
    let intel = pcs_standin::SimulatedIntel::new().unwrap();
    let machine = std::sync::Arc::new(TdxMachine::new(&intel, Default::default()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let collateral = simulated_intel_collateral(dir.path(), &intel, &machine);
    let root = dir.path().join("intel-root.pem");
    std::fs::write(&root, intel.root_pem()).unwrap();
    let root = root.to_str().unwrap().to_owned();
    let firmwares = [
        TdFields::default(),
        TdFields {
            mr_td: [0x7e; 48],
            ..TdFields::default()
        },
    ];
    let mut azure = Vec::new();
    let mut qemu = Vec::new();
    for (i, td) in firmwares.iter().enumerate() {
        let node = TdxDocumentIssuer::azure(
            soft_ak(KeyType::Rsa2048, 0x44),
            machine.clone(),
            td.clone(),
            ReportData::Bound,
        )
        .unwrap();
        azure.push(save(
            dir.path(),
            &format!("azure-{i}.json"),
            Variant::AzureTdx,
            node.document(USER_DATA, &NONCE).unwrap(),
        ));
        let node = TdxDocumentIssuer::qemu(machine.clone(), td.clone(), ReportData::Bound);
        qemu.push(save(
            dir.path(),
            &format!("qemu-{i}.json"),
            Variant::QemuTdx,
            node.document(USER_DATA, &NONCE).unwrap(),
        ));
    }
    let (policy, config, _) = derive(
        &azure[0],
        &["--document", &azure[1], "--intel-root-key", &root],
    );
    assert_eq!(config["mrtds"], json!(["7d".repeat(48), "7e".repeat(48)]));
    for node in &azure {
        let out = verify(&policy, node, &["--collateral-dir", &collateral]);
        assert_verdict(&out, 0, "\"accepted\"");
    }
    // qemu-tdx measures the MRTD as measurement 0: two firmwares are two images.
    let out = tool(&["policy", "--document", &qemu[0], "--document", &qemu[1]]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("measurement 0 differs between"), "{stderr}");
}
