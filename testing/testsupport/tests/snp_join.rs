//! SEV-SNP nodes join through the real processes: attest-proxy verifies their documents against
//! simulated AMD hardware (trusted only through the config's amdRootKey), with AMD's CRL and
//! what the documents leave out fetched from the KDS stand-in over TLS; for gcp-sev-snp, the
//! harness runs gce-identity against the GCE stand-in, which vouches for each node's AK. The
//! nodes are software keys with simulated reports, and once each join-client's own aws-sev-snp
//! issuer on a real TPM over a simulated configfs-tsm and its azure-sev-snp issuer on a real TPM
//! on which Azure's paravisor is played (testsupport::azure).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::snp::InstanceRef;
use attestation::snp::{Product, Tcb};
use attestation::{Issuer, Variant};
use gce_standin::{Fault as GceFault, GceStandin};
use kds_standin::{Fault, KdsStandin};
use snp_issuer::configfs::ConfigfsTsm;
use soft_issuer::snp::{
    GcpReportData, ReportFields, SimulatedAmd, SimulatedSigner, SnpDocumentIssuer,
};
use soft_issuer::tsm::FakeConfigfsTsm;
use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{
    GceEndpoints, Options, System, boot_measurements, join_request, refusal,
};
use tonic::Code;
use tpm_issuer::aws_sev_snp::AwsSnpIssuer;
use tpm_issuer::azure::sev_snp::AzureSnpIssuer;

const DISK: &str = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
const MIN: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

/// The serial of the VCEKs and VLEKs the simulated AMD's CRL revokes.
const REVOKED: u8 = 0x66;

fn ak(key: KeyType) -> SoftIssuer {
    SoftIssuer::new(key)
        .unwrap()
        .with_pcrs([(4, [0x44; 32]), (9, [0x99; 32])])
        .unwrap()
}

struct Setup {
    amd: SimulatedAmd,
    /// The chip every gcp node runs on.
    vcek: Arc<SimulatedSigner>,
    kds: KdsStandin,
    gce: GceStandin,
    /// Holds the KDS CA and the attestation config, readable by every uid.
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let kds = KdsStandin::start().await.unwrap();
    kds.put_vcek_chain("Milan", &amd.vcek_chain_pem());
    kds.put_vlek_chain("Milan", &amd.vlek_chain_pem());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // AMD's two CRLs, each revoking the signers with serial REVOKED of its kind.
    kds.put_vcek_crl(
        "Milan",
        amd.crl(&[REVOKED], now - 3600, now + 7 * 86_400).unwrap(),
    );
    kds.put_vlek_crl(
        "Milan",
        amd.crl(&[REVOKED], now - 3600, now + 7 * 86_400).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("kds-ca.pem"), kds.ca_pem()).unwrap();
    let gce = GceStandin::start().await.unwrap();
    std::fs::write(dir.path().join("gce-ca.pem"), gce.ca_pem()).unwrap();
    let vcek = Arc::new(amd.chip([0x17; 64], MIN, 0).unwrap());
    Setup {
        amd,
        vcek,
        kds,
        gce,
        dir,
    }
}

/// Starts the system for `variant` with a config whose SNP minimum is `MIN` and whose AMD root
/// is the simulated one.
async fn start(s: &Setup, variant: Variant) -> System {
    let measurements = serde_json::json!({
        "4": {"expected": "44".repeat(32), "warnOnly": false},
        "9": {"expected": "99".repeat(32), "warnOnly": false},
    });
    start_with(s, variant, measurements).await
}

/// [`start`], enforcing `measurements`.
async fn start_with(s: &Setup, variant: Variant, measurements: serde_json::Value) -> System {
    start_with_proxy_args(s, variant, measurements, &[]).await
}

/// [`start_with`], passing attest-proxy `extra` flags too.
async fn start_with_proxy_args(
    s: &Setup,
    variant: Variant,
    measurements: serde_json::Value,
    extra: &[&str],
) -> System {
    let config = serde_json::json!({
        "measurements": measurements,
        "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
        "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
        "amdRootKey": s.amd.ark_pem(),
        // The simulated reports' ID key digest: azure-sev-snp must pin one.
        "firmwareSignerConfig": {"acceptedKeyDigests": ["00".repeat(48)]},
    });
    let path = s.dir.path().join(format!("{variant}.json"));
    std::fs::write(&path, config.to_string()).unwrap();
    System::start(Options {
        variant: Some(variant),
        attestation_config: Some(path),
        proxy_args: vec![
            "--kds-url".into(),
            s.kds.url().into(),
            "--kds-ca-file".into(),
            s.dir.path().join("kds-ca.pem").to_str().unwrap().into(),
            "--collateral-wait".into(),
            "3s".into(),
        ]
        .into_iter()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect(),
        gce: (variant == Variant::GcpSevSnp).then(|| GceEndpoints {
            metadata_url: s.gce.metadata_url(),
            compute_url: s.gce.compute_url(),
            compute_ca_file: s.dir.path().join("gce-ca.pem"),
            proxy_args: vec![
                "--gce-identity-backoff".into(),
                "500ms".into(),
                "--gce-identity-wait".into(),
                "3s".into(),
            ],
        }),
        ..Options::default()
    })
    .await
    .unwrap()
}

fn aws_node(s: &Setup, fields: ReportFields) -> Arc<SnpDocumentIssuer> {
    let vlek = s.amd.vlek("CN=cc-eu-west-1.amazonaws.com", MIN).unwrap();
    Arc::new(
        SnpDocumentIssuer::aws(
            ak(KeyType::EcdsaP256),
            &vlek,
            &s.amd.vlek_chain_pem(),
            fields,
        )
        .unwrap(),
    )
}

fn azure_node(s: &Setup, fields: ReportFields) -> Arc<SnpDocumentIssuer> {
    let vcek = s.amd.chip([0x42; 64], MIN, 0).unwrap();
    Arc::new(
        SnpDocumentIssuer::azure(ak(KeyType::Rsa2048), &vcek, &s.amd.vcek_chain_pem(), fields)
            .unwrap(),
    )
}

/// The instance a gcp node named `name` is.
fn gce_instance(name: &str) -> InstanceRef {
    InstanceRef {
        project: "constellation-331613".to_owned(),
        zone: "europe-west3-b".to_owned(),
        instance: name.to_owned(),
    }
}

/// A gcp node on instance `name`; the GCE stand-in is told its AK as that instance's.
fn gcp_node(
    s: &Setup,
    name: &str,
    fields: ReportFields,
    report_data: GcpReportData,
) -> Arc<SnpDocumentIssuer> {
    gcp_node_on(
        s,
        name,
        (s.vcek.clone(), &s.amd.vcek_chain_pem()),
        fields,
        report_data,
    )
}

/// [`gcp_node`] on the chip `vcek` certified by `chain`.
fn gcp_node_on(
    s: &Setup,
    name: &str,
    (vcek, chain): (Arc<SimulatedSigner>, &str),
    fields: ReportFields,
    report_data: GcpReportData,
) -> Arc<SnpDocumentIssuer> {
    let node = SnpDocumentIssuer::gcp(
        ak(KeyType::EcdsaP256),
        vcek,
        chain,
        fields,
        Some(gce_instance(name)),
        report_data,
    );
    s.gce
        .put_instance(standin_instance(name), &node.ak_spki_der().unwrap(), None);
    Arc::new(node)
}

fn standin_instance(name: &str) -> gce_standin::Instance {
    let i = gce_instance(name);
    gce_standin::Instance {
        project: i.project,
        zone: i.zone,
        name: i.instance,
    }
}

/// A well-made node of `variant` with a report of `fields` (gcp: on instance `gcp-<n>`).
fn node(s: &Setup, variant: Variant, fields: ReportFields, n: u32) -> Arc<SnpDocumentIssuer> {
    match variant {
        Variant::AwsSevSnp => aws_node(s, fields),
        Variant::AzureSevSnp => azure_node(s, fields),
        _ => gcp_node(s, &format!("gcp-{n}"), fields, GcpReportData::Bound),
    }
}

/// A well-made node of `variant` whose report is signed under `amd`'s roots by a VLEK (aws) or
/// VCEK (azure, gcp) of `serial`.
fn signed_under(
    s: &Setup,
    variant: Variant,
    amd: &SimulatedAmd,
    serial: u8,
    n: u32,
) -> Arc<SnpDocumentIssuer> {
    let fields = ReportFields::default();
    match variant {
        Variant::AwsSevSnp => {
            let vlek = amd
                .vlek_with_serial("CN=cc-eu-west-1.amazonaws.com", MIN, serial)
                .unwrap();
            Arc::new(
                SnpDocumentIssuer::aws(
                    ak(KeyType::EcdsaP256),
                    &vlek,
                    &amd.vlek_chain_pem(),
                    fields,
                )
                .unwrap(),
            )
        }
        Variant::AzureSevSnp => {
            let vcek = amd.chip([0x42; 64], MIN, serial).unwrap();
            Arc::new(
                SnpDocumentIssuer::azure(
                    ak(KeyType::Rsa2048),
                    &vcek,
                    &amd.vcek_chain_pem(),
                    fields,
                )
                .unwrap(),
            )
        }
        _ => gcp_node_on(
            s,
            &format!("gcp-{n}"),
            (
                Arc::new(amd.chip([0x17; 64], MIN, serial).unwrap()),
                &amd.vcek_chain_pem(),
            ),
            fields,
            GcpReportData::Bound,
        ),
    }
}

/// A node whose report binds something else than its AK: aws and azure, another node's report
/// presented with a new AK; gcp, a report made for another connection.
fn mis_bound(s: &Setup, variant: Variant) -> Arc<SnpDocumentIssuer> {
    let honest = node(s, variant, ReportFields::default(), 90);
    match variant {
        Variant::GcpSevSnp => gcp_node(
            s,
            "gcp-91",
            ReportFields::default(),
            GcpReportData::Fixed([0x77; 64]),
        ),
        _ => Arc::new(SnpDocumentIssuer::from_parts(
            variant,
            ak(KeyType::EcdsaP256),
            honest.instance_info().to_vec(),
        )),
    }
}

/// A node whose AK is not the one vouched for: aws and azure, the report names another key;
/// gcp, the GCE API vouches for another key as its instance's.
fn unvouched(s: &Setup, variant: Variant) -> Arc<SnpDocumentIssuer> {
    match variant {
        Variant::GcpSevSnp => {
            let node = gcp_node(s, "gcp-92", ReportFields::default(), GcpReportData::Bound);
            let other = ak(KeyType::EcdsaP256).ak_public().to_vec();
            let other = attestation::tpm::Public::parse(&other)
                .unwrap()
                .spki_der()
                .unwrap();
            s.gce.put_instance(standin_instance("gcp-92"), &other, None);
            node
        }
        _ => mis_bound(s, variant),
    }
}

/// Joins, rejoins, and the refusals every SNP variant shares, each named in the node's error:
/// DEBUG, VMPL, launch TCB, a report bound to something else, an AK not vouched for, a revoked
/// signer, a root the config does not trust.
async fn joins_and_shared_refusals(variant: Variant) -> (Setup, System) {
    let s = setup().await;
    let system = start(&s, variant).await;
    let client = system
        .client(node(&s, variant, ReportFields::default(), 1))
        .unwrap();
    system
        .join_and_rejoin(&client, "worker-snp-1", DISK)
        .await
        .unwrap();
    assert!(system.proxy.log().contains("SEV-SNP Milan"), "{variant}");

    let with = |f: fn(&mut ReportFields)| {
        let mut fields = ReportFields::default();
        f(&mut fields);
        fields
    };
    let impostor = SimulatedAmd::impostor(Product::Milan).unwrap();
    let refused: [(Arc<SnpDocumentIssuer>, &str); 7] = [
        (
            node(&s, variant, with(|f| f.policy = 0x30000 | 1 << 19), 2),
            "DEBUG",
        ),
        (node(&s, variant, with(|f| f.vmpl = 1), 3), "VMPL 1"),
        (
            node(
                &s,
                variant,
                with(|f| f.launch_tcb = Some(Tcb { snp: 7, ..MIN })),
                4,
            ),
            "launch TCB",
        ),
        (
            mis_bound(&s, variant),
            "does not vouch for the attestation key",
        ),
        (
            unvouched(&s, variant),
            "does not vouch for the attestation key",
        ),
        (
            signed_under(&s, variant, &s.amd, REVOKED, 5),
            "is revoked by AMD's CRL",
        ),
        // AMD's names, another root key: the configured ARK did not sign this ASK or ASVK.
        (
            signed_under(&s, variant, &impostor, 0, 6),
            "AMD certificate chain",
        ),
    ];
    let refused = refused
        .into_iter()
        .map(|(node, needle)| (node as Arc<dyn Issuer>, needle))
        .collect();
    system
        .assert_refused_by_name(&variant.to_string(), "worker-snp-2", DISK, refused)
        .await
        .unwrap();
    (s, system)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let (s, system) = joins_and_shared_refusals(Variant::AwsSevSnp).await;
    assert!(
        system
            .proxy
            .log()
            .contains("VLEK of CN=cc-eu-west-1.amazonaws.com"),
        "{}",
        system.proxy.log()
    );

    // A chain that does not lead to the configured root: AMD's own ASVK is no issuer of the
    // simulated VLEK, and AMD's ARK is not the one this config trusts.
    let status = {
        let builtin_chain = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../lib/attestation/testdata/snp/azure-vlekcertchain.pem"
        ))
        .unwrap();
        let vlek = s.amd.vlek("cc", MIN).unwrap();
        let node = SnpDocumentIssuer::aws(
            ak(KeyType::EcdsaP256),
            &vlek,
            &builtin_chain,
            ReportFields::default(),
        )
        .unwrap();
        refusal(
            system
                .client(Arc::new(node))
                .unwrap()
                .join(join_request("worker-snp-4", DISK).unwrap())
                .await,
        )
    };
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains("AMD certificate chain"),
        "{}",
        status.message()
    );
}

/// A node as `join-client --variant aws-sev-snp` builds it: the system's swtpm (with the
/// harness's boot measurements) and the guest's configfs-tsm, simulated here over a temporary
/// directory with the simulated AMD firmware behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aws_node_attesting_with_its_tpm_and_configfs_tsm_joins_and_rejoins() {
    let s = setup().await;
    let system = start_with(&s, Variant::AwsSevSnp, boot_measurements().into()).await;
    let node = |fields: ReportFields| {
        let vlek = s.amd.vlek("CN=cc-eu-west-1.amazonaws.com", MIN).unwrap();
        let guest = Arc::new(FakeConfigfsTsm::aws(&s.amd, vlek, fields).unwrap());
        let tpm =
            tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(system.swtpm.tcti()))
                .unwrap();
        let source = ConfigfsTsm::with_fs(guest.clone(), guest.root().to_owned());
        (
            Arc::new(AwsSnpIssuer::new(tpm, Box::new(source)).unwrap()),
            guest,
        )
    };

    let (issuer, guest) = node(ReportFields::default());
    let client = system.client(issuer).unwrap();
    system
        .join_and_rejoin(&client, "worker-snp-tpm", DISK)
        .await
        .unwrap();
    assert_eq!(guest.reports_made(), 2, "one fresh report per attestation");
    assert_eq!(guest.entries_present().unwrap(), 0);
    let audit = system.proxy.log();
    assert!(
        audit.contains("VLEK of CN=cc-eu-west-1.amazonaws.com"),
        "{audit}"
    );
    // swtpm serves one client at a time.
    drop(client);

    // The same TPM on a guest launched with a debug policy is refused for it.
    let (issuer, _guest) = node(ReportFields {
        policy: 0x30000 | 1 << 19,
        ..ReportFields::default()
    });
    system
        .assert_refused_by_name(
            "aws-sev-snp on a debug guest",
            "worker-snp-tpm-2",
            DISK,
            vec![(issuer as Arc<dyn Issuer>, "DEBUG")],
        )
        .await
        .unwrap();
}

/// A node as `join-client --variant azure-sev-snp` builds it: the system's swtpm (with the
/// harness's boot measurements) on which Azure's paravisor persisted its AK and left its HCL
/// report with a report from the simulated AMD. The document carries no VCEK: attest-proxy
/// fetches it from the KDS stand-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_node_attesting_with_its_vtpm_and_hcl_report_joins_and_rejoins() {
    let s = setup().await;
    let system = start_with(&s, Variant::AzureSevSnp, boot_measurements().into()).await;
    let chip = [0x5a; 64];
    let vcek = s.amd.chip(chip, MIN, 0).unwrap();
    let url = format!(
        "/vcek/v1/Milan/{}?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115",
        hex::encode(chip)
    );
    s.kds.put_vcek(&url, vcek.cert_der().to_vec());
    testsupport::azure::boot_snp(&system.swtpm, &vcek, ReportFields::default(), None).unwrap();

    let issuer = Arc::new(AzureSnpIssuer::open(&system.swtpm.tcti()).unwrap());
    let client = system.client(issuer).unwrap();
    system
        .join_and_rejoin(&client, "worker-azure-tpm", DISK)
        .await
        .unwrap();
    assert!(s.kds.paths().contains(&url), "{:?}", s.kds.paths());
    let audit = system.proxy.log();
    assert!(audit.contains("VCEK of chip 5a5a5a5a"), "{audit}");
    drop(client);

    // Another vTPM whose HCL report names a key that is not its own is refused for it.
    let other = testsupport::swtpm::Swtpm::start().unwrap();
    let runtime = soft_issuer::snp::azure_runtime_data_for(&ak(KeyType::Rsa2048)).unwrap();
    testsupport::azure::boot_snp(&other, &vcek, ReportFields::default(), Some(runtime)).unwrap();
    let issuer = Arc::new(AzureSnpIssuer::open(&other.tcti()).unwrap());
    system
        .assert_refused_by_name(
            "azure-sev-snp naming another key",
            "worker-azure-tpm-2",
            DISK,
            vec![(
                issuer as Arc<dyn Issuer>,
                "the runtime data's keys[0] is not the attestation key",
            )],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    joins_and_shared_refusals(Variant::AzureSevSnp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let (s, system) = joins_and_shared_refusals(Variant::GcpSevSnp).await;
    assert!(
        system.proxy.log().contains(
            "AK vouched for by the GCE API for projects/constellation-331613/zones/europe-west3-b/instances/gcp-1"
        ),
        "{}",
        system.proxy.log()
    );
    // Two API calls in all, with one token: gcp-1's key, cached for its rejoin, and gcp-92's.
    // Every other refusal came from a local check, before the API was asked.
    assert_eq!(s.gce.compute_requests(), 2);
    assert_eq!(s.gce.token_requests(), 1);

    // An instance the GCE API does not know: refused, not told to retry.
    let node = gcp_node(&s, "gcp-93", ReportFields::default(), GcpReportData::Bound);
    s.gce.remove_instance(&standin_instance("gcp-93"));
    let status = refusal(
        system
            .client(node)
            .unwrap()
            .join(join_request("worker-snp-3", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("knows no instance"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_gce_api_rate_limits_or_fails_gcp_nodes_are_told_to_retry_and_then_join() {
    let s = setup().await;
    let system = start(&s, Variant::GcpSevSnp).await;
    for (i, fault) in [
        GceFault::RateLimited { retry_after: 1 },
        GceFault::ServerError,
        GceFault::Forbidden,
    ]
    .into_iter()
    .enumerate()
    {
        s.gce.set_compute_fault(fault);
        let name = format!("gcp-fault-{i}");
        let client = system
            .client(gcp_node(
                &s,
                &name,
                ReportFields::default(),
                GcpReportData::Bound,
            ))
            .unwrap();
        let status = refusal(client.join(join_request(&name, DISK).unwrap()).await);
        assert_eq!(status.code(), Code::Unavailable, "{fault:?}: {status:?}");
        assert!(
            status.message().contains("GCE API"),
            "{fault:?}: {}",
            status.message()
        );
        // Google's own words (here: the permission this cluster's service account lacks) stay
        // in gce-identity's log; the unauthenticated node learns only that the API failed.
        if fault == GceFault::Forbidden {
            assert!(
                !status.message().contains("permission"),
                "Google's message reached the node: {}",
                status.message()
            );
            assert!(
                status.message().contains("HTTP 403"),
                "{}",
                status.message()
            );
            assert!(
                system.logs().contains(
                    "Required 'compute.instances.getShieldedInstanceIdentity' permission"
                ),
                "gce-identity did not log Google's message:\n{}",
                system.logs()
            );
        }
        s.gce.set_compute_fault(GceFault::None);
        system.joins_eventually(&client, &name, DISK).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_node_without_its_vcek_gets_it_from_the_kds_and_a_revoked_one_is_refused() {
    let s = setup().await;
    let chip = [0x42; 64];
    let vcek = s.amd.chip(chip, MIN, 0).unwrap();
    let full = SnpDocumentIssuer::azure(
        ak(KeyType::Rsa2048),
        &vcek,
        &s.amd.vcek_chain_pem(),
        ReportFields::default(),
    )
    .unwrap();
    let bare = full.instance_info_without_certificates().unwrap();
    let url = format!(
        "/vcek/v1/Milan/{}?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115",
        hex::encode(chip)
    );
    s.kds.put_vcek(&url, vcek.cert_der().to_vec());

    let system = start(&s, Variant::AzureSevSnp).await;
    let node = Arc::new(SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        bare.clone(),
    ));
    system
        .client(node.clone())
        .unwrap()
        .join(join_request("worker-azure-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    assert!(s.kds.paths().contains(&url), "{:?}", s.kds.paths());

    // A fresh service, AMD's CRL now revoking the ASK (serial 2): the node is refused.
    drop(system);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    s.kds.put_vcek_crl(
        "Milan",
        s.amd.crl(&[2], now - 3600, now + 7 * 86_400).unwrap(),
    );
    let system = start(&s, Variant::AzureSevSnp).await;
    let status = refusal(
        system
            .client(node)
            .unwrap()
            .join(join_request("worker-azure-1", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{}", status.message());
}

/// AMD revokes an ASVK on the VLEK chain's own CRL (`/vlek/v1/{product}/crl`, the ASVK's CRL
/// distribution point), which the VCEK chain's CRL does not list: an aws-sev-snp node under it
/// is refused, and a VCEK CRL listing the ASVK's serial does not refuse one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aws_node_under_an_asvk_revoked_on_the_vlek_crl_is_refused() {
    let s = setup().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let crl = |serials: &[u8]| s.amd.crl(serials, now - 3600, now + 7 * 86_400).unwrap();
    // The simulated ASVK is serial 3.
    s.kds.put_vcek_crl("Milan", crl(&[3]));
    s.kds.put_vlek_crl("Milan", crl(&[]));
    let system = start(&s, Variant::AwsSevSnp).await;
    system
        .client(aws_node(&s, ReportFields::default()))
        .unwrap()
        .join(join_request("worker-aws-revoked", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    assert!(
        s.kds.paths().iter().any(|p| p == "/vlek/v1/Milan/crl"),
        "{:?}",
        s.kds.paths()
    );

    drop(system);
    s.kds.put_vcek_crl("Milan", crl(&[]));
    s.kds.put_vlek_crl("Milan", crl(&[3]));
    let system = start(&s, Variant::AwsSevSnp).await;
    let status = refusal(
        system
            .client(aws_node(&s, ReportFields::default()))
            .unwrap()
            .join(join_request("worker-aws-revoked", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{}", status.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_kds_down_and_nothing_cached_nodes_are_told_to_retry_and_then_join() {
    let s = setup().await;
    s.kds.set_fault(Fault::RateLimited { retry_after: 1 });
    let system = start(&s, Variant::AwsSevSnp).await;
    let client = system
        .client(aws_node(&s, ReportFields::default()))
        .unwrap();
    let status = refusal(
        client
            .join(join_request("worker-snp-9", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("retry"), "{}", status.message());

    s.kds.set_fault(Fault::None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match client
            .join(join_request("worker-snp-9", DISK).unwrap())
            .await
        {
            Ok(_) => break,
            Err(error) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never joined: {error}\n{}",
                    system.logs()
                );
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
    assert!(harness_metric(&system, "attest_proxy_collateral_fetches_total").await >= 1.0);
}

async fn harness_metric(system: &System, name: &str) -> f64 {
    let (_, body) = plumbing::admin::get(system.admin.proxy, "/metrics")
        .await
        .unwrap();
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn measurements() -> serde_json::Value {
    serde_json::json!({
        "4": {"expected": "44".repeat(32), "warnOnly": false},
        "9": {"expected": "99".repeat(32), "warnOnly": false},
    })
}

/// An azure-sev-snp node on chip `chip` whose document leaves out its VCEK and chain, so
/// attest-proxy fetches the VCEK its report names; `fields` as its report says.
fn bare_azure(s: &Setup, chip: [u8; 64], fields: ReportFields) -> Arc<SnpDocumentIssuer> {
    bare_azure_on(s, &s.amd.chip(chip, MIN, 0).unwrap(), fields)
}

/// [`bare_azure`] on the chip `vcek` signs for.
fn bare_azure_on(
    s: &Setup,
    vcek: &SimulatedSigner,
    fields: ReportFields,
) -> Arc<SnpDocumentIssuer> {
    let full =
        SnpDocumentIssuer::azure(ak(KeyType::Rsa2048), vcek, &s.amd.vcek_chain_pem(), fields)
            .unwrap();
    Arc::new(SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::Rsa2048),
        full.instance_info_without_certificates().unwrap(),
    ))
}

/// A chip ID no machine has, the `n`th an attacker makes up.
fn invented_chip(n: u32) -> [u8; 64] {
    let mut chip = [0xa7; 64];
    chip[..4].copy_from_slice(&n.to_be_bytes());
    chip
}

/// The VCEK path a chip's report at `MIN` names on the KDS.
fn vcek_path(chip: &[u8; 64]) -> String {
    format!(
        "/vcek/v1/Milan/{}?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115",
        hex::encode(chip)
    )
}

/// A peer streams made-up chip IDs (a software AK and a report of its own that passes every
/// check needing nothing from AMD) while the KDS answers 429 with an hour's Retry-After. The
/// peer makes attest-proxy fetch at most its share of VCEKs, and a genuine new node on another
/// address, told to retry while AMD refuses, joins once the KDS answers again: within its
/// back-off, a probe interval and `--collateral-wait`, not after the hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_streaming_invented_chips_spends_its_share_and_a_genuine_node_joins_once_amd_answers()
 {
    let s = setup().await;
    let genuine_chip = s.amd.chip([0x42; 64], MIN, 0).unwrap();
    let warm_chip = s.amd.chip([0x43; 64], MIN, 0).unwrap();
    for (chip, vcek) in [([0x42; 64], &genuine_chip), ([0x43; 64], &warm_chip)] {
        s.kds.put_vcek(&vcek_path(&chip), vcek.cert_der().to_vec());
    }
    const SHARE: usize = 2;
    let system = start_with_proxy_args(
        &s,
        Variant::AzureSevSnp,
        measurements(),
        &[
            "--collateral-peer-fetches",
            &SHARE.to_string(),
            "--collateral-peer-window",
            "10m",
            "--collateral-probe-interval",
            "1s",
        ],
    )
    .await;
    // A first node joins: AMD's CRL and chain are cached from now on.
    system
        .client(bare_azure_on(&s, &warm_chip, ReportFields::default()))
        .unwrap()
        .join(join_request("worker-warm", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));

    s.kds.set_fault(Fault::RateLimited { retry_after: 3600 });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (stop, issuers) = (
            stop.clone(),
            (0..40)
                .map(|n| bare_azure(&s, invented_chip(n), ReportFields::default()))
                .collect::<Vec<_>>(),
        );
        let system_addr = system.proxy_addr;
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for (n, issuer) in issuers.into_iter().enumerate() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let client = node_client::Client::new(
                    system_addr,
                    issuer,
                    std::time::Duration::from_secs(20),
                )
                .unwrap()
                .with_source_ip([127, 0, 0, 2].into());
                let status = refusal(
                    client
                        .join(join_request(&format!("invented-{n}"), DISK).unwrap())
                        .await,
                );
                answers.push(status.code());
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            answers
        })
    };
    // Long enough for the peer to spend its share: its first fetch and the probe a second on.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;

    let genuine = system
        .client(bare_azure_on(&s, &genuine_chip, ReportFields::default()))
        .unwrap();
    let status = refusal(
        genuine
            .join(join_request("worker-genuine", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    s.kds.set_fault(Fault::None);
    let answered = std::time::Instant::now();
    system
        .joins_eventually(&genuine, "worker-genuine", DISK)
        .await;
    let took = answered.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers = attacker.await.unwrap();
    assert!(
        took < std::time::Duration::from_secs(18),
        "joined {took:?} after the KDS answered again"
    );
    assert!(answers.len() > SHARE, "{answers:?}");
    assert!(
        answers.iter().all(|c| *c == Code::Unavailable),
        "{answers:?}"
    );
    let invented: Vec<String> = s
        .kds
        .paths()
        .into_iter()
        .filter(|p| p.contains(&hex::encode(&invented_chip(0)[4..])))
        .collect();
    assert!(
        !invented.is_empty() && invented.len() <= SHARE,
        "the inventing peer made the proxy fetch {} VCEKs: {invented:?}",
        invented.len()
    );
    assert!(
        system.proxy.log().contains("its share"),
        "{}",
        system.logs()
    );
}

/// A report that a check needing nothing from AMD refuses (the SNP policy, the AK binding)
/// makes attest-proxy ask the KDS nothing, though it names a chip whose VCEK is not cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_refused_before_any_fetch_asks_the_kds_nothing() {
    let s = setup().await;
    let warm_chip = s.amd.chip([0x43; 64], MIN, 0).unwrap();
    s.kds
        .put_vcek(&vcek_path(&[0x43; 64]), warm_chip.cert_der().to_vec());
    let system = start(&s, Variant::AzureSevSnp).await;
    system
        .client(bare_azure_on(&s, &warm_chip, ReportFields::default()))
        .unwrap()
        .join(join_request("worker-warm", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    let asked = s.kds.requests();

    let debug = ReportFields {
        policy: 0x30000 | 1 << 19,
        ..ReportFields::default()
    };
    let vmpl = ReportFields {
        vmpl: 1,
        ..ReportFields::default()
    };
    let honest = bare_azure(&s, invented_chip(3), ReportFields::default());
    let mis_bound = Arc::new(SnpDocumentIssuer::from_parts(
        Variant::AzureSevSnp,
        ak(KeyType::EcdsaP256),
        honest.instance_info().to_vec(),
    ));
    for (n, (node, needle)) in [
        (bare_azure(&s, invented_chip(1), debug), "DEBUG"),
        (bare_azure(&s, invented_chip(2), vmpl), "VMPL 1"),
        (mis_bound, "vouch for the attestation key"),
    ]
    .into_iter()
    .enumerate()
    {
        let status = refusal(
            system
                .client(node)
                .unwrap()
                .join(join_request(&format!("worker-refused-{n}"), DISK).unwrap())
                .await,
        );
        assert_eq!(status.code(), Code::Unauthenticated, "{needle}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{needle}: {}",
            status.message()
        );
    }
    assert_eq!(s.kds.requests(), asked, "{:?}", &s.kds.paths()[asked..]);
}
