//! `local-cluster --variant aws-nitro-tpm`: the demo node (the swtpm as its NitroTPM, its
//! identity document from the EC2 stand-in's IMDSv2) joins and rejoins, and the `join-client
//! --variant aws-nitro-tpm` command line it prints joins a second node through the real
//! join-client binary, which reads IMDS itself.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use testsupport::process::{Process, bin};

const HEADING: &str = "an aws-nitro-tpm node";

/// A `local-cluster` stopped with SIGTERM when dropped, its kept files removed.
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

fn line_after(log: &str, heading: &str) -> Option<String> {
    let mut lines = log.lines();
    lines.find(|l| l.starts_with(heading))?;
    lines.next().map(|l| l.trim().to_owned())
}

#[test]
fn the_demo_node_and_the_printed_join_client_command_join_as_aws_nitro_tpm() {
    let logs = tempfile::tempdir().unwrap();
    let log_file = logs.path().join("local-cluster.log");
    let process = Process::spawn(
        "local-cluster",
        Command::new(bin("local-cluster").unwrap())
            .env("RUST_LOG", "info")
            .args(["--variant", "aws-nitro-tpm", "--serve"]),
        logs.path(),
    )
    .unwrap();
    let mut cluster = Cluster {
        process,
        _logs: logs,
    };
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
        log.contains("attested with swtpm as a NitroTPM, aws-nitro-tpm"),
        "{log}"
    );
    assert!(log.contains("node worker-local rejoined"), "{log}");

    let command = line_after(&log, HEADING).unwrap();
    let mut words = command.split_whitespace();
    let program = words.next().unwrap();
    assert!(program.ends_with("/join-client"), "{command}");
    let args: Vec<&str> = words.collect();
    let joined = Command::new(program)
        .args(&args)
        .args(["--retry-for", "0s"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&joined.stderr);
    assert!(joined.status.success(), "{command}\n{stderr}\n{log}");
    let out = PathBuf::from(args[args.iter().position(|a| *a == "--out").unwrap() + 1]);
    assert!(
        std::fs::read_dir(&out).is_ok_and(|mut entries| entries.next().is_some()),
        "{command}\n{stderr}"
    );
    cluster.process.check_running().unwrap();
}
