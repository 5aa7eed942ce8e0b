//! The configfs-tsm report source against a simulated kernel (soft-issuer's `FakeConfigfsTsm`,
//! whose file operations are the production `RealFs` on a temporary directory): a good guest's
//! report and certificates become an InstanceInfo the verifier accepts; each broken interface
//! gives its own error, and no request leaves its entry behind.

#![allow(clippy::unwrap_used)]

use std::io;

use attestation::snp::{InstanceInfo, Product, SigningKey, Tcb, Trust, verify_report};
use snp_issuer::certtable::{CertTable, CertTableError, Guid};
use snp_issuer::configfs::ConfigfsTsm;
use snp_issuer::{InstanceInfoError, ReportSource, SnpSourceError, aws_instance_info};
use soft_issuer::snp::{ReportFields, SimulatedAmd};
use soft_issuer::tsm::FakeConfigfsTsm;

const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
const SPKI: &[u8] = b"a stand-in for the AK's DER SubjectPublicKeyInfo";

fn aws_guest(amd: &SimulatedAmd) -> FakeConfigfsTsm {
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    FakeConfigfsTsm::aws(amd, vlek, ReportFields::default()).unwrap()
}

fn source(fake: &FakeConfigfsTsm) -> ConfigfsTsm<&FakeConfigfsTsm> {
    ConfigfsTsm::with_fs(fake, fake.root())
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn an_aws_guest_gives_an_instance_info_whose_report_verifies_and_binds_the_key() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let fake = aws_guest(&amd);
    let info = aws_instance_info(&source(&fake), SPKI).unwrap();

    let parsed = InstanceInfo::parse(&info).unwrap();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, SPKI);
    assert_eq!(parsed.report.report_data().as_slice(), digest.as_ref());
    assert_eq!(parsed.report.vmpl(), 0);
    assert_eq!(parsed.report.signing_key(), SigningKey::Vlek);
    let signer = parsed.signer.as_ref().unwrap();
    let asvk = parsed.intermediate.as_ref().unwrap();
    assert_eq!(signer.common_name(), "SEV-VLEK");
    assert_eq!(asvk.common_name(), "SEV-VLEK-Milan");
    let trust = Trust::from_pem(amd.ark_pem().as_bytes()).unwrap();
    let ark = trust.ark_for(Product::Milan).unwrap();
    let verified = verify_report(&parsed.report, signer, asvk, ark, &trust, now()).unwrap();
    assert_eq!(
        verified.signer.csp_id.as_deref(),
        Some("CN=cc-eu-west-1.amazonaws.com")
    );

    // The JSON is Constellation's: these keys in Go's field order, Azure and GCP null.
    let text = String::from_utf8(info.clone()).unwrap();
    let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
    assert!(text.starts_with("{\"ReportSigner\":"), "{text}");
    assert!(at("ReportSigner") < at("CertChain") && at("CertChain") < at("AttestationReport"));
    assert!(at("AttestationReport") < at("Azure") && at("Azure") < at("GCP"));
    let json: serde_json::Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(json.as_object().unwrap().len(), 5);
    assert!(json["Azure"].is_null() && json["GCP"].is_null());
    assert_eq!(fake.reports_made(), 1);
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn without_the_asvk_in_the_table_only_the_vlek_is_sent() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let table = CertTable::encode(&[(Guid::VLEK, vlek.cert_der())]);
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        Ok((
            vlek.report(&fields).map_err(io::Error::other)?,
            Some(table.clone()),
        ))
    }))
    .unwrap();
    let info = aws_instance_info(&source(&fake), SPKI).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&info).unwrap();
    assert!(json["CertChain"].is_null());
    assert!(InstanceInfo::parse(&info).unwrap().intermediate.is_none());
}

#[test]
fn a_racing_writer_is_noticed_and_the_request_repeated_in_a_new_entry() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let fake = aws_guest(&amd).with_racing_writer(1);
    let report_data = [7u8; 64];
    let raw = source(&fake).get_report(&report_data).unwrap();
    assert_eq!(&raw.report[0x50..0x90], &report_data);
    // The racer's report (its write came before the outblob read), then ours.
    assert_eq!(fake.reports_made(), 2);
    assert_eq!(fake.entries_present().unwrap(), 0);

    let fake = aws_guest(&amd).with_racing_writer(100);
    let err = source(&fake).get_report(&report_data).unwrap_err();
    assert!(
        matches!(&err, SnpSourceError::Raced { attempts: 3, last } if last.contains("generation is 4, expected 2")),
        "{err}"
    );
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn another_tsm_is_refused_by_name() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let fake = aws_guest(&amd).with_provider("tdx_guest");
    let err = source(&fake).get_report(&[0; 64]).unwrap_err();
    assert!(
        matches!(&err, SnpSourceError::WrongProvider(p) if p == "tdx_guest"),
        "{err}"
    );
    assert_eq!(fake.reports_made(), 0);
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn a_short_outblob_is_refused() {
    let fake = FakeConfigfsTsm::new(Box::new(|_, _| Ok((vec![0; 1000], None)))).unwrap();
    let err = source(&fake).get_report(&[0; 64]).unwrap_err();
    assert!(matches!(err, SnpSourceError::ReportLength(1000)), "{err}");
}

#[test]
fn a_report_over_other_data_or_at_another_vmpl_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let fake = FakeConfigfsTsm::new(Box::new(move |_, _| {
        Ok((
            vlek.report(&ReportFields::default())
                .map_err(io::Error::other)?,
            None,
        ))
    }))
    .unwrap();
    let err = source(&fake).get_report(&[1; 64]).unwrap_err();
    assert!(matches!(err, SnpSourceError::ReportDataMismatch), "{err}");

    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, _| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl: 2,
            ..ReportFields::default()
        };
        Ok((vlek.report(&fields).map_err(io::Error::other)?, None))
    }))
    .unwrap();
    let err = source(&fake).get_report(&[1; 64]).unwrap_err();
    assert!(
        matches!(err, SnpSourceError::VmplMismatch { asked: 0, got: 2 }),
        "{err}"
    );
}

#[test]
fn a_privlevel_below_the_floor_is_the_kernels_refusal_of_that_write() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let fake = aws_guest(&amd).with_privlevel_floor(2);
    let err = source(&fake).get_report(&[0; 64]).unwrap_err();
    match &err {
        SnpSourceError::Attribute {
            path,
            action: "write",
            source,
        } => {
            assert!(path.ends_with("privlevel"), "{}", path.display());
            assert_eq!(source.raw_os_error(), Some(22), "EINVAL");
        }
        other => panic!("{other}"),
    }
    // At the floor it works, and the report says so.
    let raw = source(&fake)
        .privlevel(Some(2))
        .get_report(&[0; 64])
        .unwrap();
    assert_eq!(raw.report[0x30], 2);
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn tables_without_a_vlek_or_without_any_table_are_refused_for_aws() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let (ask, ark) = (amd.ask_der().to_vec(), amd.ark_der().to_vec());
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        let table = CertTable::encode(&[(Guid::ASK, &ask), (Guid::ARK, &ark)]);
        Ok((vlek.report(&fields).map_err(io::Error::other)?, Some(table)))
    }))
    .unwrap();
    let err = aws_instance_info(&source(&fake), SPKI).unwrap_err();
    assert!(
        matches!(&err, InstanceInfoError::NoVlek(listed) if listed.contains("ASK(4ab7b379") && listed.contains("ARK(")),
        "{err}"
    );

    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        Ok((vlek.report(&fields).map_err(io::Error::other)?, None))
    }))
    .unwrap();
    let err = aws_instance_info(&source(&fake), SPKI).unwrap_err();
    assert!(matches!(err, InstanceInfoError::NoCertificates(_)), "{err}");

    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        let mut table = CertTable::encode(&[(Guid::VLEK, b"x")]);
        table.truncate(30);
        Ok((vlek.report(&fields).map_err(io::Error::other)?, Some(table)))
    }))
    .unwrap();
    let err = aws_instance_info(&source(&fake), SPKI).unwrap_err();
    assert!(
        matches!(
            err,
            InstanceInfoError::CertTable(CertTableError::Unterminated { index: 1 })
        ),
        "{err}"
    );
}

#[test]
fn a_vcek_in_the_vlek_slot_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
    let vcek = amd.chip([5; 64], TCB, 0).unwrap();
    let table = CertTable::encode(&[(Guid::VLEK, vcek.cert_der())]);
    let fake = FakeConfigfsTsm::new(Box::new(move |rd, vmpl| {
        let fields = ReportFields {
            report_data: *rd,
            vmpl,
            ..ReportFields::default()
        };
        Ok((
            vlek.report(&fields).map_err(io::Error::other)?,
            Some(table.clone()),
        ))
    }))
    .unwrap();
    let err = aws_instance_info(&source(&fake), SPKI).unwrap_err();
    assert!(
        matches!(
            &err,
            InstanceInfoError::BadCertificate { which: "VLEK", .. }
        ),
        "{err}"
    );
    assert!(format!("{:?}", err).contains("SEV-VCEK"), "{err:?}");
}

#[test]
fn no_configfs_is_said_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tsm/report");
    let err = ConfigfsTsm::new(&missing).get_report(&[0; 64]).unwrap_err();
    assert!(
        matches!(&err, SnpSourceError::NoConfigfs(p) if *p == missing),
        "{err}"
    );
}
