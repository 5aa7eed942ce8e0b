//! The load generator against real servers: the whole system started by the harness (real
//! processes, real aTLS, soft-issuer documents checked by the qemu-vtpm validator; gcp-sev-snp
//! nodes on simulated AMD machines, their instances' keys vouched for by the GCE stand-in through
//! the real gce-identity process; qemu-tdx and azure-tdx nodes in TDs on simulated Intel hosts,
//! their collateral from the PCS stand-in), the benchmark's B and C of gcp-sev-es,
//! azure-trustedlaunch and aws-nitro-tpm through the `loadgen bench` binary, and the benchmark's
//! mutual-TLS floor in process.
//!
//! The system tests need the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loadgen::mtls::{self, ClientCa};
use loadgen::procstat::Watched;
use loadgen::{LoadConfig, Mode, SoftAttestation, Stop, Target};
use soft_issuer::KeyType;
use testsupport::harness::{Options, System, Uids, own_uid};
use testsupport::snp::{GceSite, SnpSite};
use testsupport::tdx::{FLEET_FMSPCS, TdxSite};

/// The simulated nodes attest with software keys, a new one per node: the harness's policy must
/// trust any attestation key instead of pinning its swtpm's.
fn soft_keys() -> Options {
    Options {
        trust_any_ak: true,
        ..Options::default()
    }
}

fn config(label: &str, concurrency: usize, count: u64) -> LoadConfig {
    LoadConfig {
        label: label.to_owned(),
        mode: Mode::Closed {
            concurrency,
            stop: Stop::Count(count),
        },
        timeout: Duration::from_secs(20),
        retry: None,
        node_prefix: loadgen::run::random_prefix(),
        spread_sources: true,
        // Half made ahead, half on the way: both paths are exercised.
        pregenerate: count / 2,
        collateral_metrics: None,
        api_server: None,
    }
}

/// The bootstrap token Secrets joins created: one per node that joined.
async fn bootstrap_tokens(system: &System) -> usize {
    system.kube.bootstrap_tokens().await.len()
}

/// The service's processes, watched for CPU and memory under these names.
fn server_side(processes: &[(&str, &testsupport::process::Process)]) -> Vec<Watched> {
    processes
        .iter()
        .map(|(name, p)| Watched {
            name: (*name).to_owned(),
            pid: p.id(),
            server_side: true,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_joins_through_the_whole_system_are_counted() {
    let system = System::start(soft_keys()).await.unwrap();
    let watched = server_side(&[
        ("attest-proxy", &system.proxy),
        ("join-core", &system.join_core),
        ("token-issuer", &system.token_issuer),
        ("keyservice", &system.keyservice),
    ]);
    let target = Arc::new(Target::Atls {
        addr: system.proxy_addr,
        server_policy: None,
        attestation: SoftAttestation::matching_harness_policy(KeyType::EcdsaP256)
            .unwrap()
            .into(),
    });

    let report = loadgen::run::run(target, &config("C", 4, 12), &watched)
        .await
        .unwrap();
    assert_eq!(
        (
            report.joins,
            report.succeeded,
            report.failed,
            report.retries
        ),
        (12, 12, 0, 0),
        "{report}\n{}",
        system.logs()
    );
    assert!(report.errors.is_empty(), "{report}");
    assert_eq!(report.latency.count, 12);
    assert!(report.latency.p50_ms > 0.0 && report.latency.p50_ms <= report.latency.max_ms);
    assert!(report.joins_per_second > 0.0);
    assert_eq!(report.processes.len(), 4);
    for p in &report.processes {
        assert!(p.peak_rss_mib > 1.0, "{report}");
        assert!(p.cpu_ms_per_join.is_some(), "{report}");
    }
    assert!(report.server_cpu_ms_per_join.unwrap() > 0.0, "{report}");
    // Each join really went through: one bootstrap token Secret per node.
    assert_eq!(bootstrap_tokens(&system).await, 12, "{report}");

    // Nodes whose measurements miss the policy are refused, and the report says why.
    let wrong = Arc::new(Target::Atls {
        addr: system.proxy_addr,
        server_policy: None,
        attestation: SoftAttestation::new(KeyType::Rsa2048, vec![(4, [0xee; 32])])
            .unwrap()
            .into(),
    });
    let report = loadgen::run::run(wrong, &config("wrong PCRs", 2, 3), &watched)
        .await
        .unwrap();
    assert_eq!((report.succeeded, report.failed), (0, 3), "{report}");
    assert_eq!(report.errors.len(), 1, "{report}");
    assert_eq!(report.errors[0].code, "Unauthenticated");
    assert_eq!(report.errors[0].count, 3);
    assert!(
        report.errors[0].class.contains("measurement"),
        "{}",
        report.errors[0].class
    );
    assert_eq!(report.server_cpu_ms_per_join, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_nodes_cost_one_gce_lookup_each_and_are_counted() {
    use attestation::Variant;
    const NODES: u64 = 6;
    let dir = tempfile::Builder::new()
        .prefix("loadgen-gcp-")
        .tempdir()
        .unwrap();
    let amd =
        Arc::new(soft_issuer::snp::SimulatedAmd::new(attestation::snp::Product::Milan).unwrap());
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = SnpSite::start(
        amd.clone(),
        dir.path(),
        Duration::from_secs(86_400),
        proxy_uid,
    )
    .await
    .unwrap();
    let gce = GceSite::start(dir.path()).await.unwrap();
    let system = System::start(Options {
        variant: Some(Variant::GcpSevSnp),
        attestation_config: Some(site.attestation_config_path()),
        proxy_args: site.proxy_args(Duration::from_secs(3)),
        gce: Some(gce.endpoints(vec![])),
        ..Options::default()
    })
    .await
    .unwrap();
    let attestation = loadgen::bench::node_attestation(
        Variant::GcpSevSnp,
        KeyType::EcdsaP256,
        Some(loadgen::bench::Vendor::Amd(&amd)),
        Some(gce.registry()),
    )
    .unwrap();
    let target = Arc::new(Target::Atls {
        addr: system.proxy_addr,
        server_policy: None,
        attestation,
    });
    let mut load = config("C gcp-sev-snp", 3, NODES);
    load.collateral_metrics = Some(system.admin.proxy);
    let watched = server_side(&[
        ("attest-proxy", &system.proxy),
        ("gce-identity", system.gce_identity.as_ref().unwrap()),
    ]);

    let report = loadgen::run::run(target, &load, &watched).await.unwrap();
    assert_eq!(
        (report.joins, report.succeeded, report.failed),
        (NODES, NODES, 0),
        "{report}\n{}",
        system.logs()
    );
    assert!(report.errors.is_empty(), "{report}");
    // Every node a new instance: attest-proxy asked gce-identity once for each, and
    // gce-identity asked the API once for each.
    let used = report.collateral.unwrap();
    let gce_used = used.counts.gce.unwrap();
    assert_eq!((gce_used.ok, gce_used.failed), (NODES, 0), "{report}");
    assert_eq!(used.cloud_lookups_per_join, Some(1.0), "{report}");
    assert_eq!(gce.standin.compute_requests() as u64, NODES, "{report}");
    assert!(
        report.to_string().contains("1.0000 lookups per join"),
        "{report}"
    );
    assert_eq!(bootstrap_tokens(&system).await as u64, NODES, "{report}");
}

/// A short run of `variant`'s nodes, made as the benchmark makes them (TDs spread over
/// `loadgen::bench::TDX_HOSTS` hosts of the fleet's platform models), through the whole system:
/// after a warm-up every join is answered and counted, and none costs a fetch from the PCS.
async fn tdx_nodes_join_and_cost_no_fetch_after_warm_up(variant: attestation::Variant) {
    const NODES: u64 = 6;
    let dir = tempfile::Builder::new()
        .prefix("loadgen-tdx-")
        .tempdir()
        .unwrap();
    let intel = Arc::new(pcs_standin::SimulatedIntel::new().unwrap());
    let fmspcs: Vec<String> = FLEET_FMSPCS.iter().map(hex::encode).collect();
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid().unwrap() == 0).then_some(Uids::POD.proxy);
    let site = TdxSite::start(
        variant,
        intel.clone(),
        &fmspcs,
        dir.path(),
        Duration::from_secs(86_400),
        proxy_uid,
    )
    .await
    .unwrap();
    let system = System::start(Options {
        variant: Some(variant),
        attestation_config: Some(site.attestation_config_path()),
        proxy_args: site.proxy_args(Duration::from_secs(3)),
        ..Options::default()
    })
    .await
    .unwrap();
    let attestation = loadgen::bench::node_attestation(
        variant,
        KeyType::EcdsaP256,
        Some(loadgen::bench::Vendor::Intel(&intel)),
        None,
    )
    .unwrap();
    assert_eq!(attestation.variant(), variant);
    let target = Arc::new(Target::Atls {
        addr: system.proxy_addr,
        server_policy: None,
        attestation,
    });
    let watched = server_side(&[("attest-proxy", &system.proxy)]);

    let mut warm = config(&format!("C {variant} warm-up"), 3, 3);
    warm.collateral_metrics = Some(system.admin.proxy);
    let warm = loadgen::run::run(target.clone(), &warm, &watched)
        .await
        .unwrap();
    assert_eq!(warm.failed, 0, "{warm}\n{}", system.logs());

    let mut load = config(&format!("C {variant}"), 3, NODES);
    load.collateral_metrics = Some(system.admin.proxy);
    let report = loadgen::run::run(target, &load, &watched).await.unwrap();
    assert_eq!(
        (report.joins, report.succeeded, report.failed),
        (NODES, NODES, 0),
        "{report}\n{}",
        system.logs()
    );
    assert!(report.errors.is_empty(), "{report}");
    let used = report.collateral.unwrap();
    assert_eq!(used.fetches_per_join, Some(0.0), "{report}");
    assert_eq!(used.counts.unavailable, 0, "{report}");
    // Every join looked its collateral up in the cache, and found it fresh.
    assert!(used.counts.hits_fresh >= NODES, "{report}");
    assert!(
        report.to_string().contains("0.0000 fetches per join"),
        "{report}"
    );
    assert_eq!(
        bootstrap_tokens(&system).await as u64,
        3 + NODES,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_tdx_nodes_join_and_cost_no_fetch_after_warm_up() {
    tdx_nodes_join_and_cost_no_fetch_after_warm_up(attestation::Variant::QemuTdx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_tdx_nodes_join_and_cost_no_fetch_after_warm_up() {
    tdx_nodes_join_and_cost_no_fetch_after_warm_up(attestation::Variant::AzureTdx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_floor_answers_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClientCa::generate().unwrap();
    let ca_cert = dir.path().join("ca.pem");
    ca.write(&ca_cert, &dir.path().join("ca.key")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (trigger, shutdown) = plumbing::shutdown::channel();
    let server = tokio::spawn(loadgen::trivial::serve_mtls(
        listener,
        mtls::server_config(&ca_cert).unwrap(),
        shutdown,
    ));

    let target = Arc::new(Target::Mtls {
        addr,
        ca: Arc::new(ca),
    });
    let me = Watched {
        name: "loadgen".to_owned(),
        pid: std::process::id(),
        server_side: false,
    };
    let report = loadgen::run::run(target, &config("A", 3, 9), &[me])
        .await
        .unwrap();
    assert_eq!((report.succeeded, report.failed), (9, 0), "{report}");
    assert_eq!(report.latency.count, 9);
    // Only the client is watched: no service cost to report.
    assert_eq!(report.server_cpu_ms_per_join, None);

    // A client certificate from another CA is refused in the handshake.
    let stranger = Arc::new(Target::Mtls {
        addr,
        ca: Arc::new(ClientCa::generate().unwrap()),
    });
    let report = loadgen::run::run(stranger, &config("A, unknown CA", 1, 2), &[])
        .await
        .unwrap();
    assert_eq!(report.failed, 2, "{report}");
    assert_eq!(report.errors[0].code, "Unavailable", "{report}");

    trigger.fire();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Sheds the first `busy` calls with `ResourceExhausted`, as an overloaded service does.
#[derive(Debug)]
struct Shedding {
    busy: u32,
    calls: AtomicU32,
}

#[tonic::async_trait]
impl proto::join::api_server::Api for Shedding {
    async fn issue_join_ticket(
        &self,
        request: tonic::Request<proto::join::IssueJoinTicketRequest>,
    ) -> Result<tonic::Response<proto::join::IssueJoinTicketResponse>, tonic::Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.busy {
            return Err(tonic::Status::resource_exhausted(
                "attestation verification queue is full (256 waiting); retry later",
            ));
        }
        loadgen::trivial::Trivial.issue_join_ticket(request).await
    }

    async fn issue_rejoin_ticket(
        &self,
        request: tonic::Request<proto::join::IssueRejoinTicketRequest>,
    ) -> Result<tonic::Response<proto::join::IssueRejoinTicketResponse>, tonic::Status> {
        loadgen::trivial::Trivial.issue_rejoin_ticket(request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_joins_are_retried_and_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClientCa::generate().unwrap();
    let ca_cert = dir.path().join("ca.pem");
    ca.write(&ca_cert, &dir.path().join("ca.key")).unwrap();
    let ca = Arc::new(ca);
    let tls = mtls::server_config(&ca_cert).unwrap();
    let serve = |busy| {
        let tls = tls.clone();
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (trigger, shutdown) = plumbing::shutdown::channel();
            let api = Shedding {
                busy,
                calls: AtomicU32::new(0),
            };
            tokio::spawn(loadgen::trivial::serve_mtls_with(
                listener, tls, api, shutdown,
            ));
            (addr, trigger)
        }
    };

    // With retries (node-client's policy, short pauses): the first node is shed twice, then joins.
    let (addr, _stop) = serve(2).await;
    let mut retrying = config("retrying", 1, 3);
    retrying.retry = Some(node_client::Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(20),
        give_up_after: Duration::from_secs(10),
    });
    let target = Arc::new(Target::Mtls {
        addr,
        ca: ca.clone(),
    });
    let report = loadgen::run::run(target, &retrying, &[]).await.unwrap();
    assert_eq!(
        (report.succeeded, report.failed, report.retries),
        (3, 0, 2),
        "{report}"
    );
    assert_eq!(report.retried_errors.len(), 1, "{report}");
    let shed = &report.retried_errors[0];
    assert_eq!(
        (shed.code.as_str(), shed.count),
        ("ResourceExhausted", 2),
        "{report}"
    );
    assert_eq!(
        shed.class,
        "attestation verification queue is full (# waiting); retry later"
    );
    assert!(report.errors.is_empty());

    // Without retries the same answers are final failures.
    let (addr, _stop) = serve(2).await;
    let target = Arc::new(Target::Mtls { addr, ca });
    let report = loadgen::run::run(target, &config("no retries", 1, 3), &[])
        .await
        .unwrap();
    assert_eq!(
        (report.succeeded, report.failed, report.retries),
        (1, 2, 0),
        "{report}"
    );
    assert_eq!(report.errors[0].code, "ResourceExhausted");
    assert_eq!(report.errors[0].count, 2);
}

/// The benchmark's B and C for the cloud-trusted vTPM variants, briefly, through the `loadgen
/// bench` binary (B: attest-proxy and the sidecar it asks, the stand-ins in loadgen; C:
/// local-cluster): every join succeeds, and the cloud lookups per join after the warm-up are what
/// each variant's caching allows. gcp-sev-es: every node a new instance, two GCE lookups each
/// (the shielded instance identity naming its AK, and whether it is a confidential VM).
/// azure-trustedlaunch: no cloud API and no collateral. aws-nitro-tpm: the one image's answer
/// was cached in the warm-up, so no EC2 lookup.
#[test]
fn cloud_trusted_variants_bench_with_their_cloud_lookups_per_join() {
    let out = tempfile::tempdir().unwrap();
    let loadgen = testsupport::process::bin("loadgen").unwrap();
    let status = std::process::Command::new(&loadgen)
        .args(["bench", "--setups", "b,c", "--concurrency", "4"])
        .args(["--step", "1s", "--warmup", "1s"])
        .args(["--variant", "gcp-sev-es,azure-trustedlaunch,aws-nitro-tpm"])
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success(), "loadgen bench: {status}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let setups = results["setups"].as_array().unwrap();
    assert_eq!(setups.len(), 6, "{results:#}");
    for setup in setups {
        let (name, variant) = (
            setup["setup"].as_str().unwrap(),
            setup["variant"].as_str().unwrap(),
        );
        let what = format!("{name} {variant}");
        let steps = setup["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 1, "{what}");
        let step = &steps[0];
        assert!(step["succeeded"].as_u64().unwrap() > 0, "{what}: {step:#}");
        assert_eq!(step["failed"], 0, "{what}: {step:#}");
        let used = &step["collateral"];
        assert_eq!(used["collateral_cache"], false, "{what}: {used:#}");
        assert_eq!(used["fetches_per_join"], 0.0, "{what}: {used:#}");
        let since_start = &setup["collateral_since_start"];
        match variant {
            "gcp-sev-es" => {
                assert_eq!(
                    used["gce"]["ok"].as_u64(),
                    step["succeeded"].as_u64().map(|n| 2 * n),
                    "{what}: {step:#}"
                );
                assert_eq!(used["gce"]["failed"], 0, "{what}: {used:#}");
                assert_eq!(used["cloud_lookups_per_join"], 2.0, "{what}: {used:#}");
                assert!(used["ec2"].is_null(), "{what}: {used:#}");
            }
            "azure-trustedlaunch" => {
                assert!(used["gce"].is_null() && used["ec2"].is_null(), "{what}");
                assert_eq!(used["cloud_lookups_per_join"], 0.0, "{what}: {used:#}");
            }
            "aws-nitro-tpm" => {
                assert_eq!(used["ec2"]["ok"], 0, "{what}: {used:#}");
                assert_eq!(used["ec2"]["failed"], 0, "{what}: {used:#}");
                assert_eq!(used["cloud_lookups_per_join"], 0.0, "{what}: {used:#}");
                assert!(
                    used["ec2"]["hits"].as_u64().unwrap() > 0,
                    "{what}: {used:#}"
                );
                // The one image was asked about once, in the warm-up.
                assert_eq!(since_start["ec2"]["ok"], 1, "{what}: {since_start:#}");
            }
            other => panic!("unexpected variant {other}"),
        }
    }
}
