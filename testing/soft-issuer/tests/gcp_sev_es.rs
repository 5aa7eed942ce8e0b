//! gcp-sev-es documents of simulated GCE confidential VMs through the real validator: accepted
//! when the GCE API vouches for the AK and every record says AMD SEV, refused by name when
//! anything does not hold, with the API asked only after every local check.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use attestation::gce::{
    ConfidentialCompute, GceIdentity, GceKeyError, GcpProjects, InstanceRef, StaticGceIdentity,
};
use attestation::{Error, GcpSevEsValidator, Issuer, Measurement, Policy, Validator, Variant};
use soft_issuer::gce::{GceSevEsNode, technology};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];

fn instance() -> InstanceRef {
    InstanceRef {
        project: "constellation-331613".to_owned(),
        zone: "europe-west3-b".to_owned(),
        instance: "worker-es-1".to_owned(),
    }
}

fn node(tech: u8) -> GceSevEsNode {
    GceSevEsNode::new(
        SoftIssuer::new(KeyType::Rsa2048).unwrap(),
        &instance(),
        1,
        tech,
    )
    .unwrap()
    .with_pcrs([(9, [0x99; 32])])
    .unwrap()
}

fn policy_for(node: &GceSevEsNode) -> Policy {
    let pcrs = node.ak().pcrs();
    Policy::new(
        [0u32, 9]
            .into_iter()
            .map(|i| {
                (
                    i,
                    Measurement {
                        expected: pcrs[&i].clone(),
                        warn_only: false,
                    },
                )
            })
            .collect(),
    )
    .unwrap()
}

fn sev() -> ConfidentialCompute {
    ConfidentialCompute {
        enabled: true,
        instance_type: "SEV".to_owned(),
    }
}

/// The GCE API as `inner` answers it, counting the calls.
#[derive(Debug)]
struct Counting {
    inner: StaticGceIdentity,
    asked: AtomicUsize,
}

impl GceIdentity for Counting {
    fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.inner.signing_key(instance)
    }

    fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<ConfidentialCompute, GceKeyError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.inner.confidential_compute(instance)
    }
}

fn api(vouched: &GceSevEsNode, confidential: ConfidentialCompute) -> Arc<Counting> {
    Arc::new(Counting {
        inner: StaticGceIdentity::new()
            .with_key(instance(), vouched.ak_spki_der().unwrap())
            .with_confidential_compute(instance(), confidential),
        asked: AtomicUsize::new(0),
    })
}

fn validate(v: &GcpSevEsValidator, node: &dyn Issuer) -> Result<attestation::Verified, Error> {
    let document = node.issue(USER_DATA, NONCE).unwrap();
    v.validate(&document, NONCE)
}

#[test]
fn an_sev_node_the_api_vouches_for_is_accepted() {
    for tech in [technology::AMD_SEV, technology::AMD_SEV_ES] {
        let node = node(tech);
        let gce = api(&node, sev());
        let v = GcpSevEsValidator::new(policy_for(&node)).with_gce_identity(gce.clone());
        let verified = validate(&v, &node).unwrap();
        assert_eq!(verified.variant, Variant::GcpSevEs);
        assert_eq!(verified.user_data, USER_DATA);
        let notes = verified.notes.join("\n");
        assert!(notes.contains("GCE firmware v1"), "{notes}");
        assert!(
            notes.contains(
                "AK vouched for by the GCE API for projects/constellation-331613/zones/europe-west3-b/instances/worker-es-1"
            ),
            "{notes}"
        );
        assert!(
            notes.contains("enableConfidentialCompute true, SEV"),
            "{notes}"
        );
        assert_eq!(gce.asked.load(Ordering::SeqCst), 2);
    }
}

#[test]
fn the_instance_info_is_what_constellations_issuer_writes() {
    let node = node(technology::AMD_SEV);
    assert_eq!(
        std::str::from_utf8(node.instance_info()).unwrap(),
        r#"{"zone":"europe-west3-b","project_id":"constellation-331613","instance_name":"worker-es-1"}"#
    );
}

#[test]
fn what_the_api_says_refuses_by_name() {
    let good = node(technology::AMD_SEV);
    // RSA test keys are all one shipped key: another node's key is an ECDSA one.
    let other = GceSevEsNode::new(
        SoftIssuer::new(KeyType::EcdsaP256).unwrap(),
        &instance(),
        1,
        technology::AMD_SEV,
    )
    .unwrap();
    let not_confidential = ConfidentialCompute::default();
    let snp = ConfidentialCompute {
        enabled: true,
        instance_type: "SEV_SNP".to_owned(),
    };
    type Check = fn(&Error) -> bool;
    let cases: [(Arc<Counting>, Check); 4] = [
        (
            api(&other, sev()),
            |e| matches!(e, Error::Binding(m) if m.contains("is not the signing key the GCE API vouches for")),
        ),
        (
            api(&good, not_confidential),
            |e| matches!(e, Error::GcePlatform(m) if m.contains("enableConfidentialCompute is not true")),
        ),
        (
            api(&good, snp),
            |e| matches!(e, Error::GcePlatform(m) if m.contains("SEV_SNP confidential VM")),
        ),
        (
            Arc::new(Counting {
                inner: StaticGceIdentity::new(),
                asked: AtomicUsize::new(0),
            }),
            |e| matches!(e, Error::Binding(m) if m.contains("the GCE API knows no instance")),
        ),
    ];
    for (gce, check) in cases {
        let v = GcpSevEsValidator::new(policy_for(&good)).with_gce_identity(gce);
        let err = validate(&v, &good).unwrap_err();
        assert!(check(&err), "{err}");
        assert!(!err.is_unavailable());
    }
    let down = Arc::new(StaticGceIdentity::new().unavailable("HTTP 429"));
    let v = GcpSevEsValidator::new(policy_for(&good)).with_gce_identity(down);
    let err = validate(&v, &good).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(
        attestation::audit::check_name(&err),
        "collateral_unavailable"
    );
}

#[test]
fn local_refusals_come_before_the_api_is_asked() {
    let good = node(technology::AMD_SEV);
    let gce = api(&good, sev());
    let v = || GcpSevEsValidator::new(policy_for(&good)).with_gce_identity(gce.clone());

    // The firmware recorded a machine that is not SEV.
    for (tech, needle) in [
        (technology::NONE, "not an AMD SEV confidential VM"),
        (technology::AMD_SEV_SNP, "attests as its own variant"),
    ] {
        let node = GceSevEsNode::new(good.ak().clone(), &instance(), 1, tech).unwrap();
        let v = GcpSevEsValidator::new(policy_for(&node)).with_gce_identity(gce.clone());
        let err = validate(&v, &node).unwrap_err();
        assert!(
            matches!(&err, Error::GcePlatform(m) if m.contains(needle)),
            "{err}"
        );
        assert_eq!(attestation::audit::check_name(&err), "gce_platform");
    }
    // Old firmware.
    let old = GceSevEsNode::new(good.ak().clone(), &instance(), 0, technology::AMD_SEV).unwrap();
    let err = GcpSevEsValidator::new(policy_for(&old))
        .with_gce_identity(gce.clone())
        .validate(&old.issue(USER_DATA, NONCE).unwrap(), NONCE)
        .unwrap_err();
    assert!(
        matches!(&err, Error::GcePlatform(m) if m.contains("older than 1")),
        "{err}"
    );

    // Measurements that differ.
    let differ = good.clone().with_pcrs([(9, [0x11; 32])]).unwrap();
    let err = validate(&v(), &differ).unwrap_err();
    assert!(matches!(err, Error::Measurements { .. }), "{err}");

    // A project outside allowedGcpProjects.
    let only = v().with_gcp_projects(GcpProjects::only(["my-cluster-project"]));
    let err = validate(&only, &good).unwrap_err();
    assert!(
        matches!(&err, Error::Binding(m) if m.contains("constellation-331613 is not in allowedGcpProjects")),
        "{err}"
    );

    // InstanceInfo that names no instance, or nothing at all.
    for (info, needle) in [
        (&b"not json"[..], "not GCEInstanceInfo JSON"),
        (br#"{"zone":"europe-west3-b","project_id":"constellation-331613","instance_name":"../x"}"#, "instance_name"),
        (br#"{"zone":"europe-west3-b","instance_name":"w"}"#, "project_id"),
    ] {
        let bad = good.clone().with_instance_info(info.to_vec());
        let err = validate(&v(), &bad).unwrap_err();
        assert!(matches!(&err, Error::Binding(m) if m.contains(needle)), "{needle}: {err}");
    }
    let none = good.clone().with_instance_info(Vec::new());
    assert!(matches!(validate(&v(), &none), Err(Error::Missing(_))));

    // No event log: nothing records the platform.
    let no_log_ak = SoftIssuer::new(KeyType::Rsa2048).unwrap();
    let no_log = GceSevEsNode::new(no_log_ak.clone(), &instance(), 1, technology::AMD_SEV).unwrap();
    let document = no_log_ak
        .issue_document_with_instance_info(USER_DATA, NONCE, Some(no_log.instance_info()))
        .unwrap();
    let err = GcpSevEsValidator::new(policy_for(&no_log))
        .with_gce_identity(gce.clone())
        .validate(&document, NONCE)
        .unwrap_err();
    assert!(
        matches!(&err, Error::GcePlatform(m) if m.contains("no event log")),
        "{err}"
    );

    assert_eq!(gce.asked.load(Ordering::SeqCst), 0, "the API was asked");
}

#[test]
fn instance_info_changed_after_quoting_breaks_the_quote() {
    let good = node(technology::AMD_SEV);
    let gce = api(&good, sev());
    let v = GcpSevEsValidator::new(policy_for(&good)).with_gce_identity(gce);
    let document = good.issue(USER_DATA, NONCE).unwrap();
    let mut parsed: serde_json::Value = serde_json::from_slice(&document).unwrap();
    use base64::Engine as _;
    parsed["InstanceInfo"] = serde_json::Value::String(
        base64::engine::general_purpose::STANDARD.encode(
            br#"{"zone":"europe-west3-b","project_id":"constellation-331613","instance_name":"worker-es-2"}"#,
        ),
    );
    let err = v
        .validate(&serde_json::to_vec(&parsed).unwrap(), NONCE)
        .unwrap_err();
    assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
}

#[test]
fn the_config_digest_covers_the_allowed_projects() {
    let measurements = format!(
        r#""measurements": {{"9": {{"expected": "{}"}}}}"#,
        "99".repeat(32)
    );
    let (_, plain) =
        GcpSevEsValidator::from_attestation_config(format!("{{{measurements}}}").as_bytes())
            .unwrap();
    let (_, pinned) = GcpSevEsValidator::from_attestation_config(
        format!(r#"{{{measurements}, "allowedGcpProjects": ["my-cluster-project"]}}"#).as_bytes(),
    )
    .unwrap();
    assert_ne!(plain, pinned);
    for bad in [
        r#"{"measurements": {}}"#.to_owned(),
        format!(r#"{{{measurements}, "allowedGcpProjects": []}}"#),
        format!(r#"{{{measurements}, "allowedGcpProjects": ["Bad_Project"]}}"#),
    ] {
        assert!(
            GcpSevEsValidator::from_attestation_config(bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
}
