//! TDX nodes join through the real processes: attest-proxy verifies their quotes against a
//! simulated Intel (trusted only through the config's intelRootKey), with TCB info, QE identity
//! and CRLs fetched from the PCS stand-in over TLS. The nodes are TDs on simulated TDX machines:
//! qemu-tdx documents made per connection, azure-tdx vTPM documents whose TD quote binds the
//! vTPM key through Azure's runtime data. A qemu-tdx node also joins as `join-client --variant
//! qemu-tdx` does: its real issuer asking a simulated configfs-tsm for each quote; and an
//! azure-tdx node as `join-client --variant azure-tdx` does: its real issuer reading the HCL
//! report from a swtpm on which Azure's paravisor is played and asking a stand-in of Azure's
//! quote service, over HTTP, for each quote.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::{Issuer, Variant};
use pcs_standin::intel::OUT_OF_DATE_TDX_TCB_SVNS;
use pcs_standin::{PckCa, SimulatedIntel};
use soft_issuer::tdx::{
    PckSpec, QuoteVersion, RTMRS, ReportData, TD_ATTRIBUTES_DEBUG, TD_ATTRIBUTES_SEPT_VE_DISABLE,
    TdFields, TdxDocumentIssuer, TdxMachine,
};
use soft_issuer::tsm::FakeConfigfsTsm;
use soft_issuer::{KeyType, SoftIssuer};
use tdx_issuer::{ConfigfsTdx, QemuTdxIssuer};
use testsupport::azure::QuoteServiceStandin;
use testsupport::harness::{Options, System, Uids, boot_pcrs, own_uid};
use testsupport::tdx::{TdxMachines, TdxSite};
use tpm_issuer::azure::tdx::{AzureTdxIssuer, ImdsQuoteClient};

const DISK: &str = "6e5d4c3b-2a1f-4e0d-9c8b-7a6f5e4d3c2b";

/// The serial of the PCK the site's Platform CA CRL revokes.
const REVOKED: u64 = 0xdead;

struct Setup {
    site: TdxSite,
    machines: TdxMachines,
    /// Holds the PCS CA, the attestation config and the collateral directory.
    _dir: tempfile::TempDir,
}

async fn setup(variant: Variant) -> Setup {
    let intel = Arc::new(SimulatedIntel::new().unwrap());
    let machines = TdxMachines::new(variant, &intel, 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy_uid = (own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = TdxSite::start(
        variant,
        intel,
        &machines.fmspcs(),
        dir.path(),
        Duration::from_secs(7 * 86_400),
        proxy_uid,
    )
    .await
    .unwrap();
    site.revoke(PckCa::Platform, &[REVOKED]).unwrap();
    Setup {
        site,
        machines,
        _dir: dir,
    }
}

async fn start(s: &Setup, variant: Variant) -> System {
    System::start(Options {
        variant: Some(variant),
        attestation_config: Some(s.site.attestation_config_path()),
        proxy_args: s.site.proxy_args(Duration::from_secs(3)),
        ..Options::default()
    })
    .await
    .unwrap()
}

/// A node whose TD runs on `host` with `td`, bound as a node binds its documents.
fn on(s: &Setup, host: Arc<TdxMachine>, td: TdFields) -> Arc<dyn Issuer> {
    Arc::new(s.machines.node_on(host, td, ReportData::Bound).unwrap())
}

/// attest-proxy's audit log names the quote a simulated machine made: v4, with its FMSPC.
fn assert_audited_simulated_quote(system: &System) {
    let audit = system.proxy.log();
    assert!(
        audit.contains("TDX quote v4, FMSPC 00806f050000"),
        "{audit}"
    );
}

fn with(td: impl FnOnce(&mut TdFields)) -> TdFields {
    let mut fields = TdFields::default();
    td(&mut fields);
    fields
}

/// Joins, rejoins, and every refusal, each named in the node's error: REPORT_DATA made for
/// something else, a debug TD, a measurement that differs, a TCB level the config does not
/// accept, a revoked PCK, a root the config does not trust.
async fn joins_and_refusals(variant: Variant) {
    let s = setup(variant).await;
    let system = start(&s, variant).await;
    let client = system.client(Arc::new(s.machines.node().unwrap())).unwrap();
    system
        .join_and_rejoin(&client, "worker-tdx-1", DISK)
        .await
        .unwrap();
    assert_audited_simulated_quote(&system);

    let host = s.machines.host(0);
    let revoked = Arc::new(
        TdxMachine::new(
            &s.site.intel,
            PckSpec {
                serial: REVOKED,
                ..PckSpec::default()
            },
        )
        .unwrap(),
    );
    let untrusted =
        Arc::new(TdxMachine::new(&SimulatedIntel::new().unwrap(), PckSpec::default()).unwrap());
    let measured: (Arc<dyn Issuer>, &str) = match variant {
        // RTMR2 (measurement index 3) differs, then MRTD (index 0).
        Variant::QemuTdx => {
            let mut rtmrs = RTMRS;
            rtmrs[2] = [0xee; 48];
            (
                on(&s, host.clone(), with(|f| f.rtmrs = rtmrs)),
                "measurements do not match the policy",
            )
        }
        // azure-tdx measures the vTPM's PCRs: PCR 9 differs.
        _ => {
            let ak = SoftIssuer::new(KeyType::Rsa2048)
                .unwrap()
                .with_pcrs(boot_pcrs())
                .unwrap()
                .with_pcrs([(9, [0x98; 32])])
                .unwrap();
            (
                Arc::new(
                    TdxDocumentIssuer::azure(
                        ak,
                        host.clone(),
                        TdFields::default(),
                        ReportData::Bound,
                    )
                    .unwrap(),
                ),
                "measurements do not match the policy",
            )
        }
    };
    let mut refused: Vec<(Arc<dyn Issuer>, &str)> = vec![
        (
            Arc::new(
                s.machines
                    .node_on(
                        host.clone(),
                        TdFields::default(),
                        ReportData::Fixed([0x33; 64]),
                    )
                    .unwrap(),
            ),
            "REPORT_DATA",
        ),
        (
            on(
                &s,
                host.clone(),
                with(|f| f.td_attributes = TD_ATTRIBUTES_DEBUG | TD_ATTRIBUTES_SEPT_VE_DISABLE),
            ),
            "debug TD",
        ),
        measured,
        (
            on(
                &s,
                host.clone(),
                with(|f| f.tee_tcb_svn = OUT_OF_DATE_TDX_TCB_SVNS),
            ),
            "the TCB status is OutOfDate",
        ),
        (
            on(&s, revoked, TdFields::default()),
            "revoked by Intel's CRL",
        ),
        // Intel's names, another root key: the configured root did not sign this PCK CA.
        (
            on(&s, untrusted, TdFields::default()),
            "Intel certificate chain",
        ),
    ];
    if variant == Variant::QemuTdx {
        refused.push((
            on(&s, host.clone(), with(|f| f.mr_td = [0x11; 48])),
            "measurements do not match the policy",
        ));
    }
    system
        .assert_refused_by_name(&variant.to_string(), "worker-tdx-2", DISK, refused)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_tdx_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    joins_and_refusals(Variant::QemuTdx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_tdx_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    joins_and_refusals(Variant::AzureTdx).await;
}

/// A node as `join-client --variant qemu-tdx` builds it: `tdx-issuer` asking the guest's
/// configfs-tsm, simulated here over a temporary directory with a simulated TDX machine behind
/// it, for a fresh quote per attestation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_tdx_node_quoting_through_configfs_tsm_joins_and_rejoins() {
    let s = setup(Variant::QemuTdx).await;
    let system = start(&s, Variant::QemuTdx).await;
    let node = |td: TdFields| {
        let guest = Arc::new(FakeConfigfsTsm::tdx(s.machines.host(0), td).unwrap());
        let issuer = QemuTdxIssuer::with_source(ConfigfsTdx::with_fs(
            guest.clone(),
            guest.root().to_owned(),
        ));
        (Arc::new(issuer), guest)
    };

    let (issuer, guest) = node(TdFields::default());
    let client = system.client(issuer).unwrap();
    system
        .join_and_rejoin(&client, "worker-tdx-tsm", DISK)
        .await
        .unwrap();
    assert_eq!(guest.reports_made(), 2, "one fresh quote per attestation");
    assert_eq!(guest.entries_present().unwrap(), 0);
    assert_audited_simulated_quote(&system);

    // The same issuer in a TD whose RTMR2 differs, or that the host may debug, is refused by
    // name.
    let mut rtmrs = RTMRS;
    rtmrs[2] = [0xee; 48];
    let (measured, _) = node(with(|f| f.rtmrs = rtmrs));
    let (debug, _) = node(with(|f| {
        f.td_attributes = TD_ATTRIBUTES_DEBUG | TD_ATTRIBUTES_SEPT_VE_DISABLE
    }));
    system
        .assert_refused_by_name(
            "qemu-tdx through configfs-tsm",
            "worker-tdx-tsm-2",
            DISK,
            vec![
                (
                    measured as Arc<dyn Issuer>,
                    "measurements do not match the policy",
                ),
                (debug as Arc<dyn Issuer>, "debug TD"),
            ],
        )
        .await
        .unwrap();
}

/// A node as `join-client --variant azure-tdx` builds it: the system's swtpm (with the
/// harness's boot measurements) on which Azure's paravisor persisted its AK and left its HCL
/// report with the TD report of a TD on a simulated machine, and the quote service stand-in
/// quoting with that machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_tdx_node_attesting_with_its_vtpm_and_the_quote_service_joins_and_rejoins() {
    let s = setup(Variant::AzureTdx).await;
    let system = start(&s, Variant::AzureTdx).await;
    let quotes = QuoteServiceStandin::start(s.machines.host(0), QuoteVersion::V4).unwrap();
    testsupport::azure::boot_tdx(&system.swtpm, &TdFields::default(), None).unwrap();
    let issuer = Arc::new(AzureTdxIssuer::new(
        tpm_issuer::azure::open_tpm(&system.swtpm.tcti()).unwrap(),
        Box::new(ImdsQuoteClient::new(&quotes.url(), Duration::from_secs(10)).unwrap()),
    ));
    let client = system.client(issuer).unwrap();
    system
        .join_and_rejoin(&client, "worker-azure-tdx-tpm", DISK)
        .await
        .unwrap();
    assert_eq!(quotes.requests(), 2, "one quote per attestation");
    assert_audited_simulated_quote(&system);
}
