//! The TDX verifier on real quotes and Intel collateral (`../shared/testdata/tdx`).

use std::path::PathBuf;

use attestation::tdx::collateral::PcsResponses;
use attestation::tdx::{Collateral, TdQuote, TdxError, Trust, verify_quote};
use base64::Engine as _;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/tdx")
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

#[test]
fn probe() {
    let q = TdQuote::parse(&read("dcap-qvl-uptodate/quote.bin")).unwrap();
    let v = verify_quote(&q, &uptodate(), &Trust::builtin(), 1750329147);
    println!("{v:#?}");
    let q = TdQuote::parse(&read("automata-00806f050000/quote_tdx_00806f050000.dat")).unwrap();
    let v = verify_quote(&q, &automata(), &Trust::builtin(), 1739418641);
    println!("{v:#?}");
    let q = TdQuote::parse(&read("azure-tdx-vtpm/td-quote.bin")).unwrap();
    let v = verify_quote(&q, &automata(), &Trust::builtin(), 1739418641);
    println!("{v:#?}");
    let v = verify_quote(&q, &automata(), &Trust::builtin(), 1739418640);
    println!("{v:#?}");
    let v = verify_quote(&q, &automata(), &Trust::builtin(), 1742009941);
    println!("{v:#?}");
    let _ = TdxError::Debug;
}
