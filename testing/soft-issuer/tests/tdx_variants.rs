//! qemu-tdx and azure-tdx documents from simulated TDX machines through the real validator,
//! with collateral a simulated Intel signed and trusted only through `intelRootKey`: accepted
//! when every link holds, refused with the specific error when one does not.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use attestation::tdx::collateral::PcsResponses;
use attestation::tdx::{
    Collateral, StaticCollateral, TcbStatus, TdQuote, TdxError, TdxPolicyError,
};
use attestation::variants::tdx::{TdxKind, TdxValidator, parse_azure_instance_info};
use attestation::{Error, Issuer, Validator, Variant};
use pcs_standin::intel::{
    OUT_OF_DATE_ADVISORY, OUT_OF_DATE_PCE_SVN, OUT_OF_DATE_SGX_TCB_SVNS, OUT_OF_DATE_TDX_TCB_SVNS,
    PCE_SVN, SGX_TCB_SVNS,
};
use pcs_standin::{PckCa, SimulatedIntel};
use soft_issuer::tdx::{
    MRSEAM, MRTD, PckSpec, QuoteVersion, RTMRS, ReportData, TD_ATTRIBUTES_DEBUG,
    TD_ATTRIBUTES_SEPT_VE_DISABLE, TdFields, TdxDocumentIssuer, TdxMachine,
};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
}

/// `intel`'s collateral for `fmspc` and `ca`, issued an hour ago for a day, its PCK CRL revoking
/// `revoked`.
fn collateral(intel: &SimulatedIntel, fmspc: &str, ca: PckCa, revoked: &[u64]) -> Collateral {
    let issued = now() - Duration::from_secs(3600);
    let next = now() + Duration::from_secs(86_400);
    let tcb = intel.signed_tcb_info(fmspc, issued, next).unwrap();
    let qe = intel
        .sign_qe_identity(&intel.qe_identity_json(issued, next).unwrap())
        .unwrap();
    let chain = intel.tcb_issuer_chain_pem();
    Collateral::from_pcs(PcsResponses {
        tcb_info: tcb.as_bytes(),
        tcb_info_issuer_chain: &chain,
        qe_identity: qe.as_bytes(),
        qe_identity_issuer_chain: &chain,
        pck_crl: &intel.pck_crl(ca, revoked, issued, next).unwrap(),
        pck_crl_issuer_chain: &intel.pck_issuer_chain_pem(ca),
        root_ca_crl: &intel.root_crl(&[], issued, next).unwrap(),
    })
    .unwrap()
}

fn hex48(v: &[u8; 48]) -> String {
    hex::encode(v)
}

/// The qemu-tdx config: MRTD and RTMR0..3 enforced at 0..4, `intel`'s root trusted.
fn qemu_config(intel: &SimulatedIntel) -> serde_json::Value {
    let mut measurements = serde_json::Map::new();
    for (i, value) in std::iter::once(MRTD).chain(RTMRS).enumerate() {
        measurements.insert(
            i.to_string(),
            serde_json::json!({ "expected": hex48(&value), "warnOnly": false }),
        );
    }
    serde_json::json!({
        "measurements": measurements, "intelRootKey": intel.root_pem(),
        "mrSeams": [hex48(&MRSEAM)],
    })
}

const PCRS: [(u32, [u8; 32]); 2] = [(4, [0x44; 32]), (9, [0x99; 32])];

/// The azure-tdx config: the vTPM's PCRs 4 and 9 enforced, `intel`'s root trusted.
fn azure_config(intel: &SimulatedIntel) -> serde_json::Value {
    let measurements: serde_json::Map<_, _> = PCRS
        .iter()
        .map(|(i, v)| {
            (
                i.to_string(),
                serde_json::json!({ "expected": hex::encode(v), "warnOnly": false }),
            )
        })
        .collect();
    serde_json::json!({
        "measurements": measurements, "intelRootKey": intel.root_pem(),
        "mrtds": [hex48(&MRTD)], "mrSeams": [hex48(&MRSEAM)],
    })
}

fn validator(kind: TdxKind, config: &serde_json::Value, collateral: Collateral) -> TdxValidator {
    let (v, _) = TdxValidator::from_attestation_config(
        kind,
        config.to_string().as_bytes(),
        Arc::new(StaticCollateral::new().with(collateral)),
    )
    .unwrap();
    v
}

fn validate(v: &TdxValidator, node: &dyn Issuer) -> Result<attestation::Verified, Error> {
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    v.validate(&doc, NONCE)
}

struct Site {
    intel: SimulatedIntel,
    machine: Arc<TdxMachine>,
}

fn site(pck: PckSpec) -> Site {
    let intel = SimulatedIntel::new().unwrap();
    let machine = Arc::new(TdxMachine::new(&intel, pck).unwrap());
    Site { intel, machine }
}

impl Site {
    fn collateral(&self, revoked: &[u64]) -> Collateral {
        collateral(
            &self.intel,
            &self.machine.fmspc_hex(),
            self.machine.pck().ca,
            revoked,
        )
    }

    fn qemu(&self, td: TdFields) -> TdxDocumentIssuer {
        TdxDocumentIssuer::qemu(self.machine.clone(), td, ReportData::Bound)
    }

    fn azure(&self, td: TdFields) -> TdxDocumentIssuer {
        TdxDocumentIssuer::azure(azure_ak(), self.machine.clone(), td, ReportData::Bound).unwrap()
    }

    fn qemu_validator(&self) -> TdxValidator {
        validator(
            TdxKind::Qemu,
            &qemu_config(&self.intel),
            self.collateral(&[]),
        )
    }

    fn azure_validator(&self) -> TdxValidator {
        validator(
            TdxKind::Azure,
            &azure_config(&self.intel),
            self.collateral(&[]),
        )
    }
}

fn azure_ak() -> SoftIssuer {
    SoftIssuer::new(KeyType::Rsa2048)
        .unwrap()
        .with_pcrs(PCRS)
        .unwrap()
}

#[test]
fn the_pck_extension_and_quote_read_as_the_verifier_reads_real_ones() {
    for ca in [PckCa::Platform, PckCa::Processor] {
        let s = site(PckSpec {
            ca,
            ..PckSpec::default()
        });
        let doc = s.qemu(TdFields::default()).issue(USER_DATA, NONCE).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(json["RawQuote"].as_str().unwrap())
            .unwrap();
        let quote = TdQuote::parse(&raw).unwrap();
        assert_eq!(quote.version(), 4);
        assert_eq!(quote.fmspc(), soft_issuer::tdx::FMSPC);
        assert_eq!(
            quote.pck_ca(),
            match ca {
                PckCa::Platform => attestation::tdx::PckCa::Platform,
                PckCa::Processor => attestation::tdx::PckCa::Processor,
            }
        );
        assert_eq!(quote.pck_svns(), (SGX_TCB_SVNS, PCE_SVN));
        assert_eq!(quote.td().mr_td, MRTD);
        assert_eq!(quote.td().rtmrs.map(|r| r.0), RTMRS);
        assert!(quote.sept_ve_disable());
        assert!(!quote.td().is_debug());
        let verified = s.qemu_validator().validate(&doc, NONCE).unwrap();
        assert_eq!(verified.variant, Variant::QemuTdx);
        assert_eq!(verified.user_data, USER_DATA);
        assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
        assert!(
            verified
                .notes
                .iter()
                .any(|n| n.contains("TCB status UpToDate")),
            "{:?}",
            verified.notes
        );
    }
}

#[test]
fn a_version_5_quote_verifies_and_a_td_without_sept_ve_disable_only_on_azure_tdx() {
    let s = site(PckSpec::default());
    let v5 = s.qemu(TdFields {
        version: QuoteVersion::V5,
        ..TdFields::default()
    });
    let verified = validate(&s.qemu_validator(), &v5).unwrap();
    assert!(
        verified.notes[0].starts_with("TDX quote v5"),
        "{:?}",
        verified.notes
    );
    // As an Azure TD's: the attribute unset. Refused on qemu-tdx, where nothing excuses it
    // (Constellation accepts it)...
    let azure_like = s.qemu(TdFields {
        td_attributes: 0,
        ..TdFields::default()
    });
    let error = validate(&s.qemu_validator(), &azure_like).unwrap_err();
    assert!(
        matches!(error, Error::TdxPolicy(TdxPolicyError::SeptVeDisable)),
        "{error}"
    );
    // ... and accepted only on azure-tdx, whose paravisor TDs never set it.
    let azure = s.azure(TdFields {
        td_attributes: 0,
        ..TdFields::default()
    });
    let verified = validate(&s.azure_validator(), &azure).unwrap();
    assert!(
        verified.notes[0].contains("SEPT_VE_DISABLE not set"),
        "{:?}",
        verified.notes
    );
}

#[test]
fn an_azure_node_is_accepted_and_its_quote_binds_the_vtpm_key() {
    let s = site(PckSpec::default());
    let node = s.azure(TdFields::default());
    assert_eq!(node.variant(), Variant::AzureTdx);
    let v = s.azure_validator();
    let verified = validate(&v, &node).unwrap();
    assert_eq!(verified.variant, Variant::AzureTdx);
    assert_eq!(verified.user_data, USER_DATA);
    let (quote, runtime) = parse_azure_instance_info(node.instance_info().unwrap()).unwrap();
    assert_eq!(
        &quote.td().report_data[..32],
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &runtime).as_ref()
    );
    assert_eq!(quote.td().report_data[32..], [0; 32]);
    // The vTPM quote's nonce binding still holds.
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    assert!(matches!(
        v.validate(&doc, b"another nonce").unwrap_err(),
        Error::NonceMismatch { .. }
    ));
    // The same TD quote presented by another vTPM key: the runtime data names the first.
    let thief = TdxDocumentIssuer::azure_from_parts(
        SoftIssuer::new(KeyType::EcdsaP256)
            .unwrap()
            .with_pcrs(PCRS)
            .unwrap(),
        s.machine.clone(),
        node.instance_info().unwrap().to_vec(),
    );
    assert!(matches!(
        validate(&v, &thief).unwrap_err(),
        Error::Binding(_)
    ));
}

#[test]
fn a_report_data_made_for_something_else_is_refused() {
    let s = site(PckSpec::default());
    let qemu = TdxDocumentIssuer::qemu(
        s.machine.clone(),
        TdFields::default(),
        ReportData::Fixed([0x33; 64]),
    );
    let error = validate(&s.qemu_validator(), &qemu).unwrap_err();
    assert!(
        matches!(&error, Error::Binding(reason) if reason.contains("REPORT_DATA")),
        "{error}"
    );
    let azure = TdxDocumentIssuer::azure(
        azure_ak(),
        s.machine.clone(),
        TdFields::default(),
        ReportData::Fixed([0x33; 64]),
    )
    .unwrap();
    let error = validate(&s.azure_validator(), &azure).unwrap_err();
    assert!(
        matches!(&error, Error::Binding(reason) if reason.contains("SHA-256 of the HCL runtime data")),
        "{error}"
    );
}

#[test]
fn a_debug_td_is_refused_on_both_variants() {
    let s = site(PckSpec::default());
    let debug = TdFields {
        td_attributes: TD_ATTRIBUTES_DEBUG | TD_ATTRIBUTES_SEPT_VE_DISABLE,
        ..TdFields::default()
    };
    for (v, node) in [
        (s.qemu_validator(), s.qemu(debug.clone())),
        (s.azure_validator(), s.azure(debug.clone())),
    ] {
        let error = validate(&v, &node).unwrap_err();
        assert!(matches!(error, Error::Tdx(TdxError::Debug)), "{error}");
    }
}

#[test]
fn a_measurement_that_differs_is_refused() {
    let s = site(PckSpec::default());
    let mut rtmr2 = RTMRS;
    rtmr2[2] = [0xee; 48];
    for (td, index) in [
        (
            TdFields {
                mr_td: [0x11; 48],
                ..TdFields::default()
            },
            0,
        ),
        (
            TdFields {
                rtmrs: rtmr2,
                ..TdFields::default()
            },
            3,
        ),
    ] {
        let error = validate(&s.qemu_validator(), &s.qemu(td)).unwrap_err();
        let Error::Measurements { enforced, .. } = &error else {
            panic!("{error}");
        };
        assert_eq!(
            enforced.iter().map(|m| m.index).collect::<Vec<_>>(),
            [index],
            "{error}"
        );
    }
    // azure-tdx measures the vTPM's PCRs, not the TD's registers.
    let node = TdxDocumentIssuer::azure(
        azure_ak().with_pcrs([(9, [0x98; 32])]).unwrap(),
        s.machine.clone(),
        TdFields::default(),
        ReportData::Bound,
    )
    .unwrap();
    let error = validate(&s.azure_validator(), &node).unwrap_err();
    let Error::Measurements { enforced, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(enforced.iter().map(|m| m.index).collect::<Vec<_>>(), [9]);
}

#[test]
fn an_out_of_date_tcb_is_refused_unless_accepted() {
    // The TDX module behind, then the platform's PCK (CPUSVN, PCESVN) behind.
    let behind_module = TdFields {
        tee_tcb_svn: OUT_OF_DATE_TDX_TCB_SVNS,
        ..TdFields::default()
    };
    let behind_platform = PckSpec {
        sgx_tcb_svns: OUT_OF_DATE_SGX_TCB_SVNS,
        pce_svn: OUT_OF_DATE_PCE_SVN,
        ..PckSpec::default()
    };
    for (pck, td) in [
        (PckSpec::default(), behind_module),
        (behind_platform, TdFields::default()),
    ] {
        let s = site(pck);
        let error = validate(&s.qemu_validator(), &s.qemu(td.clone())).unwrap_err();
        match &error {
            Error::TdxPolicy(TdxPolicyError::Status {
                status, advisories, ..
            }) => {
                assert_eq!(status, &TcbStatus::OutOfDate.to_string());
                assert_eq!(advisories, OUT_OF_DATE_ADVISORY);
            }
            other => panic!("{other}"),
        }
        let mut config = qemu_config(&s.intel);
        config["acceptedTcbStatuses"] = serde_json::json!(["UpToDate", "OutOfDate"]);
        let accepting = validator(TdxKind::Qemu, &config, s.collateral(&[]));
        let verified = validate(&accepting, &s.qemu(td)).unwrap();
        assert!(
            verified
                .notes
                .iter()
                .any(|n| n.contains("TCB status OutOfDate") && n.contains(OUT_OF_DATE_ADVISORY)),
            "{:?}",
            verified.notes
        );
    }
    // Below every level: no TCB level matches at all.
    let s = site(PckSpec::default());
    let error = validate(
        &s.qemu_validator(),
        &s.qemu(TdFields {
            tee_tcb_svn: [0; 16],
            ..TdFields::default()
        }),
    )
    .unwrap_err();
    assert!(
        matches!(error, Error::Tdx(TdxError::NoTcbLevel(_))),
        "{error}"
    );
}

#[test]
fn a_revoked_pck_is_refused() {
    for ca in [PckCa::Platform, PckCa::Processor] {
        let s = site(PckSpec {
            ca,
            serial: 0xbad,
            ..PckSpec::default()
        });
        let revoking = s.collateral(&[0xbad]);
        let v = validator(TdxKind::Qemu, &qemu_config(&s.intel), revoking);
        let error = validate(&v, &s.qemu(TdFields::default())).unwrap_err();
        assert!(matches!(error, Error::Tdx(TdxError::Revoked(_))), "{error}");
        // Another serial revoked: this PCK still passes.
        let v = validator(
            TdxKind::Qemu,
            &qemu_config(&s.intel),
            s.collateral(&[0xbac]),
        );
        validate(&v, &s.qemu(TdFields::default())).unwrap();
    }
}

#[test]
fn a_root_the_config_does_not_name_is_not_trusted() {
    let trusted = site(PckSpec::default());
    // Another Intel's machines (same FMSPC and CA), judged with the trusted Intel's collateral.
    // Its CAs have Intel's names, so the chain is built up to the trusted root by name and
    // fails on the first signature the trusted keys did not make: the PCK CA's (checked before
    // the collateral for its FMSPC is looked up).
    let other = site(PckSpec::default());
    for (v, node) in [
        (trusted.qemu_validator(), other.qemu(TdFields::default())),
        (trusted.azure_validator(), other.azure(TdFields::default())),
    ] {
        let error = validate(&v, &node).unwrap_err();
        assert!(
            matches!(&error, Error::Tdx(TdxError::Chain(reason)) if reason.contains("the PCK CA's signature does not verify with the trusted root's key")),
            "{error}"
        );
    }
    // Without intelRootKey only Intel's own root is trusted, which signed none of it.
    let mut builtin = qemu_config(&trusted.intel);
    builtin.as_object_mut().unwrap().remove("intelRootKey");
    let v = validator(TdxKind::Qemu, &builtin, trusted.collateral(&[]));
    let error = validate(&v, &trusted.qemu(TdFields::default())).unwrap_err();
    let intel = attestation::tdx::Trust::builtin().fingerprint();
    assert!(
        matches!(&error, Error::Tdx(TdxError::Chain(reason))
            if reason.contains("does not verify with the trusted root's key") && reason.contains(&intel)),
        "{error}"
    );
}

/// A PCK CA that is not a CA, or whose KeyUsage lacks keyCertSign, certifies no PCK (RFC 5280;
/// Intel's real PCK CAs carry both): the chain is refused by name, for both PCK CAs, before the
/// collateral for the platform is looked up.
#[test]
fn a_pck_ca_without_key_cert_sign_or_ca_true_is_refused() {
    for (flaw, needle) in [
        (
            pcs_standin::IssuerFlaw::PckCaNoKeyCertSign,
            "no KeyUsage keyCertSign",
        ),
        (pcs_standin::IssuerFlaw::PckCaNotCa, "is not a CA"),
    ] {
        for ca in [PckCa::Platform, PckCa::Processor] {
            let intel = SimulatedIntel::with_flaw(flaw).unwrap();
            let pck = PckSpec {
                ca,
                ..PckSpec::default()
            };
            let machine = Arc::new(TdxMachine::new(&intel, pck).unwrap());
            let s = Site { intel, machine };
            let error = validate(&s.qemu_validator(), &s.qemu(TdFields::default())).unwrap_err();
            assert!(
                matches!(&error, Error::Tdx(TdxError::Chain(reason))
                    if reason.contains("the PCK CA") && reason.contains(needle)),
                "{flaw:?} {ca:?}: {error}"
            );
        }
    }
}
