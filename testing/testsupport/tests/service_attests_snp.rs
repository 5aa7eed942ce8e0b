//! End to end, the service attests itself on (simulated) SEV-SNP: the certifier issues
//! aws-sev-snp documents from the control-plane node's swtpm and a simulated configfs-tsm,
//! attest-proxy puts AMD's collateral for them (from the KDS stand-in, through its cache) into
//! its certificate, and a node with an aws-sev-snp service policy, which reaches no KDS, joins
//! through all the real processes; a node whose service policy expects other measurements
//! refuses the service by name before sending its request.
//!
//! The certifier runs in this process (`certifier::run`, the binary's own code), since the
//! simulated configfs-tsm is the kernel's side of file operations made through it and cannot be
//! reached from another process; everything else runs as its own process, under the pod's uids
//! when run as root. `--variant aws-sev-snp` opening the real devices is `certifier::device`'s.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use atls::server_collateral::ServerCollateral;
use attestation::Variant;
use attestation::snp::Product;
use common::InProcessCertifier;
use node_client::ServicePolicy;
use snp_issuer::configfs::ConfigfsTsm;
use soft_issuer::snp::{ReportFields, SimulatedAmd};
use soft_issuer::tsm::FakeConfigfsTsm;
use testsupport::harness::{BOOT_MEASUREMENTS, SharedCluster, System, own_uid};
use testsupport::snp::{SnpSite, TCB, attestation_config};
use testsupport::swtpm::Swtpm;
use tpm_issuer::aws_sev_snp::AwsSnpIssuer;

const DISK: &str = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9";

/// The running service and what keeps its certifier alive.
struct Attested {
    system: System,
    site: SnpSite,
    guest: Arc<FakeConfigfsTsm>,
    certifier: InProcessCertifier,
    _control_plane: Swtpm,
    dir: tempfile::TempDir,
}

/// The control-plane node's swtpm, with the harness's boot chain measured.
fn control_plane_tpm() -> Swtpm {
    let tpm = Swtpm::start().unwrap();
    for (index, byte) in BOOT_MEASUREMENTS {
        tpm.extend_pcr(index, &[byte; 32]).unwrap();
    }
    tpm
}

async fn start() -> Attested {
    // Its turn at the shared control plane first: nothing below may wait holding a TPM.
    let cluster = SharedCluster::alone().await.unwrap();
    let own = own_uid().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let amd = Arc::new(SimulatedAmd::new(Product::Milan).unwrap());
    let site = SnpSite::start(
        amd.clone(),
        &dir.path().join("site"),
        Duration::from_secs(7 * 86_400),
        (own == 0).then_some(common::proxy_uid()),
    )
    .await
    .unwrap();

    let control_plane = control_plane_tpm();
    let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", TCB).unwrap();
    let guest = Arc::new(FakeConfigfsTsm::aws(&amd, vlek, ReportFields::default()).unwrap());
    let tpm = tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(control_plane.tcti()))
        .unwrap();
    let source = ConfigfsTsm::with_fs(guest.clone(), guest.root().to_owned());
    let certifier = InProcessCertifier::start(
        dir.path(),
        Variant::AwsSevSnp,
        &["--tcti", &control_plane.tcti()],
        Arc::new(AwsSnpIssuer::new(tpm, Box::new(source)).unwrap()),
    )
    .await;

    let system = certifier
        .serve(
            cluster,
            Variant::AwsSevSnp,
            site.attestation_config_path(),
            site.proxy_args(Duration::from_secs(3)),
        )
        .await;
    Attested {
        system,
        site,
        guest,
        certifier,
        _control_plane: control_plane,
        dir,
    }
}

impl Attested {
    /// Stops the certifier before its swtpm goes away, so it closes the TPM cleanly.
    async fn stop(self) {
        self.certifier.stop().await;
    }

    /// A node on the system's swtpm and a simulated AWS guest of the same AMD, as
    /// `join-client --variant aws-sev-snp` builds it.
    fn node(&self) -> (Arc<AwsSnpIssuer>, Arc<FakeConfigfsTsm>) {
        let vlek = self
            .site
            .amd
            .vlek("CN=cc-eu-west-1.amazonaws.com", TCB)
            .unwrap();
        let guest =
            Arc::new(FakeConfigfsTsm::aws(&self.site.amd, vlek, ReportFields::default()).unwrap());
        let tpm = tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(
            self.system.swtpm.tcti(),
        ))
        .unwrap();
        let source = ConfigfsTsm::with_fs(guest.clone(), guest.root().to_owned());
        (
            Arc::new(AwsSnpIssuer::new(tpm, Box::new(source)).unwrap()),
            guest,
        )
    }

    /// A service policy file for the control plane: `config` as the node keeps it.
    fn service_policy(&self, config: &str) -> ServicePolicy {
        common::service_policy(self.dir.path(), Variant::AwsSevSnp, config)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_an_snp_service_policy_joins_a_service_attesting_on_snp() {
    let attested = start().await;
    let system = &attested.system;
    // The control plane booted what the nodes did, on the same (simulated) AMD.
    let policy = attested.service_policy(&attestation_config(&attested.site.amd));
    let (issuer, node_guest) = attested.node();
    let client = system
        .client(issuer.clone())
        .unwrap()
        .with_service_policy(policy.clone());
    common::joins_and_rejoins(system, &client, "worker-snp-1", DISK).await;

    // The service's evidence came from the control plane's guest, once per key (not per
    // connection); the node's from its own.
    assert_eq!(attested.guest.reports_made(), 1, "{}", system.logs());
    assert_eq!(node_guest.reports_made(), 2);
    let logs = system.logs();
    assert!(logs.contains("server key certified"), "{logs}");
    // AMD's CRL reached the node through the certificate: the KDS served it to attest-proxy
    // only, and no more often than attest-proxy itself needed it.
    assert!(
        attested
            .site
            .kds
            .paths()
            .iter()
            .any(|path| path.contains("/crl")),
        "{logs}"
    );
    // A Go node can read the certificate, which carries AMD's collateral.
    let (_, collateral) = common::served_certificate(system, issuer, &policy).await;
    assert!(matches!(collateral, ServerCollateral::Amd(_)));
    drop(client);
    attested.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_an_snp_service_with_other_measurements_before_sending_its_request() {
    let attested = start().await;
    let system = &attested.system;
    let mut config: serde_json::Value =
        serde_json::from_str(&attestation_config(&attested.site.amd)).unwrap();
    config["measurements"]["4"]["expected"] = serde_json::json!("45".repeat(32));
    let policy = attested.service_policy(&config.to_string());
    let (issuer, _guest) = attested.node();
    let client = system.client(issuer).unwrap().with_service_policy(policy);
    let decision =
        common::refused_before_sending(system, &client, "worker-snp-2", DISK, "measurement 4")
            .await;
    assert_eq!(decision.check.as_deref(), Some("measurements"));
    drop(client);
    attested.stop().await;
}
