//! deploy/components: each variant's component, and the overlay in deploy/examples that applies
//! it. A component changes attest-proxy's variant through its flag variable (an env entry, which
//! a strategic merge merges by name) and adds the collateral egress the variant needs; the rest
//! of the pod is the base's.

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::Value;

/// The variants with a component of their own, and the collateral component each includes.
const VARIANTS: [(&str, &str); 4] = [
    ("aws-sev-snp", "sev-snp-collateral"),
    ("azure-sev-snp", "sev-snp-collateral"),
    ("qemu-tdx", "tdx-collateral"),
    ("azure-tdx", "tdx-collateral"),
];

fn component_dir(name: &str) -> PathBuf {
    deploy_dir().join("components").join(name)
}

fn kustomization_of(dir: &std::path::Path) -> Value {
    read_docs(&dir.join("kustomization.yaml")).remove(0)
}

/// The pod spec an overlay of the base and `variant`'s component runs.
fn pod_spec_with(variant: &str) -> Value {
    merged_pod_spec(&component_dir(variant).join("variant.yaml"))
}

#[test]
fn each_variant_overlay_is_the_base_and_its_component() {
    for (variant, _) in VARIANTS {
        let overlay = kustomization_of(&deploy_dir().join("examples").join(variant));
        assert_eq!(overlay["kind"], "Kustomization", "{variant}");
        assert_eq!(overlay["resources"], serde_json::json!(["../../base"]));
        assert_eq!(
            overlay["components"],
            serde_json::json!([format!("../../components/{variant}")])
        );
        assert!(
            overlay.get("patches").is_none(),
            "{variant}: patches of its own"
        );
    }
}

#[test]
fn a_component_sets_the_variant_and_includes_its_collateral_egress() {
    for (variant, collateral) in VARIANTS {
        let component = kustomization_of(&component_dir(variant));
        assert_eq!(component["kind"], "Component", "{variant}");
        assert_eq!(
            component["components"],
            serde_json::json!([format!("../{collateral}")])
        );
        let patches = array(&component["patches"]);
        assert_eq!(patches.len(), 1, "{variant}");
        assert_eq!(patches[0]["path"], "variant.yaml");
        assert_eq!(patches[0]["target"]["kind"], "DaemonSet");
        assert_eq!(
            patches[0]["target"]["name"],
            daemonset()["metadata"]["name"]
        );

        let spec = pod_spec_with(variant);
        let containers = array(&spec["containers"]);
        let proxy = containers
            .iter()
            .find(|c| c["name"] == "attest-proxy")
            .expect("attest-proxy");
        assert_eq!(required_flag(proxy, "variant"), variant);
        assert_args_parse(&containers);
        // Only the variant changes: the rest of attest-proxy, the other containers and the pod.
        let base = container("attest-proxy");
        assert_eq!(args(proxy), args(&base), "{variant} changes the args");
        let strip = |c: &Value| {
            let mut c = c.clone();
            c.as_object_mut().expect("a container").remove("env");
            c
        };
        assert_eq!(strip(proxy), strip(&base), "{variant} changes attest-proxy");
        for other in ["join-core", "token-issuer"] {
            assert!(
                containers.contains(&container(other)),
                "{variant} changes {other}"
            );
        }
        assert_eq!(containers.len(), array(&pod_spec()["containers"]).len());
    }
}

#[test]
fn the_collateral_components_add_one_egress_policy_each() {
    for (collateral, file, name) in [
        ("sev-snp-collateral", "kds-egress.yaml", "join-service-kds"),
        ("tdx-collateral", "pcs-egress.yaml", "join-service-pcs"),
    ] {
        let component = kustomization_of(&component_dir(collateral));
        assert_eq!(component["kind"], "Component");
        assert_eq!(component["resources"], serde_json::json!([file]));
        let docs = read_docs(&component_dir(collateral).join(file));
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0]["kind"], "NetworkPolicy");
        assert_eq!(docs[0]["metadata"]["name"], name);
        assert_eq!(
            docs[0]["spec"]["policyTypes"],
            serde_json::json!(["Egress"])
        );
        assert_eq!(
            docs[0]["spec"]["podSelector"],
            one_of("NetworkPolicy")["spec"]["podSelector"]
        );
    }
}

/// Where a component or overlay sets a flag, the base reads it from its variable too: an
/// entry in args would win over the variable and the component would change nothing.
#[test]
fn the_flags_components_set_are_not_in_the_base_args() {
    let base = container("attest-proxy");
    assert!(flag(&base, "variant").is_some());
    assert!(
        args(&base).iter().all(|a| !a.starts_with("--variant")),
        "the base sets the variant in args, where no env entry can change it"
    );
    assert_env_only_sets_flags(&base);
}
