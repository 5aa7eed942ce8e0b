//! aws-nitro-tpm with AWS's NitroTPM attestation document: documents from a simulated Nitro PKI
//! (`soft_issuer::nitro`), a software AK quoting SHA-256 and SHA-384 banks as a NitroTPM does.
//! A bound AK joins with no opt-in in the config; every refusal is named; the chain passes
//! `openssl verify -x509_strict` (the CLI only checks the simulation is faithful).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use attestation::variants::aws_nitro_tpm::attestation_document::{self, NitroDocError, NitroRoots};
use attestation::variants::aws_nitro_tpm::{AwsNitroTpmValidator, ImageRef, StaticEc2Images};
use attestation::vtpm::make_extra_data;
use attestation::{Error, PolicyError, Validator, ak_digest};
use soft_issuer::SoftIssuer;
use soft_issuer::nitro::{NitroPki, NitroRequest};

const IMAGE: &str = "ami-0a1b2c3d4e5f60718";
const PCR4: [u8; 48] = [0x44; 48];
const USER_DATA: &[u8] = b"spki hash";

fn identity(document: Option<&[u8]>) -> Vec<u8> {
    use base64::Engine as _;
    let field = document
        .map(|d| {
            format!(
                r#","nitroTpmAttestationDocument":"{}""#,
                base64::engine::general_purpose::STANDARD.encode(d)
            )
        })
        .unwrap_or_default();
    format!(
        r#"{{"availabilityZone":"us-east-2a","region":"us-east-2","instanceId":"i-0fedcba9876543210","instanceType":"m6a.large","accountId":"123456789012","imageId":"{IMAGE}"{field}}}"#
    )
    .into_bytes()
}

fn config(pki: &NitroPki, extra: &str) -> String {
    serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(PCR4)}},
        "nitroTpmRoots": pki.root_pem(),
    })
    .to_string()
    .replacen('{', &format!("{{{extra}"), 1)
}

fn validator(pki: &NitroPki, extra: &str) -> AwsNitroTpmValidator {
    let ec2 =
        StaticEc2Images::new().with_image(ImageRef::new("us-east-2", IMAGE).unwrap(), Some("v2.0"));
    AwsNitroTpmValidator::from_attestation_config(config(pki, extra).as_bytes())
        .unwrap()
        .0
        .with_ec2_images(Arc::new(ec2))
}

fn node() -> SoftIssuer {
    SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_sha384_pcrs([(4, PCR4)])
        .unwrap()
}

/// The request a correct node makes for `nonce`: extraData as nonce, its AK's digest as user_data.
fn request(node: &SoftIssuer, nonce: &[u8]) -> NitroRequest {
    let mut pcrs = BTreeMap::new();
    pcrs.insert(4, PCR4.to_vec());
    pcrs.insert(7, vec![0x77; 48]);
    NitroRequest {
        pcrs,
        user_data: Some(ak_digest(node.ak_public()).to_vec()),
        nonce: Some(make_extra_data(USER_DATA, nonce).to_vec()),
        ..NitroRequest::default()
    }
}

fn attest(node: &SoftIssuer, nitro: Option<&[u8]>, nonce: &[u8]) -> Vec<u8> {
    node.issue_document_with_instance_info(USER_DATA, nonce, Some(&identity(nitro)))
        .unwrap()
}

fn refusal(v: &AwsNitroTpmValidator, doc: &[u8], nonce: &[u8]) -> Error {
    v.validate(doc, nonce).unwrap_err()
}

/// The refusal of `node` sending the AWS document `pki` makes for `req`.
fn refused_with(
    v: &AwsNitroTpmValidator,
    pki: &NitroPki,
    node: &SoftIssuer,
    req: &NitroRequest,
    nonce: &[u8],
) -> Error {
    refusal(
        v,
        &attest(node, Some(&pki.document(req).unwrap()), nonce),
        nonce,
    )
}

#[test]
fn a_bound_ak_joins_without_an_opt_in_and_every_refusal_is_named() {
    let pki = NitroPki::new("aws").unwrap();
    let v = validator(&pki, r#""requireNitroTpmAttestation": true,"#);
    let node = node();
    let nonce = [7u8; 32];
    let nitro = pki.document(&request(&node, &nonce)).unwrap();
    let verified = v
        .validate(&attest(&node, Some(&nitro), &nonce), &nonce)
        .unwrap();
    assert!(
        verified.notes[1].contains("bound by AWS's NitroTPM attestation document"),
        "{:?}",
        verified.notes
    );

    // A document made for another connection.
    let other = [8u8; 32];
    let err = refusal(&v, &attest(&node, Some(&nitro), &other), &other);
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::NonceMismatch)),
        "{err}"
    );

    // A document binding another key.
    let mut req = request(&node, &nonce);
    req.user_data = Some(vec![0; 32]);
    let err = refused_with(&v, &pki, &node, &req, &nonce);
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::AkNotBound { .. })),
        "{err}"
    );

    // AWS's PCR 4 differs from the quote's.
    let mut req = request(&node, &nonce);
    req.pcrs.insert(4, vec![0x45; 48]);
    let err = refused_with(&v, &pki, &node, &req, &nonce);
    assert!(
        matches!(
            err,
            Error::NitroDocument(NitroDocError::PcrMismatch { index: 4 })
        ),
        "{err}"
    );

    // PCR 4 absent from AWS's document.
    let mut req = request(&node, &nonce);
    req.pcrs.remove(&4);
    let err = refused_with(&v, &pki, &node, &req, &nonce);
    assert!(
        matches!(
            err,
            Error::NitroDocument(NitroDocError::PcrMissing { index: 4, .. })
        ),
        "{err}"
    );

    // A document from a PKI the config does not trust.
    let foreign = NitroPki::new("aws").unwrap();
    let err = refusal(
        &v,
        &attest(
            &node,
            Some(&foreign.document(&request(&node, &nonce)).unwrap()),
            &nonce,
        ),
        &nonce,
    );
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::ForeignRoot { .. })),
        "{err}"
    );
    // ... nor does the built-in AWS root.
    let aws = v.clone().with_nitro_roots(NitroRoots::aws());
    let err = refusal(&aws, &attest(&node, Some(&nitro), &nonce), &nonce);
    assert!(err.to_string().contains("aws.nitro-enclaves"), "{err}");

    // No document while the config requires one.
    let err = refusal(&v, &attest(&node, None, &nonce), &nonce);
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::Required)),
        "{err}"
    );

    // A tampered signature.
    let mut bad = nitro.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let err = refusal(&v, &attest(&node, Some(&bad), &nonce), &nonce);
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::Signature(_))),
        "{err}"
    );

    // Verified later than the leaf lives, or a leaf not yet valid at the document's time.
    let err = refusal(
        &v.clone().at(4_000_000_000),
        &attest(&node, Some(&nitro), &nonce),
        &nonce,
    );
    assert!(
        matches!(
            err,
            Error::NitroDocument(NitroDocError::Validity { when: "now", .. })
        ),
        "{err}"
    );
    let mut req = request(&node, &nonce);
    req.timestamp_ms = 1_000_000_000_000;
    let err = refused_with(&v, &pki, &node, &req, &nonce);
    assert!(
        matches!(
            err,
            Error::NitroDocument(NitroDocError::Validity {
                when: "at the document's timestamp",
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn with_an_opt_in_a_present_document_never_falls_back_and_an_absent_one_needs_the_opt_in() {
    let pki = NitroPki::new("aws").unwrap();
    let node = node();
    let nonce = [7u8; 32];
    let listed = format!(
        r#""trustedAkDigests": ["{}"],"#,
        hex::encode(ak_digest(node.ak_public()))
    );
    let v = validator(&pki, &listed);
    // Without a document, the listed key joins as before.
    v.validate(&attest(&node, None, &nonce), &nonce).unwrap();
    // A failing document is refused although the key is listed.
    let mut req = request(&node, &nonce);
    req.nonce = Some(vec![1; 32]);
    let err = refused_with(&v, &pki, &node, &req, &nonce);
    assert!(
        matches!(err, Error::NitroDocument(NitroDocError::NonceMismatch)),
        "{err}"
    );
}

#[test]
fn configs_that_require_the_document_refuse_the_opt_in_and_sha256_measurements() {
    let pki = NitroPki::new("aws").unwrap();
    let both = config(
        &pki,
        r#""requireNitroTpmAttestation": true, "trustAnyAk": true,"#,
    );
    let err = AwsNitroTpmValidator::from_attestation_config(both.as_bytes()).unwrap_err();
    assert!(matches!(err, PolicyError::NitroAttestation(_)), "{err}");
    let sha256 = format!(
        r#"{{"measurements": {{"4": {{"expected": "{}"}}}}, "requireNitroTpmAttestation": true}}"#,
        "11".repeat(32)
    );
    let err = AwsNitroTpmValidator::from_attestation_config(sha256.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("SHA-384"), "{err}");
    let bad_root = serde_json::json!({
        "measurements": {"4": {"expected": hex::encode(PCR4)}},
        "requireNitroTpmAttestation": true,
        "nitroTpmRoots": "not a certificate",
    });
    let err =
        AwsNitroTpmValidator::from_attestation_config(bad_root.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("nitroTpmRoots"), "{err}");
    // Without the setting, no opt-in is refused as before.
    let err =
        AwsNitroTpmValidator::from_attestation_config(config(&pki, "").as_bytes()).unwrap_err();
    assert!(matches!(err, PolicyError::NoAkTrust), "{err}");
}

#[test]
fn malformed_payloads_are_refused_by_name() {
    use ciborium::value::Value;
    let pki = NitroPki::new("aws").unwrap();
    let roots = NitroRoots::from_pem(pki.root_pem()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let good = pki.payload(&NitroRequest {
        pcrs: [(4, vec![0; 48])].into_iter().collect(),
        ..NitroRequest::default()
    });
    attestation_document::verify(&pki.sign(&good).unwrap(), &roots, now).unwrap();
    let with = |key: &str, value: Value| {
        let Value::Map(mut m) = good.clone() else {
            unreachable!()
        };
        m.retain(|(k, _)| k.as_text() != Some(key));
        m.push((Value::Text(key.to_owned()), value));
        pki.sign(&Value::Map(m)).unwrap()
    };
    for (key, value, needle) in [
        ("digest", Value::Text("SHA256".into()), "not \"SHA384\""),
        ("module_id", Value::Text(String::new()), "module_id"),
        ("timestamp", Value::Integer(0.into()), "timestamp"),
        ("nitrotpm_pcrs", Value::Map(vec![]), "1..=32"),
        (
            "nitrotpm_pcrs",
            Value::Map(vec![(Value::Integer(32.into()), Value::Bytes(vec![0; 48]))]),
            "0..31",
        ),
        (
            "nitrotpm_pcrs",
            Value::Map(vec![(Value::Integer(4.into()), Value::Bytes(vec![0; 32]))]),
            "48",
        ),
        (
            "user_data",
            Value::Bytes(vec![0; 513]),
            "user_data is 513 bytes",
        ),
        ("nonce", Value::Bytes(vec![0; 513]), "nonce is 513 bytes"),
        ("public_key", Value::Bytes(vec![]), "public_key is 0 bytes"),
        ("cabundle", Value::Array(vec![]), "cabundle has 0"),
        (
            "certificate",
            Value::Bytes(vec![0; 1025]),
            "certificate is 1025 bytes",
        ),
        ("certificate", Value::Null, "certificate is null"),
    ] {
        let err = attestation_document::verify(&with(key, value), &roots, now).unwrap_err();
        assert!(err.to_string().contains(needle), "{key}: {needle}: {err}");
    }
}

#[test]
fn the_simulated_chain_passes_openssl_strict_verification() {
    let pki = NitroPki::new("aws").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("root.pem"), pki.root_pem()).unwrap();
    std::fs::write(path("chain.pem"), pki.intermediates_pem()).unwrap();
    std::fs::write(path("leaf.pem"), pki.leaf_pem()).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["verify", "-x509_strict", "-CAfile"])
        .arg(path("root.pem"))
        .arg("-untrusted")
        .arg(path("chain.pem"))
        .arg(path("leaf.pem"))
        .output()
        .expect("the openssl CLI checks the simulated PKI");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fuzz target's seed reaches every check: it verifies against the root it names, at its own
/// time (`fuzz/src/targets.rs`, `nitro_tpm_document`).
#[test]
fn the_fuzz_seed_passes_every_check_against_its_own_root() {
    use attestation::variants::aws_nitro_tpm::attestation_document::{NitroRoots, parse, verify};
    let seed = include_bytes!("../../../fuzz/seeds/nitro_tpm_document/simulated-nitro-pki.cbor");
    let (_, doc) = parse(seed).unwrap();
    let roots = NitroRoots::from_der(vec![doc.cabundle[0].clone()]).unwrap();
    let at = i64::try_from(doc.timestamp_ms / 1000).unwrap();
    let verified = verify(seed, &roots, at).unwrap();
    assert_eq!(verified.nonce.as_deref(), Some(&[4u8; 32][..]));
    assert!(verify(seed, &NitroRoots::aws(), at).is_err());
}
