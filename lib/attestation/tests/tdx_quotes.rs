//! The TDX verifier on real quotes and Intel collateral (`testdata/tdx`, copied from the shared test data).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;

use attestation::snp::instance_info::check_azure_binding;
use attestation::tdx::collateral::PcsResponses;
use attestation::tdx::{
    Collateral, TcbStatus, TdQuote, TdxConfig, TdxError, TdxPolicyError, Trust, verify_quote,
    verify_quote_within,
};
use attestation::vtpm::{Pcrs, Quote, verify_quote as verify_tpm_quote};
use base64::Engine as _;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/tdx")
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(dir().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// The automata collateral as PCS serves it: the TCB signing certificate and the root make
/// the issuer chains.
fn automata() -> Collateral {
    let a = "automata-00806f050000/";
    let chain = String::from_utf8(read(&format!("{a}signing_cert.pem"))).unwrap()
        + &pem(&read(&format!(
            "{a}Intel_SGX_Provisioning_Certification_RootCA.cer"
        )));
    Collateral::from_pcs(PcsResponses {
        tcb_info: &read(&format!("{a}tcbinfov3_00806f050000.json")),
        tcb_info_issuer_chain: &chain,
        qe_identity: &read(&format!("{a}qeidentityv2_apiv4.json")),
        qe_identity_issuer_chain: &chain,
        pck_crl: &read(&format!("{a}pck_platform_crl.der")),
        pck_crl_issuer_chain: "",
        root_ca_crl: &read(&format!("{a}intel_root_ca_crl.der")),
    })
    .unwrap()
}

fn uptodate() -> Collateral {
    Collateral::from_dcap_json(&read("dcap-qvl-uptodate/collateral.json")).unwrap()
}

const UPTODATE_WINDOW: (i64, i64) = (1750329147, 1752919235);
const AUTOMATA_WINDOW: (i64, i64) = (1739418641, 1742009940);

fn uptodate_quote() -> TdQuote {
    TdQuote::parse(&read("dcap-qvl-uptodate/quote.bin")).unwrap()
}

fn automata_quote_bytes() -> Vec<u8> {
    read("automata-00806f050000/quote_tdx_00806f050000.dat")
}

fn azure_quote() -> TdQuote {
    TdQuote::parse(&read("azure-tdx-vtpm/td-quote.bin")).unwrap()
}

fn accepting(statuses: &[&str]) -> TdxConfig {
    TdxConfig::from_attestation_config(
        serde_json::json!({ "acceptedTcbStatuses": statuses })
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

#[test]
fn the_uptodate_quote_verifies_inside_its_window_only() {
    let quote = uptodate_quote();
    assert_eq!(quote.version(), 4);
    assert_eq!(hex::encode(quote.fmspc()), "b0c06f000000");
    assert_eq!(
        hex::encode(quote.td().mr_td),
        "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7"
    );
    // TDX module TDX_01 at ISVSVN 6, QE ISVSVN 6.
    assert_eq!(&quote.td().tee_tcb_svn[..2], &[6, 1]);
    assert_eq!(quote.qe_isvsvn(), 6);
    let collateral = uptodate();
    // nextUpdate itself is past: the last second the collateral vouches for is the one before.
    for at in [UPTODATE_WINDOW.0, UPTODATE_WINDOW.1 - 1] {
        let verified = verify_quote(&quote, &collateral, &Trust::builtin(), at).unwrap();
        assert_eq!(verified.status, TcbStatus::UpToDate);
        assert!(verified.advisory_ids.is_empty());
        assert_eq!(verified.window, UPTODATE_WINDOW);
        // The default config accepts UpToDate and notes it.
        let notes = TdxConfig::default().check(&verified).unwrap();
        assert!(notes[0].contains("TCB status UpToDate"), "{notes:?}");
    }
    for at in [UPTODATE_WINDOW.0 - 1, UPTODATE_WINDOW.1] {
        assert!(matches!(
            verify_quote(&quote, &collateral, &Trust::builtin(), at).unwrap_err(),
            TdxError::NotCurrent { .. }
        ));
    }
}

/// While Intel is unreachable a cache serves collateral past its nextUpdate for a bounded time;
/// the verifier accepts it for exactly that long, says so, and still holds every certificate to
/// the real time.
#[test]
fn stale_collateral_is_accepted_for_the_allowed_time_only() {
    let quote = uptodate_quote();
    let collateral = uptodate();
    let hour = 3600;
    for at in [UPTODATE_WINDOW.1, UPTODATE_WINDOW.1 + hour - 1] {
        let verified =
            verify_quote_within(&quote, &collateral, &Trust::builtin(), at, hour).unwrap();
        assert!(verified.stale);
        assert_eq!(verified.status, TcbStatus::UpToDate);
    }
    let fresh = verify_quote_within(
        &quote,
        &collateral,
        &Trust::builtin(),
        UPTODATE_WINDOW.1 - 1,
        hour,
    )
    .unwrap();
    assert!(!fresh.stale);
    match verify_quote_within(
        &quote,
        &collateral,
        &Trust::builtin(),
        UPTODATE_WINDOW.1 + hour,
        hour,
    )
    .unwrap_err()
    {
        TdxError::NotCurrent { reason, .. } => {
            assert!(reason.contains("accepted 3600 s past that"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Evaluating stale collateral at its last current second must not excuse a certificate that
    // has expired since: ten years on, the PCK certificate has.
    let decade = 10 * 365 * 24 * hour;
    match verify_quote_within(
        &quote,
        &collateral,
        &Trust::builtin(),
        UPTODATE_WINDOW.1 + decade,
        2 * decade,
    )
    .unwrap_err()
    {
        TdxError::NotCurrent { reason, .. } => {
            assert!(reason.contains("a certificate in"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_automata_quote_is_out_of_date_with_its_advisories() {
    let quote = TdQuote::parse(&automata_quote_bytes()).unwrap();
    assert_eq!(&quote.td().tee_tcb_svn[..2], &[4, 1]); // TDX_01 at ISVSVN 4
    let collateral = automata();
    let verified = verify_quote(&quote, &collateral, &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap();
    assert_eq!(verified.status, TcbStatus::OutOfDate);
    assert_eq!(verified.platform_status, TcbStatus::OutOfDate);
    assert_eq!(verified.qe_status, TcbStatus::UpToDate);
    assert_eq!(verified.tcb_date, "2023-08-09T00:00:00Z");
    assert_eq!(
        verified.advisory_ids,
        ["INTEL-SA-00960", "INTEL-SA-00982", "INTEL-SA-00986"]
    );
    assert_eq!(verified.window, AUTOMATA_WINDOW);

    // UpToDate only, by default: refused, naming the status and every advisory.
    let error = TdxConfig::default().check(&verified).unwrap_err();
    assert!(matches!(error, TdxPolicyError::Status { .. }));
    let text = error.to_string();
    assert!(
        text.contains("OutOfDate") && text.contains("INTEL-SA-00986"),
        "{text}"
    );
    // Accepted once the operator adds OutOfDate; the audit note names the advisories.
    let notes = accepting(&["UpToDate", "OutOfDate"])
        .check(&verified)
        .unwrap();
    assert!(
        notes[0].contains("INTEL-SA-00960,INTEL-SA-00982,INTEL-SA-00986"),
        "{notes:?}"
    );

    for at in [AUTOMATA_WINDOW.0 - 1, AUTOMATA_WINDOW.1] {
        assert!(matches!(
            verify_quote(&quote, &collateral, &Trust::builtin(), at).unwrap_err(),
            TdxError::NotCurrent { .. }
        ));
    }
}

/// Intel's rule and a comparison of all 16 TEE_TCB_SVN bytes give different answers for the
/// Azure quote (TEE_TCB_SVN 02 01 06 ..): every platform level asks for 3 in byte 0, so the
/// 16-byte comparison meets no level and would refuse the quote, while Intel's rule leaves bytes
/// 0 and 1 to the module identity TDX_01 (ISVSVN 2: OutOfDate) and meets the 2023-08-09 level.
#[test]
fn intels_tdx_module_rule_decides_the_level() {
    let quote = azure_quote();
    let collateral = automata();
    let tee = quote.td().tee_tcb_svn;
    assert_eq!(&tee[..3], &[2, 1, 6]);
    let verified = verify_quote(&quote, &collateral, &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap();
    assert_eq!(verified.tcb_date, "2023-08-09T00:00:00Z");
    assert_eq!(verified.platform_status, TcbStatus::OutOfDate);

    let info: serde_json::Value = serde_json::from_str(collateral.tcb_info_json()).unwrap();
    let (cpu_svn, pce_svn) = quote.pck_svns();
    let svns = |level: &serde_json::Value, key: &str| -> Vec<u8> {
        level["tcb"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["svn"].as_u64().unwrap() as u8)
            .collect()
    };
    let meets = |level: &serde_json::Value, skip: usize| {
        svns(level, "sgxtcbcomponents")
            .iter()
            .zip(&cpu_svn)
            .all(|(need, have)| have >= need)
            && u64::from(pce_svn) >= level["tcb"]["pcesvn"].as_u64().unwrap()
            && svns(level, "tdxtcbcomponents")
                .iter()
                .zip(&tee)
                .skip(skip)
                .all(|(need, have)| have >= need)
    };
    let levels = info["tcbLevels"].as_array().unwrap();
    assert!(
        levels.iter().all(|level| !meets(level, 0)),
        "all 16 bytes: no level"
    );
    let intel = levels.iter().find(|level| meets(level, 2)).unwrap();
    assert_eq!(intel["tcbDate"], "2023-08-09T00:00:00Z");
    // The module identity TDX_01 rates ISVSVN 2 OutOfDate (4 would be UpToDate).
    let module = info["tdxModuleIdentities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "TDX_01")
        .unwrap();
    let module_level = module["tcbLevels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["tcb"]["isvsvn"].as_u64().unwrap() <= u64::from(tee[0]))
        .unwrap();
    assert_eq!(module_level["tcbStatus"], "OutOfDate");
}

/// Offsets in a v4 quote: header 48, TD report 584, signature data length 4, then the quote
/// signature (64), the attestation key (64), certification data type 6 and size (6), the QE
/// report (384), its signature (64), and the QE auth data (size 2, data).
const TD_REPORT_MRTD: usize = 48 + 136;
const QUOTE_SIGNATURE: usize = 48 + 584 + 4;
const QE_REPORT: usize = QUOTE_SIGNATURE + 64 + 64 + 6;
const QE_REPORT_SIGNATURE: usize = QE_REPORT + 384;
const QE_AUTH_DATA: usize = QE_REPORT_SIGNATURE + 64 + 2;

#[test]
fn a_changed_byte_fails_with_the_check_it_breaks() {
    let bytes = automata_quote_bytes();
    let collateral = automata();
    for (offset, expected) in [
        (TD_REPORT_MRTD, TdxError::QuoteSignature),
        (QUOTE_SIGNATURE + 5, TdxError::QuoteSignature),
        (QE_REPORT + 300, TdxError::QeReportSignature),
        (QE_REPORT_SIGNATURE + 5, TdxError::QeReportSignature),
        (QE_AUTH_DATA, TdxError::QeReportData),
    ] {
        let mut tampered = bytes.clone();
        tampered[offset] ^= 1;
        let quote = TdQuote::parse(&tampered).unwrap();
        assert_eq!(
            verify_quote(&quote, &collateral, &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap_err(),
            expected,
            "byte {offset}"
        );
    }
}

#[test]
fn collateral_that_does_not_verify_is_named() {
    let quote = TdQuote::parse(&automata_quote_bytes()).unwrap();
    let a = "automata-00806f050000/";
    let chain = String::from_utf8(read(&format!("{a}signing_cert.pem"))).unwrap()
        + &pem(&read(&format!(
            "{a}Intel_SGX_Provisioning_Certification_RootCA.cer"
        )));
    let tcb_info = String::from_utf8(read(&format!("{a}tcbinfov3_00806f050000.json"))).unwrap();
    // One character of the signed TCB info changed (its evaluation data number 17 → 18).
    let forged = tcb_info.replacen(
        "\"tcbEvaluationDataNumber\":17",
        "\"tcbEvaluationDataNumber\":18",
        1,
    );
    assert_ne!(forged, tcb_info);
    let collateral = Collateral::from_pcs(PcsResponses {
        tcb_info: forged.as_bytes(),
        tcb_info_issuer_chain: &chain,
        qe_identity: &read(&format!("{a}qeidentityv2_apiv4.json")),
        qe_identity_issuer_chain: &chain,
        pck_crl: &read(&format!("{a}pck_platform_crl.der")),
        pck_crl_issuer_chain: "",
        root_ca_crl: &read(&format!("{a}intel_root_ca_crl.der")),
    })
    .unwrap();
    assert_eq!(
        verify_quote(&quote, &collateral, &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap_err(),
        TdxError::TcbInfoSignature
    );
    // Collateral for another platform.
    assert!(matches!(
        verify_quote(&quote, &uptodate(), &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap_err(),
        TdxError::Collateral(_)
    ));
}

#[test]
fn a_root_other_than_intels_is_not_trusted() {
    // Any other self-signed certificate as intelRootKey: the root CA CRL no longer verifies.
    let other = pem(&attestation_test_root());
    let trust = Trust::from_pem(other.as_bytes()).unwrap();
    let quote = TdQuote::parse(&automata_quote_bytes()).unwrap();
    assert_eq!(
        verify_quote(&quote, &automata(), &trust, AUTOMATA_WINDOW.0).unwrap_err(),
        TdxError::UntrustedRoot(trust.fingerprint())
    );
    // The built-in root is the one the vector ships (Intel's public root).
    assert_eq!(
        Trust::builtin().root_der(),
        read("automata-00806f050000/Intel_SGX_Provisioning_Certification_RootCA.cer")
    );
}

/// An ECDSA P-256 self-signed certificate from the SNP vectors' neighbours: any certificate that
/// is not Intel's will do.
fn attestation_test_root() -> Vec<u8> {
    let chain = String::from_utf8(read("dcap-qvl-uptodate/collateral.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&chain).unwrap();
    // The TCB signing certificate: real, but not a root.
    let pem = json["tcb_info_issuer_chain"].as_str().unwrap();
    let block = pem.split("-----END CERTIFICATE-----").next().unwrap();
    let b64: String = block.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

/// The Azure TDX chain: the TD quote verifies (OutOfDate), its REPORT_DATA binds the HCL runtime
/// data, whose keys[0] signed the vTPM quote.
#[test]
fn the_azure_tdx_chain_verifies_through_the_hcl_to_the_vtpm_quote() {
    let quote = azure_quote();
    assert_eq!(
        hex::encode(quote.td().mr_td),
        "024a32b070383331181619fa387cb4d55d1e38879f989933055ccad5bc2db795d1737b66205949d15469dc8c1ba7ab7b"
    );
    assert_eq!(hex::encode(quote.td().xfam), "e718060000000000");
    assert!(quote.td().rtmrs.iter().all(|r| r.0 == [0; 48]));
    assert!(!quote.sept_ve_disable());
    let verified = verify_quote(&quote, &automata(), &Trust::builtin(), AUTOMATA_WINDOW.0).unwrap();
    assert_eq!(verified.status, TcbStatus::OutOfDate);
    assert!(matches!(
        TdxConfig::default().check(&verified).unwrap_err(),
        TdxPolicyError::Status { .. }
    ));
    // Azure's paravisor TDs never set SEPT_VE_DISABLE: only azure-tdx's config lets them pass.
    let mut outofdate = accepting(&["OutOfDate"]);
    assert_eq!(
        outofdate.check(&verified).unwrap_err(),
        TdxPolicyError::SeptVeDisable
    );
    outofdate.sept_ve_disable_required = false;
    outofdate.check(&verified).unwrap();
    for at in [AUTOMATA_WINDOW.0 - 1, AUTOMATA_WINDOW.1] {
        assert!(matches!(
            verify_quote(&quote, &automata(), &Trust::builtin(), at).unwrap_err(),
            TdxError::NotCurrent { .. }
        ));
    }

    // HCL report: "HCLA", version 2, type 4; variable data at 1236, 1201 bytes.
    let hcl = read("azure-tdx-vtpm/hcl-report.bin");
    assert_eq!(&hcl[..4], b"HCLA");
    let runtime = &hcl[1236..1236 + 1201];
    let ak_pub = ak_public(runtime);
    let ak = attestation::tpm::Public::parse(&ak_pub).unwrap();
    check_azure_binding(&quote.td().report_data, runtime, &ak).unwrap();

    // The vTPM quote verifies with that key.
    let tpm: serde_json::Value =
        serde_json::from_slice(&read("azure-tdx-vtpm/tpm-quote-v1.json")).unwrap();
    let signature = hex::decode(tpm["signature"].as_str().unwrap()).unwrap();
    let mut raw_sig = vec![0x00, 0x14, 0x00, 0x0b];
    raw_sig.extend_from_slice(&(signature.len() as u16).to_be_bytes());
    raw_sig.extend_from_slice(&signature);
    let pcrs = tpm["pcrs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u32, hex::decode(v.as_str().unwrap()).unwrap()))
        .collect();
    let tpm_quote = Quote {
        quote: hex::decode(tpm["message"].as_str().unwrap()).unwrap(),
        raw_sig,
        pcrs: Some(Pcrs { hash: 0x000b, pcrs }),
    };
    verify_tpm_quote(&ak_pub, &tpm_quote, b"challenge").unwrap();

    // Runtime data changed: no longer what REPORT_DATA names.
    let mut changed = runtime.to_vec();
    changed[100] ^= 1;
    assert!(matches!(
        check_azure_binding(&quote.td().report_data, &changed, &ak).unwrap_err(),
        attestation::Error::Binding(_)
    ));
}

/// The TPMT_PUBLIC of the RSA key in the runtime data's keys[0] (an AK's attributes).
fn ak_public(runtime: &[u8]) -> Vec<u8> {
    let json: serde_json::Value = serde_json::from_slice(runtime).unwrap();
    let key = &json["keys"][0];
    assert_eq!(key["kid"], "HCLAkPub");
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(key["n"].as_str().unwrap().trim_end_matches('='))
        .unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&0x0001u16.to_be_bytes()); // RSA
    out.extend_from_slice(&0x000bu16.to_be_bytes()); // nameAlg SHA-256
    // fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | restricted | sign
    out.extend_from_slice(&0x0005_0072u32.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes()); // authPolicy
    out.extend_from_slice(&0x0010u16.to_be_bytes()); // symmetric NULL
    out.extend_from_slice(&0x0014u16.to_be_bytes()); // RSASSA
    out.extend_from_slice(&0x000bu16.to_be_bytes()); // SHA-256
    out.extend_from_slice(&((n.len() * 8) as u16).to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // exponent 65537
    out.extend_from_slice(&(n.len() as u16).to_be_bytes());
    out.extend_from_slice(&n);
    out
}

#[test]
fn the_config_checks_the_td_report() {
    let verified = verify_quote(
        &azure_quote(),
        &automata(),
        &Trust::builtin(),
        AUTOMATA_WINDOW.0,
    )
    .unwrap();
    let config = |extra: serde_json::Value| {
        let mut json = serde_json::json!({ "acceptedTcbStatuses": ["OutOfDate"] });
        json.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        // An Azure TD: no SEPT_VE_DISABLE, as azure-tdx's config allows.
        TdxConfig::from_attestation_config(json.to_string().as_bytes()).map(|mut c| {
            c.sept_ve_disable_required = false;
            c
        })
    };
    let quote = &verified.quote;
    let td = quote.td();
    // Everything as the quote has it: accepted.
    config(serde_json::json!({
        "qeSVN": quote.qe_svn(), "pceSVN": quote.pce_svn(),
        "teeTCBSVN": hex::encode(td.tee_tcb_svn), "qeVendorID": "939a7233f79c4ca9940a0db3957f0607",
        "mrSeam": hex::encode(td.mr_seam), "xfam": "e718060000000000",
        "mrtds": ["11".repeat(48), hex::encode(td.mr_td)],
        "mrSeams": ["22".repeat(48)],
    }))
    .unwrap()
    .check(&verified)
    .unwrap();
    let refused = |extra| config(extra).unwrap().check(&verified).unwrap_err();
    assert!(matches!(
        refused(serde_json::json!({ "qeSVN": quote.qe_svn() + 1 })),
        TdxPolicyError::Svn { which: "QE", .. }
    ));
    assert!(matches!(
        refused(serde_json::json!({ "pceSVN": quote.pce_svn() + 1 })),
        TdxPolicyError::Svn { which: "PCE", .. }
    ));
    let mut higher = td.tee_tcb_svn;
    higher[2] += 1;
    assert!(matches!(
        refused(serde_json::json!({ "teeTCBSVN": hex::encode(higher) })),
        TdxPolicyError::TeeTcbSvn { index: 2, .. }
    ));
    assert!(matches!(
        refused(serde_json::json!({ "xfam": "e700060000000000" })),
        TdxPolicyError::Mismatch { field: "xfam", .. }
    ));
    assert_eq!(
        refused(serde_json::json!({ "mrSeam": "11".repeat(48) })),
        TdxPolicyError::MrSeam(hex::encode(td.mr_seam))
    );
    assert_eq!(
        refused(serde_json::json!({ "mrSeams": ["11".repeat(48), "22".repeat(48)] })),
        TdxPolicyError::MrSeam(hex::encode(td.mr_seam))
    );
    assert_eq!(
        refused(serde_json::json!({ "mrtds": ["11".repeat(48)] })),
        TdxPolicyError::Mrtd(hex::encode(td.mr_td))
    );
    assert!(matches!(
        refused(serde_json::json!({ "qeVendorID": "00".repeat(15) + "01" })),
        TdxPolicyError::Mismatch {
            field: "qeVendorID",
            ..
        }
    ));
    // A debug TD is refused whatever else the config says.
    let mut debug = verified.clone();
    let mut bytes = read("azure-tdx-vtpm/td-quote.bin");
    bytes[48 + 16 + 48 + 48 + 8] |= 1; // TD attributes, bit 0
    debug.quote = TdQuote::parse(&bytes).unwrap();
    assert!(debug.quote.td().is_debug());
    assert_eq!(
        config(serde_json::json!({}))
            .unwrap()
            .check(&debug)
            .unwrap_err(),
        TdxPolicyError::Debug
    );
    // The same byte changed in a quote the crate verifies: its signature no longer holds.
    assert_eq!(
        verify_quote(
            &debug.quote,
            &automata(),
            &Trust::builtin(),
            AUTOMATA_WINDOW.0
        )
        .unwrap_err(),
        TdxError::QuoteSignature
    );
    // Bad settings are named.
    for (json, needle) in [
        (serde_json::json!({ "qeSVN": "latest" }), "latest"),
        (serde_json::json!({ "qeSVN": 70000 }), "0 to 65535"),
        (serde_json::json!({ "xfam": "e718" }), "8 bytes of hex"),
        (
            serde_json::json!({ "acceptedTcbStatuses": ["Revoked"] }),
            "Revoked",
        ),
        (
            serde_json::json!({ "acceptedTcbStatuses": ["Fine"] }),
            "not a TCB status",
        ),
        (serde_json::json!({ "acceptedTcbStatuses": [] }), "empty"),
        (serde_json::json!({ "mrtds": [] }), "mrtds: empty"),
        (
            serde_json::json!({ "mrSeams": ["abcd"] }),
            "48 bytes of hex",
        ),
        (
            serde_json::json!({ "intelRootKey": "not PEM" }),
            "intelRootKey",
        ),
    ] {
        let error = TdxConfig::from_attestation_config(json.to_string().as_bytes()).unwrap_err();
        assert!(error.to_string().contains(needle), "{error}");
    }
}

/// qemu-tdx: a real quote verifies with Intel's collateral, but its REPORT_DATA was not made for
/// this nonce and user data, so the document is refused as not bound to the connection.
#[test]
fn a_qemu_tdx_document_must_bind_the_connection() {
    use attestation::Validator;
    use attestation::tdx::StaticCollateral;
    use attestation::variants::tdx::{TdxKind, TdxValidator};
    use std::sync::Arc;

    let quote = read("dcap-qvl-uptodate/quote.bin");
    let mrtd = hex::encode(uptodate_quote().td().mr_td);
    let config = serde_json::json!({
        "measurements": { "0": { "expected": mrtd, "warnOnly": false } },
        "mrSeams": [hex::encode(uptodate_quote().td().mr_seam)],
    });
    let (validator, digest) = TdxValidator::from_attestation_config(
        TdxKind::Qemu,
        config.to_string().as_bytes(),
        Arc::new(StaticCollateral::new().with(uptodate())),
    )
    .unwrap();
    assert_eq!(digest.len(), 64);
    let validator = validator.with_clock(Arc::new(|| UPTODATE_WINDOW.0));
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let document = serde_json::json!({ "RawQuote": b64(&quote), "UserData": b64(b"key hash") });
    let error = validator
        .validate(document.to_string().as_bytes(), b"nonce")
        .unwrap_err();
    assert!(matches!(error, attestation::Error::Binding(_)), "{error}");
    // No collateral for the platform: retry later, not a refusal.
    let empty = validator
        .clone()
        .with_collateral(Arc::new(StaticCollateral::new()));
    assert!(
        empty
            .validate(document.to_string().as_bytes(), b"nonce")
            .unwrap_err()
            .is_unavailable()
    );
    // Intel does not know the platform: a refusal, named as such, not a retry.
    let unknown = validator.with_collateral(Arc::new(UnknownToIntel));
    let error = unknown
        .validate(document.to_string().as_bytes(), b"nonce")
        .unwrap_err();
    assert!(!error.is_unavailable(), "{error}");
    assert!(
        matches!(&error, attestation::Error::Tdx(TdxError::UnknownPlatform(m)) if m.contains("b0c06f000000")),
        "{error}"
    );
    assert_eq!(
        attestation::audit::check_name(&error),
        "tdx_platform_unknown"
    );
    // Not the document's shape.
    assert!(matches!(
        empty.validate(b"{\"RawQuote\": 5}", b"nonce").unwrap_err(),
        attestation::Error::Malformed(_)
    ));
}

/// A source to which Intel answered that it knows no such FMSPC.
#[derive(Debug)]
struct UnknownToIntel;

impl attestation::tdx::TdxCollateral for UnknownToIntel {
    fn collateral(
        &self,
        fmspc: [u8; 6],
        _ca: attestation::tdx::PckCa,
    ) -> Result<std::sync::Arc<Collateral>, attestation::tdx::TdxCollateralError> {
        Err(attestation::tdx::TdxCollateralError::UnknownPlatform {
            fmspc: hex::encode(fmspc),
            reason: "HTTP 404".to_owned(),
        })
    }
}

/// A collateral source that counts the platforms it is asked for, as the PCS cache would see
/// them.
#[derive(Debug)]
struct Counting {
    inner: attestation::tdx::StaticCollateral,
    asked: std::sync::Mutex<Vec<[u8; 6]>>,
}

impl attestation::tdx::TdxCollateral for Counting {
    fn collateral(
        &self,
        fmspc: [u8; 6],
        ca: attestation::tdx::PckCa,
    ) -> Result<std::sync::Arc<Collateral>, attestation::tdx::TdxCollateralError> {
        self.asked.lock().unwrap().push(fmspc);
        self.inner.collateral(fmspc, ca)
    }
}

/// The quote with the FMSPC in its PCK certificate (the first PEM block of its certification
/// data) replaced: the certificate parses as before, its signature no longer covers it.
fn with_fmspc_in_pck(quote: &[u8], from: [u8; 6], to: [u8; 6]) -> Vec<u8> {
    let begin = b"-----BEGIN CERTIFICATE-----";
    let end = b"-----END CERTIFICATE-----";
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
            .unwrap()
    };
    let start = find(quote, begin, 0) + begin.len();
    let stop = find(quote, end, start);
    let body = &quote[start..stop];
    let b64: Vec<u8> = body
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    let engine = base64::engine::general_purpose::STANDARD;
    let mut der = engine.decode(&b64).unwrap();
    let at: Vec<usize> = der
        .windows(6)
        .enumerate()
        .filter(|(_, w)| *w == from)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the FMSPC occurs once in the PCK certificate");
    der[at[0]..at[0] + 6].copy_from_slice(&to);
    let mut encoded = engine.encode(&der).into_bytes().into_iter();
    assert_eq!(encoded.len(), b64.len());
    // The same line breaks as before: same length, so nothing else in the quote moves.
    let body: Vec<u8> = body
        .iter()
        .map(|b| {
            if b.is_ascii_whitespace() {
                *b
            } else {
                encoded.next().unwrap()
            }
        })
        .collect();
    [&quote[..start], &body, &quote[stop..]].concat()
}

/// The FMSPC is looked up at Intel only once the PCK certificate that names it verifies to the
/// trusted root: a node cannot make the service ask Intel for platforms it made up.
#[test]
fn a_pck_certificate_not_signed_up_to_the_trusted_root_is_refused_before_any_lookup() {
    use attestation::Validator;
    use attestation::tdx::StaticCollateral;
    use attestation::variants::tdx::{TdxKind, TdxValidator};
    use std::sync::Arc;

    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let document =
        |quote: &[u8]| serde_json::json!({ "RawQuote": b64(quote), "UserData": b64(b"key hash") });
    let real = read("dcap-qvl-uptodate/quote.bin");
    let mrtd = hex::encode(uptodate_quote().td().mr_td);
    let validator = |extra: serde_json::Value| {
        let mut config = serde_json::json!({
            "measurements": { "0": { "expected": mrtd, "warnOnly": false } },
            "mrSeams": [hex::encode(uptodate_quote().td().mr_seam)],
        });
        if let serde_json::Value::Object(extra) = extra {
            config.as_object_mut().unwrap().extend(extra);
        }
        let counting = Arc::new(Counting {
            inner: StaticCollateral::new().with(uptodate()),
            asked: Default::default(),
        });
        let (validator, _) = TdxValidator::from_attestation_config(
            TdxKind::Qemu,
            config.to_string().as_bytes(),
            counting.clone(),
        )
        .unwrap();
        (
            validator.with_clock(Arc::new(|| UPTODATE_WINDOW.0)),
            counting,
        )
    };

    // The real quote: its platform is looked up, and the hardware verifies (the document then
    // fails only for not being made for this nonce).
    let (intel, counting) = validator(serde_json::json!({}));
    let error = intel
        .validate(document(&real).to_string().as_bytes(), b"nonce")
        .unwrap_err();
    assert!(matches!(error, attestation::Error::Binding(_)), "{error}");
    assert_eq!(*counting.asked.lock().unwrap(), [uptodate_quote().fmspc()]);

    // The same quote with another FMSPC written into its PCK certificate.
    let made_up = [0xde, 0xad, 0xbe, 0xef, 0x00, 0x01];
    let tampered = with_fmspc_in_pck(&real, uptodate_quote().fmspc(), made_up);
    assert_eq!(TdQuote::parse(&tampered).unwrap().fmspc(), made_up);
    let (intel, counting) = validator(serde_json::json!({}));
    let error = intel
        .validate(document(&tampered).to_string().as_bytes(), b"nonce")
        .unwrap_err();
    assert!(
        matches!(&error, attestation::Error::Tdx(TdxError::Chain(m)) if m.contains("PCK certificate's signature")),
        "{error}"
    );
    assert!(!error.is_unavailable());
    assert!(counting.asked.lock().unwrap().is_empty());

    // The real quote, but a configuration trusting another root: Intel's PCK CA is not under it.
    let other = pem(&attestation_test_root());
    let (elsewhere, counting) = validator(serde_json::json!({ "intelRootKey": other }));
    let error = elsewhere
        .validate(document(&real).to_string().as_bytes(), b"nonce")
        .unwrap_err();
    let fingerprint = Trust::from_pem(other.as_bytes()).unwrap().fingerprint();
    assert!(
        matches!(&error, attestation::Error::Tdx(TdxError::Chain(m)) if m.contains("trusted root") && m.contains(&fingerprint)),
        "{error}"
    );
    assert!(counting.asked.lock().unwrap().is_empty());
}

#[test]
fn the_real_quotes_pck_chains_verify_to_intels_root() {
    let quotes = [
        uptodate_quote(),
        TdQuote::parse(&automata_quote_bytes()).unwrap(),
        azure_quote(),
    ];
    for quote in quotes {
        quote.verify_pck_signatures(&Trust::builtin()).unwrap();
    }
}

/// What each TDX variant must pin, named when missing: an MRSEAM on both, the MRTD on azure-tdx
/// (its measurements are vTPM PCRs), and on qemu-tdx the MRTD as measurement 0 or `mrtds`.
#[test]
fn each_tdx_variant_refuses_a_config_that_leaves_its_firmware_unpinned() {
    use attestation::Variant;
    use attestation::tdx::TdxConfigError;

    let azure = azure_quote();
    let mrtd = hex::encode(azure.td().mr_td);
    let mrseam = hex::encode(azure.td().mr_seam);
    let pcrs = serde_json::json!({ "4": { "expected": "44".repeat(32), "warnOnly": false } });
    let load = |variant, json: serde_json::Value| {
        let raw = json.to_string();
        let policy = attestation::Policy::from_attestation_config(raw.as_bytes()).unwrap();
        TdxConfig::for_variant(variant, raw.as_bytes(), &policy)
    };
    let unpinned = |result: Result<TdxConfig, TdxConfigError>| match result.unwrap_err() {
        TdxConfigError::Unpinned { field, .. } => field,
        other => panic!("{other}"),
    };
    // azure-tdx: MRTD and MRSEAM both needed; the example's old shape (qeVendorID only) fails.
    assert_eq!(
        unpinned(load(
            Variant::AzureTdx,
            serde_json::json!({ "measurements": pcrs, "qeVendorID": "939a7233f79c4ca9940a0db3957f0607" })
        )),
        "mrSeams"
    );
    let error = load(
        Variant::AzureTdx,
        serde_json::json!({ "measurements": pcrs, "mrSeams": [mrseam] }),
    )
    .unwrap_err();
    assert!(
        matches!(error, TdxConfigError::Unpinned { field: "mrtds", .. })
            && error.to_string().contains("Stricter than Constellation"),
        "{error}"
    );
    let config = load(
        Variant::AzureTdx,
        serde_json::json!({ "measurements": pcrs, "mrSeam": mrseam, "mrtds": [mrtd] }),
    )
    .unwrap();
    assert!(!config.sept_ve_disable_required, "Azure's TDs go without");

    // qemu-tdx: measurement 0 is the MRTD; warnOnly there leaves it unpinned.
    let measured = |warn_only: bool| {
        serde_json::json!({ "0": { "expected": "91".repeat(48), "warnOnly": warn_only },
                            "1": { "expected": "a0".repeat(48), "warnOnly": false } })
    };
    assert_eq!(
        unpinned(load(
            Variant::QemuTdx,
            serde_json::json!({ "measurements": measured(false) })
        )),
        "mrSeams"
    );
    assert_eq!(
        unpinned(load(
            Variant::QemuTdx,
            serde_json::json!({ "measurements": measured(true), "mrSeams": [mrseam] })
        )),
        "measurements[0] (MRTD) enforced, or mrtds"
    );
    let config = load(
        Variant::QemuTdx,
        serde_json::json!({ "measurements": measured(false), "mrSeams": [mrseam] }),
    )
    .unwrap();
    assert!(config.sept_ve_disable_required);
    load(
        Variant::QemuTdx,
        serde_json::json!({ "measurements": measured(true), "mrSeams": [mrseam], "mrtds": [mrtd] }),
    )
    .unwrap();
}

/// The real Azure TD (no SEPT_VE_DISABLE) under each variant's config: refused by qemu-tdx's,
/// accepted by azure-tdx's; and the pins decide on the real quotes' MRTD and MRSEAM.
#[test]
fn sept_ve_disable_is_required_outside_azure_tdx_and_the_pins_decide_on_real_quotes() {
    use attestation::Variant;

    let verified = verify_quote(
        &azure_quote(),
        &automata(),
        &Trust::builtin(),
        AUTOMATA_WINDOW.0,
    )
    .unwrap();
    let td = verified.quote.td();
    let config = |variant, measurements: serde_json::Value, mrtd: &str, mrseam: &str| {
        let raw = serde_json::json!({
            "measurements": measurements, "acceptedTcbStatuses": ["UpToDate", "OutOfDate"],
            "mrtds": [mrtd], "mrSeams": [mrseam],
        })
        .to_string();
        let policy = attestation::Policy::from_attestation_config(raw.as_bytes()).unwrap();
        TdxConfig::for_variant(variant, raw.as_bytes(), &policy).unwrap()
    };
    let (mrtd, mrseam) = (hex::encode(td.mr_td), hex::encode(td.mr_seam));
    let pcrs = serde_json::json!({ "4": { "expected": "44".repeat(32) } });
    let mrtd0 = serde_json::json!({ "0": { "expected": mrtd } });
    config(Variant::AzureTdx, pcrs.clone(), &mrtd, &mrseam)
        .check(&verified)
        .unwrap();
    assert_eq!(
        config(Variant::QemuTdx, mrtd0, &mrtd, &mrseam)
            .check(&verified)
            .unwrap_err(),
        TdxPolicyError::SeptVeDisable
    );
    // Another TD's MRTD (the UpToDate vector's), another module's MRSEAM: refused by name.
    let other = uptodate_quote();
    assert_eq!(
        config(
            Variant::AzureTdx,
            pcrs.clone(),
            &hex::encode(other.td().mr_td),
            &mrseam
        )
        .check(&verified)
        .unwrap_err(),
        TdxPolicyError::Mrtd(mrtd.clone())
    );
    assert_eq!(
        config(
            Variant::AzureTdx,
            pcrs,
            &mrtd,
            &hex::encode(other.td().mr_seam)
        )
        .check(&verified)
        .unwrap_err(),
        TdxPolicyError::MrSeam(mrseam)
    );
    // A real TD that sets SEPT_VE_DISABLE passes qemu-tdx's check.
    let uptodate = verify_quote(&other, &uptodate(), &Trust::builtin(), UPTODATE_WINDOW.0).unwrap();
    let td = other.td();
    config(
        Variant::QemuTdx,
        serde_json::json!({ "0": { "expected": hex::encode(td.mr_td) } }),
        &hex::encode(td.mr_td),
        &hex::encode(td.mr_seam),
    )
    .check(&uptodate)
    .unwrap();
}
