//! deploy/examples/aws-nitro-tpm.attestationConfig.json: a valid aws-nitro-tpm policy once the
//! image's measurements and the nodes' AK digests are filled in, and one that names the keys it
//! trusts: it does not fall back to trusting any key.
//! deploy/examples/aws-nitro-tpm-document.attestationConfig.json: the policy for nodes that send
//! AWS's NitroTPM attestation document, which trusts keys only through it.

mod common;

use attestation::PolicyError;
use attestation::variants::aws_nitro_tpm::AwsNitroTpmValidator;
use common::*;
use serde_json::Value;

fn example_named(name: &str) -> Value {
    let text = std::fs::read_to_string(deploy_dir().join("examples").join(name))
        .expect("the example config");
    serde_json::from_str(&text).expect("JSON")
}

fn example() -> Value {
    example_named("aws-nitro-tpm.attestationConfig.json")
}

fn document_example() -> Value {
    example_named("aws-nitro-tpm-document.attestationConfig.json")
}

/// `config` with every expected measurement set to `len` bytes of hex.
fn measured(mut config: Value, len: usize) -> Value {
    for (_, m) in config["measurements"]
        .as_object_mut()
        .expect("measurements")
        .iter_mut()
    {
        m["expected"] = Value::String("ab".repeat(len));
    }
    config
}

/// The example with every placeholder replaced by 32 bytes of hex.
fn filled() -> Value {
    let mut config = measured(example(), 32);
    for digest in config["trustedAkDigests"]
        .as_array_mut()
        .expect("trustedAkDigests")
    {
        *digest = Value::String("cd".repeat(32));
    }
    config
}

#[test]
fn the_example_is_a_valid_policy_pinning_its_keys_once_filled_in() {
    let (validator, digest) =
        AwsNitroTpmValidator::from_attestation_config(filled().to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(digest.len(), 64);
    assert!(validator.policy().enforces_any());
    assert!(
        !validator.ak_trust().unwrap().is_any(),
        "the example must not trust any key"
    );
    assert!(example().get("trustAnyAk").is_none());

    // As shipped, the placeholders are refused by name rather than read as values.
    let err = AwsNitroTpmValidator::from_attestation_config(example().to_string().as_bytes())
        .unwrap_err();
    assert!(err.to_string().contains("not valid hex"), "{err}");

    // Without its key list it trusts no key, and says which settings exist.
    let mut keyless = filled();
    keyless
        .as_object_mut()
        .expect("object")
        .remove("trustedAkDigests");
    let err =
        AwsNitroTpmValidator::from_attestation_config(keyless.to_string().as_bytes()).unwrap_err();
    assert!(matches!(err, PolicyError::NoAkTrust), "{err}");
}

#[test]
fn the_document_example_requires_aws_document_and_sha384_measurements_once_filled_in() {
    let filled = measured(document_example(), 48);
    let validator = AwsNitroTpmValidator::from_attestation_config(filled.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
        .0;
    assert!(validator.policy().enforces_any());
    assert!(
        validator.ak_trust().is_none(),
        "keys are trusted only through AWS's document"
    );

    // As shipped, the placeholders are refused by name.
    let err =
        AwsNitroTpmValidator::from_attestation_config(document_example().to_string().as_bytes())
            .unwrap_err();
    assert!(err.to_string().contains("not valid hex"), "{err}");

    // SHA-256 values, the opt-in bank, are refused: AWS signs the SHA-384 PCRs.
    let sha256 = measured(filled.clone(), 32);
    let err =
        AwsNitroTpmValidator::from_attestation_config(sha256.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("SHA-384"), "{err}");

    // Adding the opt-in beside the requirement is refused, not merged.
    let mut both = filled;
    both["trustAnyAk"] = Value::Bool(true);
    let err =
        AwsNitroTpmValidator::from_attestation_config(both.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("remove trustedAkDigests"), "{err}");
}
