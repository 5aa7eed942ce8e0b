//! The `local-cluster` binary: `--attested-service`, as `scripts/local-join.sh` runs it (the demo
//! node verifies the service before it joins, and the `join-client --service-policy` command line
//! it prints joins a second node through the real join-client binary, which verifies the service
//! too); `--variant aws-nitro-tpm` with its printed join-client command; and the processes it
//! starts ending with it, however it ends.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use testsupport::process::{Process, Signal, bin};

/// A `local-cluster` stopped with SIGTERM when dropped, its kept files removed.
struct Cluster {
    process: Process,
    _logs: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let dir = kept_dir(&self.process.log());
        if self.process.terminate(Duration::from_secs(15)).is_err() {
            self.process.kill();
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The directory local-cluster keeps its files and logs in (`--serve`), as its log names it.
fn kept_dir(log: &str) -> Option<PathBuf> {
    log.lines().find_map(|l| {
        let (_, dir) = l.split_once("(files and logs in ")?;
        Some(PathBuf::from(dir.trim_end_matches(')')))
    })
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

/// A process as `/proc/<pid>/stat` shows it.
#[derive(Clone, Debug)]
struct ProcStat {
    pid: u32,
    comm: String,
    state: char,
    parent: u32,
    /// Clock ticks after boot: with the pid, names the process even once the pid is reused.
    start_time: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        pid,
        comm,
        state: fields.first()?.chars().next()?,
        parent: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The processes whose parent is `parent`.
fn children(parent: u32) -> Vec<ProcStat> {
    let mut found: Vec<ProcStat> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(proc_stat)
        .filter(|p| p.parent == parent)
        .collect();
    found.sort_by(|a, b| a.comm.cmp(&b.comm));
    found
}

/// Whether `process` still runs: its pid names the same process, and not a zombie (one whose
/// new parent has not reaped it yet has ended all the same).
fn still_running(process: &ProcStat) -> bool {
    proc_stat(process.pid)
        .is_some_and(|now| now.start_time == process.start_time && now.state != 'Z')
}

/// The inodes of the TCP sockets listening on `port` (any address, IPv4 or IPv6), from
/// `/proc/net/tcp{,6}`: a socket's inode names it for as long as it is open.
fn listening_sockets(port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                inodes.extend(inode.parse::<u64>());
            }
        }
    }
    inodes
}

/// Starts `local-cluster --serve --no-demo` with `args`, waits until every service is up, checks
/// that it started `expected` (by process name), ends it with `signal`, and requires every
/// process it started to be gone within ten seconds and attest-proxy's listening sockets to be
/// closed.
///
/// As root, its services run as the pod's uids, each switched to before the parent-death signal
/// is set.
fn ends_with_everything_it_started(signal: Signal, args: &[&str], expected: &[&str]) {
    let logs = tempfile::tempdir().unwrap();
    let mut process = Process::spawn(
        "local-cluster",
        Command::new(bin("local-cluster").unwrap())
            .env("RUST_LOG", "info")
            .args(["--serve", "--no-demo"])
            .args(args),
        logs.path(),
    )
    .unwrap();
    let proxy: SocketAddr = process
        .wait_for_line("the system up", Duration::from_secs(120), |l| {
            l.strip_prefix("join service up: attest-proxy on ")?
                .split_once(' ')?
                .0
                .parse()
                .ok()
        })
        .unwrap();
    let admin: SocketAddr = process
        .wait_for_line(
            "attest-proxy's admin endpoint",
            Duration::from_secs(10),
            |l| {
                l.strip_prefix("attest-proxy admin endpoint on ")?
                    .parse()
                    .ok()
            },
        )
        .unwrap();
    let started = children(process.id());
    // The sockets themselves, not the port numbers: once they are closed, a test running beside
    // this one may bind the same ephemeral port.
    let listeners: Vec<(SocketAddr, Vec<u64>)> = [proxy, admin]
        .into_iter()
        .map(|addr| (addr, listening_sockets(addr.port())))
        .collect();
    for (addr, sockets) in &listeners {
        assert!(!sockets.is_empty(), "no listening socket found for {addr}");
    }
    let names: Vec<&str> = started.iter().map(|p| p.comm.as_str()).collect();
    for name in expected {
        assert!(names.contains(name), "no {name} among {names:?}");
    }
    let dir = kept_dir(&process.log());

    process.signal(signal).unwrap();
    process.wait_exit(Duration::from_secs(20)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<&ProcStat> = started.iter().filter(|p| still_running(p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running 10 s after local-cluster ended ({signal:?}): {left:?}\n{}",
            process.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (addr, sockets) in listeners {
        let still: Vec<u64> = listening_sockets(addr.port())
            .into_iter()
            .filter(|inode| sockets.contains(inode))
            .collect();
        assert!(
            still.is_empty(),
            "{addr}'s listening socket (inode {still:?}) still open after local-cluster ended ({signal:?})"
        );
    }
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// SIGKILL leaves local-cluster no chance to stop anything: its services, the certifier and
/// both swtpms end all the same.
#[test]
fn killed_it_leaves_none_of_its_processes_running() {
    ends_with_everything_it_started(
        Signal::Kill,
        &["--attested-service"],
        &[
            "swtpm",
            "keyservice",
            "token-issuer",
            "join-core",
            "attest-proxy",
            "certifier",
        ],
    );
}

/// The same for gcp-sev-snp, which also runs gce-identity (the process with the cloud
/// credential) and local-cluster's KDS and GCE stand-ins.
#[test]
fn killed_with_gcp_sev_snp_it_leaves_no_gce_identity_running() {
    let site = tempfile::tempdir().unwrap();
    ends_with_everything_it_started(
        Signal::Kill,
        &[
            "--variant",
            "gcp-sev-snp",
            "--snp-dir",
            site.path().to_str().unwrap(),
        ],
        &[
            "swtpm",
            "keyservice",
            "token-issuer",
            "join-core",
            "attest-proxy",
            "gce-identity",
        ],
    );
}

/// The same for aws-nitro-tpm, which also runs ec2-identity (the process with the AWS
/// credential) and local-cluster's EC2 stand-in.
#[test]
fn killed_with_aws_nitro_tpm_it_leaves_no_ec2_identity_running() {
    ends_with_everything_it_started(
        Signal::Kill,
        &["--variant", "aws-nitro-tpm"],
        &[
            "swtpm",
            "keyservice",
            "token-issuer",
            "join-core",
            "attest-proxy",
            "ec2-identity",
        ],
    );
}

/// SIGTERM: local-cluster stops its services itself.
#[test]
fn terminated_it_stops_every_process_it_started() {
    ends_with_everything_it_started(
        Signal::Term,
        &[],
        &[
            "swtpm",
            "keyservice",
            "token-issuer",
            "join-core",
            "attest-proxy",
        ],
    );
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

/// `local-cluster --variant azure-trustedlaunch`: the demo node, a swtpm on which Azure's Trusted
/// Launch setup is played, joins and rejoins through the real processes, attest-proxy trusting
/// the simulated Azure vTPM root the config written for it names.
#[test]
fn an_azure_trustedlaunch_cluster_joins_and_rejoins_its_demo_node() {
    let out = Command::new(bin("local-cluster").unwrap())
        .args(["--variant", "azure-trustedlaunch"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("simulated Azure vTPM CA: CA published at http://127.0.0.1:"),
        "{text}"
    );
    assert!(
        text.contains(
            "node worker-local joined (attested with swtpm as an Azure Trusted Launch vTPM, azure-trustedlaunch)"
        ),
        "{text}"
    );
    assert!(
        text.contains("node worker-local rejoined: same state disk key"),
        "{text}"
    );
}

/// `local-cluster --variant gcp-sev-es`: the demo node, a simulated GCE confidential VM whose key
/// the GCE stand-in vouches for, joins and rejoins through gce-identity and attest-proxy.
#[test]
fn a_gcp_sev_es_cluster_joins_its_demo_node() {
    let site = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut process = Process::spawn(
        "local-cluster",
        Command::new(bin("local-cluster").unwrap())
            .env("RUST_LOG", "info")
            .args(["--variant", "gcp-sev-es", "--gce-dir"])
            .arg(site.path()),
        logs.path(),
    )
    .unwrap();
    let status = process.wait_exit(Duration::from_secs(120)).unwrap();
    let log = process.log();
    assert!(status.success(), "{status:?}\n{log}");
    for needle in [
        "node worker-local joined (attested with simulated GCE confidential VM (AMD SEV), gcp-sev-es)",
        "node worker-local rejoined: same state disk key",
    ] {
        assert!(log.contains(needle), "{needle}:\n{log}");
    }
    let config = std::fs::read_to_string(site.path().join("attestationConfig")).unwrap();
    assert!(config.contains("allowedGcpProjects"), "{config}");
}

/// `--variant aws-nitro-tpm`: the demo node (the swtpm as its NitroTPM, its identity document
/// from the EC2 stand-in's IMDSv2) joins and rejoins, and the `join-client --variant
/// aws-nitro-tpm` command line it prints joins a second node through the real join-client
/// binary, which reads IMDS itself.
#[test]
fn the_demo_node_and_the_printed_join_client_command_join_as_aws_nitro_tpm() {
    const HEADING: &str = "an aws-nitro-tpm node";
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
