//! From a node to a policy, end to end through the built binaries: `join-client attest` saves a
//! node's document, `attest-tool policy --document` derives the attestation config from it,
//! `attest-tool verify` accepts it, and attest-proxy, given that config, lets the node join and
//! refuses another machine. The same from a control-plane node: the derived service policy lets
//! a node join the attested service, and join-client refuses the service under a policy derived
//! from another machine.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use testsupport::harness::{self, Options, System};
use testsupport::process::bin;
use testsupport::swtpm::Swtpm;

fn run(name: &str, args: &[&str]) -> Output {
    Command::new(bin(name).unwrap())
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `join-client attest` on the TPM at `tcti`, saved to `dir/<name>`.
fn attest(dir: &Path, name: &str, tcti: &str) -> String {
    let out = dir.join(name).to_str().unwrap().to_owned();
    ok(&run(
        "join-client",
        &[
            "attest",
            "--variant",
            "qemu-vtpm",
            "--tcti",
            tcti,
            "--out",
            &out,
        ],
    ));
    out
}

/// `attest-tool policy --document` with `extra`, written to `<document>.policy`; and stderr.
fn derive(document: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["policy", "--document", document];
    args.extend_from_slice(extra);
    let out = run("attest-tool", &args);
    let policy = format!("{document}.policy");
    std::fs::write(&policy, ok(&out)).unwrap();
    (policy, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn verify(policy: &str, document: &str) -> Output {
    run("attest-tool", &["verify", "--config", policy, document])
}

/// `join-client join` through `system` with the TPM at `tcti` and `extra` flags.
fn join(system: &System, dir: &Path, node: &str, tcti: &str, extra: &[&str]) -> Output {
    let endpoint = system.proxy_addr.to_string();
    let out = dir.join(format!("{node}-ticket"));
    let mut args = vec![
        "join",
        "--endpoint",
        &endpoint,
        "--tcti",
        tcti,
        "--disk-uuid",
        "8c1f6b1e-4f0a-4d7e-9a55-2b3c4d5e6f70",
        "--out",
        out.to_str().unwrap(),
        "--node-name",
        node,
        "--retry-for",
        "0s",
    ];
    args.extend_from_slice(extra);
    run("join-client", &args)
}

/// Projects `policy` as attest-proxy's attestation config and waits until it is in force.
async fn apply(system: &System, policy: &str) {
    let contents = std::fs::read(policy).unwrap();
    let digest = attestation::QemuVtpmConfig::from_attestation_config(&contents)
        .unwrap()
        .digest();
    let dir = system.paths.attestation_config.parent().unwrap();
    harness::project_config_map(dir, &[("attestationConfig", &contents)]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !system
        .proxy
        .log()
        .lines()
        .any(|l| l.contains("measurement policy") && l.contains(&format!(" policy={digest}")))
    {
        assert!(
            Instant::now() < deadline,
            "the derived policy {digest} was not loaded\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Another machine booted like the node: the same boot measurements, its own TPM and key.
fn other_machine() -> Swtpm {
    let tpm = Swtpm::start().unwrap();
    for (index, byte) in harness::BOOT_MEASUREMENTS {
        tpm.extend_pcr(index, &[byte; 32]).unwrap();
    }
    tpm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_derived_from_a_nodes_document_admits_it_and_refuses_another_machine() {
    let system = System::start(Options::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tcti = system.swtpm.tcti();

    let document = attest(dir.path(), "node.json", &tcti);
    let (policy, stderr) = derive(&document, &[]);
    println!(
        "derived policy:\n{}",
        std::fs::read_to_string(&policy).unwrap()
    );
    println!("{stderr}");
    let verified = ok(&verify(&policy, &document));
    assert!(verified.starts_with("ACCEPTED: qemu-vtpm"), "{verified}");

    apply(&system, &policy).await;
    let joined = ok(&join(&system, dir.path(), "worker-1", &tcti, &[]));
    assert!(joined.contains("joined: node worker-1"), "{joined}");

    let other = other_machine();
    let other_document = attest(dir.path(), "other.json", &other.tcti());
    let refused = verify(&policy, &other_document);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("attestation key"),
        "{}",
        String::from_utf8_lossy(&refused.stdout)
    );
    let refused = join(&system, dir.path(), "worker-2", &other.tcti(), &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("attestation key"), "{stderr}");
    assert!(
        system.proxy.log().contains("attestation key"),
        "{}",
        system.proxy.log()
    );

    // A policy tightened to another image refuses the node itself.
    let mut tightened: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&policy).unwrap()).unwrap();
    tightened["measurements"]["4"]["expected"] = "00".repeat(32).into();
    let tightened_path = dir.path().join("tightened.json");
    std::fs::write(&tightened_path, tightened.to_string()).unwrap();
    let tightened_path = tightened_path.to_str().unwrap();
    assert_eq!(verify(tightened_path, &document).status.code(), Some(1));
    apply(&system, tightened_path).await;
    let refused = join(&system, dir.path(), "worker-1", &tcti, &[]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("measurement 4"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_policy_derived_from_the_control_plane_node_verifies_the_service() {
    let mut system = System::start(Options {
        certifier: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();

    // The control-plane node's TPM serves one client at a time: the certifier steps aside
    // while the operator saves its document.
    let (certifier, control_plane) = system.certifier.as_mut().unwrap();
    certifier.terminate(Duration::from_secs(10)).unwrap();
    let document = attest(dir.path(), "control-plane.json", &control_plane.tcti());
    certifier.restart().unwrap();
    certifier
        .wait_for_socket(&system.paths.certifier_socket)
        .unwrap();

    let (policy, stderr) = derive(&document, &["--service-policy"]);
    assert!(
        stderr.contains("--service-policy FILE --service-variant qemu-vtpm"),
        "{stderr}"
    );
    ok(&verify(&policy, &document));
    let tcti = system.swtpm.tcti();
    let flags = ["--service-policy", policy.as_str()];
    let joined = ok(&join(&system, dir.path(), "worker-1", &tcti, &flags));
    assert!(joined.contains("joined: node worker-1"), "{joined}");

    // A service policy derived from another machine's document refuses this service.
    let other = other_machine();
    let other_document = attest(dir.path(), "other.json", &other.tcti());
    let (other_policy, _) = derive(&other_document, &["--service-policy"]);
    let flags = ["--service-policy", other_policy.as_str()];
    let refused = join(&system, dir.path(), "worker-2", &tcti, &flags);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("attestation key"), "{stderr}");
}
