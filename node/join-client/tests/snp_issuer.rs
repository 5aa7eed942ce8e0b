//! join-client's aws-sev-snp issuer on a real TPM (swtpm) and a simulated SNP guest kernel
//! (soft-issuer's configfs-tsm): its documents pass the aws-sev-snp validator the service runs,
//! configured with the simulated AMD root, and a broken guest interface fails the issue with
//! the reason, before anything is sent.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::snp::{Product, StaticCollateral};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Issuer, Validator, Variant};
use snp_issuer::certtable::{CertTable, Guid};
use snp_issuer::configfs::ConfigfsTsm;
use soft_issuer::snp::{ReportFields, SimulatedAmd};
use soft_issuer::tsm::FakeConfigfsTsm;
use testsupport::harness::extended_once;
use testsupport::snp::{TCB, attestation_config_enforcing, current_crl};
use testsupport::swtpm::Swtpm;
use tpm_issuer::aws_sev_snp::AwsSnpIssuer;

fn tpm(swtpm: &Swtpm) -> tpm_issuer::TpmIssuer {
    tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(swtpm.tcti())).unwrap()
}

fn aws_validator(amd: &SimulatedAmd, pcr9: [u8; 32]) -> SevSnpValidator {
    let config = attestation_config_enforcing(
        amd,
        serde_json::json!({"9": {"expected": hex::encode(pcr9), "warnOnly": false}}),
    );
    let collateral = StaticCollateral::new().with_crl(Product::Milan, current_crl(amd).unwrap());
    SevSnpValidator::from_attestation_config(Binding::Aws, config.as_bytes(), Arc::new(collateral))
        .unwrap()
        .0
}

#[test]
fn documents_from_the_tpm_and_configfs_tsm_pass_the_aws_validator() {
    let swtpm = Swtpm::start().unwrap();
    swtpm.extend_pcr(9, &[0x99; 32]).unwrap();
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-eu-central-1.amazonaws.com", TCB).unwrap();
    let fake = Arc::new(FakeConfigfsTsm::aws(&amd, vlek, ReportFields::default()).unwrap());
    let source = ConfigfsTsm::with_fs(fake.clone(), fake.root());
    let issuer = AwsSnpIssuer::new(tpm(&swtpm), Box::new(source)).unwrap();
    assert_eq!(issuer.variant(), Variant::AwsSevSnp);

    let validator = aws_validator(&amd, extended_once(&[0x99; 32]));
    for nonce in [[1u8; 32], [2u8; 32]] {
        let document = issuer.issue(b"user data", &nonce).unwrap();
        let verified = validator
            .validate(&document, &nonce)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verified.user_data, b"user data");
        assert!(
            verified.notes[0].contains("VLEK of CN=cc-eu-central-1.amazonaws.com"),
            "{:?}",
            verified.notes
        );
        // Bound to its nonce.
        let other = [9u8; 32];
        assert!(validator.validate(&document, &other).is_err());
    }
    // A fresh report per document, and no entry left behind.
    assert_eq!(fake.reports_made(), 2);
    assert_eq!(fake.entries_present().unwrap(), 0);

    // The same documents fail a policy expecting other measurements: the PCRs count too.
    let strict = aws_validator(&amd, [0x42; 32]);
    let document = issuer.issue(b"user data", &[1; 32]).unwrap();
    let err = strict
        .validate(&document, &[1; 32])
        .unwrap_err()
        .to_string();
    assert!(err.contains("measurement 9"), "{err}");
}

#[test]
fn a_guest_whose_host_gives_no_vlek_cannot_issue_and_says_why() {
    let swtpm = Swtpm::start().unwrap();
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let ask = amd.asvk_der().to_vec();
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        let report = vlek.report(&fields).map_err(std::io::Error::other)?;
        Ok((report, Some(CertTable::encode(&[(Guid::ASK, &ask)]))))
    }))
    .unwrap();
    let root = fake.root().to_owned();
    let issuer =
        AwsSnpIssuer::new(tpm(&swtpm), Box::new(ConfigfsTsm::with_fs(fake, root))).unwrap();
    let err = issuer.issue(b"u", &[0; 32]).unwrap_err();
    assert_eq!(err.variant, Variant::AwsSevSnp);
    assert!(
        err.reason
            .contains("the host's certificate table has no VLEK (it lists ASK(4ab7b379"),
        "{}",
        err.reason
    );
}

#[test]
fn a_guest_of_another_tsm_cannot_issue_and_says_why() {
    let swtpm = Swtpm::start().unwrap();
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let fake = FakeConfigfsTsm::aws(&amd, vlek, ReportFields::default())
        .unwrap()
        .with_provider("tdx_guest");
    let root = fake.root().to_owned();
    let issuer =
        AwsSnpIssuer::new(tpm(&swtpm), Box::new(ConfigfsTsm::with_fs(fake, root))).unwrap();
    let err = issuer.issue(b"u", &[0; 32]).unwrap_err();
    assert!(
        err.reason
            .contains("provider is \"tdx_guest\", not \"sev_guest\""),
        "{}",
        err.reason
    );
}
