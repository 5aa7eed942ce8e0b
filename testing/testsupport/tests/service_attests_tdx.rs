//! End to end, the service attests itself on (simulated) TDX: the certifier issues qemu-tdx
//! documents through `tdx-issuer` on a simulated configfs-tsm of the control plane's TD,
//! attest-proxy puts Intel's collateral for them (from the PCS stand-in, through its cache) into
//! its certificate, and a node with a qemu-tdx service policy, which reaches no PCS, joins and
//! rejoins through all the real processes; a node whose service policy expects another MRTD or
//! RTMR, or trusts another Intel root, refuses the service by name before sending its request.
//!
//! The certifier runs in this process (see `common`); everything else runs as its own process,
//! under the pod's uids when run as root. The nodes are TDs on simulated TDX machines of the
//! same Intel, as in tdx_join.rs.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use atls::server_collateral::ServerCollateral;
use attestation::Variant;
use common::InProcessCertifier;
use node_client::ServicePolicy;
use pcs_standin::SimulatedIntel;
use soft_issuer::tdx::TdFields;
use soft_issuer::tsm::FakeConfigfsTsm;
use tdx_issuer::{ConfigfsTdx, QemuTdxIssuer};
use testsupport::harness::{SharedCluster, System, own_uid};
use testsupport::tdx::{TdxMachines, TdxSite, attestation_config};

const DISK: &str = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f";

/// The running service and what keeps its certifier alive.
struct Attested {
    system: System,
    site: TdxSite,
    machines: TdxMachines,
    /// The control plane's TD, as its configfs-tsm.
    guest: Arc<FakeConfigfsTsm>,
    certifier: InProcessCertifier,
    dir: tempfile::TempDir,
}

async fn start() -> Attested {
    // Its turn at the shared control plane first: nothing below may wait holding a TPM.
    let cluster = SharedCluster::alone().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let intel = Arc::new(SimulatedIntel::new().unwrap());
    let machines = TdxMachines::new(Variant::QemuTdx, &intel, 2).unwrap();
    let site = TdxSite::start(
        Variant::QemuTdx,
        intel,
        &machines.fmspcs(),
        &dir.path().join("site"),
        Duration::from_secs(7 * 86_400),
        (own_uid().unwrap() == 0).then_some(common::proxy_uid()),
    )
    .await
    .unwrap();

    // The control plane booted what the nodes did: a production TD on the first host.
    let guest = Arc::new(FakeConfigfsTsm::tdx(machines.host(0), TdFields::default()).unwrap());
    let issuer =
        QemuTdxIssuer::with_source(ConfigfsTdx::with_fs(guest.clone(), guest.root().to_owned()));
    let certifier =
        InProcessCertifier::start(dir.path(), Variant::QemuTdx, &[], Arc::new(issuer)).await;

    let system = certifier
        .serve(
            cluster,
            Variant::QemuTdx,
            site.attestation_config_path(),
            site.proxy_args(Duration::from_secs(3)),
        )
        .await;
    Attested {
        system,
        site,
        machines,
        guest,
        certifier,
        dir,
    }
}

impl Attested {
    /// The qemu-tdx attestation config of the site's TDs, as JSON to edit.
    fn config(&self) -> serde_json::Value {
        serde_json::from_str(&attestation_config(Variant::QemuTdx, &self.site.intel).unwrap())
            .unwrap()
    }

    /// A node's service policy for the control plane: `config` as the node keeps it.
    fn service_policy(&self, config: &serde_json::Value) -> ServicePolicy {
        common::service_policy(self.dir.path(), Variant::QemuTdx, &config.to_string())
    }

    /// A node attesting as a production TD on the next host.
    fn node(&self) -> Arc<dyn attestation::Issuer> {
        Arc::new(self.machines.node().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_tdx_service_policy_joins_a_service_attesting_on_tdx() {
    let attested = start().await;
    let system = &attested.system;
    let policy = attested.service_policy(&attested.config());
    let client = system
        .client(attested.node())
        .unwrap()
        .with_service_policy(policy.clone());
    common::joins_and_rejoins(system, &client, "worker-tdx-1", DISK).await;

    // The service's quote came from the control plane's TD, once per key (not per connection).
    assert_eq!(attested.guest.reports_made(), 1, "{}", system.logs());
    let logs = system.logs();
    assert!(logs.contains("server key certified"), "{logs}");

    // Intel's collateral for the control plane's platform reached the node in the certificate,
    // which a Go node can still read.
    let (_, collateral) = common::served_certificate(system, attested.node(), &policy).await;
    let ServerCollateral::Intel(collateral) = collateral else {
        panic!("expected Intel collateral, got {}'s", collateral.vendor());
    };
    assert_eq!(
        hex::encode(collateral.fmspc()),
        attested.machines.host(0).fmspc_hex()
    );
    drop(client);
    attested.certifier.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_a_tdx_service_it_does_not_expect_before_sending_its_request() {
    let attested = start().await;
    let system = &attested.system;
    let mut other_mrtd = attested.config();
    other_mrtd["measurements"]["0"]["expected"] = serde_json::json!("5d".repeat(48));
    let mut other_rtmr = attested.config();
    other_rtmr["measurements"]["3"]["expected"] = serde_json::json!("ee".repeat(48));
    let mut other_intel = attested.config();
    other_intel["intelRootKey"] = serde_json::json!(SimulatedIntel::new().unwrap().root_pem());

    for (case, config, check) in [
        ("another MRTD", other_mrtd, "measurements"),
        ("another RTMR2", other_rtmr, "measurements"),
        // The certificate's collateral and the TD's PCK chain end in a root the node does not
        // trust.
        ("another Intel root", other_intel, "tdx_chain"),
    ] {
        let client = system
            .client(attested.node())
            .unwrap()
            .with_service_policy(attested.service_policy(&config));
        let decision =
            common::refused_before_sending(system, &client, "worker-tdx-2", DISK, case).await;
        assert_eq!(decision.check.as_deref(), Some(check), "{case}");
    }
    attested.certifier.stop().await;
}
