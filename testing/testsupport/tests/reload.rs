//! Policy hot reload and the audit line, end to end: a node joins over and over through the
//! real processes while the attestation config is swapped the way the kubelet swaps a ConfigMap
//! volume. No join may fail because of a swap, each change must apply to the next handshake, a
//! broken file must leave the previous policy in force, and every decision must be explained by
//! exactly one audit line in attest-proxy's log.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use node_client::ClientError;
use serde_json::Value;
use testsupport::harness::{self, Options, System};
use tokio::sync::Mutex;

const CONFIG_FILE: &str = "attestationConfig";

fn join_request(node_name: &str) -> proto::join::IssueJoinTicketRequest {
    harness::join_request(node_name, "6a2e4c1d-8b3f-4e5a-9c7d-1f0e2d3c4b5a").unwrap()
}

fn digest(config: &str) -> String {
    attestation::QemuVtpmConfig::from_attestation_config(config.as_bytes())
        .unwrap()
        .digest()
}

fn project(system: &System, contents: &str) -> Instant {
    let dir = system.paths.attestation_config.parent().unwrap();
    harness::project_config_map(dir, &[(CONFIG_FILE, contents.as_bytes())]).unwrap();
    Instant::now()
}

/// Every audit line attest-proxy wrote so far, parsed, in order.
fn audit_lines(system: &System) -> Vec<Value> {
    system
        .proxy
        .log()
        .lines()
        .filter_map(attestation::audit_trail::record_in_line)
        .filter(|record| record.get("chain_start").is_none())
        .collect()
}

/// Waits until a line of attest-proxy's log contains every one of `needles`.
async fn wait_for_log(system: &System, needles: &[&str]) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if system
            .proxy
            .log()
            .lines()
            .any(|line| needles.iter().all(|n| line.contains(n)))
        {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {needles:?}\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One join: when it started and ended, and how it went.
#[derive(Debug)]
struct Join {
    started: Instant,
    ended: Instant,
    result: Result<(), String>,
}

/// Joins one after another (swtpm serves one client at a time), each over a new connection and
/// so a new handshake, until told to stop.
fn join_continuously(
    system: &Arc<System>,
    stop: Arc<AtomicBool>,
    joins: Arc<Mutex<Vec<Join>>>,
) -> tokio::task::JoinHandle<()> {
    let system = system.clone();
    tokio::spawn(async move {
        let issuer = system.issuer().unwrap();
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let started = Instant::now();
            let client = system.client(issuer.clone()).unwrap();
            let result = client
                .join(join_request(&format!("worker-{n}")))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            joins.lock().await.push(Join {
                started,
                ended: Instant::now(),
                result,
            });
        }
    })
}

async fn wait_for_joins(joins: &Mutex<Vec<Join>>, after: Instant, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while joins
        .lock()
        .await
        .iter()
        .filter(|j| j.started > after)
        .count()
        < count
    {
        assert!(Instant::now() < deadline, "joins stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_reloads_under_continuous_joins() {
    let system = Arc::new(System::start(Options::default()).await.unwrap());

    // The policies in turn: the harness's own (same bytes as the file it wrote), one with a
    // warn-only mismatch on PCR 16, another with one on PCR 23, a broken file, and finally one
    // enforcing a PCR 16 value the node does not have.
    let p0 = system.attestation_config(&[]);
    let p1 = system.attestation_config(&[(16, [0xaa; 32], true)]);
    let p2 = system.attestation_config(&[(23, [0xcc; 32], true)]);
    let broken = r#"{"measurements": {"4": {"expected": "not hex", "warnOnly": false}}}"#;
    let p3 = system.attestation_config(&[(16, [0xaa; 32], false), (23, [0xcc; 32], true)]);
    let (d0, d1, d2, d3) = (digest(&p0), digest(&p1), digest(&p2), digest(&p3));

    // The plain file becomes the kubelet's symlink layout: removed and created, same policy.
    project(&system, &p0);

    let stop = Arc::new(AtomicBool::new(false));
    let joins = Arc::new(Mutex::new(Vec::new()));
    let joiner = join_continuously(&system, stop.clone(), joins.clone());
    let start = Instant::now();
    wait_for_joins(&joins, start, 2).await;

    // (digest in force, from when it was seen in force, until the next file was written)
    let mut phases = Vec::new();
    let mut in_force = (d0.clone(), start);
    for (contents, expect) in [(&p1, &d1), (&p2, &d2)] {
        let written = project(&system, contents);
        phases.push((in_force.0.clone(), in_force.1, written));
        let seen = wait_for_log(&system, &["measurement policy reloaded", expect]).await;
        in_force = (expect.clone(), seen);
        wait_for_joins(&joins, seen, 2).await;
    }
    let written = project(&system, broken);
    phases.push((in_force.0.clone(), in_force.1, written));
    let seen = wait_for_log(&system, &["measurement policy file refused", &d2]).await;
    wait_for_joins(&joins, seen, 3).await;
    stop.store(true, Ordering::SeqCst);
    joiner.await.unwrap();
    // The broken file never took effect: d2 stays in force to the end.
    phases.push((d2.clone(), seen, Instant::now()));

    let joins = joins.lock().await;
    let failed: Vec<_> = joins.iter().filter(|j| j.result.is_err()).collect();
    assert!(
        failed.is_empty(),
        "joins failed during reloads: {failed:?}\n{}",
        system.logs()
    );

    // One audit line per join, in join order (joins are sequential, one handshake each).
    let audit = audit_lines(&system);
    assert_eq!(audit.len(), joins.len(), "{audit:#?}");
    let mut judged_in_phase = vec![0; phases.len()];
    for (join, line) in joins.iter().zip(&audit) {
        assert_eq!(line["result"], "accepted", "{line}");
        assert_eq!(line["variant"], "qemu-vtpm");
        assert!(line["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
        assert_eq!(line["evidence"]["kind"], "certificate");
        assert_eq!(line["evidence"]["sha256"].as_str().unwrap().len(), 64);
        // A join that began after a policy was seen in force, and ended before the next file
        // was written, was judged by exactly that policy.
        for (phase, (policy, from, until)) in phases.iter().enumerate() {
            if join.started > *from && join.ended < *until {
                assert_eq!(line["policy"], policy.as_str(), "{line}");
                judged_in_phase[phase] += 1;
            }
        }
        // Warn-only mismatches let the node in and are named in the line.
        let measurements = line["measurements"].as_array().unwrap();
        let policy = line["policy"].as_str().unwrap();
        if policy == d1 || policy == d2 {
            let (index, expected) = if policy == d1 { (16, "aa") } else { (23, "cc") };
            assert_eq!(measurements.len(), 1, "{line}");
            let m = &measurements[0];
            assert_eq!(m["index"], index);
            assert_eq!(m["enforcement"], "warn_only");
            assert_eq!(m["expected"], expected.repeat(32));
            assert_ne!(m["actual"], m["expected"]);
        } else {
            assert_eq!(policy, d0, "{line}");
            assert!(measurements.is_empty(), "{line}");
        }
    }
    // Sequential joins, and at least two started after each change was seen: the first of them
    // ended before the next file was written.
    assert!(
        judged_in_phase.iter().all(|&n| n > 0),
        "a phase had no join wholly inside it: {judged_in_phase:?}"
    );
    for d in [&d0, &d1, &d2] {
        assert!(
            audit.iter().any(|l| l["policy"] == d.as_str()),
            "no join was judged by policy {d}"
        );
    }
    let before_enforcing = audit.len();
    drop(joins);

    // An enforced mismatch refuses the next node; the audit line says why, down to the PCR, and
    // still lists the warn-only mismatch.
    project(&system, &p3);
    wait_for_log(&system, &["measurement policy reloaded", &d3]).await;
    let issuer = system.issuer().unwrap();
    let refused = match system
        .client(issuer)
        .unwrap()
        .join(join_request("worker-refused"))
        .await
    {
        Err(ClientError::Status(status)) => status,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("measurement 16"), "{refused:?}");
    let audit = audit_lines(&system);
    assert_eq!(audit.len(), before_enforcing + 1, "{audit:#?}");
    let line = audit.last().unwrap();
    assert_eq!(line["result"], "rejected");
    assert_eq!(line["check"], "measurements");
    assert_eq!(line["policy"], d3.as_str());
    assert!(
        line["reason"]
            .as_str()
            .unwrap()
            .contains("measurements do not match the policy"),
        "{line}"
    );
    let measurements = line["measurements"].as_array().unwrap();
    assert_eq!(measurements.len(), 2, "{line}");
    assert_eq!(measurements[0]["index"], 16);
    assert_eq!(measurements[0]["enforcement"], "enforced");
    assert_eq!(measurements[0]["expected"], "aa".repeat(32));
    assert_eq!(measurements[0]["actual"].as_str().unwrap().len(), 64);
    assert_eq!(measurements[1]["index"], 23);
    assert_eq!(measurements[1]["enforcement"], "warn_only");
    assert!(
        !system.join_core.log().contains("worker-refused"),
        "a refused node must not reach join-core"
    );
}
