//! aws-sev-snp and azure-sev-snp documents from simulated hardware through the real validator:
//! accepted when every link holds, refused with the specific error when one does not.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::snp::{
    Cert, Crl, Product, SigningKey, SnpConfig, SnpError, SnpPolicyError, StaticCollateral, Tcb,
};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Error, Issuer, Measurement, Policy, Validator, Variant};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];
const NOW: i64 = 1_795_564_800; // 2026-11-25
const MIN: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

fn ak(key: KeyType) -> SoftIssuer {
    SoftIssuer::new(key)
        .unwrap()
        .with_pcrs([(4, [0x44; 32]), (9, [0x99; 32])])
        .unwrap()
}

fn policy() -> Policy {
    Policy::new(
        [(4, [0x44; 32]), (9, [0x99; 32])]
            .into_iter()
            .map(|(i, v)| {
                (
                    i,
                    Measurement {
                        expected: v.to_vec(),
                        warn_only: false,
                    },
                )
            })
            .collect(),
    )
    .unwrap()
}

fn snp_config(amd: &SimulatedAmd) -> SnpConfig {
    let json = serde_json::json!({
        "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
        "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
        "amdRootKey": amd.ark_pem(),
    });
    SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap()
}

fn empty_crl(amd: &SimulatedAmd) -> Crl {
    let now = u64::try_from(NOW).unwrap();
    Crl::from_der(amd.crl(&[], now - 3600, now + 86_400).unwrap()).unwrap()
}

fn validator(binding: Binding, config: SnpConfig, collateral: StaticCollateral) -> SevSnpValidator {
    SevSnpValidator::new(binding, policy(), config, Arc::new(collateral))
        .with_clock(Arc::new(|| NOW))
}

fn collateral(amd: &SimulatedAmd) -> StaticCollateral {
    StaticCollateral::new().with_crl(amd.product(), empty_crl(amd))
}

struct Aws {
    amd: SimulatedAmd,
    node: SnpDocumentIssuer,
}

fn aws(fields: ReportFields) -> Aws {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("cc-eu-west-1.aws.example", MIN).unwrap();
    let node = SnpDocumentIssuer::aws(ak(KeyType::EcdsaP256), &vlek, &amd.vlek_chain_pem(), fields)
        .unwrap();
    Aws { amd, node }
}

fn validate(v: &SevSnpValidator, node: &dyn Issuer) -> Result<attestation::Verified, Error> {
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    v.validate(&doc, NONCE)
}

#[test]
fn an_aws_node_is_accepted_and_the_audit_names_the_hardware() {
    let Aws { amd, node } = aws(ReportFields::default());
    assert_eq!(node.variant(), Variant::AwsSevSnp);
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert_eq!(v.variant(), Variant::AwsSevSnp);
    let verified = validate(&v, &node).unwrap();
    assert_eq!(verified.user_data, USER_DATA);
    assert!(
        verified.notes[0].contains("SEV-SNP Milan"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[0].contains("VLEK of cc-eu-west-1.aws.example"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[0].contains("reported TCB bl 3 tee 0 snp 8 ucode 115"),
        "{:?}",
        verified.notes
    );
    // The nonce binding of the vTPM quote still holds.
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    assert!(matches!(
        v.validate(&doc, b"another nonce").unwrap_err(),
        Error::NonceMismatch { .. }
    ));
}

#[test]
fn an_aws_report_that_vouches_for_another_key_is_refused() {
    let Aws { amd, node } = aws(ReportFields::default());
    // The same hardware evidence, presented by another AK.
    let thief = SnpDocumentIssuer::from_parts(
        Variant::AwsSevSnp,
        ak(KeyType::EcdsaP256),
        node.instance_info().to_vec(),
    );
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert!(matches!(
        validate(&v, &thief).unwrap_err(),
        Error::Binding(_)
    ));
}

#[test]
fn hardware_policy_refusals_name_the_check() {
    type Change = fn(&mut ReportFields);
    type Expect = fn(&Error) -> bool;
    let cases: [(Change, Expect); 4] = [
        (
            |f| f.policy |= 1 << 19,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::Debug)),
        ),
        (
            |f| f.vmpl = 2,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::Vmpl(2))),
        ),
        (
            |f| f.launch_tcb = Some(Tcb { snp: 7, ..MIN }),
            |e| {
                matches!(
                    e,
                    Error::SnpPolicy(SnpPolicyError::TcbBelowMinimum {
                        which: "launch",
                        ..
                    })
                )
            },
        ),
        (
            |f| f.policy |= 1 << 18,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::MigrationAgent)),
        ),
    ];
    for (change, expected) in cases {
        let mut fields = ReportFields::default();
        change(&mut fields);
        let Aws { amd, node } = aws(fields);
        let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
        let error = validate(&v, &node).unwrap_err();
        assert!(expected(&error), "{error}");
        assert!(!error.is_unavailable());
    }
}

#[test]
fn an_untrusted_root_a_revoked_intermediate_and_missing_collateral() {
    let Aws { amd, node } = aws(ReportFields::default());
    // AMD's built-in roots, not the simulated one: the ARK the configuration trusts for Milan
    // (AMD's) did not sign the simulated ASVK.
    let builtin = SnpConfig::from_attestation_config(
        br#"{"bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115}"#,
    )
    .unwrap();
    let v = validator(Binding::Aws, builtin, collateral(&amd));
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::ChainSignature {
            which: "intermediate",
            ..
        })
    ));

    // The ASVK (serial 3) revoked.
    let now = u64::try_from(NOW).unwrap();
    let revoked = StaticCollateral::new().with_crl(
        Product::Milan,
        Crl::from_der(amd.crl(&[3], now - 3600, now + 86_400).unwrap()).unwrap(),
    );
    let v = validator(Binding::Aws, snp_config(&amd), revoked);
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::Revoked { .. })
    ));

    // No CRL to be had: the node is told to retry, not refused.
    let v = validator(Binding::Aws, snp_config(&amd), StaticCollateral::new());
    let error = validate(&v, &node).unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

#[test]
fn an_aws_report_signed_by_a_vcek_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([7; 64], MIN, 0).unwrap();
    let node = SnpDocumentIssuer::azure(
        ak(KeyType::Rsa2048),
        &vcek,
        &amd.vcek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::ReportField(_))
    ));
}

struct Azure {
    amd: SimulatedAmd,
    vcek: soft_issuer::snp::SimulatedSigner,
    node: SnpDocumentIssuer,
}

fn azure(product: Product) -> Azure {
    let amd = SimulatedAmd::new(product).unwrap();
    let vcek = amd.chip([9; 64], MIN, 0).unwrap();
    let node = SnpDocumentIssuer::azure(
        ak(KeyType::Rsa2048),
        &vcek,
        &amd.vcek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    Azure { amd, vcek, node }
}

#[test]
fn azure_nodes_of_every_product_are_accepted() {
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        let Azure { amd, node, .. } = azure(product);
        let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
        let verified = validate(&v, &node).unwrap();
        assert_eq!(verified.variant, Variant::AzureSevSnp);
        assert!(
            verified.notes[0].contains(&format!("SEV-SNP {product}")),
            "{:?}",
            verified.notes
        );
    }
}

#[test]
fn azure_runtime_data_must_hash_into_the_report_and_name_the_ak() {
    let Azure { amd, vcek, node } = azure(Product::Milan);
    let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
    let info: serde_json::Value = serde_json::from_slice(node.instance_info()).unwrap();

    // Runtime data changed after the report was made.
    let mut changed = info.clone();
    changed["Azure"]["RuntimeData"] = serde_json::Value::String(base64_of(b"{\"keys\":[]}"));
    let tampered = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        changed.to_string().into_bytes(),
    );
    let error = validate(&v, &tampered).unwrap_err();
    assert!(
        matches!(error, Error::Binding(ref m) if m.contains("SHA-256")),
        "{error}"
    );

    // The report and runtime data of one node, presented by another AK. (Every RSA soft AK is
    // the one shipped test key, so the other AK here is an ECDSA one.)
    let thief = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::EcdsaP256),
        node.instance_info().to_vec(),
    );
    let error = validate(&v, &thief).unwrap_err();
    assert!(matches!(error, Error::Binding(_)), "{error}");
    let _ = vcek;
}

#[test]
fn a_vcek_the_document_lacks_comes_from_the_collateral_source() {
    let Azure { amd, vcek, node } = azure(Product::Genoa);
    let bare = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        node.instance_info_without_certificates().unwrap(),
    );

    // Nothing to fetch from: retry later.
    let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
    assert!(validate(&v, &bare).unwrap_err().is_unavailable());

    let cert = |der: &[u8]| Cert::from_der(der.to_vec()).unwrap();
    let full = collateral(&amd)
        .with_vcek(Product::Genoa, &[9; 64], MIN, cert(vcek.cert_der()))
        .with_intermediate(Product::Genoa, SigningKey::Vcek, cert(amd.ask_der()));
    let v = validator(Binding::Azure, snp_config(&amd), full);
    validate(&v, &bare).unwrap();
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
