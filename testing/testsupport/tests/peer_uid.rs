//! join-core's and token-issuer's sockets serve one peer uid each; a process running as any
//! other uid is dropped, even when file permissions would let it connect.
//!
//! The probe runs as a real process under another uid: this test binary re-runs a copy of itself
//! as `nobody`, which takes root, so the test is `#[ignore]`d and `scripts/test.sh` runs it (with
//! every other `as_root_` test) when it runs as root, as CI does. The copy lives in a directory
//! `nobody` can reach: the checkout may sit under one only root can traverse.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testsupport::harness::{Options, System, own_uid};

const PROBE_SOCKET: &str = "PEER_UID_PROBE_SOCKET";
const NOBODY: u32 = 65534;

/// Not a test of its own: the body the real test runs as another uid. Connects, speaks the
/// HTTP/2 preface, and reports whether the server answered or hung up.
#[test]
fn probe() {
    let Ok(path) = std::env::var(PROBE_SOCKET) else {
        return;
    };
    let outcome = (|| {
        let mut stream = std::os::unix::net::UnixStream::connect(&path)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0");
        let mut buf = [0u8; 64];
        Ok::<_, std::io::Error>(match stream.read(&mut buf)? {
            0 => "closed".to_owned(),
            _ => "answered".to_owned(),
        })
    })();
    let outcome = outcome.unwrap_or_else(|e| match e.kind() {
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => "closed".to_owned(),
        _ => format!("error {e}"),
    });
    println!("PROBE-RESULT {outcome}");
}

/// This test binary, copied into a fresh directory every uid can traverse.
fn reachable_copy_of_this_binary() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("peer-uid-probe")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("probe");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, copy)
}

fn run_probe(probe: &Path, socket: &Path, uid: Option<u32>) -> String {
    let mut command = Command::new(probe);
    command
        .args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env(PROBE_SOCKET, socket);
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("PROBE-RESULT ").map(|(_, result)| result))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            panic!(
                "probe printed no result: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to run a probe as another uid; scripts/test.sh runs it as root"]
async fn as_root_sockets_refuse_processes_of_other_uids() {
    assert_eq!(own_uid().unwrap(), 0, "run as root: scripts/test.sh does");
    let (_probe_dir, probe) = reachable_copy_of_this_binary();
    let system = System::start(Options::default()).await.unwrap();
    // Open the file permissions wide, so the peer-credential check is the only fence left.
    for dir in [
        system.paths.root.as_path(),
        system.paths.join_core_socket.parent().unwrap(),
    ] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // As root the harness runs the services as the pod's uids: each socket serves its peer's.
    assert!(system.uids.distinct(), "{:?}", system.uids);
    for (socket, peer) in [
        (&system.paths.join_core_socket, system.uids.proxy),
        (&system.paths.token_issuer_socket, system.uids.join_core),
    ] {
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            run_probe(&probe, socket, Some(peer)),
            "answered",
            "the allowed uid is served on {}",
            socket.display()
        );
        assert_eq!(
            run_probe(&probe, socket, Some(NOBODY)),
            "closed",
            "uid {NOBODY} must be dropped by {}",
            socket.display()
        );
    }
    for process in [&system.join_core, &system.token_issuer] {
        let log = process.log();
        assert!(
            log.contains(&format!("peer uid {NOBODY}")),
            "{} logs the refused uid:\n{log}",
            process.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to run a probe as another uid; scripts/test.sh runs it as root"]
async fn as_root_attest_proxy_uid_is_refused_at_token_issuers_socket() {
    assert_eq!(own_uid().unwrap(), 0, "run as root: scripts/test.sh does");
    let (_probe_dir, probe) = reachable_copy_of_this_binary();
    let system = System::start(Options::default()).await.unwrap();
    let socket = &system.paths.token_issuer_socket;
    // In the pod attest-proxy cannot even reach this socket; with the file opened to everyone,
    // token-issuer's peer check still keeps it out: only join-core may ask for credentials.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        run_probe(&probe, socket, Some(system.uids.proxy)),
        "closed",
        "attest-proxy's uid {} must be dropped by token-issuer",
        system.uids.proxy
    );
    assert_eq!(
        run_probe(&probe, socket, Some(system.uids.join_core)),
        "answered"
    );
    let log = system.token_issuer.log();
    assert!(
        log.contains(&format!("peer uid {}", system.uids.proxy)),
        "token-issuer logs the refused uid:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to run a probe as another uid; scripts/test.sh runs it as root"]
async fn as_root_only_attest_proxys_uid_reaches_the_certifier() {
    assert_eq!(own_uid().unwrap(), 0, "run as root: scripts/test.sh does");
    let (_probe_dir, probe) = reachable_copy_of_this_binary();
    let system = System::start(Options {
        certifier: true,
        ..Options::default()
    })
    .await
    .unwrap();
    assert!(system.uids.distinct(), "{:?}", system.uids);
    // Whoever can ask the certifier can have a key of its choice certified as the service's;
    // with the file opened to everyone, its peer check is the fence that keeps them out.
    let socket = &system.paths.certifier_socket;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        run_probe(&probe, socket, Some(system.uids.proxy)),
        "answered",
        "attest-proxy's uid is served"
    );
    for uid in [system.uids.join_core, system.uids.token_issuer, NOBODY] {
        assert_eq!(
            run_probe(&probe, socket, Some(uid)),
            "closed",
            "uid {uid} must be dropped by the certifier"
        );
    }
    let (certifier, _) = system.certifier.as_ref().unwrap();
    let log = certifier.log();
    assert!(
        log.contains(&format!("peer uid {NOBODY}")),
        "the certifier logs the refused uid:\n{log}"
    );
}
