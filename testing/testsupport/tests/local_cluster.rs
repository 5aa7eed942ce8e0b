//! `local-cluster --attested-service`, as `scripts/local-join.sh` runs it: the demo node verifies
//! the service before it joins, and the `join-client --service-policy` command line it prints
//! joins a second node through the real join-client binary, which verifies the service too.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use testsupport::process::{Process, bin};

/// A `local-cluster` stopped with SIGTERM (SIGKILL would orphan its processes), its kept files
/// removed.
struct Cluster {
    process: Process,
    _logs: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let dir = self.process.log().lines().find_map(|l| {
            let (_, dir) = l.split_once("(files and logs in ")?;
            Some(PathBuf::from(dir.trim_end_matches(')')))
        });
        if self.process.terminate(Duration::from_secs(15)).is_err() {
            self.process.kill();
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The line after the one starting with `heading` in `log`, trimmed.
fn line_after(log: &str, heading: &str) -> Option<String> {
    let mut lines = log.lines();
    lines.find(|l| l.starts_with(heading))?;
    lines.next().map(|l| l.trim().to_owned())
}

#[test]
fn the_attested_service_is_verified_by_the_demo_node_and_by_the_printed_join_client_command() {
    const HEADING: &str = "a node that verifies the service before it joins";
    let logs = tempfile::tempdir().unwrap();
    let log_file = logs.path().join("local-cluster.log");
    let process = Process::spawn(
        "local-cluster",
        // Info: the harness waits for each service's "listening" line.
        Command::new(bin("local-cluster").unwrap())
            .env("RUST_LOG", "info")
            .args(["--attested-service", "--serve"]),
        logs.path(),
    )
    .unwrap();
    let mut cluster = Cluster {
        process,
        _logs: logs,
    };
    // It prints the command once the demo node has joined and rejoined.
    cluster
        .process
        .wait_until(
            "the join-client command line",
            Duration::from_secs(90),
            || {
                std::fs::read_to_string(&log_file)
                    .is_ok_and(|log| line_after(&log, HEADING).is_some_and(|l| !l.is_empty()))
            },
        )
        .unwrap();
    let log = cluster.process.log();
    assert!(
        log.contains("node worker-local verified the service first"),
        "{log}"
    );
    assert!(log.contains("node worker-local rejoined"), "{log}");

    let command = line_after(&log, HEADING).unwrap();
    let mut words = command.split_whitespace();
    let program = words.next().unwrap();
    assert!(program.ends_with("/join-client"), "{command}");
    let args: Vec<&str> = words.collect();
    let value = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert!(
        std::fs::metadata(value("--service-policy")).is_ok(),
        "{command}"
    );
    let out = PathBuf::from(value("--out"));

    let joined = Command::new(program)
        .args(&args)
        .args(["--retry-for", "0s"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&joined.stderr);
    assert!(joined.status.success(), "{command}\n{stderr}\n{log}");
    assert!(
        stderr.contains("verifying the join service at") && !stderr.contains("NOT VERIFIED"),
        "{stderr}"
    );
    // The second node's ticket, written where the command said.
    assert!(
        std::fs::read_dir(&out).is_ok_and(|mut entries| entries.next().is_some()),
        "{command}\n{stderr}"
    );

    // The same command with a service policy the service does not meet: refused, the record
    // calls the peer the service, and each cause is printed once.
    let mut policy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(value("--service-policy")).unwrap()).unwrap();
    for (_, m) in policy["measurements"].as_object_mut().unwrap().iter_mut() {
        m["expected"] = "00".repeat(32).into();
    }
    let other_policy = out.with_file_name("other-service-policy.json");
    std::fs::write(&other_policy, policy.to_string()).unwrap();
    let other_args: Vec<&str> = args
        .iter()
        .map(|a| {
            if *a == value("--service-policy") {
                other_policy.to_str().unwrap()
            } else {
                a
            }
        })
        .collect();
    let refused = Command::new(program)
        .args(&other_args)
        .args(["--retry-for", "0s"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("REJECTED by check measurements: qemu-vtpm service 127.0.0.1:"),
        "{stderr}"
    );
    let reason = stderr
        .lines()
        .find_map(|l| l.strip_prefix("  reason:   "))
        .unwrap_or_else(|| panic!("no reason line:\n{stderr}"));
    assert_eq!(stderr.matches(reason).count(), 1, "{stderr}");
    cluster.process.check_running().unwrap();
}

/// `local-cluster --variant aws-sev-snp --kds-url URL --kds-ca-file CA` (as `scripts/local-join.sh`
/// passes them on): attest-proxy fetches AMD's CRLs and chains from that collateral service, a
/// KDS stand-in of the test's own here, instead of local-cluster's stand-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_snp_cluster_fetches_from_the_kds_its_flags_name() {
    let kds = kds_standin::KdsStandin::start().await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let ca = logs.path().join("own-kds-ca.pem");
    std::fs::write(&ca, kds.ca_pem()).unwrap();
    let process = Process::spawn(
        "local-cluster",
        Command::new(bin("local-cluster").unwrap())
            .env("RUST_LOG", "info")
            .args(["--variant", "aws-sev-snp", "--no-demo", "--serve"])
            .args(["--kds-url", kds.url(), "--kds-ca-file"])
            .arg(&ca),
        logs.path(),
    )
    .unwrap();
    let cluster = Cluster {
        process,
        _logs: logs,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let wanted = [
        "/vcek/v1/Milan/crl",
        "/vlek/v1/Milan/crl",
        "/vcek/v1/Milan/cert_chain",
        "/vlek/v1/Milan/cert_chain",
    ];
    while !wanted.iter().all(|w| kds.paths().iter().any(|p| p == w)) {
        assert!(
            std::time::Instant::now() < deadline,
            "asked for {:?}\n{}",
            kds.paths(),
            cluster.process.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = cluster.process.log();
    assert!(
        log.contains(&format!("fetches collateral from {}", kds.url())),
        "{log}"
    );
}
