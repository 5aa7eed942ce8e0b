//! End to end, the service attests itself on (simulated) Azure SEV-SNP: the certifier, opened
//! by `certifier::device` for `--variant azure-sev-snp` on the control-plane node's swtpm on
//! which Azure's paravisor is played (testsupport::azure), issues azure-sev-snp documents
//! without a VCEK; attest-proxy puts the VCEK and AMD's CRL (from the KDS stand-in, through its
//! cache) into its certificate, and an azure-sev-snp node with an azure-sev-snp service policy,
//! which reaches no KDS, joins through the real processes. A service whose control plane booted
//! other measurements is refused by name before the node sends its request.
//!
//! The certifier runs in this process (`certifier::run`, the binary's own code), as in the
//! other service_attests tests; its device is the real one `--variant azure-sev-snp --tcti`
//! names.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use atls::server_collateral::ServerCollateral;
use attestation::Variant;
use attestation::snp::Product;
use clap::Parser as _;
use common::InProcessCertifier;
use soft_issuer::snp::{ReportFields, SimulatedAmd};
use testsupport::harness::{BOOT_MEASUREMENTS, SharedCluster, System, own_uid};
use testsupport::snp::{SnpSite, TCB, attestation_config, vcek_path};
use testsupport::swtpm::Swtpm;
use tpm_issuer::azure::sev_snp::AzureSnpIssuer;

const DISK: &str = "7e6d5c4b-3a29-4817-a6b5-c4d3e2f1a0b9";

struct Attested {
    system: System,
    site: SnpSite,
    certifier: InProcessCertifier,
    _control_plane: Swtpm,
    dir: tempfile::TempDir,
}

/// An Azure CVM's vTPM on the simulated AMD's chip `chip`: `tpm` with the harness's boot chain
/// measured (unless it is already), the paravisor's AK and HCL report on it, and the chip's
/// VCEK published at the KDS stand-in.
fn boot_azure(site: &SnpSite, tpm: &Swtpm, chip: [u8; 64], measure: bool) {
    if measure {
        for (index, byte) in BOOT_MEASUREMENTS {
            tpm.extend_pcr(index, &[byte; 32]).unwrap();
        }
    }
    let vcek = site.amd.chip(chip, TCB, 0).unwrap();
    site.kds.put_vcek(
        &vcek_path(Product::Milan, &vcek.hw_id().unwrap(), &TCB),
        vcek.cert_der().to_vec(),
    );
    testsupport::azure::boot_snp(tpm, &vcek, ReportFields::default(), None).unwrap();
}

async fn start(control_plane_measured: bool) -> Attested {
    // Its turn at the shared control plane first: nothing below may wait holding a TPM.
    let cluster = SharedCluster::alone().await.unwrap();
    let own = own_uid().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let amd = Arc::new(SimulatedAmd::new(Product::Milan).unwrap());
    let site = SnpSite::start(
        amd,
        &dir.path().join("site"),
        Duration::from_secs(7 * 86_400),
        (own == 0).then_some(common::proxy_uid()),
    )
    .await
    .unwrap();

    let control_plane = Swtpm::start().unwrap();
    if !control_plane_measured {
        control_plane.extend_pcr(9, &[0x66; 32]).unwrap();
    }
    boot_azure(&site, &control_plane, [0xc1; 64], control_plane_measured);
    let tcti = control_plane.tcti();
    let args = ["--tcti", tcti.as_str()];
    // The device the binary opens for these flags.
    let config = certifier::Config::try_parse_from(
        ["certifier", "--peer-uid", "0", "--variant", "azure-sev-snp"]
            .into_iter()
            .chain(args),
    )
    .unwrap();
    let issuer = certifier::device::open(&config).unwrap();
    let certifier =
        InProcessCertifier::start(dir.path(), Variant::AzureSevSnp, &args, issuer).await;
    let system = certifier
        .serve(
            cluster,
            Variant::AzureSevSnp,
            site.attestation_config_path(),
            site.proxy_args(Duration::from_secs(3)),
        )
        .await;
    boot_azure(&site, &system.swtpm, [0xd2; 64], false);
    Attested {
        system,
        site,
        certifier,
        _control_plane: control_plane,
        dir,
    }
}

impl Attested {
    async fn stop(self) {
        self.certifier.stop().await;
    }

    /// The node on the system's swtpm, as `join-client --variant azure-sev-snp` builds it,
    /// with an azure-sev-snp service policy for the control plane.
    fn node(&self) -> node_client::Client {
        let policy = common::service_policy(
            self.dir.path(),
            Variant::AzureSevSnp,
            &attestation_config(&self.site.amd),
        );
        let issuer = Arc::new(AzureSnpIssuer::open(&self.system.swtpm.tcti()).unwrap());
        self.system
            .client(issuer)
            .unwrap()
            .with_service_policy(policy)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_node_joins_a_service_attesting_on_azure_sev_snp() {
    let attested = start(true).await;
    let system = &attested.system;
    let client = attested.node();
    common::joins_and_rejoins(system, &client, "worker-azure-1", DISK).await;
    drop(client);
    let logs = system.logs();
    assert!(logs.contains("server key certified"), "{logs}");
    // Both VCEKs came from the KDS, to attest-proxy only: the node's for its own join, the
    // control plane's to go into the certificate.
    let paths = attested.site.kds.paths();
    for chip in ["c1c1c1c1", "d2d2d2d2"] {
        assert!(
            paths
                .iter()
                .any(|p| p.contains("/vcek/") && p.contains(chip)),
            "{paths:?}"
        );
    }
    // The certificate carries the control plane's VCEK, which its document leaves out.
    let policy = common::service_policy(
        attested.dir.path(),
        Variant::AzureSevSnp,
        &attestation_config(&attested.site.amd),
    );
    let issuer = Arc::new(AzureSnpIssuer::open(&system.swtpm.tcti()).unwrap());
    let (_, collateral) = common::served_certificate(system, issuer, &policy).await;
    let ServerCollateral::Amd(amd) = collateral else {
        panic!("not AMD collateral: {collateral:?}");
    };
    assert!(amd.signer.is_some(), "no VCEK in the certificate");
    attested.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_node_refuses_a_service_that_booted_other_measurements() {
    let attested = start(false).await;
    let system = &attested.system;
    let client = attested.node();
    let decision = common::refused_before_sending(
        system,
        &client,
        "worker-azure-2",
        DISK,
        "other measurements",
    )
    .await;
    assert_eq!(decision.check.as_deref(), Some("measurements"));
    drop(client);
    attested.stop().await;
}
