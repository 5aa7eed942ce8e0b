//! deploy/examples/gcp-sev-es: the overlay (gcp-sev-snp's, attest-proxy serving gcp-sev-es) and
//! its attestation config, a valid gcp-sev-es policy once the image's measurements and the
//! cluster's project are filled in, and refused as long as the project placeholder is left in
//! (an unfilled allow-list must not admit anyone by accident).

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

fn overlay_dir() -> std::path::PathBuf {
    deploy_dir().join("examples/gcp-sev-es")
}

/// The pod spec `kubectl apply -k deploy/examples/gcp-sev-es` runs: the base, gcp-sev-snp's
/// patch, then this overlay's.
fn pod() -> serde_json::Value {
    merge_pod_patch(
        merged_pod_spec(&deploy_dir().join("examples/gcp-sev-snp/gce-identity.yaml")),
        &overlay_dir().join("variant.yaml"),
    )
}

#[test]
fn the_overlay_is_gcp_sev_snps_serving_gcp_sev_es() {
    let k = &read_docs(&overlay_dir().join("kustomization.yaml"))[0];
    assert_eq!(
        str_set(k["resources"].as_array().expect("resources")),
        names(&["../gcp-sev-snp"])
    );
    let patches = array(&k["patches"]);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["path"], "variant.yaml");
    assert_eq!(patches[0]["target"]["kind"], "DaemonSet");
    assert_eq!(
        patches[0]["target"]["name"],
        daemonset()["metadata"]["name"]
    );
    let containers = array(&pod()["containers"]);
    let container = |name: &str| {
        containers
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no container {name}"))
    };
    let proxy = container("attest-proxy");
    assert_eq!(required_flag(&proxy, "variant"), "gcp-sev-es");
    assert_eq!(
        required_flag(&proxy, "gce-identity-uid"),
        run_as_user(&container("gce-identity")).to_string()
    );
    assert_args_parse(&containers);
}
