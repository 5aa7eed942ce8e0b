//! azure-sev-snp documents from a real TPM (swtpm) on which Azure's paravisor is played
//! (testsupport::azure: the AK persisted at 0x81000003, an HCL report in NV index 0x01400001
//! holding a report from soft-issuer's simulated AMD): the real validator accepts them with
//! the simulated VCEK, chain and CRL as its collateral, and refuses or the issuer says why when
//! the runtime data names another key, the NV index is missing or the report is cut short.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::snp::{Cert, Product, SigningKey, StaticCollateral};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Issuer, Variant};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SimulatedSigner};
use testsupport::harness::extended_once;
use testsupport::snp::{TCB, attestation_config_enforcing, current_crl};
use testsupport::swtpm::Swtpm;
use tpm_issuer::azure::sev_snp::AzureSnpIssuer;

mod common;
use common::{assert_accepted, assert_refused};

struct Machine {
    amd: SimulatedAmd,
    vcek: SimulatedSigner,
}

fn machine() -> Machine {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([0x3c; 64], TCB, 1).unwrap();
    Machine { amd, vcek }
}

fn validator(m: &Machine, pcr9: [u8; 32]) -> SevSnpValidator {
    let config = attestation_config_enforcing(
        &m.amd,
        serde_json::json!({"9": {"expected": hex::encode(pcr9), "warnOnly": false}}),
    );
    let collateral = StaticCollateral::new()
        .with_crl(Product::Milan, current_crl(&m.amd).unwrap())
        .with_vcek(
            Product::Milan,
            &m.vcek.hw_id().unwrap(),
            TCB,
            Cert::from_der(m.vcek.cert_der().to_vec()).unwrap(),
        )
        .with_intermediate(
            Product::Milan,
            SigningKey::Vcek,
            Cert::from_der(m.amd.ask_der().to_vec()).unwrap(),
        );
    SevSnpValidator::from_attestation_config(
        Binding::Azure,
        config.as_bytes(),
        Arc::new(collateral),
    )
    .unwrap()
    .0
}

#[test]
fn documents_from_the_hcl_report_pass_the_azure_validator() {
    let swtpm = Swtpm::start().unwrap();
    swtpm.extend_pcr(9, &[0x99; 32]).unwrap();
    let m = machine();
    testsupport::azure::boot_snp(&swtpm, &m.vcek, ReportFields::default(), None).unwrap();
    let issuer = AzureSnpIssuer::open(&swtpm.tcti()).unwrap();
    assert_eq!(issuer.variant(), Variant::AzureSevSnp);

    let accepting = validator(&m, extended_once(&[0x99; 32]));
    assert_accepted(&issuer, &accepting, "VCEK of chip 3c3c");
    // The PCRs count too.
    assert_refused(&issuer, &validator(&m, [0x42; 32]), "measurement 9");
}

#[test]
fn runtime_data_naming_another_key_is_refused() {
    let swtpm = Swtpm::start().unwrap();
    let m = machine();
    // A consistent HCL report (the SNP report binds this runtime data), but the key it names
    // is another TPM's, not the one persisted here.
    let other = soft_issuer::SoftIssuer::rsa_2048().unwrap();
    let runtime = soft_issuer::snp::azure_runtime_data_for(&other).unwrap();
    testsupport::azure::boot_snp(&swtpm, &m.vcek, ReportFields::default(), Some(runtime)).unwrap();
    let issuer = AzureSnpIssuer::open(&swtpm.tcti()).unwrap();
    assert_refused(
        &issuer,
        &validator(&m, [0; 32]),
        "the runtime data's keys[0] is not the attestation key",
    );
}

#[test]
fn a_tpm_without_the_hcl_report_cannot_issue_and_says_why() {
    let swtpm = Swtpm::start().unwrap();
    // No paravisor at all: not even the AK.
    let err = AzureSnpIssuer::open(&swtpm.tcti()).unwrap_err();
    assert_eq!(
        format!("{err}: {}", std::error::Error::source(&err).unwrap()),
        "opening the HCL's attestation key: no key is persisted at handle 0x81000003"
    );

    // The AK, but no report.
    testsupport::azure::persist_hcl_ak(&swtpm).unwrap();
    let issuer = AzureSnpIssuer::open(&swtpm.tcti()).unwrap();
    let err = issuer.issue(b"u", &[1; 32]).unwrap_err();
    assert_eq!(err.variant, Variant::AzureSevSnp);
    assert!(
        err.reason.starts_with(
            "reading Azure's HCL report from the vTPM (NV index 0x01400001); is this an Azure \
             confidential VM?: NV index 0x01400001 is not defined"
        ),
        "{}",
        err.reason
    );
}

#[test]
fn a_truncated_hcl_report_cannot_issue_and_says_why() {
    let m = machine();
    let fields = ReportFields::default();
    // What the paravisor would write, cut inside the SNP report and inside the runtime data.
    let probe = Swtpm::start().unwrap();
    let full = testsupport::azure::boot_snp(&probe, &m.vcek, fields.clone(), None).unwrap();
    drop(probe);
    for (cut, expected) in [
        (
            1000,
            "1000 bytes end before the report type (which needs 1228)",
        ),
        (
            full.len() - 10,
            "bytes end before the end of the runtime data",
        ),
    ] {
        let swtpm = Swtpm::start().unwrap();
        testsupport::azure::persist_hcl_ak(&swtpm).unwrap();
        testsupport::azure::write_hcl_report(&swtpm, &full[..cut]).unwrap();
        let issuer = AzureSnpIssuer::open(&swtpm.tcti()).unwrap();
        let err = issuer.issue(b"u", &[1; 32]).unwrap_err();
        assert!(
            err.reason.starts_with("Azure's HCL report is unusable: ")
                && err.reason.contains(expected),
            "{}",
            err.reason
        );
    }
}
