//! deploy/examples for the TDX variants: each attestation config is a valid policy of its
//! variant once the image's measurements are filled in, and the PCS egress opens HTTPS only, for
//! the join-service pods only.

mod common;

use std::sync::Arc;

use attestation::tdx::StaticCollateral;
use attestation::variants::tdx::{TdxKind, TdxValidator};
use common::*;
use serde_json::Value;

/// The example with every measurement placeholder replaced by `len` bytes of hex, and every
/// other placeholder (an MRSEAM) by 48.
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
    if let Some(seams) = config["mrSeams"].as_array_mut() {
        for seam in seams
            .iter_mut()
            .filter(|s| s.as_str().is_some_and(|s| s.starts_with('<')))
        {
            *seam = Value::String("5e".repeat(48));
        }
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

/// azure-tdx's example pins the firmware and TDX module of the real Azure TD in the test
/// vectors (its MRTD and MRSEAM); without them (the config Constellation ships, `qeVendorID`
/// only) it is refused, naming the field.
#[test]
fn the_azure_tdx_example_pins_the_real_azure_tds_firmware() {
    let config = measured("azure-tdx.attestationConfig.json", 32);
    let raw = config.to_string();
    let policy = attestation::Policy::from_attestation_config(raw.as_bytes()).expect("policy");
    let tdx = attestation::tdx::TdxConfig::for_variant(
        attestation::Variant::AzureTdx,
        raw.as_bytes(),
        &policy,
    )
    .expect("azure-tdx pins its firmware");
    let quote = std::fs::read(
        deploy_dir().join("../lib/attestation/testdata/tdx/azure-tdx-vtpm/td-quote.bin"),
    )
    .expect("the Azure TD quote");
    let quote = attestation::tdx::TdQuote::parse(&quote).expect("a quote");
    assert_eq!(tdx.mrtds, Some(vec![quote.td().mr_td]));
    assert_eq!(tdx.mr_seams, Some(vec![quote.td().mr_seam]));
    assert!(!tdx.sept_ve_disable_required);

    for field in ["mrtds", "mrSeams"] {
        let mut without = config.clone();
        without.as_object_mut().expect("object").remove(field);
        let error = TdxValidator::from_attestation_config(
            TdxKind::Azure,
            without.to_string().as_bytes(),
            Arc::new(StaticCollateral::new()),
        )
        .expect_err("unpinned");
        assert!(
            error.to_string().contains(&format!("needs {field}")),
            "{error}"
        );
    }
}

#[test]
fn the_pcs_egress_opens_https_only_for_the_join_service() {
    let docs = read_docs(&deploy_dir().join("components/tdx-collateral/pcs-egress.yaml"));
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
    let text =
        std::fs::read_to_string(deploy_dir().join("components/tdx-collateral/pcs-egress.yaml"))
            .expect("the egress example");
    for host in [
        "api.trustedservices.intel.com",
        "certificates.trustedservices.intel.com",
    ] {
        assert!(text.contains(host), "names {host}");
    }
}
