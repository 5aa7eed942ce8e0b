//! The DaemonSet's pod: who runs as whom, what each container mounts, how the processes are
//! wired to each other.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;

const CONTAINERS: [&str; 3] = ["attest-proxy", "join-core", "token-issuer"];
const SA_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[test]
fn three_containers_each_running_its_own_binary() {
    let got: Vec<String> = containers()
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(got, CONTAINERS);
    for c in containers() {
        let command = array(&c["command"]);
        assert_eq!(
            command.len(),
            1,
            "{}: command is the binary alone",
            c["name"]
        );
        let binary = command[0].as_str().expect("command is a string");
        assert_eq!(
            binary,
            format!("/usr/local/bin/{}", c["name"].as_str().expect("name")),
            "the Dockerfile installs the binaries to /usr/local/bin"
        );
    }
    // One image for all three, the name kustomize rewrites.
    let images = str_set(containers().iter().map(|c| &c["image"]).collect::<Vec<_>>());
    assert_eq!(images, names(&["join-service"]));
    let rewritten = str_set(
        array(&kustomization()["images"])
            .iter()
            .map(|i| &i["name"])
            .collect::<Vec<_>>(),
    );
    assert_eq!(rewritten, images, "kustomization sets the image");
    for image in array(&kustomization()["images"]) {
        assert_pinned_by_digest(&image);
    }
}

#[test]
fn runs_on_control_plane_nodes_as_a_critical_pod() {
    let spec = pod_spec();
    assert_eq!(
        spec["nodeSelector"]["node-role.kubernetes.io/control-plane"],
        ""
    );
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    let tolerated: BTreeSet<String> = array(&spec["tolerations"])
        .iter()
        .filter(|t| t["effect"] == "NoSchedule" && t["operator"] == "Exists")
        .map(|t| t["key"].as_str().expect("key").to_owned())
        .collect();
    assert!(tolerated.contains("node-role.kubernetes.io/control-plane"));
    // The selector matches the template.
    let ds = daemonset();
    for (k, v) in ds["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v);
    }
}

#[test]
fn only_token_issuer_gets_a_service_account_token() {
    let spec = pod_spec();
    assert_eq!(
        spec["automountServiceAccountToken"],
        Value::Bool(false),
        "the pod must not automount a token into every container"
    );
    assert_eq!(spec["serviceAccountName"], "join-token-issuer");
    let sa = one_of("ServiceAccount");
    assert_eq!(sa["metadata"]["name"], "join-token-issuer");
    assert_eq!(sa["automountServiceAccountToken"], Value::Bool(false));

    // Every volume that can carry a token or any Secret: the token-issuer's token, and the
    // measurement salt (a Secret that only join-core mounts, checked below).
    let volumes = array(&spec["volumes"]);
    let secret_volumes: BTreeSet<String> = volumes
        .iter()
        .filter(|v| {
            array(&v["projected"]["sources"])
                .iter()
                .any(|s| s.get("serviceAccountToken").is_some() || s.get("secret").is_some())
                || v.get("secret").is_some()
        })
        .map(|v| v["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(
        secret_volumes,
        names(&["token-issuer-token", "measurement-salt"])
    );
    assert_eq!(mounted_by("measurement-salt"), names(&["join-core"]));
    let token_volumes: Vec<&Value> = volumes
        .iter()
        .filter(|v| {
            array(&v["projected"]["sources"])
                .iter()
                .any(|s| s.get("serviceAccountToken").is_some())
        })
        .collect();
    assert_eq!(token_volumes.len(), 1, "exactly one token volume");
    let token = token_volumes[0];
    let name = token["name"].as_str().expect("name");
    assert_eq!(mounted_by(name), names(&["token-issuer"]));

    // It is what kube-rs's in-cluster config reads: token, ca.crt, namespace.
    let sources = array(&token["projected"]["sources"]);
    let paths: BTreeSet<String> = sources
        .iter()
        .flat_map(|s| {
            let mut p = Vec::new();
            if let Some(t) = s.get("serviceAccountToken") {
                p.push(t["path"].clone());
            }
            for item in array(&s["configMap"]["items"]) {
                assert_eq!(s["configMap"]["name"], "kube-root-ca.crt");
                p.push(item["path"].clone());
            }
            for item in array(&s["downwardAPI"]["items"]) {
                assert_eq!(item["fieldRef"]["fieldPath"], "metadata.namespace");
                p.push(item["path"].clone());
            }
            p
        })
        .map(|p| p.as_str().expect("path").to_owned())
        .collect();
    assert_eq!(paths, names(&["token", "ca.crt", "namespace"]));
    let mount = array(&container("token-issuer")["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == name)
        .expect("mount");
    assert_eq!(mount["mountPath"], SA_PATH);
    assert_eq!(mount["readOnly"], Value::Bool(true));
    assert!(flag(&container("token-issuer"), "kubeconfig").is_none());

    // Nobody else mounts anything at the token path.
    for c in containers() {
        if c["name"] == "token-issuer" {
            continue;
        }
        for m in array(&c["volumeMounts"]) {
            let path = m["mountPath"].as_str().expect("mountPath");
            assert!(
                !path.starts_with("/var/run/secrets"),
                "{} mounts {path}",
                c["name"]
            );
        }
    }
}

#[test]
fn no_host_namespaces_no_privilege_no_root() {
    let spec = pod_spec();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(spec[key], Value::Bool(true), "pod sets {key}");
    }
    let pod_sc = &spec["securityContext"];
    assert_eq!(pod_sc["runAsNonRoot"], Value::Bool(true));
    assert_ne!(pod_sc["runAsUser"], 0);
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(spec.get("initContainers").is_none());
    assert!(spec.get("ephemeralContainers").is_none());

    for c in containers() {
        assert_locked_down(&c);
    }
}

#[test]
fn each_container_has_its_own_uid() {
    let uids: BTreeSet<u64> = containers().iter().map(run_as_user).collect();
    assert_eq!(uids, [10001, 10002, 10003].into_iter().collect());
    assert_eq!(run_as_user(&container("attest-proxy")), 10001);
    assert_eq!(run_as_user(&container("join-core")), 10002);
    assert_eq!(run_as_user(&container("token-issuer")), 10003);
    let fs_group = pod_spec()["securityContext"]["fsGroup"]
        .as_u64()
        .expect("a shared fsGroup, so the sockets are reachable");
    assert!(!uids.contains(&fs_group));
}

#[test]
fn socket_ends_check_exactly_their_peer_uid() {
    let proxy = container("attest-proxy");
    let core = container("join-core");
    let issuer = container("token-issuer");
    assert_eq!(
        required_flag(&core, "proxy-uid")
            .parse::<u64>()
            .expect("uid"),
        run_as_user(&proxy),
        "join-core must admit attest-proxy's uid"
    );
    assert_eq!(
        required_flag(&issuer, "peer-uid")
            .parse::<u64>()
            .expect("uid"),
        run_as_user(&core),
        "token-issuer must admit join-core's uid"
    );
    // And each client talks only to a server of the right uid.
    assert_eq!(
        required_flag(&proxy, "upstream-uid")
            .parse::<u64>()
            .expect("uid"),
        run_as_user(&core),
        "attest-proxy must expect join-core's uid"
    );
    assert_eq!(
        required_flag(&core, "token-issuer-uid")
            .parse::<u64>()
            .expect("uid"),
        run_as_user(&issuer),
        "join-core must expect token-issuer's uid"
    );
}

#[test]
fn clients_and_servers_agree_on_socket_paths() {
    let proxy = container("attest-proxy");
    let core = container("join-core");
    let issuer = container("token-issuer");
    let core_socket = required_flag(&core, "socket");
    let issuer_socket = required_flag(&issuer, "socket");
    assert_eq!(required_flag(&proxy, "upstream-socket"), core_socket);
    assert_eq!(required_flag(&core, "token-issuer-socket"), issuer_socket);

    // Each socket lives on an in-memory emptyDir of its own, mounted at the socket's directory
    // writable by its server alone and read-only by its one client, so no other container can
    // unlink or replace it.
    for (socket, server, client) in [
        (&core_socket, "join-core", "attest-proxy"),
        (&issuer_socket, "token-issuer", "join-core"),
    ] {
        let dir = std::path::Path::new(socket).parent().expect("parent");
        let volume_name = format!("{server}-socket");
        let v = volume(&volume_name);
        assert_eq!(v["emptyDir"]["medium"], "Memory", "{volume_name}");
        assert_eq!(mounted_by(&volume_name), names(&[server, client]));
        for (name, read_only) in [(server, false), (client, true)] {
            let m = array(&container(name)["volumeMounts"])
                .into_iter()
                .find(|m| m["name"] == volume_name.as_str())
                .expect("socket mount");
            assert_eq!(
                m["readOnly"].as_bool().unwrap_or(false),
                read_only,
                "{name}: {volume_name} must be {}",
                if read_only { "read-only" } else { "writable" }
            );
            assert!(m.get("subPath").is_none());
            assert_eq!(
                m["mountPath"].as_str(),
                dir.to_str(),
                "{name}: {volume_name} is mounted where {socket} lives"
            );
        }
    }
    // The proxy connects as another uid through the shared group: group-writable, not world.
    let mode = u32::from_str_radix(&required_flag(&core, "socket-mode"), 8).expect("octal");
    assert_eq!(mode & 0o060, 0o060);
    assert_eq!(mode & 0o007, 0);
}

#[test]
fn host_paths_are_read_only_and_token_issuer_only() {
    let volumes = array(&pod_spec()["volumes"]);
    let host: Vec<&Value> = volumes
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .collect();
    let paths: BTreeSet<String> = host
        .iter()
        .map(|v| {
            assert_eq!(
                v["hostPath"]["type"], "File",
                "{}: mount single files",
                v["name"]
            );
            v["hostPath"]["path"].as_str().expect("path").to_owned()
        })
        .collect();
    // The cluster CA, and the shared CA keys and certificates control-plane joiners get;
    // never a serving key (apiserver.key, etcd/server.key, ...).
    assert_eq!(
        paths,
        names(&[
            "/etc/kubernetes/pki/ca.crt",
            "/etc/kubernetes/pki/ca.key",
            "/etc/kubernetes/pki/sa.key",
            "/etc/kubernetes/pki/sa.pub",
            "/etc/kubernetes/pki/front-proxy-ca.crt",
            "/etc/kubernetes/pki/front-proxy-ca.key",
            "/etc/kubernetes/pki/etcd/ca.crt",
            "/etc/kubernetes/pki/etcd/ca.key",
        ])
    );
    for v in host {
        let name = v["name"].as_str().expect("name");
        assert_eq!(mounted_by(name), names(&["token-issuer"]), "{name}");
        for c in containers() {
            for m in array(&c["volumeMounts"])
                .iter()
                .filter(|m| m["name"] == name)
            {
                assert_eq!(m["readOnly"], Value::Bool(true), "{name} must be read-only");
                assert_eq!(m["mountPath"], v["hostPath"]["path"]);
            }
        }
    }
    let issuer = container("token-issuer");
    assert_eq!(
        required_flag(&issuer, "ca-cert"),
        "/etc/kubernetes/pki/ca.crt"
    );
    assert_eq!(
        required_flag(&issuer, "ca-key"),
        "/etc/kubernetes/pki/ca.key"
    );
    assert_eq!(required_flag(&issuer, "pki-dir"), "/etc/kubernetes/pki");
}

#[test]
fn configuration_reaches_only_the_container_that_reads_it() {
    // The measurement policy, to attest-proxy, as a directory mount so hot reload works.
    let policy = volume("attestation-config");
    assert_eq!(policy["configMap"]["name"], "join-config");
    assert_eq!(
        str_set(
            array(&policy["configMap"]["items"])
                .iter()
                .map(|i| &i["key"])
                .collect::<Vec<_>>()
        ),
        names(&["attestationConfig"])
    );
    assert_eq!(mounted_by("attestation-config"), names(&["attest-proxy"]));
    let proxy = container("attest-proxy");
    let mount = array(&proxy["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == "attestation-config")
        .expect("mount");
    assert!(
        mount.get("subPath").is_none(),
        "subPath mounts never update"
    );
    assert_eq!(
        required_flag(&proxy, "attestation-config"),
        format!(
            "{}/attestationConfig",
            mount["mountPath"].as_str().expect("path")
        )
    );
    assert!(flag(&proxy, "variant").is_some(), "the variant is explicit");

    // The measurement salt, to join-core, from a Secret.
    let salt = volume("measurement-salt");
    assert_eq!(salt["secret"]["secretName"], "join-measurement-salt");
    assert_eq!(
        str_set(
            array(&salt["secret"]["items"])
                .iter()
                .map(|i| &i["key"])
                .collect::<Vec<_>>()
        ),
        names(&["measurementSalt"])
    );
    assert_eq!(mounted_by("measurement-salt"), names(&["join-core"]));
    let core = container("join-core");
    let mount = array(&core["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == "measurement-salt")
        .expect("mount");
    assert_eq!(
        required_flag(&core, "measurement-salt-file"),
        format!(
            "{}/measurementSalt",
            mount["mountPath"].as_str().expect("path")
        )
    );
    assert!(
        required_flag(&core, "kms-endpoint").starts_with("http://key-service.kube-system:9000")
    );

    // kubeadm's ClusterConfiguration, to join-core (the SSH principals), as a directory mount.
    let kubeadm = volume("kubeadm-config");
    assert_eq!(kubeadm["configMap"]["name"], "kubeadm-config");
    assert_eq!(mounted_by("kubeadm-config"), names(&["join-core"]));
    let mount = array(&core["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == "kubeadm-config")
        .expect("mount");
    assert!(mount.get("subPath").is_none());
    assert_eq!(
        required_flag(&core, "kubeadm-config"),
        format!(
            "{}/ClusterConfiguration",
            mount["mountPath"].as_str().expect("path")
        )
    );

    // Only the proxy exposes its API port; each process has its own admin port, which is
    // where its --admin-listen binds.
    for c in containers() {
        let ports = array(&c["ports"]);
        let (api, admin): (Vec<&Value>, Vec<&Value>) = ports
            .iter()
            .partition(|p| !p["name"].as_str().is_some_and(|n| n.ends_with("-admin")));
        assert_eq!(admin.len(), 1, "{}: one admin port", c["name"]);
        assert_eq!(
            required_flag(&c, "admin-listen"),
            format!("0.0.0.0:{}", admin[0]["containerPort"])
        );
        if c["name"] == "attest-proxy" {
            assert_eq!(api.len(), 1);
            assert_eq!(api[0]["containerPort"], 9090);
            assert_eq!(required_flag(&c, "listen"), "0.0.0.0:9090");
        } else {
            assert!(api.is_empty(), "{} exposes ports", c["name"]);
        }
        // Every mount other than the container's own socket directory (and attest-proxy's
        // cache of collateral and evidence, below) is read-only.
        let own_socket = format!("{}-socket", c["name"].as_str().expect("name"));
        for m in array(&c["volumeMounts"]) {
            let own_cache = c["name"] == "attest-proxy" && m["name"] == "proxy-cache";
            if m["name"] != own_socket.as_str() && !own_cache {
                assert_eq!(
                    m["readOnly"],
                    Value::Bool(true),
                    "{}: {}",
                    c["name"],
                    m["name"]
                );
            }
        }
    }
}

#[test]
fn collateral_and_evidence_outlive_a_proxy_restart_in_a_bounded_volume_of_its_own() {
    // AMD's public collateral, cached on disk so a restarted attest-proxy does not go back to the
    // KDS for every chip in a storm, and the evidence of the nodes it decided on lately, which
    // dry runs and the reload guard read: an emptyDir on disk (a memory one would count against
    // the container's limit), bounded, mounted by attest-proxy alone. --collateral-dir and
    // --evidence-dir are two directories in it, which attest-proxy creates (the evidence one
    // 0700, which it can only be sure of for a directory it owns).
    let cache = volume("proxy-cache");
    assert!(cache["emptyDir"].is_object(), "an emptyDir: {cache}");
    assert!(
        cache["emptyDir"].get("medium").is_none(),
        "on disk, not in memory"
    );
    assert!(
        cache["emptyDir"]["sizeLimit"].is_string(),
        "bounded: {cache}"
    );
    assert_eq!(mounted_by("proxy-cache"), names(&["attest-proxy"]));
    let proxy = container("attest-proxy");
    let mount = array(&proxy["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == "proxy-cache")
        .expect("mount");
    assert_ne!(mount["readOnly"], Value::Bool(true), "the cache is written");
    let root = std::path::Path::new(mount["mountPath"].as_str().expect("path"));
    for flag in ["collateral-dir", "evidence-dir"] {
        let dir = required_flag(&proxy, flag);
        assert_eq!(
            std::path::Path::new(&dir).parent(),
            Some(root),
            "--{flag} is a directory of the volume"
        );
    }
    assert_ne!(
        required_flag(&proxy, "collateral-dir"),
        required_flag(&proxy, "evidence-dir")
    );
}

#[test]
fn api_server_endpoint_is_the_host_ip() {
    let issuer = container("token-issuer");
    assert!(flag(&issuer, "api-server-endpoint").is_none());
    assert_eq!(required_flag(&issuer, "api-server-host"), "$(HOST_IP)");
    assert_eq!(required_flag(&issuer, "api-server-port"), "6443");
    let env = array(&issuer["env"]);
    let host_ip = env
        .iter()
        .find(|e| e["name"] == "HOST_IP")
        .expect("HOST_IP is defined, or $(HOST_IP) is passed literally");
    assert_eq!(
        host_ip["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
}

/// Parses `20s`-style durations (whole seconds, as the manifests write them).
fn seconds(s: &str) -> u64 {
    s.strip_suffix('s')
        .unwrap_or(s)
        .parse()
        .unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn grace_period_outlasts_every_drain() {
    let grace = pod_spec()["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    // Each process's drain timeout; unset means its default of 20s.
    let drains = [
        flag(&container("attest-proxy"), "grace-period"),
        flag(&container("join-core"), "grace-period"),
        flag(&container("token-issuer"), "grace-period"),
    ];
    for d in drains {
        let d = d.map_or(20, |d| seconds(&d));
        assert!(grace > d, "grace period {grace}s must exceed drain {d}s");
    }
}

#[test]
fn every_container_has_requests_and_limits() {
    for c in containers() {
        for kind in ["requests", "limits"] {
            for res in ["cpu", "memory"] {
                assert!(
                    c["resources"][kind].get(res).is_some(),
                    "{}: resources.{kind}.{res}",
                    c["name"]
                );
            }
        }
    }
}

#[test]
fn probes_use_each_process_admin_endpoint() {
    for c in containers() {
        let admin = array(&c["ports"])
            .into_iter()
            .find(|p| p["name"].as_str().is_some_and(|n| n.ends_with("-admin")))
            .expect("admin port");
        for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{}: {probe}", c["name"]);
            assert_eq!(get["port"], admin["name"], "{}: {probe}", c["name"]);
        }
        // Liveness must be slower to give up than readiness: a dependency outage should take
        // the pod out of the Service, not restart containers that are fine.
        let threshold = |probe: &str| {
            let p = &c[probe];
            p["periodSeconds"].as_u64().unwrap_or(10) * p["failureThreshold"].as_u64().unwrap_or(3)
        };
        assert!(threshold("livenessProbe") > threshold("readinessProbe"));
    }
}

#[test]
fn every_argument_is_a_flag_the_binary_accepts() {
    assert_args_parse(&containers());
}
