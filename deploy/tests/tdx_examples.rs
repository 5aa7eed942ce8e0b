//! deploy/examples for the TDX variants: each attestation config is a valid policy of its
//! variant once the image's measurements are filled in, and the PCS egress opens HTTPS only, for
//! the join-service pods only.

mod common;

use std::sync::Arc;

use attestation::tdx::StaticCollateral;
use attestation::variants::tdx::{TdxKind, TdxValidator};
use common::*;
use serde_json::Value;

/// The example with every placeholder replaced by `len` bytes of hex.
fn measured(name: &str, len: usize) -> Value {
    let text = std::fs::read_to_string(deploy_dir().join("examples").join(name))
        .expect("the example config");
    let mut config: Value = serde_json::from_str(&text).expect("JSON");
    for (_, m) in config["measurements"]
        .as_object_mut()
        .expect("measurements")
        .iter_mut()
    {
        assert!(
            m["expected"].as_str().is_some_and(|s| s.starts_with('<')),
            "{name}: a placeholder, not a value that only fits one image"
        );
        m["expected"] = Value::String("ab".repeat(len));
    }
    config
}

#[test]
fn the_example_configs_are_valid_tdx_policies_once_measured() {
    // qemu-tdx measures MRTD and the RTMRs (48 bytes); azure-tdx the vTPM's PCRs (32 bytes).
    for (name, kind, len) in [
        ("qemu-tdx.attestationConfig.json", TdxKind::Qemu, 48),
        ("azure-tdx.attestationConfig.json", TdxKind::Azure, 32),
    ] {
        let config = measured(name, len);
        let (validator, digest) = TdxValidator::from_attestation_config(
            kind,
            config.to_string().as_bytes(),
            Arc::new(StaticCollateral::new()),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(digest.len(), 64, "{name}");
        assert!(validator.policy().enforces_any(), "{name}");
        // As shipped, with placeholders, no proxy would start on it.
        let text = std::fs::read(deploy_dir().join("examples").join(name)).expect("the example");
        assert!(
            TdxValidator::from_attestation_config(kind, &text, Arc::new(StaticCollateral::new()))
                .is_err(),
            "{name}"
        );
    }
}

#[test]
fn the_pcs_egress_opens_https_only_for_the_join_service() {
    let docs = read_docs(&deploy_dir().join("examples/pcs-egress.yaml"));
    assert_eq!(docs.len(), 1);
    let policy = &docs[0];
    assert_eq!(policy["kind"], "NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], "kube-system");
    assert_eq!(
        policy["spec"]["podSelector"],
        daemonset()["spec"]["selector"],
        "the join-service pods, as the DaemonSet selects them"
    );
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Egress"]));
    assert!(policy["spec"]["ingress"].is_null());
    let egress = array(&policy["spec"]["egress"]);
    assert_eq!(egress.len(), 1);
    assert_eq!(
        egress[0]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 443}])
    );
    let text = std::fs::read_to_string(deploy_dir().join("examples/pcs-egress.yaml"))
        .expect("the egress example");
    for host in [
        "api.trustedservices.intel.com",
        "certificates.trustedservices.intel.com",
    ] {
        assert!(text.contains(host), "names {host}");
    }
}
