//! deploy/examples for azure-trustedlaunch: the attestation config is a valid policy once the
//! image's measurements and the operator's Azure vTPM root are filled in (and none as shipped),
//! and the overlay is the base with a component that changes attest-proxy's variant and nothing
//! else: attest-proxy fetches nothing for this variant, so no egress is opened.

mod common;

use attestation::variants::azure_trustedlaunch::{TrustedLaunchValidator, builtin_roots};
use common::*;
use serde_json::Value;

const VARIANT: &str = "azure-trustedlaunch";

fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

#[test]
fn the_example_config_is_a_valid_policy_once_measured_and_given_a_root() {
    let path = deploy_dir()
        .join("examples")
        .join(format!("{VARIANT}.attestationConfig.json"));
    let text = std::fs::read_to_string(&path).expect("the example config");
    // As shipped, with placeholders, no proxy would start on it.
    assert!(TrustedLaunchValidator::from_attestation_config(text.as_bytes()).is_err());

    let mut config: Value = serde_json::from_str(&text).expect("JSON");
    for (_, m) in config["measurements"]
        .as_object_mut()
        .expect("measurements")
        .iter_mut()
    {
        assert!(
            m["expected"].as_str().is_some_and(|s| s.starts_with('<')),
            "a placeholder, not a value that only fits one image"
        );
        m["expected"] = Value::String("ab".repeat(32));
    }
    let roots = config["azureVtpmRoots"]
        .as_array_mut()
        .expect("azureVtpmRoots");
    assert_eq!(roots.len(), 1);
    assert!(roots[0].as_str().is_some_and(|s| s.starts_with("<PEM")));
    // Any CA certificate stands for the operator's root here: the built-in one.
    roots[0] = Value::String(pem(builtin_roots()[0].der()));
    let (validator, digest) =
        TrustedLaunchValidator::from_attestation_config(config.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(digest.len(), 64);
    assert!(validator.policy().enforces_any());
    // Enforced, every one: the vTPM's PCRs are all this variant measures.
    assert!(
        validator
            .policy()
            .measurements()
            .values()
            .all(|m| !m.warn_only)
    );
}

#[test]
fn the_overlay_is_the_base_and_a_component_that_only_sets_the_variant() {
    let overlay = read_docs(
        &deploy_dir()
            .join("examples")
            .join(VARIANT)
            .join("kustomization.yaml"),
    )
    .remove(0);
    assert_eq!(overlay["resources"], serde_json::json!(["../../base"]));
    assert_eq!(
        overlay["components"],
        serde_json::json!([format!("../../components/{VARIANT}")])
    );
    assert!(overlay.get("patches").is_none());

    let component_dir = deploy_dir().join("components").join(VARIANT);
    let component = read_docs(&component_dir.join("kustomization.yaml")).remove(0);
    assert_eq!(component["kind"], "Component");
    assert!(
        component.get("components").is_none() && component.get("resources").is_none(),
        "no collateral egress: attest-proxy fetches nothing for {VARIANT}"
    );
    let spec = merged_pod_spec(&component_dir.join("variant.yaml"));
    let containers = array(&spec["containers"]);
    let proxy = containers
        .iter()
        .find(|c| c["name"] == "attest-proxy")
        .expect("attest-proxy");
    assert_eq!(required_flag(proxy, "variant"), VARIANT);
    assert_args_parse(&containers);
    assert_eq!(args(proxy), args(&container("attest-proxy")));
    for other in ["join-core", "token-issuer"] {
        assert!(containers.contains(&container(other)), "changes {other}");
    }
}
