//! The simulated Azure vTPM CA issues what Azure issues, as an independent X.509 implementation
//! (the `openssl verify` CLI, `-x509_strict`) sees it, and the azure-trustedlaunch validator
//! accepts documents whose AK it certified and refuses, by name, every way the certificate can
//! fail to vouch for the quoting key.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use attestation::Validator;
use attestation::variants::azure_trustedlaunch::{InstanceInfo, TrustedLaunchValidator};
use soft_issuer::SoftIssuer;
use soft_issuer::azure_vtpm::{SimulatedAzureVtpmCa, Window};

const PCR4: [u8; 32] = [0x44; 32];
const NONCE: &[u8] = b"a fresh nonce of thirty-two byte";

fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

fn write(dir: &Path, name: &str, der: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem(der)).unwrap();
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

fn soft_ak() -> SoftIssuer {
    SoftIssuer::rsa_2048()
        .unwrap()
        .with_pcrs([(4, PCR4)])
        .unwrap()
}

#[test]
fn openssl_x509_strict_accepts_the_simulated_chain_and_its_ak_certificate() {
    let azure = SimulatedAzureVtpmCa::new().unwrap();
    let ak = soft_ak();
    let cert = azure
        .ak_cert(
            ak.ak_public(),
            "0f1e2d3c4b5a",
            Window::current(),
            &["http://ca.example/ca.crt"],
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = write(dir.path(), "root.pem", azure.root_der());
    let ca = write(dir.path(), "ca.pem", azure.ca_der());
    let leaf = write(dir.path(), "ak.pem", &cert);

    let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &root, &ca]);
    assert!(ok, "{text}");
    let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &root, "-untrusted", &ca, &leaf]);
    assert!(ok, "{text}");
    // What the AK certificate says, as openssl prints it.
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &leaf])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("CN=0f1e2d3c4b5a.TrustedVM.Azure.windows.net")
            || text.contains("CN = 0f1e2d3c4b5a.TrustedVM.Azure.windows.net"),
        "{text}"
    );
    assert!(text.contains("2.23.133.8.3"), "{text}");
    assert!(
        text.contains("CA Issuers - URI:http://ca.example/ca.crt"),
        "{text}"
    );

    // The impostor's chain does not verify to the simulated root.
    let impostor = SimulatedAzureVtpmCa::impostor().unwrap();
    let other_ca = write(dir.path(), "other-ca.pem", impostor.ca_der());
    let (ok, text) = openssl_verify(&["-x509_strict", "-CAfile", &root, &other_ca]);
    assert!(!ok, "{text}");
}

fn validator(azure: &SimulatedAzureVtpmCa) -> TrustedLaunchValidator {
    let config = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(PCR4), "warnOnly": false}},
        "azureVtpmRoots": [azure.root_pem()],
    });
    TrustedLaunchValidator::from_attestation_config(config.to_string().as_bytes())
        .unwrap()
        .0
}

fn document(ak: &SoftIssuer, ak_cert: Vec<u8>, ca: &[u8]) -> Vec<u8> {
    let info = InstanceInfo {
        ak_cert,
        ca: ca.to_vec(),
    }
    .to_json();
    ak.issue_document_with_instance_info(b"user data", NONCE, Some(&info))
        .unwrap()
}

fn refusal(validator: &TrustedLaunchValidator, doc: &[u8]) -> (String, &'static str) {
    let err = validator.validate(doc, NONCE).unwrap_err();
    (err.to_string(), attestation::audit::check_name(&err))
}

#[test]
fn the_validator_accepts_a_certified_ak_and_refuses_each_broken_certificate_by_name() {
    let azure = SimulatedAzureVtpmCa::new().unwrap();
    let validator = validator(&azure);
    let ak = soft_ak();
    let good = azure
        .ak_cert(ak.ak_public(), "vm1", Window::current(), &[])
        .unwrap();
    let verified = validator
        .validate(&document(&ak, good.clone(), azure.ca_der()), NONCE)
        .unwrap();
    assert_eq!(verified.user_data, b"user data");
    assert!(
        verified.notes[0].contains("vm1.TrustedVM.Azure.windows.net"),
        "{:?}",
        verified.notes
    );

    // Expired.
    let expired = azure
        .ak_cert(ak.ak_public(), "vm1", Window::expired(), &[])
        .unwrap();
    let (text, check) = refusal(&validator, &document(&ak, expired, azure.ca_der()));
    assert_eq!(check, "ak_cert_expired", "{text}");
    assert!(
        text.contains("the AK certificate CN=vm1.TrustedVM.Azure.windows.net is not valid at"),
        "{text}"
    );

    // Chained to another root with Azure's names.
    let impostor = SimulatedAzureVtpmCa::impostor().unwrap();
    let foreign = impostor
        .ak_cert(ak.ak_public(), "vm1", Window::current(), &[])
        .unwrap();
    let (text, check) = refusal(
        &validator,
        &document(&ak, foreign.clone(), impostor.ca_der()),
    );
    assert_eq!(check, "ak_cert_untrusted_root", "{text}");
    assert!(
        text.contains("no trusted root of that name signed it"),
        "{text}"
    );
    // Its AK certificate beside the trusted CA: the names match, the signature does not.
    let (text, check) = refusal(&validator, &document(&ak, foreign, azure.ca_der()));
    assert_eq!(check, "ak_cert_chain", "{text}");
    assert!(
        text.contains("signature does not verify with the CA's key"),
        "{text}"
    );

    // A certificate for another purpose than attestation keys (document signing only):
    // Constellation accepts any ExtendedKeyUsage, so the refusal says it is stricter.
    let signing_only = azure
        .ak_cert_for(
            ak.ak_public(),
            "vm1",
            Window::current(),
            &[],
            &[soft_issuer::azure_vtpm::MS_KP_DOCUMENT_SIGNING],
        )
        .unwrap();
    let (text, check) = refusal(&validator, &document(&ak, signing_only, azure.ca_der()));
    assert_eq!(check, "ak_cert_usage", "{text}");
    assert!(
        text.contains("names neither tcg-kp-AIKCertificate")
            && text.contains("stricter than Constellation"),
        "{text}"
    );

    // A certificate for another key than the quoting one.
    let other = SoftIssuer::ecdsa_p256().unwrap();
    let rsa_other = SoftIssuer::rsa_2048_from_pkcs8(&other_rsa_pkcs8()).unwrap();
    let for_other = azure
        .ak_cert(rsa_other.ak_public(), "vm1", Window::current(), &[])
        .unwrap();
    let (text, check) = refusal(&validator, &document(&ak, for_other, azure.ca_der()));
    assert_eq!(check, "ak_cert_key_mismatch", "{text}");
    // An ECDSA AK is refused: Azure's is RSA.
    let (text, check) = refusal(&validator, &document(&other, good.clone(), azure.ca_der()));
    assert_eq!(check, "ak_cert_key_mismatch", "{text}");
    assert!(text.contains("not an RSA key"), "{text}");

    // A CA that is not the AK certificate's issuer.
    let root_as_ca = document(&ak, good.clone(), azure.root_der());
    let (text, check) = refusal(&validator, &root_as_ca);
    assert_eq!(check, "ak_cert_chain", "{text}");
    assert!(
        text.contains("not by the CA the document carries"),
        "{text}"
    );

    // A config with the built-in roots only (Azure's 2023 root and Constellation's AME root) and
    // no simulated root.
    let builtin_only = TrustedLaunchValidator::from_attestation_config(
        serde_json::json!({
            "measurements": {"4": {"expected": hex::encode(PCR4)}},
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap()
    .0;
    let (text, check) = refusal(&builtin_only, &document(&ak, good.clone(), azure.ca_der()));
    assert_eq!(check, "ak_cert_untrusted_root", "{text}");
    assert!(
        text.contains(
            "none of the trusted roots (C=US, O=Microsoft Corporation, CN=Azure Virtual TPM Root Certificate Authority 2023"
        ) && text.contains("DC=GBL, DC=AME, CN=ameroot"),
        "{text}"
    );

    // The PCRs come last, from the verified quote.
    let wrong_pcr = SoftIssuer::rsa_2048()
        .unwrap()
        .with_pcrs([(4, [0x45; 32])])
        .unwrap();
    let (text, check) = refusal(
        &validator,
        &document(&wrong_pcr, good.clone(), azure.ca_der()),
    );
    assert_eq!(check, "measurements", "{text}");

    // Verified at another time: the certificate was not yet valid a year ago.
    let past = validator.clone().with_clock(Arc::new(|| {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap()
            - 365 * 86_400
    }));
    let (_, check) = refusal(&past, &document(&ak, good, azure.ca_der()));
    assert_eq!(check, "ak_cert_expired");
}

/// Another RSA key than soft-issuer's RSA test key: the simulated CA's, which is a test key too.
fn other_rsa_pkcs8() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("keys/rsa2048-azure-vtpm-ca-test.pk8"))
        .unwrap()
}

/// A deeper hierarchy (AK certificate ← CA ← intermediate ← root), of which a document carries
/// only the CA: openssl verifies the whole chain; the validator refuses it when only the root is
/// trusted (the intermediate is not in the document) and accepts it when the config lists the
/// intermediate as an anchor.
#[test]
fn a_deeper_hierarchy_verifies_with_its_intermediate_as_the_anchor() {
    let azure = SimulatedAzureVtpmCa::deeper().unwrap();
    let ak = soft_ak();
    let cert = azure
        .ak_cert(ak.ak_public(), "deep-vm", Window::current(), &[])
        .unwrap();
    let intermediate = azure.intermediate_pem().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let root = write(dir.path(), "root.pem", azure.root_der());
    let chain = dir.path().join("chain.pem");
    std::fs::write(&chain, format!("{}{intermediate}", pem(azure.ca_der()))).unwrap();
    let leaf = write(dir.path(), "ak.pem", &cert);
    let (ok, text) = openssl_verify(&[
        "-x509_strict",
        "-CAfile",
        &root,
        "-untrusted",
        chain.to_str().unwrap(),
        &leaf,
    ]);
    assert!(ok, "{text}");

    let doc = document(&ak, cert, azure.ca_der());
    let (text, check) = refusal(&validator(&azure), &doc);
    assert_eq!(check, "ak_cert_untrusted_root", "{text}");
    assert!(
        text.contains("was issued by CN=Azure Cloud Virtual TPM CA 2025"),
        "{text}"
    );

    let config = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(PCR4), "warnOnly": false}},
        "azureVtpmRoots": [intermediate],
    });
    let anchored = TrustedLaunchValidator::from_attestation_config(config.to_string().as_bytes())
        .unwrap()
        .0;
    let verified = anchored.validate(&doc, NONCE).unwrap();
    assert!(
        verified.notes[0].contains("anchored at CN=Azure Cloud Virtual TPM CA 2025"),
        "{:?}",
        verified.notes
    );
}
