//! Real Intel collateral passes the PCS source's parse step, with the dates Intel wrote in it,
//! and comes out byte for byte as it went in (the signatures cover the exact bytes).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use collateral::pcs::{Checked, check};

fn testdata(name: &str) -> Vec<u8> {
    let path = format!("{}/testdata/tdx/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn assert_dates(checked: &Checked, issued: u64, next: u64) {
    assert_eq!(checked.issued, at(issued));
    assert_eq!(checked.next_update, at(next));
    assert_eq!(checked.refresh_after(), at(next - (next - issued) / 4));
}

#[test]
fn automata_pcs_v4_answers_parse_with_their_dates() {
    // The one chain at hand for every item: the source parses chains, the verifier checks who
    // signed what.
    let chain = String::from_utf8(testdata("automata-00806f050000/signing_cert.pem")).unwrap();

    let tcb = testdata("automata-00806f050000/tcbinfov3_00806f050000.json");
    let checked = check("tcb/00806f050000", &tcb, &chain).unwrap();
    assert_dates(&checked, 1_739_418_641, 1_742_010_641); // 2025-02-13T03:50:41Z, 2025-03-15T03:50:41Z
    assert_eq!(checked.item.body, tcb);
    assert_eq!(checked.item.issuer_chain, chain);

    let qe = testdata("automata-00806f050000/qeidentityv2_apiv4.json");
    let checked = check("qe/identity", &qe, &chain).unwrap();
    assert_dates(&checked, 1_739_417_940, 1_742_009_940); // 2025-02-13T03:39:00Z, 2025-03-15T03:39:00Z
    assert_eq!(checked.item.body, qe);

    let pck_crl = testdata("automata-00806f050000/pck_platform_crl.der");
    let checked = check("pckcrl/platform", &pck_crl, &chain).unwrap();
    assert_dates(&checked, 1_739_418_028, 1_742_010_028); // 2025-02-13 03:40:28Z, 2025-03-15 03:40:28Z
    assert_eq!(checked.item.body, pck_crl);

    let root_crl = testdata("automata-00806f050000/intel_root_ca_crl.der");
    let checked = check("rootcrl", &root_crl, "").unwrap();
    assert_dates(&checked, 1_710_962_370, 1_743_707_970); // 2024-03-20 19:19:30Z, 2025-04-03 19:19:30Z
    assert_eq!(checked.item.issuer_chain, "");

    // The TCB info of one FMSPC is not taken for another's.
    let error = check("tcb/b0c06f000000", &tcb, &chain).unwrap_err();
    assert!(error.contains("asked for \"b0c06f000000\""), "{error}");
    // Nor a root CA certificate for a chain.
    let root_der =
        testdata("automata-00806f050000/Intel_SGX_Provisioning_Certification_RootCA.cer");
    let error = check("qe/identity", &qe, &String::from_utf8_lossy(&root_der)).unwrap_err();
    assert_eq!(error, "the issuer chain holds no certificate");
}

#[test]
fn dcap_qvl_collateral_rebuilt_as_pcs_serves_it_parses_with_its_dates() {
    let stored: serde_json::Value =
        serde_json::from_slice(&testdata("dcap-qvl-uptodate/collateral.json")).unwrap();
    let field = |name: &str| stored[name].as_str().unwrap().to_owned();
    // The PCS body around the exact signed bytes, as Intel writes it.
    let signed = |name: &str, inner: &str, sig: &str| {
        format!("{{\"{name}\":{inner},\"signature\":\"{sig}\"}}").into_bytes()
    };

    let tcb = signed("tcbInfo", &field("tcb_info"), &field("tcb_info_signature"));
    let checked = check("tcb/b0c06f000000", &tcb, &field("tcb_info_issuer_chain")).unwrap();
    assert_dates(&checked, 1_750_328_163, 1_752_920_163);
    assert_eq!(
        checked
            .item
            .issuer_chain
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );

    let qe = signed(
        "enclaveIdentity",
        &field("qe_identity"),
        &field("qe_identity_signature"),
    );
    let checked = check("qe/identity", &qe, &field("qe_identity_issuer_chain")).unwrap();
    assert_dates(&checked, 1_750_329_147, 1_752_921_147);

    let pck_crl = hex::decode(field("pck_crl")).unwrap();
    let checked = check("pckcrl/platform", &pck_crl, &field("pck_crl_issuer_chain")).unwrap();
    assert_dates(&checked, 1_750_327_235, 1_752_919_235);

    let root_crl = hex::decode(field("root_ca_crl")).unwrap();
    let checked = check("rootcrl", &root_crl, "").unwrap();
    assert_dates(&checked, 1_742_469_717, 1_775_215_317);
}

#[test]
fn a_crl_served_as_pem_is_kept_as_der() {
    use base64::Engine as _;
    let der = testdata("automata-00806f050000/pck_platform_crl.der");
    let body = base64::engine::general_purpose::STANDARD.encode(&der);
    let mut pem = String::from("-----BEGIN X509 CRL-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap());
        pem.push('\n');
    }
    pem.push_str("-----END X509 CRL-----\n");
    let chain = String::from_utf8(testdata("automata-00806f050000/signing_cert.pem")).unwrap();
    let checked = check("pckcrl/platform", pem.as_bytes(), &chain).unwrap();
    assert_eq!(checked.item.body, der);
}
