//! deploy/examples/gcp-sev-snp: the overlay that adds gce-identity. The patch is merged onto the
//! base DaemonSet as kustomize's strategic merge does (containers and volumes by name, `args`
//! replaced, `volumeMounts` appended), and the result is held to the base's rules.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;
use serde_json::Value;

fn overlay_dir() -> PathBuf {
    deploy_dir().join("examples/gcp-sev-snp")
}

/// The pod spec `kubectl apply -k deploy/examples/gcp-sev-snp` runs.
fn gcp_pod_spec() -> Value {
    merged_pod_spec(&overlay_dir().join("gce-identity.yaml"))
}

fn gcp_container(name: &str) -> Value {
    array(&gcp_pod_spec()["containers"])
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[test]
fn the_overlay_builds_on_the_base_and_patches_the_daemonset() {
    let docs = read_docs(&overlay_dir().join("kustomization.yaml"));
    let k = &docs[0];
    assert_eq!(
        str_set(k["resources"].as_array().expect("resources")),
        names(&["../../base", "egress.yaml", "metrics-ingress.yaml"])
    );
    let patches = array(&k["patches"]);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["path"], "gce-identity.yaml");
    assert_eq!(patches[0]["target"]["kind"], "DaemonSet");
    assert_eq!(
        patches[0]["target"]["name"],
        daemonset()["metadata"]["name"]
    );
    let patch = &read_docs(&overlay_dir().join("gce-identity.yaml"))[0];
    assert_eq!(patch["metadata"]["name"], daemonset()["metadata"]["name"]);
    assert_eq!(patch["metadata"]["namespace"], "kube-system");
}

/// gce-identity runs the service image, and the base's `images:` does not reach a container the
/// overlay's patch adds: without the overlay's own pin it would pull `join-service` from Docker
/// Hub, unpinned.
#[test]
fn gce_identity_runs_the_base_image_pinned_by_the_overlay() {
    assert_eq!(gcp_container("gce-identity")["image"], "join-service");
    let pins = overlay_image_pins(&overlay_dir(), &overlay_dir().join("gce-identity.yaml"));
    let base = array(&kustomization()["images"]);
    assert_eq!(pins.len(), 1);
    let base_pin = base
        .iter()
        .find(|p| p["name"] == "join-service")
        .expect("the base pins join-service");
    assert_eq!(
        (&pins[0]["newName"], &pins[0]["digest"]),
        (&base_pin["newName"], &base_pin["digest"]),
        "gce-identity runs the same image as the base's containers"
    );
}

#[test]
fn gce_identity_is_locked_down_like_every_container() {
    let spec = gcp_pod_spec();
    let containers = array(&spec["containers"]);
    assert_eq!(
        str_set(containers.iter().map(|c| &c["name"])),
        names(&["attest-proxy", "join-core", "token-issuer", "gce-identity"])
    );
    for c in &containers {
        assert_locked_down(c);
    }
    let uids: BTreeSet<u64> = containers.iter().map(run_as_user).collect();
    assert_eq!(uids.len(), 4, "each container has its own uid");
    assert_eq!(run_as_user(&gcp_container("gce-identity")), 10004);
    let fs_group = spec["securityContext"]["fsGroup"]
        .as_u64()
        .expect("fsGroup");
    assert!(!uids.contains(&fs_group));
    let c = gcp_container("gce-identity");
    assert_eq!(
        c["command"],
        serde_json::json!(["/usr/local/bin/gce-identity"])
    );
    assert!(c["resources"]["limits"]["memory"].is_string());
    let dockerfile =
        std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    assert!(dockerfile.contains("--bin gce-identity"));
    assert!(dockerfile.contains("target/release/gce-identity"));
}

#[test]
fn gce_identity_gets_no_kubernetes_credential_and_no_secret() {
    let spec = gcp_pod_spec();
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    let c = gcp_container("gce-identity");
    let mounts = array(&c["volumeMounts"]);
    assert_eq!(
        str_set(mounts.iter().map(|m| &m["name"])),
        names(&["gce-identity-socket"]),
        "gce-identity mounts its socket directory and nothing else"
    );
    for m in &mounts {
        let path = m["mountPath"].as_str().expect("mountPath");
        assert!(!path.starts_with("/var/run/secrets"), "mounts {path}");
    }
    let socket = array(&spec["volumes"])
        .into_iter()
        .find(|v| v["name"] == "gce-identity-socket")
        .expect("the socket volume");
    assert_eq!(socket["emptyDir"]["medium"], "Memory");
    assert!(c.get("env").is_none() && c.get("envFrom").is_none());
}

#[test]
fn the_socket_ends_agree_on_path_and_peer_uid() {
    let proxy = gcp_container("attest-proxy");
    let gce = gcp_container("gce-identity");
    assert_eq!(required_flag(&proxy, "variant"), "gcp-sev-snp");
    assert_eq!(
        required_flag(&proxy, "gce-identity-uid"),
        run_as_user(&gce).to_string()
    );
    assert_eq!(
        required_flag(&gce, "peer-uid"),
        run_as_user(&proxy).to_string()
    );
    let socket = required_flag(&gce, "socket");
    assert_eq!(required_flag(&proxy, "gce-identity-socket"), socket);
    let dir = socket.rsplit_once('/').expect("a directory").0;
    let mount = |c: &Value| {
        array(&c["volumeMounts"])
            .into_iter()
            .find(|m| m["name"] == "gce-identity-socket")
            .unwrap_or_else(|| panic!("{} lacks the socket mount", c["name"]))
    };
    assert_eq!(mount(&gce)["mountPath"], dir);
    assert_ne!(
        mount(&gce)["readOnly"],
        Value::Bool(true),
        "the server binds there"
    );
    assert_eq!(mount(&proxy)["mountPath"], dir);
    assert_eq!(mount(&proxy)["readOnly"], Value::Bool(true));
    for other in ["join-core", "token-issuer"] {
        assert!(
            array(&gcp_container(other)["volumeMounts"])
                .iter()
                .all(|m| m["name"] != "gce-identity-socket"),
            "{other} mounts gce-identity's socket"
        );
    }
    // attest-proxy keeps everything else the base gives it.
    let base = container("attest-proxy");
    for a in args(&base) {
        if !a.starts_with("--variant=") {
            assert!(args(&proxy).contains(&a), "the overlay drops {a}");
        }
    }
}

#[test]
fn every_argument_is_a_flag_the_binary_accepts() {
    assert_args_parse(&array(&gcp_pod_spec()["containers"]));
}

#[test]
fn egress_reaches_the_metadata_server_and_https_only() {
    let docs = read_docs(&overlay_dir().join("egress.yaml"));
    assert_eq!(docs.len(), 1);
    let policy = &docs[0];
    assert_eq!(policy["kind"], "NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], "kube-system");
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Egress"]));
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["k8s-app"],
        pod_spec_labels()["k8s-app"]
    );
    let rules: BTreeSet<(String, u64)> = array(&policy["spec"]["egress"])
        .iter()
        .flat_map(|rule| {
            let cidrs: Vec<String> = array(&rule["to"])
                .iter()
                .map(|t| t["ipBlock"]["cidr"].as_str().expect("cidr").to_owned())
                .collect();
            let ports: Vec<u64> = array(&rule["ports"])
                .iter()
                .map(|p| {
                    assert_eq!(p["protocol"], "TCP");
                    p["port"].as_u64().expect("port")
                })
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

fn pod_spec_labels() -> Value {
    daemonset()["spec"]["template"]["metadata"]["labels"].clone()
}

#[test]
fn the_example_config_is_a_valid_gcp_sev_snp_policy_once_measured() {
    let config = measured_example("gcp-sev-snp.attestationConfig.json");
    attestation::snp::SnpConfig::from_attestation_config(config.to_string().as_bytes())
        .expect("the SNP settings parse");
    attestation::Policy::from_attestation_config(config.to_string().as_bytes())
        .expect("the measurements parse");
}

/// The TCP ports an ingress rule admits from the monitoring namespace, over every
/// NetworkPolicy in `docs`.
fn monitoring_ports(docs: &[Value]) -> BTreeSet<u64> {
    docs.iter()
        .filter(|d| d["kind"] == "NetworkPolicy")
        .flat_map(|d| array(&d["spec"]["ingress"]))
        .filter(|rule| {
            array(&rule["from"]).iter().any(|f| {
                f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"
            })
        })
        .flat_map(|rule| array(&rule["ports"]))
        .map(|p| p["port"].as_u64().expect("port"))
        .collect()
}

#[test]
fn prometheus_reaches_every_admin_endpoint_of_the_overlay() {
    let mut docs = read_docs(&deploy_dir().join("base/networkpolicy.yaml"));
    docs.extend(read_docs(&overlay_dir().join("metrics-ingress.yaml")));
    let admitted = monitoring_ports(&docs);
    for container in array(&gcp_pod_spec()["containers"]) {
        for port in array(&container["ports"]) {
            let number = port["containerPort"].as_u64().expect("containerPort");
            if port["name"].as_str().is_some_and(|n| n.ends_with("admin")) {
                assert!(
                    admitted.contains(&number),
                    "{}'s admin port {number} is not admitted from the monitoring namespace ({admitted:?})",
                    container["name"]
                );
            }
        }
    }
}
