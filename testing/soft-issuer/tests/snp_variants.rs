//! aws-sev-snp, azure-sev-snp and gcp-sev-snp documents from simulated hardware through the real validator:
//! accepted when every link holds, refused with the specific error when one does not.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::snp::{
    Cert, Crl, GceIdentity, GceKeyError, GcpProjects, InstanceRef, MinimumTcbs, Product,
    SigningKey, SnpConfig, SnpError, SnpPolicyError, StaticCollateral, StaticGceIdentity, Tcb,
};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::{Error, Issuer, Measurement, Policy, Validator, Variant};
use soft_issuer::snp::{GcpReportData, ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];
const NOW: i64 = 1_795_564_800; // 2026-11-25
const MIN: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

fn ak(key: KeyType) -> SoftIssuer {
    SoftIssuer::new(key)
        .unwrap()
        .with_pcrs([(4, [0x44; 32]), (9, [0x99; 32])])
        .unwrap()
}

fn policy() -> Policy {
    Policy::new(
        [(4, [0x44; 32]), (9, [0x99; 32])]
            .into_iter()
            .map(|(i, v)| {
                (
                    i,
                    Measurement {
                        expected: v.to_vec(),
                        warn_only: false,
                    },
                )
            })
            .collect(),
    )
    .unwrap()
}

fn snp_config(amd: &SimulatedAmd) -> SnpConfig {
    let json = serde_json::json!({
        "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
        "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
        "amdRootKey": amd.ark_pem(),
    });
    let mut config = SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap();
    config.minimum_tcb = MinimumTcbs::all(config.minimum_tcb.milan);
    config
}

fn empty_crl(amd: &SimulatedAmd) -> Crl {
    let now = u64::try_from(NOW).unwrap();
    Crl::from_der(amd.crl(&[], now - 3600, now + 86_400).unwrap()).unwrap()
}

fn validator(binding: Binding, config: SnpConfig, collateral: StaticCollateral) -> SevSnpValidator {
    SevSnpValidator::new(binding, policy(), config, Arc::new(collateral))
        .with_clock(Arc::new(|| NOW))
}

fn collateral(amd: &SimulatedAmd) -> StaticCollateral {
    StaticCollateral::new().with_crl(amd.product(), empty_crl(amd))
}

struct Aws {
    amd: SimulatedAmd,
    node: SnpDocumentIssuer,
}

fn aws(fields: ReportFields) -> Aws {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", MIN).unwrap();
    let node = SnpDocumentIssuer::aws(ak(KeyType::EcdsaP256), &vlek, &amd.vlek_chain_pem(), fields)
        .unwrap();
    Aws { amd, node }
}

fn validate(v: &SevSnpValidator, node: &dyn Issuer) -> Result<attestation::Verified, Error> {
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    v.validate(&doc, NONCE)
}

#[test]
fn an_aws_node_is_accepted_and_the_audit_names_the_hardware() {
    let Aws { amd, node } = aws(ReportFields::default());
    assert_eq!(node.variant(), Variant::AwsSevSnp);
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert_eq!(v.variant(), Variant::AwsSevSnp);
    let verified = validate(&v, &node).unwrap();
    assert_eq!(verified.user_data, USER_DATA);
    assert!(
        verified.notes[0].contains("SEV-SNP Milan"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[0].contains("VLEK of CN=cc-eu-west-1.amazonaws.com"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[0].contains("reported TCB bl 3 tee 0 snp 8 ucode 115"),
        "{:?}",
        verified.notes
    );
    // The nonce binding of the vTPM quote still holds.
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    assert!(matches!(
        v.validate(&doc, b"another nonce").unwrap_err(),
        Error::NonceMismatch { .. }
    ));
}

#[test]
fn an_aws_report_that_vouches_for_another_key_is_refused() {
    let Aws { amd, node } = aws(ReportFields::default());
    // The same hardware evidence, presented by another AK.
    let thief = SnpDocumentIssuer::from_parts(
        Variant::AwsSevSnp,
        ak(KeyType::EcdsaP256),
        node.instance_info().to_vec(),
    );
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert!(matches!(
        validate(&v, &thief).unwrap_err(),
        Error::Binding(_)
    ));
}

#[test]
fn hardware_policy_refusals_name_the_check() {
    type Change = fn(&mut ReportFields);
    type Expect = fn(&Error) -> bool;
    let cases: [(Change, Expect); 4] = [
        (
            |f| f.policy |= 1 << 19,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::Debug)),
        ),
        (
            |f| f.vmpl = 2,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::Vmpl(2))),
        ),
        (
            |f| f.launch_tcb = Some(Tcb { snp: 7, ..MIN }),
            |e| {
                matches!(
                    e,
                    Error::SnpPolicy(SnpPolicyError::TcbBelowMinimum {
                        which: "launch",
                        ..
                    })
                )
            },
        ),
        (
            |f| f.policy |= 1 << 18,
            |e| matches!(e, Error::SnpPolicy(SnpPolicyError::MigrationAgent)),
        ),
    ];
    for (change, expected) in cases {
        let mut fields = ReportFields::default();
        change(&mut fields);
        let Aws { amd, node } = aws(fields);
        let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
        let error = validate(&v, &node).unwrap_err();
        assert!(expected(&error), "{error}");
        assert!(!error.is_unavailable());
    }
}

#[test]
fn an_untrusted_root_a_revoked_intermediate_and_missing_collateral() {
    let Aws { amd, node } = aws(ReportFields::default());
    // AMD's built-in roots, not the simulated one: the ARK the configuration trusts for Milan
    // (AMD's) did not sign the simulated ASVK.
    let builtin = SnpConfig::from_attestation_config(
        br#"{"bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115}"#,
    )
    .unwrap();
    let v = validator(Binding::Aws, builtin, collateral(&amd));
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::ChainSignature {
            which: "intermediate",
            ..
        })
    ));

    // The ASVK (serial 3) revoked.
    let now = u64::try_from(NOW).unwrap();
    let revoked = StaticCollateral::new().with_crl(
        Product::Milan,
        Crl::from_der(amd.crl(&[3], now - 3600, now + 86_400).unwrap()).unwrap(),
    );
    let v = validator(Binding::Aws, snp_config(&amd), revoked);
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::Revoked { .. })
    ));

    // No CRL to be had: the node is told to retry, not refused.
    let v = validator(Binding::Aws, snp_config(&amd), StaticCollateral::new());
    let error = validate(&v, &node).unwrap_err();
    assert!(error.is_unavailable(), "{error}");
}

/// AMD issues VLEKs to several clouds, each naming its CSP; an aws-sev-snp node's must be AWS's
/// (`CN=cc-<region>.amazonaws.com`), or one of `vlekCspDomains` where the operator runs in
/// another AWS partition.
#[test]
fn an_aws_report_signed_by_another_clouds_vlek_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let node = |csp: &str| {
        let vlek = amd.vlek(csp, MIN).unwrap();
        SnpDocumentIssuer::aws(
            ak(KeyType::EcdsaP256),
            &vlek,
            &amd.vlek_chain_pem(),
            ReportFields::default(),
        )
        .unwrap()
    };
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    for csp in [
        "CN=cc-eu-west-1.othercloud.example",
        "CN=amazonaws.com",
        "CN=cc-eu-west-1.amazonaws.com.example",
    ] {
        let err = validate(&v, &node(csp)).unwrap_err();
        assert!(
            matches!(&err, Error::Binding(m) if m.contains(&format!("the VLEK was issued to {csp}, not to AWS"))),
            "{csp}: {err}"
        );
    }
    // Another AWS partition, named in the config.
    let china = "CN=cc-cn-north-1.amazonaws.com.cn";
    assert!(validate(&v, &node(china)).is_err());
    let json = serde_json::json!({
        "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
        "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
        "amdRootKey": amd.ark_pem(),
        "vlekCspDomains": ["amazonaws.com", "amazonaws.com.cn"],
    });
    let mut config = SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap();
    config.minimum_tcb = MinimumTcbs::all(config.minimum_tcb.milan);
    let v = validator(Binding::Aws, config, collateral(&amd));
    validate(&v, &node(china)).unwrap();
    validate(&v, &node("CN=cc-eu-west-1.amazonaws.com")).unwrap();
    // An empty list would refuse every VLEK; it is refused instead.
    let mut empty = json.clone();
    empty["vlekCspDomains"] = serde_json::json!([]);
    let err = SnpConfig::from_attestation_config(empty.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("vlekCspDomains"), "{err}");
}

#[test]
fn an_aws_report_signed_by_a_vcek_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let vcek = amd.chip([7; 64], MIN, 0).unwrap();
    let node = SnpDocumentIssuer::azure(
        ak(KeyType::Rsa2048),
        &vcek,
        &amd.vcek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    let v = validator(Binding::Aws, snp_config(&amd), collateral(&amd));
    assert!(matches!(
        validate(&v, &node).unwrap_err(),
        Error::Snp(SnpError::ReportField(_))
    ));
}

struct Azure {
    amd: SimulatedAmd,
    vcek: soft_issuer::snp::SimulatedSigner,
    node: SnpDocumentIssuer,
}

fn azure(product: Product) -> Azure {
    let amd = SimulatedAmd::new(product).unwrap();
    let vcek = amd.chip([9; 64], MIN, 0).unwrap();
    let node = SnpDocumentIssuer::azure(
        ak(KeyType::Rsa2048),
        &vcek,
        &amd.vcek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    Azure { amd, vcek, node }
}

#[test]
fn azure_nodes_of_every_product_are_accepted() {
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        let Azure { amd, node, .. } = azure(product);
        let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
        let verified = validate(&v, &node).unwrap();
        assert_eq!(verified.variant, Variant::AzureSevSnp);
        assert!(
            verified.notes[0].contains(&format!("SEV-SNP {product}")),
            "{:?}",
            verified.notes
        );
    }
}

#[test]
fn azure_runtime_data_must_hash_into_the_report_and_name_the_ak() {
    let Azure { amd, vcek, node } = azure(Product::Milan);
    let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
    let info: serde_json::Value = serde_json::from_slice(node.instance_info()).unwrap();

    // Runtime data changed after the report was made.
    let mut changed = info.clone();
    changed["Azure"]["RuntimeData"] = serde_json::Value::String(base64_of(b"{\"keys\":[]}"));
    let tampered = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        changed.to_string().into_bytes(),
    );
    let error = validate(&v, &tampered).unwrap_err();
    assert!(
        matches!(error, Error::Binding(ref m) if m.contains("SHA-256")),
        "{error}"
    );

    // The report and runtime data of one node, presented by another AK. (Every RSA soft AK is
    // the one shipped test key, so the other AK here is an ECDSA one.)
    let thief = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::EcdsaP256),
        node.instance_info().to_vec(),
    );
    let error = validate(&v, &thief).unwrap_err();
    assert!(matches!(error, Error::Binding(_)), "{error}");
    let _ = vcek;
}

#[test]
fn a_vcek_the_document_lacks_comes_from_the_collateral_source() {
    let Azure { amd, vcek, node } = azure(Product::Genoa);
    let bare = SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        node.instance_info_without_certificates().unwrap(),
    );

    // Nothing to fetch from: retry later.
    let v = validator(Binding::Azure, snp_config(&amd), collateral(&amd));
    assert!(validate(&v, &bare).unwrap_err().is_unavailable());

    let cert = |der: &[u8]| Cert::from_der(der.to_vec()).unwrap();
    let full = collateral(&amd)
        .with_vcek(Product::Genoa, &[9; 64], MIN, cert(vcek.cert_der()))
        .with_intermediate(Product::Genoa, SigningKey::Vcek, cert(amd.ask_der()));
    let v = validator(Binding::Azure, snp_config(&amd), full);
    validate(&v, &bare).unwrap();
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn instance() -> InstanceRef {
    InstanceRef {
        project: "constellation-331613".to_owned(),
        zone: "europe-west3-b".to_owned(),
        instance: "worker-gcp-1".to_owned(),
    }
}

struct Gcp {
    amd: SimulatedAmd,
    vcek: Arc<soft_issuer::snp::SimulatedSigner>,
}

impl Gcp {
    fn new() -> Gcp {
        let amd = SimulatedAmd::new(Product::Milan).unwrap();
        let vcek = Arc::new(amd.chip([7; 64], MIN, 0).unwrap());
        Gcp { amd, vcek }
    }

    fn node(&self, gcp: Option<InstanceRef>, report_data: GcpReportData) -> SnpDocumentIssuer {
        SnpDocumentIssuer::gcp(
            ak(KeyType::EcdsaP256),
            self.vcek.clone(),
            &self.amd.vcek_chain_pem(),
            ReportFields::default(),
            gcp,
            report_data,
        )
    }

    /// A validator asking `gce` for the keys GCE vouches for.
    fn validator(&self, gce: StaticGceIdentity) -> SevSnpValidator {
        validator(Binding::Gcp, snp_config(&self.amd), collateral(&self.amd))
            .with_gce_identity(Arc::new(gce))
    }
}

fn vouching_for(node: &SnpDocumentIssuer) -> StaticGceIdentity {
    StaticGceIdentity::new().with_key(instance(), node.ak_spki_der().unwrap())
}

#[test]
fn a_gcp_node_whose_key_gce_vouches_for_is_accepted() {
    let gcp = Gcp::new();
    let node = gcp.node(Some(instance()), GcpReportData::Bound);
    assert_eq!(node.variant(), Variant::GcpSevSnp);
    let v = gcp.validator(vouching_for(&node));
    assert_eq!(v.variant(), Variant::GcpSevSnp);
    let verified = validate(&v, &node).unwrap();
    assert_eq!(verified.variant, Variant::GcpSevSnp);
    assert!(
        verified.notes[0].contains("SEV-SNP Milan"),
        "{:?}",
        verified.notes
    );
    assert!(
        verified.notes[1].contains(
            "GCE API for projects/constellation-331613/zones/europe-west3-b/instances/worker-gcp-1"
        ),
        "{:?}",
        verified.notes
    );
    // The report binds the connection: a document made for one nonce fails for another, here
    // already at the vTPM quote.
    let doc = node.issue(USER_DATA, NONCE).unwrap();
    assert!(v.validate(&doc, b"another nonce").is_err());
}

#[test]
fn gcp_binding_refusals_name_what_is_wrong() {
    let gcp = Gcp::new();
    let good = gcp.node(Some(instance()), GcpReportData::Bound);
    let cases: [(SnpDocumentIssuer, StaticGceIdentity, &str); 6] = [
        (
            gcp.node(Some(instance()), GcpReportData::Fixed([0x77; 64])),
            vouching_for(&good),
            "REPORT_DATA[0:32] is not this connection's extraData",
        ),
        (
            gcp.node(Some(instance()), GcpReportData::NonzeroTail),
            vouching_for(&good),
            "REPORT_DATA[32:64] is not 32 zero bytes",
        ),
        (
            gcp.node(None, GcpReportData::Bound),
            vouching_for(&good),
            "no GCP field",
        ),
        (
            gcp.node(
                Some(InstanceRef {
                    instance: "../../other".to_owned(),
                    ..instance()
                }),
                GcpReportData::Bound,
            ),
            vouching_for(&good),
            "GCE instance instance_name",
        ),
        (
            gcp.node(
                Some(InstanceRef {
                    instance: "worker-gcp-2".to_owned(),
                    ..instance()
                }),
                GcpReportData::Bound,
            ),
            vouching_for(&good),
            "knows no instance projects/constellation-331613/zones/europe-west3-b/instances/worker-gcp-2",
        ),
        // GCE vouches for `good`'s key; this node (every node gets a fresh ECDSA AK) presents
        // its own.
        (
            gcp.node(Some(instance()), GcpReportData::Bound),
            vouching_for(&good),
            "is not the signing key the GCE API vouches for",
        ),
    ];
    for (node, gce, needle) in cases {
        let v = gcp.validator(gce);
        let error = validate(&v, &node).unwrap_err();
        assert!(
            matches!(error, Error::Binding(ref m) if m.contains(needle)),
            "{needle}: {error}"
        );
        assert_eq!(attestation::audit::check_name(&error), "hardware_binding");
    }

    // Without a way to ask GCE, nothing is vouched for.
    let v = validator(Binding::Gcp, snp_config(&gcp.amd), collateral(&gcp.amd));
    assert!(matches!(
        validate(&v, &good).unwrap_err(),
        Error::Binding(_)
    ));
}

/// A GCE identity that counts how often it is asked.
#[derive(Debug)]
struct Counting {
    inner: StaticGceIdentity,
    asked: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn new(inner: StaticGceIdentity) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            asked: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl GceIdentity for Counting {
    fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.signing_key(instance)
    }

    fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<attestation::gce::ConfidentialCompute, GceKeyError> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.confidential_compute(instance)
    }
}

#[test]
fn gcp_instances_of_other_projects_are_refused_before_gce_is_asked() {
    let gcp = Gcp::new();
    let node = gcp.node(Some(instance()), GcpReportData::Bound);
    let gce = Counting::new(vouching_for(&node));
    let only = |projects: &[&str]| {
        validator(Binding::Gcp, snp_config(&gcp.amd), collateral(&gcp.amd))
            .with_gce_identity(gce.clone())
            .with_gcp_projects(GcpProjects::only(projects.iter().copied()))
    };

    let error = validate(&only(&["attacker-project"]), &node).unwrap_err();
    assert!(
        matches!(error, Error::Binding(ref m) if m.contains("GCP project constellation-331613 is not in allowedGcpProjects")),
        "{error}"
    );
    assert_eq!(
        gce.asked(),
        0,
        "the GCE API was asked for a project not allowed"
    );

    validate(&only(&["attacker-project", "constellation-331613"]), &node).unwrap();
    assert_eq!(gce.asked(), 1);
}

#[test]
fn gcp_measurements_are_compared_before_gce_is_asked() {
    let gcp = Gcp::new();
    let node = SnpDocumentIssuer::gcp(
        SoftIssuer::new(KeyType::EcdsaP256)
            .unwrap()
            .with_pcrs([(4, [0x45; 32]), (9, [0x99; 32])])
            .unwrap(),
        gcp.vcek.clone(),
        &gcp.amd.vcek_chain_pem(),
        ReportFields::default(),
        Some(instance()),
        GcpReportData::Bound,
    );
    let gce = Counting::new(vouching_for(&node));
    let v = validator(Binding::Gcp, snp_config(&gcp.amd), collateral(&gcp.amd))
        .with_gce_identity(gce.clone());
    let error = validate(&v, &node).unwrap_err();
    assert!(matches!(error, Error::Measurements { .. }), "{error}");
    assert_eq!(
        gce.asked(),
        0,
        "the GCE API was asked for a node with wrong PCRs"
    );
}

#[test]
fn allowed_gcp_projects_are_read_from_the_config_and_bound_into_its_digest() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let config = |extra: serde_json::Value| {
        let mut json = serde_json::json!({
            "measurements": {"4": {"expected": hex::encode([0x44; 32]), "warnOnly": false}},
            "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
            "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
            "amdRootKey": amd.ark_pem(),
        });
        json.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json.to_string()
    };
    let load = |binding: Binding, json: &str| {
        SevSnpValidator::from_attestation_config(
            binding,
            json.as_bytes(),
            Arc::new(collateral(&amd)),
        )
    };
    let (_, any) = load(Binding::Gcp, &config(serde_json::json!({}))).unwrap();
    let (_, one) = load(
        Binding::Gcp,
        &config(serde_json::json!({"allowedGcpProjects": ["constellation-331613"]})),
    )
    .unwrap();
    assert_ne!(
        any, one,
        "the project allow-list is not in the policy digest"
    );

    for (binding, extra, needle) in [
        (
            Binding::Gcp,
            serde_json::json!({"allowedGcpProjects": []}),
            "allowedGcpProjects is empty",
        ),
        (
            Binding::Gcp,
            serde_json::json!({"allowedGcpProjects": ["Not A Project"]}),
            "\"Not A Project\" is not a GCP project ID",
        ),
        (
            Binding::Aws,
            serde_json::json!({"allowedGcpProjects": ["constellation-331613"]}),
            "applies to gcp-sev-snp and gcp-sev-es only; aws-sev-snp",
        ),
    ] {
        let error = load(binding, &config(extra)).unwrap_err();
        assert!(error.to_string().contains(needle), "{needle}: {error}");
    }
}

#[test]
fn when_gce_cannot_be_asked_the_node_is_told_to_retry() {
    let gcp = Gcp::new();
    let node = gcp.node(Some(instance()), GcpReportData::Bound);
    let v = gcp.validator(vouching_for(&node).unavailable("HTTP 429 Too Many Requests"));
    let error = validate(&v, &node).unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("429"), "{error}");
}

#[test]
fn gcp_hardware_policy_is_applied_before_gce_is_asked() {
    let gcp = Gcp::new();
    let node = SnpDocumentIssuer::gcp(
        ak(KeyType::EcdsaP256),
        gcp.vcek.clone(),
        &gcp.amd.vcek_chain_pem(),
        ReportFields {
            vmpl: 1,
            ..ReportFields::default()
        },
        Some(instance()),
        GcpReportData::Bound,
    );
    // GCE "unavailable" would make this a retry; the VMPL refusal comes first.
    let v = gcp.validator(vouching_for(&node).unavailable("down"));
    let error = validate(&v, &node).unwrap_err();
    assert!(matches!(error, Error::SnpPolicy(_)), "{error}");
}
