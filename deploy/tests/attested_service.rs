//! deploy/examples/attested-service: the overlay that adds the certifier. Only the certifier
//! reaches the TPM device; attest-proxy keeps no device, no host path and no privilege, and the
//! two ends of the certifier's socket agree on path and uids.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;
use serde_json::Value;

fn overlay_dir() -> PathBuf {
    deploy_dir().join("examples/attested-service")
}

fn spec() -> Value {
    merged_pod_spec(&overlay_dir().join("certifier.yaml"))
}

fn overlay_container(name: &str) -> Value {
    array(&spec()["containers"])
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The volumes that give a container something of the host (hostPath), by name.
fn host_volumes(spec: &Value) -> BTreeSet<String> {
    array(&spec["volumes"])
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| v["name"].as_str().expect("name").to_owned())
        .collect()
}

#[test]
fn the_overlay_builds_on_the_base_and_patches_the_daemonset() {
    let k = &read_docs(&overlay_dir().join("kustomization.yaml"))[0];
    assert_eq!(
        str_set(k["resources"].as_array().expect("resources")),
        names(&["../.."])
    );
    let patches = array(&k["patches"]);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["path"], "certifier.yaml");
    assert_eq!(
        patches[0]["target"]["name"],
        daemonset()["metadata"]["name"]
    );
}

#[test]
fn only_the_certifier_reaches_the_tpm() {
    let spec = spec();
    let tpm = array(&spec["volumes"])
        .into_iter()
        .find(|v| v["name"] == "tpm")
        .expect("the tpm volume");
    assert_eq!(tpm["hostPath"]["path"], "/dev/tpmrm0");
    assert_eq!(tpm["hostPath"]["type"], "CharDevice");
    for c in array(&spec["containers"]) {
        let name = c["name"].as_str().expect("name");
        let mounts: BTreeSet<String> = array(&c["volumeMounts"])
            .iter()
            .map(|m| m["name"].as_str().expect("name").to_owned())
            .collect();
        let host: Vec<&String> = mounts
            .iter()
            .filter(|m| host_volumes(&spec).contains(*m))
            .collect();
        if name == "certifier" {
            assert_eq!(
                mounts,
                names(&["certifier-socket", "tpm"]),
                "the certifier mounts its socket directory and the device, nothing else"
            );
        } else {
            assert!(!mounts.contains("tpm"), "{name} mounts the TPM device");
            // token-issuer reads kubeadm's PKI files from the host; no one else has a host path.
            if name != "token-issuer" {
                assert!(host.is_empty(), "{name} mounts host paths {host:?}");
            }
        }
        assert!(
            c.get("devices").is_none() && c["securityContext"]["privileged"] != Value::Bool(true),
            "{name} gets devices or privilege"
        );
    }
}

#[test]
fn the_certifier_is_locked_down_and_holds_no_credential() {
    let spec = spec();
    let containers = array(&spec["containers"]);
    assert_eq!(
        str_set(containers.iter().map(|c| &c["name"])),
        names(&["attest-proxy", "join-core", "token-issuer", "certifier"])
    );
    for c in &containers {
        assert_locked_down(c);
    }
    let uids: BTreeSet<u64> = containers.iter().map(run_as_user).collect();
    assert_eq!(uids.len(), 4, "each container has its own uid");
    let c = overlay_container("certifier");
    assert_eq!(run_as_user(&c), 10005);
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    assert!(c.get("env").is_none() && c.get("envFrom").is_none());
    assert!(c.get("ports").is_none(), "the certifier listens on no port");
}

#[test]
fn the_socket_ends_agree_on_path_and_peer_uid() {
    let proxy = overlay_container("attest-proxy");
    let certifier = overlay_container("certifier");
    assert_eq!(
        required_flag(&proxy, "certifier-uid"),
        run_as_user(&certifier).to_string()
    );
    assert_eq!(
        required_flag(&certifier, "peer-uid"),
        run_as_user(&proxy).to_string()
    );
    let socket = required_flag(&certifier, "socket");
    assert_eq!(required_flag(&proxy, "certifier-socket"), socket);
    assert_eq!(
        required_flag(&proxy, "variant"),
        required_flag(&certifier, "variant")
    );
    let dir = socket.rsplit_once('/').expect("a directory").0;
    let mount = |c: &Value| {
        array(&c["volumeMounts"])
            .into_iter()
            .find(|m| m["name"] == "certifier-socket")
            .unwrap_or_else(|| panic!("{} lacks the socket mount", c["name"]))
    };
    assert_eq!(mount(&certifier)["mountPath"], dir);
    assert_ne!(mount(&certifier)["readOnly"], Value::Bool(true));
    assert_eq!(mount(&proxy)["mountPath"], dir);
    assert_eq!(mount(&proxy)["readOnly"], Value::Bool(true));
    for other in ["join-core", "token-issuer"] {
        assert!(
            array(&overlay_container(other)["volumeMounts"])
                .iter()
                .all(|m| m["name"] != "certifier-socket"),
            "{other} mounts the certifier's socket"
        );
    }
    // attest-proxy keeps everything else the base gives it.
    for a in args(&container("attest-proxy")) {
        assert!(args(&proxy).contains(&a), "the overlay drops {a}");
    }
}

#[test]
fn every_argument_is_a_flag_the_binary_accepts() {
    assert_args_parse(&array(&spec()["containers"]));
}
