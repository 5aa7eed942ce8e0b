//! gcp-sev-es nodes join through the real processes: attest-proxy verifies their vTPM documents,
//! asking gce-identity (its own process, holding the token from the GCE stand-in's metadata
//! server) whether the GCE API vouches for each node's AK and calls its instance a confidential
//! VM. The nodes are software keys on simulated GCE confidential VMs (the boot record Google's
//! firmware measures, Constellation's InstanceInfo), and once tpm-issuer's gcp-sev-es issuer on
//! a swtpm on which Google's part is played (testsupport::gce), naming its instance from a
//! metadata server.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::gce::InstanceRef;
use attestation::{Issuer, Variant};
use gce_standin::{Fault, GceStandin};
use soft_issuer::gce::{GceSevEsNode, technology};
use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{GceEndpoints, Options, System, join_request, refusal};
use tonic::Code;

const DISK: &str = "7e6d5c4b-3a29-4817-9f6e-5d4c3b2a1908";
const PROJECT: &str = "constellation-331613";
const ZONE: &str = "europe-west3-b";

struct Setup {
    gce: GceStandin,
    /// Holds the GCE CA and the attestation config, readable by every uid.
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let gce = GceStandin::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("gce-ca.pem"), gce.ca_pem()).unwrap();
    Setup { gce, dir }
}

fn instance_in(project: &str, name: &str) -> InstanceRef {
    InstanceRef {
        project: project.to_owned(),
        zone: ZONE.to_owned(),
        instance: name.to_owned(),
    }
}

fn standin(i: &InstanceRef) -> gce_standin::Instance {
    gce_standin::Instance {
        project: i.project.clone(),
        zone: i.zone.clone(),
        name: i.instance.clone(),
    }
}

/// A node of `technology` on instance `i` with a key of its own; not yet known to the API.
fn unregistered(i: &InstanceRef, tech: u8) -> GceSevEsNode {
    GceSevEsNode::new(SoftIssuer::new(KeyType::EcdsaP256).unwrap(), i, 1, tech).unwrap()
}

/// An SEV node on instance `name` of the cluster's project, whose key the API vouches for.
fn node(s: &Setup, name: &str) -> GceSevEsNode {
    let i = instance_in(PROJECT, name);
    let node = unregistered(&i, technology::AMD_SEV);
    s.gce
        .put_instance(standin(&i), &node.ak_spki_der().unwrap(), None);
    node
}

/// The system for gcp-sev-es, enforcing the simulated firmware's PCR 0 and an unextended PCR 9
/// (what a fresh vTPM and a software node both quote), admitting only the cluster's project.
async fn start(s: &Setup) -> System {
    let pcr0 = hex::encode(
        &unregistered(&instance_in(PROJECT, "w"), technology::AMD_SEV)
            .ak()
            .pcrs()[&0],
    );
    let config = serde_json::json!({
        "measurements": {
            "0": {"expected": pcr0, "warnOnly": false},
            "9": {"expected": "00".repeat(32), "warnOnly": false},
        },
        "allowedGcpProjects": [PROJECT],
    });
    let path = s.dir.path().join("gcp-sev-es.json");
    std::fs::write(&path, config.to_string()).unwrap();
    System::start(Options {
        variant: Some(Variant::GcpSevEs),
        attestation_config: Some(path),
        gce: Some(GceEndpoints {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_sev_es_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let s = setup().await;
    let system = start(&s).await;
    let client = system.client(Arc::new(node(&s, "es-1"))).unwrap();
    system
        .join_and_rejoin(&client, "worker-es-1", DISK)
        .await
        .unwrap();
    let log = system.proxy.log();
    for needle in [
        "GCE firmware v1, AMD SEV",
        "AK vouched for by the GCE API for projects/constellation-331613/zones/europe-west3-b/instances/es-1",
        "enableConfidentialCompute true",
    ] {
        assert!(log.contains(needle), "{needle}:\n{log}");
    }
    // es-1's key and confidential config, each asked once and cached for the rejoin.
    assert_eq!(s.gce.compute_requests(), 2);
    assert_eq!(s.gce.token_requests(), 1);

    // A key the cloud does not vouch for: the API names another key for es-2.
    let unvouched = node(&s, "es-2");
    let other = unregistered(&instance_in(PROJECT, "x"), technology::AMD_SEV);
    s.gce.put_instance(
        standin(&instance_in(PROJECT, "es-2")),
        &other.ak_spki_der().unwrap(),
        None,
    );
    // An instance the API says is not a confidential VM.
    let shielded_only = node(&s, "es-3");
    assert!(
        s.gce
            .set_confidential(&standin(&instance_in(PROJECT, "es-3")), None)
    );
    // A machine whose firmware recorded no confidential computing.
    let plain = unregistered(&instance_in(PROJECT, "es-4"), technology::NONE);
    s.gce.put_instance(
        standin(&instance_in(PROJECT, "es-4")),
        &plain.ak_spki_der().unwrap(),
        None,
    );
    // A genuine confidential VM in a project of the attacker's own.
    let foreign_instance = instance_in("attacker-project-1", "es-5");
    let foreign = unregistered(&foreign_instance, technology::AMD_SEV);
    s.gce.put_instance(
        standin(&foreign_instance),
        &foreign.ak_spki_der().unwrap(),
        None,
    );
    // An instance the API does not know.
    let unknown = unregistered(&instance_in(PROJECT, "es-6"), technology::AMD_SEV);
    let before = s.gce.compute_requests();

    let refused: Vec<(Arc<dyn Issuer>, &str)> = vec![
        (
            Arc::new(unvouched),
            "is not the signing key the GCE API vouches for",
        ),
        (
            Arc::new(shielded_only),
            "the GCE API says the instance is not a confidential VM",
        ),
        (
            Arc::new(plain),
            "the firmware records no confidential computing, not an AMD SEV confidential VM",
        ),
        (
            Arc::new(foreign),
            "GCP project attacker-project-1 is not in allowedGcpProjects",
        ),
        (Arc::new(unknown), "the GCE API knows no instance"),
    ];
    system
        .assert_refused_by_name("gcp-sev-es", "worker-es-2", DISK, refused)
        .await
        .unwrap();
    // The firmware's and the project's refusals asked nothing of Google: es-2 (key), es-3 (key
    // and config), es-6 (key).
    assert_eq!(s.gce.compute_requests() - before, 4);
    assert!(
        system.proxy.log().contains("check=gce_platform")
            || system.proxy.log().contains("\"check\":\"gce_platform\""),
        "{}",
        system.proxy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_gce_api_is_down_nodes_are_told_to_retry_and_then_join() {
    let s = setup().await;
    let system = start(&s).await;
    for (i, fault) in [
        Fault::RateLimited { retry_after: 1 },
        Fault::ServerError,
        Fault::Forbidden,
        Fault::Hang,
    ]
    .into_iter()
    .enumerate()
    {
        s.gce.set_compute_fault(fault);
        let name = format!("es-fault-{i}");
        let client = system.client(Arc::new(node(&s, &name))).unwrap();
        let status = refusal(client.join(join_request(&name, DISK).unwrap()).await);
        assert_eq!(status.code(), Code::Unavailable, "{fault:?}: {status:?}");
        assert!(
            status.message().contains("GCE API") || status.message().contains("gce-identity"),
            "{fault:?}: {}",
            status.message()
        );
        assert!(
            !status.message().contains("permission"),
            "Google's message reached the node: {}",
            status.message()
        );
        s.gce.set_compute_fault(Fault::None);
        system.joins_eventually(&client, &name, DISK).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gce_node_attesting_with_its_vtpm_joins_and_rejoins() {
    let s = setup().await;
    let system = start(&s).await;
    let tpm = testsupport::swtpm::Swtpm::start().unwrap();
    let log = testsupport::gce::boot(&tpm, 1, technology::AMD_SEV).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("binary_bios_measurements");
    std::fs::write(&log_path, &log).unwrap();
    // The node's own metadata server names its instance.
    let metadata = GceStandin::start().await.unwrap();
    let vm = instance_in(PROJECT, "es-tpm");
    metadata.set_vm(standin(&vm));

    let tcti = tpm.tcti();
    let metadata_url = metadata.metadata_url();
    let issuer = tokio::task::spawn_blocking(move || {
        let mut config = tpm_issuer::gce::tpm_config(&tcti);
        config.event_log = Some(log_path);
        let tpm = tpm_issuer::TpmIssuer::open(&config).unwrap();
        let metadata =
            tpm_issuer::gce::MetadataClient::new(&metadata_url, std::time::Duration::from_secs(5))
                .unwrap();
        tpm_issuer::gce::GcpSevEsIssuer::new(tpm, &metadata).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        std::str::from_utf8(issuer.instance_info()).unwrap(),
        r#"{"zone":"europe-west3-b","project_id":"constellation-331613","instance_name":"es-tpm"}"#
    );
    let ak = attestation::tpm::Public::parse(&issuer.ak_public().unwrap())
        .unwrap()
        .spki_der()
        .unwrap();
    s.gce.put_instance(standin(&vm), &ak, None);

    let client = system.client(Arc::new(issuer)).unwrap();
    system
        .join_and_rejoin(&client, "worker-es-tpm", DISK)
        .await
        .unwrap();
    let log = system.proxy.log();
    assert!(
        log.contains("AK vouched for by the GCE API for projects/constellation-331613/zones/europe-west3-b/instances/es-tpm"),
        "{log}"
    );
}
