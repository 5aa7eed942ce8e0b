//! deploy/examples for the SNP variants: each attestation config is a valid policy of its
//! variant once the image's measurements are filled in, and passes the real reports of the test
//! vectors it corresponds to.

mod common;

use std::sync::Arc;

use attestation::snp::{
    Cert, Product, Report, SnpConfig, SnpPolicyError, StaticCollateral, Trust, VerifiedReport,
    certs_from_pem, verify_report,
};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use common::*;
use serde_json::Value;

fn vector(path: &str) -> Vec<u8> {
    std::fs::read(
        deploy_dir()
            .join("../lib/attestation/testdata/snp")
            .join(path),
    )
    .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// 2026-11-25 and 2025-06-01, seconds since the epoch.
const TODAY: i64 = 1_795_564_800;
const JUNE_2025: i64 = 1_748_736_000;

fn verified(report: &[u8], leaf: Cert, chain: &str, at: i64) -> VerifiedReport {
    let mut chain = certs_from_pem(&vector(chain)).expect("chain");
    let ark = chain.pop().expect("ARK");
    let intermediate = chain.pop().expect("ASK");
    let report = Report::parse(report).expect("report");
    verify_report(&report, &leaf, &intermediate, &ark, &Trust::builtin(), at).expect("verifies")
}

fn azure_milan() -> VerifiedReport {
    verified(
        &vector("milan-azure-trustee/test-report.bin"),
        Cert::from_der(vector("milan-azure-trustee/test-vcek.der")).expect("VCEK"),
        "azure-certchain.pem",
        TODAY,
    )
}

fn azure_genoa() -> VerifiedReport {
    let evidence: Value =
        serde_json::from_slice(&vector("azure-genoa-vtpm/evidence-genoa.json")).expect("JSON");
    let hcl: Vec<u8> = evidence["report"]
        .as_array()
        .expect("report")
        .iter()
        .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
        .collect();
    let vcek = certs_from_pem(evidence["vcek"].as_str().expect("vcek").as_bytes())
        .expect("PEM")
        .remove(0);
    verified(
        &hcl[0x20..0x20 + 1184],
        vcek,
        "amd-roots/genoa-ask-ark.pem",
        TODAY,
    )
}

fn aws() -> VerifiedReport {
    let vlek = certs_from_pem(&vector("constellation-aws/vlek.pem"))
        .expect("PEM")
        .remove(0);
    verified(
        &vector("constellation-aws/report.bin"),
        vlek,
        "azure-vlekcertchain.pem",
        JUNE_2025,
    )
}

#[test]
fn the_example_configs_are_valid_snp_policies_of_their_variant_once_measured() {
    for (name, binding) in [
        ("aws-sev-snp.attestationConfig.json", Binding::Aws),
        ("azure-sev-snp.attestationConfig.json", Binding::Azure),
        ("gcp-sev-snp.attestationConfig.json", Binding::Gcp),
    ] {
        let config = measured_example(name);
        let (validator, digest) = SevSnpValidator::from_attestation_config(
            binding,
            config.to_string().as_bytes(),
            Arc::new(StaticCollateral::new()),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(digest.len(), 64, "{name}");
        assert!(validator.policy().enforces_any(), "{name}");
    }
}

/// azure-sev-snp's example accepts Azure's real Milan and Genoa reports (their ID key digests,
/// each product's minimum TCB), and leaves Turin, of which no Azure report is known, refused by
/// name; without `firmwareSignerConfig` it is no valid azure-sev-snp policy.
#[test]
fn the_azure_sev_snp_example_accepts_azures_real_reports() {
    let config = measured_example("azure-sev-snp.attestationConfig.json");
    let snp = SnpConfig::for_variant(
        attestation::Variant::AzureSevSnp,
        config.to_string().as_bytes(),
    )
    .expect("valid");
    assert_eq!(snp.check(&azure_milan()), Ok(vec![]));
    let genoa = azure_genoa();
    assert_eq!(genoa.product(), Product::Genoa);
    assert_eq!(snp.check(&genoa), Ok(vec![]));
    assert!(snp.minimum_tcb.for_product(Product::Turin).is_none());

    let mut without = config.clone();
    without
        .as_object_mut()
        .expect("object")
        .remove("firmwareSignerConfig");
    let error = SevSnpValidator::from_attestation_config(
        Binding::Azure,
        without.to_string().as_bytes(),
        Arc::new(StaticCollateral::new()),
    )
    .expect_err("unpinned");
    assert!(
        error.to_string().contains("needs firmwareSignerConfig"),
        "{error}"
    );
}

/// aws-sev-snp's example accepts Constellation's real AWS report (Milan), and, setting no
/// Genoa minimum, refuses a Genoa report by name.
#[test]
fn the_aws_sev_snp_example_accepts_the_real_aws_report() {
    let config = measured_example("aws-sev-snp.attestationConfig.json");
    let snp = SnpConfig::for_variant(
        attestation::Variant::AwsSevSnp,
        config.to_string().as_bytes(),
    )
    .expect("valid");
    assert_eq!(snp.check(&aws()), Ok(vec![]));
    assert_eq!(
        snp.check(&azure_genoa()),
        Err(SnpPolicyError::NoMinimumTcb(Product::Genoa))
    );
}
