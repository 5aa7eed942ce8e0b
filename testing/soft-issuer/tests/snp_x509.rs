//! The simulated AMD issues what AMD issues, as an independent X.509 implementation (the
//! `openssl verify` CLI; nothing is linked) sees it, and the verifier refuses issuers that RFC
//! 5280 does not let sign.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use attestation::snp::certs::verify_chain;
use attestation::snp::{Cert, Crl, Product, SnpError, Tcb};
use soft_issuer::snp::{IssuerFlaw, SimulatedAmd};

const NOW: i64 = 1_795_564_800; // 2026-11-25
const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn write(dir: &Path, name: &str, label: &str, der: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem(label, der)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `openssl verify` at [`NOW`] with `args`: whether it succeeded, and what it printed.
fn openssl_verify(args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .arg("verify")
        .args(["-attime", &NOW.to_string()])
        .args(args)
        .output()
        .expect("the openssl CLI (scripts/install-deps.sh installs it)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

struct Files {
    _dir: tempfile::TempDir,
    ark: String,
    ask: String,
    asvk: String,
    vcek: String,
    vlek: String,
    crl: String,
    ask_revoked: String,
    asvk_revoked: String,
}

fn files(amd: &SimulatedAmd) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let now = u64::try_from(NOW).unwrap();
    let crl = |revoked: &[u8]| amd.crl(revoked, now - 3600, now + 86_400).unwrap();
    Files {
        ark: write(d, "ark.pem", "CERTIFICATE", amd.ark_der()),
        ask: write(d, "ask.pem", "CERTIFICATE", amd.ask_der()),
        asvk: write(d, "asvk.pem", "CERTIFICATE", amd.asvk_der()),
        vcek: write(
            d,
            "vcek.pem",
            "CERTIFICATE",
            amd.chip([7; 64], TCB, 0).unwrap().cert_der(),
        ),
        vlek: write(
            d,
            "vlek.pem",
            "CERTIFICATE",
            amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB)
                .unwrap()
                .cert_der(),
        ),
        crl: write(d, "crl.pem", "X509 CRL", &crl(&[])),
        ask_revoked: write(d, "crl-ask.pem", "X509 CRL", &crl(&[2])),
        asvk_revoked: write(d, "crl-asvk.pem", "X509 CRL", &crl(&[3])),
        _dir: dir,
    }
}

/// AMD's CAs as `openssl verify -x509_strict` wants them (with AMD's CRLs, `-crl_check`), and
/// the whole VCEK and VLEK chains. AMD's VCEKs and VLEKs carry no AuthorityKeyIdentifier, so
/// `-x509_strict` refuses the leaf of AMD's real chain as of the simulated one, for that only.
#[test]
fn openssl_verifies_the_simulated_amd_chains_and_crls() {
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        let amd = SimulatedAmd::new(product).unwrap();
        let f = files(&amd);
        for (intermediate, leaf, revoking) in [
            (&f.ask, &f.vcek, &f.ask_revoked),
            (&f.asvk, &f.vlek, &f.asvk_revoked),
        ] {
            let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &f.ark, intermediate]);
            assert!(ok, "{product} {intermediate}: {text}");
            let (ok, text) = openssl_verify(&[
                "-x509_strict",
                "-crl_check",
                "-CAfile",
                &f.ark,
                "-CRLfile",
                &f.crl,
                intermediate,
            ]);
            assert!(ok, "{product} {intermediate} with the CRL: {text}");
            let (ok, text) = openssl_verify(&[
                "-x509_strict",
                "-crl_check",
                "-CAfile",
                &f.ark,
                "-CRLfile",
                revoking,
                intermediate,
            ]);
            assert!(!ok && text.contains("revoked"), "{product}: {text}");
            let (ok, text) = openssl_verify(&["-CAfile", &f.ark, "-untrusted", intermediate, leaf]);
            assert!(ok, "{product} {leaf}: {text}");
            let (ok, text) = openssl_verify(&[
                "-x509_strict",
                "-CAfile",
                &f.ark,
                "-untrusted",
                intermediate,
                leaf,
            ]);
            assert!(
                !ok && text.contains("Missing Authority Key Identifier"),
                "{product} {leaf}: {text}"
            );
        }
    }
}

/// AMD's real Milan VCEK chain, for the one `-x509_strict` complaint it shares with the
/// simulated one.
#[test]
fn openssl_x509_strict_refuses_amds_real_vcek_for_its_missing_authority_key_id_only() {
    let dir = tempfile::tempdir().unwrap();
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lib/attestation/testdata/snp");
    let chain = attestation::snp::certs_from_pem(
        &std::fs::read(testdata.join("azure-certchain.pem")).unwrap(),
    )
    .unwrap();
    let ask = write(dir.path(), "ask.pem", "CERTIFICATE", chain[0].der());
    let ark = write(dir.path(), "ark.pem", "CERTIFICATE", chain[1].der());
    let vcek = testdata.join("azure-vcek.pem");
    let vcek = vcek.to_str().unwrap();
    let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &ark, &ask]);
    assert!(ok, "{text}");
    let (ok, text) = openssl_verify(&["-CAfile", &ark, "-untrusted", &ask, vcek]);
    assert!(ok, "{text}");
    let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &ark, "-untrusted", &ask, vcek]);
    assert!(
        !ok && text.contains("Missing Authority Key Identifier"),
        "{text}"
    );
}

/// An ASK or ASVK that is not a CA, or whose KeyUsage lacks keyCertSign, signs no VCEK or VLEK;
/// an ARK without cRLSign signs no CRL. openssl agrees.
#[test]
fn issuers_without_ca_true_key_cert_sign_or_crl_sign_are_refused() {
    for (flaw, needle) in [
        (IssuerFlaw::NotCa, "is not a CA"),
        (IssuerFlaw::NoKeyCertSign, "no KeyUsage keyCertSign"),
    ] {
        let amd = SimulatedAmd::with_flaw(Product::Milan, flaw).unwrap();
        let ark = Cert::from_der(amd.ark_der().to_vec()).unwrap();
        let chains = [
            (amd.chip([7; 64], TCB, 0).unwrap(), amd.ask_der()),
            (
                amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap(),
                amd.asvk_der(),
            ),
        ];
        for (leaf, intermediate) in &chains {
            let err = verify_chain(
                &Cert::from_der(leaf.cert_der().to_vec()).unwrap(),
                &Cert::from_der(intermediate.to_vec()).unwrap(),
                &ark,
                std::slice::from_ref(&ark),
                NOW,
            )
            .unwrap_err();
            assert!(
                matches!(&err, SnpError::Chain(m) if m.contains(needle) && m.contains("intermediate")),
                "{flaw:?}: {err}"
            );
        }
        let f = files(&amd);
        let (ok, text) = openssl_verify(&["-CAfile", &f.ark, "-untrusted", &f.ask, &f.vcek]);
        assert!(!ok, "{flaw:?}: openssl accepted {text}");
    }

    let amd = SimulatedAmd::with_flaw(Product::Milan, IssuerFlaw::ArkNoCrlSign).unwrap();
    let ark = Cert::from_der(amd.ark_der().to_vec()).unwrap();
    let ask = Cert::from_der(amd.ask_der().to_vec()).unwrap();
    let vcek = Cert::from_der(amd.chip([7; 64], TCB, 0).unwrap().cert_der().to_vec()).unwrap();
    let now = u64::try_from(NOW).unwrap();
    let crl = Crl::from_der(amd.crl(&[], now - 3600, now + 86_400).unwrap()).unwrap();
    let err = crl.check(&ark, &ask, &vcek, NOW, 0).unwrap_err();
    assert!(
        matches!(&err, SnpError::Crl(m) if m.contains("no KeyUsage cRLSign")),
        "{err}"
    );
    let f = files(&amd);
    let (ok, text) = openssl_verify(&["-crl_check", "-CAfile", &f.ark, "-CRLfile", &f.crl, &f.ask]);
    assert!(
        !ok,
        "openssl accepted a CRL of an ARK without cRLSign: {text}"
    );
}
