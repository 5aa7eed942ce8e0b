//! What several of attest-tool's test files read: the real vectors in
//! `lib/attestation/testdata` and Intel's real collateral laid out as PCS answers.

use std::path::Path;

use base64::Engine as _;

/// The path of a file under `lib/attestation/testdata`.
pub fn testdata(path: &str) -> String {
    format!(
        "{}/../../lib/attestation/testdata/{path}",
        env!("CARGO_MANIFEST_DIR")
    )
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

/// Writes the automata collateral (FMSPC 00806f050000) into `dir` as `--collateral` reads PCS
/// answers.
pub fn automata_pcs_dir(dir: &Path) {
    let a =
        |name: &str| std::fs::read(testdata(&format!("tdx/automata-00806f050000/{name}"))).unwrap();
    let chain = String::from_utf8(a("signing_cert.pem")).unwrap()
        + &pem(&a("Intel_SGX_Provisioning_Certification_RootCA.cer"));
    for (name, bytes) in [
        ("tcb_info.json", a("tcbinfov3_00806f050000.json")),
        ("qe_identity.json", a("qeidentityv2_apiv4.json")),
        ("pck_crl.der", a("pck_platform_crl.der")),
        ("root_ca_crl.der", a("intel_root_ca_crl.der")),
        ("tcb_info_issuer_chain.pem", chain.clone().into_bytes()),
        ("qe_identity_issuer_chain.pem", chain.into_bytes()),
    ] {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
