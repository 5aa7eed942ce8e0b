//! SEV-SNP nodes join through the real processes: attest-proxy verifies their documents against
//! simulated AMD hardware (trusted only through the config's amdRootKey), with AMD's CRL and
//! what the documents leave out fetched from the KDS stand-in over TLS. The nodes are software
//! keys with simulated reports, and once join-client's own aws-sev-snp issuer on a real TPM
//! over a simulated configfs-tsm.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::Variant;
use attestation::snp::{Product, Tcb};
use kds_standin::{Fault, KdsStandin};
use node_client::ClientError;
use node_client::snp::AwsSnpIssuer;
use proto::join::IssueJoinTicketResponse;
use snp_issuer::configfs::ConfigfsTsm;
use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};
use soft_issuer::tsm::FakeConfigfsTsm;
use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{BOOT_MEASUREMENTS, Options, System, extended_once, join_request};
use tonic::Code;

const DISK: &str = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
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

struct Setup {
    amd: SimulatedAmd,
    kds: KdsStandin,
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
    kds.put_crl("Milan", amd.crl(&[], now - 3600, now + 7 * 86_400).unwrap());
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("kds-ca.pem"), kds.ca_pem()).unwrap();
    Setup { amd, kds, dir }
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
    let config = serde_json::json!({
        "measurements": measurements,
        "bootloaderVersion": MIN.bootloader, "teeVersion": MIN.tee,
        "snpVersion": MIN.snp, "microcodeVersion": MIN.microcode,
        "amdRootKey": s.amd.ark_pem(),
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
        ],
        ..Options::default()
    })
    .await
    .unwrap()
}

fn refusal(result: Result<IssueJoinTicketResponse, ClientError>) -> tonic::Status {
    match result {
        Err(ClientError::Status(status)) => status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

fn aws_node(s: &Setup, fields: ReportFields) -> Arc<SnpDocumentIssuer> {
    let vlek = s.amd.vlek("cc-eu-west-1.aws.example", MIN).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let s = setup().await;
    let system = start(&s, Variant::AwsSevSnp).await;
    let client = system
        .client(aws_node(&s, ReportFields::default()))
        .unwrap();
    client
        .join(join_request("worker-snp-1", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    client
        .rejoin(DISK)
        .await
        .unwrap_or_else(|e| panic!("rejoin: {e}\n{}", system.logs()));
    let audit = system.proxy.log();
    assert!(
        audit.contains("SEV-SNP Milan") && audit.contains("VLEK of cc-eu-west-1.aws.example"),
        "{audit}"
    );

    let refused: [(ReportFields, &str); 3] = [
        (
            ReportFields {
                policy: 0x30000 | 1 << 19,
                ..ReportFields::default()
            },
            "DEBUG",
        ),
        (
            ReportFields {
                vmpl: 1,
                ..ReportFields::default()
            },
            "VMPL 1",
        ),
        (
            ReportFields {
                launch_tcb: Some(Tcb { snp: 7, ..MIN }),
                ..ReportFields::default()
            },
            "launch TCB",
        ),
    ];
    for (fields, needle) in refused {
        let client = system.client(aws_node(&s, fields)).unwrap();
        let status = refusal(
            client
                .join(join_request("worker-snp-2", DISK).unwrap())
                .await,
        );
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{needle}: {}",
            status.message()
        );
    }

    // The report vouches for another key than the one that signed the quotes.
    let stolen = aws_node(&s, ReportFields::default());
    let thief = SnpDocumentIssuer::from_parts(
        Variant::AwsSevSnp,
        ak(KeyType::EcdsaP256),
        stolen.instance_info().to_vec(),
    );
    let status = refusal(
        system
            .client(Arc::new(thief))
            .unwrap()
            .join(join_request("worker-snp-3", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status
            .message()
            .contains("does not vouch for the attestation key"),
        "{}",
        status.message()
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
    let mut measurements = serde_json::Map::new();
    for (index, byte) in BOOT_MEASUREMENTS {
        measurements.insert(
            index.to_string(),
            serde_json::json!({"expected": hex::encode(extended_once(&[byte; 32])), "warnOnly": false}),
        );
    }
    let system = start_with(&s, Variant::AwsSevSnp, measurements.into()).await;
    let node = |fields: ReportFields| {
        let vlek = s.amd.vlek("cc-eu-west-1.aws.example", MIN).unwrap();
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
    client
        .join(join_request("worker-snp-tpm", DISK).unwrap())
        .await
        .unwrap_or_else(|e| panic!("join: {e}\n{}", system.logs()));
    client
        .rejoin(DISK)
        .await
        .unwrap_or_else(|e| panic!("rejoin: {e}\n{}", system.logs()));
    assert_eq!(guest.reports_made(), 2, "one fresh report per attestation");
    assert_eq!(guest.entries_present().unwrap(), 0);
    let audit = system.proxy.log();
    assert!(
        audit.contains("VLEK of cc-eu-west-1.aws.example"),
        "{audit}"
    );
    // swtpm serves one client at a time.
    drop(client);

    // The same TPM on a guest launched with a debug policy is refused for it.
    let (issuer, _guest) = node(ReportFields {
        policy: 0x30000 | 1 << 19,
        ..ReportFields::default()
    });
    let status = refusal(
        system
            .client(issuer)
            .unwrap()
            .join(join_request("worker-snp-tpm-2", DISK).unwrap())
            .await,
    );
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("DEBUG"), "{}", status.message());
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
    s.kds.put_crl(
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
