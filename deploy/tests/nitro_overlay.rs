//! deploy/examples/aws-nitro-tpm: the overlay that adds ec2-identity, merged onto the base
//! DaemonSet as kustomize's strategic merge does, and held to the base's rules.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;
use serde_json::Value;

fn overlay_dir() -> PathBuf {
    deploy_dir().join("examples/aws-nitro-tpm")
}

fn pod_spec() -> Value {
    merged_pod_spec(&overlay_dir().join("ec2-identity.yaml"))
}

fn nitro_container(name: &str) -> Value {
    array(&pod_spec()["containers"])
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[test]
fn the_overlay_builds_on_the_base_and_pins_ec2_identity_to_the_base_image() {
    let k = &read_docs(&overlay_dir().join("kustomization.yaml"))[0];
    assert_eq!(
        str_set(k["resources"].as_array().expect("resources")),
        names(&["../../base", "egress.yaml"])
    );
    let patches = array(&k["patches"]);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["path"], "ec2-identity.yaml");
    assert_eq!(
        patches[0]["target"]["name"],
        daemonset()["metadata"]["name"]
    );
    assert_eq!(nitro_container("ec2-identity")["image"], "join-service");
    let pins = overlay_image_pins(&overlay_dir(), &overlay_dir().join("ec2-identity.yaml"));
    let base_pin = array(&kustomization()["images"])
        .into_iter()
        .find(|p| p["name"] == "join-service")
        .expect("the base pins join-service");
    assert_eq!(pins.len(), 1);
    assert_eq!(
        (&pins[0]["newName"], &pins[0]["digest"]),
        (&base_pin["newName"], &base_pin["digest"])
    );
}

#[test]
fn ec2_identity_is_locked_down_has_its_own_uid_and_no_kubernetes_credential() {
    let spec = pod_spec();
    let containers = array(&spec["containers"]);
    assert_eq!(
        str_set(containers.iter().map(|c| &c["name"])),
        names(&["attest-proxy", "join-core", "token-issuer", "ec2-identity"])
    );
    for c in &containers {
        assert_locked_down(c);
    }
    let uids: BTreeSet<u64> = containers.iter().map(run_as_user).collect();
    assert_eq!(uids.len(), 4, "each container has its own uid");
    let c = nitro_container("ec2-identity");
    assert_eq!(
        c["command"],
        serde_json::json!(["/usr/local/bin/ec2-identity"])
    );
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    assert_eq!(
        str_set(array(&c["volumeMounts"]).iter().map(|m| &m["name"])),
        names(&["ec2-identity-socket"]),
        "ec2-identity mounts its socket directory and nothing else"
    );
    assert!(c.get("env").is_none() && c.get("envFrom").is_none());
    let dockerfile =
        std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    assert!(dockerfile.contains("--bin ec2-identity"));
    assert!(dockerfile.contains("target/release/ec2-identity"));
}

#[test]
fn the_socket_ends_agree_on_path_and_peer_uid_and_every_argument_parses() {
    let proxy = nitro_container("attest-proxy");
    let ec2 = nitro_container("ec2-identity");
    assert_eq!(required_flag(&proxy, "variant"), "aws-nitro-tpm");
    assert_eq!(
        required_flag(&proxy, "ec2-identity-uid"),
        run_as_user(&ec2).to_string()
    );
    assert_eq!(
        required_flag(&ec2, "peer-uid"),
        run_as_user(&proxy).to_string()
    );
    let socket = required_flag(&ec2, "socket");
    assert_eq!(required_flag(&proxy, "ec2-identity-socket"), socket);
    let dir = socket.rsplit_once('/').expect("a directory").0;
    let mount = |c: &Value| {
        array(&c["volumeMounts"])
            .into_iter()
            .find(|m| m["name"] == "ec2-identity-socket")
            .unwrap_or_else(|| panic!("{} lacks the socket mount", c["name"]))
    };
    assert_eq!(mount(&ec2)["mountPath"], dir);
    assert_ne!(mount(&ec2)["readOnly"], Value::Bool(true));
    assert_eq!(mount(&proxy)["mountPath"], dir);
    assert_eq!(mount(&proxy)["readOnly"], Value::Bool(true));
    assert_args_parse(&array(&pod_spec()["containers"]));
}

#[test]
fn egress_reaches_imds_and_https_only() {
    let policy = &read_docs(&overlay_dir().join("egress.yaml"))[0];
    assert_eq!(policy["kind"], "NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Egress"]));
    let rules: BTreeSet<(String, u64)> = array(&policy["spec"]["egress"])
        .iter()
        .flat_map(|rule| {
            let cidrs: Vec<String> = array(&rule["to"])
                .iter()
                .map(|t| t["ipBlock"]["cidr"].as_str().expect("cidr").to_owned())
                .collect();
            let ports: Vec<u64> = array(&rule["ports"])
                .iter()
                .map(|p| p["port"].as_u64().expect("port"))
                .collect();
            cidrs
                .into_iter()
                .flat_map(move |c| ports.clone().into_iter().map(move |p| (c.clone(), p)))
        })
        .collect();
    assert_eq!(
        rules,
        [
            ("169.254.169.254/32".to_owned(), 80),
            ("0.0.0.0/0".to_owned(), 443)
        ]
        .into_iter()
        .collect()
    );
}
