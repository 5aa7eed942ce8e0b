//! deploy/examples/gcp-sev-es.attestationConfig.json: a valid gcp-sev-es policy once the image's
//! measurements and the cluster's project are filled in, and refused as long as the project
//! placeholder is left in (an unfilled allow-list must not admit anyone by accident).

mod common;

use common::*;

#[test]
fn the_example_config_is_a_valid_gcp_sev_es_policy_once_filled_in() {
    let mut config = measured_example("gcp-sev-es.attestationConfig.json");
    config["allowedGcpProjects"] = serde_json::json!(["my-cluster-project"]);
    let (validator, digest) =
        attestation::GcpSevEsValidator::from_attestation_config(config.to_string().as_bytes())
            .expect("a gcp-sev-es policy");
    assert_eq!(digest.len(), 64);
    assert!(validator.policy().enforces_any());
    // The project is part of what the digest covers.
    config["allowedGcpProjects"] = serde_json::json!(["another-project"]);
    let (_, other) =
        attestation::GcpSevEsValidator::from_attestation_config(config.to_string().as_bytes())
            .expect("a gcp-sev-es policy");
    assert_ne!(digest, other);
}

#[test]
fn the_project_placeholder_is_refused_until_it_is_filled_in() {
    let config = measured_example("gcp-sev-es.attestationConfig.json");
    let err =
        attestation::GcpSevEsValidator::from_attestation_config(config.to_string().as_bytes())
            .expect_err("the placeholder is no project ID");
    assert!(err.to_string().contains("allowedGcpProjects"), "{err}");
}
