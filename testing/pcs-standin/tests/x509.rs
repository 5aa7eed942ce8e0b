//! The simulated Intel issues what Intel issues, as an independent X.509 implementation (the
//! `openssl verify` CLI; nothing is linked) sees it: the PCK chain (root, Platform and Processor
//! CA, a PCK certificate) and the TCB signing chain pass `-x509_strict`, with Intel's CRLs under
//! `-crl_check_all`, and a revoked PCK or CA is refused.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use pcs_standin::intel::{certificate_pem, pem};
use pcs_standin::{PckCa, SimulatedIntel};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn openssl_verify(args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .arg("verify")
        .args(args)
        .output()
        .expect("the openssl CLI (scripts/install-deps.sh installs it)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn openssl_verifies_the_simulated_intel_chains_and_crls() {
    let intel = SimulatedIntel::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let now = SystemTime::now();
    let (this, next) = (
        now - Duration::from_secs(3600),
        now + Duration::from_secs(86_400),
    );
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();

    let root = write(d, "root.pem", &certificate_pem(intel.root_der()));
    let tcb = write(d, "tcb.pem", &certificate_pem(intel.tcb_signing_der()));
    let root_crl = intel.root_crl(&[], this, next).unwrap();
    let root_crl = write(d, "root-crl.pem", &pem("X509 CRL", &root_crl));
    let strict = |extra: &[&str], cert: &str| {
        let mut args = vec!["-x509_strict", "-CAfile", &root];
        args.extend_from_slice(extra);
        args.push(cert);
        openssl_verify(&args)
    };

    // The TCB signing chain (TCB info and QE identity are signed by its leaf).
    let (ok, text) = strict(&["-crl_check_all", "-CRLfile", &root_crl], &tcb);
    assert!(ok, "TCB signing chain: {text}");
    let revoked = intel.root_crl(&[2], this, next).unwrap();
    let revoked = write(d, "root-crl-tcb.pem", &pem("X509 CRL", &revoked));
    let (ok, text) = strict(&["-crl_check_all", "-CRLfile", &revoked], &tcb);
    assert!(!ok && text.contains("revoked"), "{text}");

    for (ca, name, ca_serial) in [
        (PckCa::Platform, "platform", 3u64),
        (PckCa::Processor, "processor", 4),
    ] {
        let ca_pem = write(
            d,
            &format!("{name}-ca.pem"),
            &certificate_pem(intel.pck_ca_der(ca)),
        );
        let pck = intel
            .pck_certificate(ca, key.public_key().as_ref(), 0x1234, Vec::new())
            .unwrap();
        let pck = write(d, &format!("{name}-pck.pem"), &certificate_pem(&pck));
        let pck_crl = |revoked: &[u64]| {
            let der = intel.pck_crl(ca, revoked, this, next).unwrap();
            write(
                d,
                &format!("{name}-crl-{}.pem", revoked.len()),
                &pem("X509 CRL", &der),
            )
        };
        let (pck_crl_empty, pck_crl_revoking) = (pck_crl(&[]), pck_crl(&[0x1234]));

        let (ok, text) = strict(&["-untrusted", &ca_pem], &pck);
        assert!(ok, "{name} PCK chain: {text}");
        let (ok, text) = strict(
            &[
                "-untrusted",
                &ca_pem,
                "-crl_check_all",
                "-CRLfile",
                &root_crl,
                "-CRLfile",
                &pck_crl_empty,
            ],
            &pck,
        );
        assert!(ok, "{name} PCK chain with CRLs: {text}");
        let (ok, text) = strict(
            &[
                "-untrusted",
                &ca_pem,
                "-crl_check_all",
                "-CRLfile",
                &root_crl,
                "-CRLfile",
                &pck_crl_revoking,
            ],
            &pck,
        );
        assert!(!ok && text.contains("revoked"), "{name}: {text}");
        let ca_revoked = intel.root_crl(&[ca_serial], this, next).unwrap();
        let ca_revoked = write(
            d,
            &format!("root-crl-{name}.pem"),
            &pem("X509 CRL", &ca_revoked),
        );
        let (ok, text) = strict(
            &[
                "-untrusted",
                &ca_pem,
                "-crl_check_all",
                "-CRLfile",
                &ca_revoked,
                "-CRLfile",
                &pck_crl_empty,
            ],
            &pck,
        );
        assert!(!ok && text.contains("revoked"), "{name} CA revoked: {text}");
    }
}
