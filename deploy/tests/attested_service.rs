//! deploy/examples/attested-service: the overlay that adds the certifier, the device plugin that
//! grants it the TPM, and the certifier's image. Only the certifier reaches the TPM device, as a
//! device plugin resource (no host path under /dev, no privilege); attest-proxy keeps no device
//! and stays as the base has it; the two ends of the certifier's socket agree on path and uids;
//! the plugin has exactly the privileges it declares, in a namespace of its own; the certifier's
//! image provides every library the built certifier loads, and runs as non-root.
//!
//! And the overlays on it for other hardware: attested-service-aws-sev-snp (the TPM and the SEV
//! guest device, both from the device plugin, which sev-snp-device-plugin configures for both)
//! and attested-service-qemu-tdx (configfs-tsm's report directory and nothing else, as uid 0
//! without capabilities). Each changes only the variant and what the certifier is granted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// The gid the certifier runs as: the node's `tss` group, which owns `/dev/tpmrm0` (udev:
/// `root:tss 0660`). Fedora, on which Constellation's node image is built, allocates it
/// statically as 59; Debian allocates it dynamically, so the operator sets it (deploy/README.md).
const TSS_GID: u64 = 59;

/// The namespace the TPM device plugin runs in: its own, not the join service's.
const PLUGIN_NAMESPACE: &str = "tpm-device-plugin";

/// Resources every container may request; anything else is an extended resource (a device).
const ORDINARY_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

fn overlay_dir() -> PathBuf {
    deploy_dir().join("examples/attested-service")
}

fn plugin_dir() -> PathBuf {
    deploy_dir().join("examples/tpm-device-plugin")
}

fn spec() -> Value {
    merged_pod_spec(&overlay_dir().join("certifier.yaml"))
}

fn overlay_container(name: &str) -> Value {
    container_of(&spec(), name)
}

/// The container `name` of a pod spec.
fn container_of(spec: &Value, name: &str) -> Value {
    array(&spec["containers"])
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
        names(&["../../base"])
    );
    let patches = array(&k["patches"]);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["path"], "certifier.yaml");
    assert_eq!(
        patches[0]["target"]["name"],
        daemonset()["metadata"]["name"]
    );
}

/// The base's `images:` does not reach a container the overlay adds; the overlay pins the
/// certifier's own image by digest.
#[test]
fn the_certifier_image_is_pinned_by_the_overlay() {
    let pins = overlay_image_pins(&overlay_dir(), &overlay_dir().join("certifier.yaml"));
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0]["name"], "join-service-certifier");
}

/// A container's extended resources (devices), from its limits and requests.
fn extended_resources(c: &Value) -> BTreeMap<String, Value> {
    let mut found = BTreeMap::new();
    for kind in ["limits", "requests"] {
        if let Some(map) = c["resources"][kind].as_object() {
            for (name, amount) in map {
                if !ORDINARY_RESOURCES.contains(&name.as_str()) {
                    found.insert(format!("{kind}.{name}"), amount.clone());
                }
            }
        }
    }
    found
}

#[test]
fn only_the_certifier_requests_the_tpm_and_no_container_mounts_dev() {
    let spec = spec();
    let resource = plugin_resource();
    for c in array(&spec["containers"]) {
        let name = c["name"].as_str().expect("name");
        let devices = extended_resources(&c);
        if name == "certifier" {
            // One device, as a limit (the request defaults to it); the plugin hands it out once.
            assert_eq!(
                devices,
                BTreeMap::from([(format!("limits.{resource}"), json!(1))]),
                "the certifier requests exactly one TPM"
            );
            assert_eq!(
                mount_names(&c),
                names(&["certifier-socket"]),
                "the certifier mounts its socket directory, nothing else: the device comes \
                 from the kubelet, not from a volume"
            );
        } else {
            assert!(devices.is_empty(), "{name} requests devices {devices:?}");
        }
        assert!(c.get("volumeDevices").is_none(), "{name} has volumeDevices");
        assert_ne!(
            c["securityContext"]["privileged"],
            Value::Bool(true),
            "{name} is privileged"
        );
        // token-issuer reads kubeadm's PKI files from the host; no one else has a host path.
        let host: BTreeSet<String> = mount_names(&c)
            .intersection(&host_volumes(&spec))
            .cloned()
            .collect();
        if name != "token-issuer" {
            assert!(host.is_empty(), "{name} mounts host paths {host:?}");
        }
    }
    for v in array(&spec["volumes"]) {
        if let Some(path) = v["hostPath"]["path"].as_str() {
            assert!(
                path != "/dev" && !path.starts_with("/dev/"),
                "volume {} is the host's {path}: a device node reaches a container only \
                 through the device plugin",
                v["name"]
            );
        }
    }
}

/// The keys of a JSON object.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

/// The pod volumes container `c` of `spec` mounts.
fn mounted_volumes(spec: &Value, c: &Value) -> Vec<Value> {
    array(&c["volumeMounts"])
        .iter()
        .map(|m| {
            array(&spec["volumes"])
                .into_iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("no volume {}", m["name"]))
        })
        .collect()
}

fn mount_names(c: &Value) -> BTreeSet<String> {
    array(&c["volumeMounts"])
        .iter()
        .map(|m| m["name"].as_str().expect("name").to_owned())
        .collect()
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
    // Everything it mounts is an emptyDir: no Secret, no projected token, no ConfigMap, no host.
    for volume in mounted_volumes(&spec, &c) {
        assert_eq!(
            keys(&volume),
            names(&["name", "emptyDir"]),
            "the certifier mounts {}",
            volume["name"]
        );
    }
    // The device node is root:tss 0660 on the node: the certifier reaches it as a member of tss,
    // as its own primary group, so no other container of the pod gets that group.
    assert_eq!(c["securityContext"]["runAsGroup"], json!(TSS_GID));
    assert!(
        !array(&spec["securityContext"]["supplementalGroups"]).contains(&json!(TSS_GID)),
        "the pod's supplementalGroups would give tss to every container"
    );
    assert_ne!(spec["securityContext"]["fsGroup"], json!(TSS_GID));
}

#[test]
fn attest_proxy_and_the_others_stay_as_the_base_has_them() {
    let base = pod_spec();
    let overlay = spec();
    // The patch touches the pod's containers and volumes, nothing else of the DaemonSet (the
    // merge below reads only those two, so this is what makes it the whole picture).
    let patch = &read_docs(&overlay_dir().join("certifier.yaml"))[0];
    assert_eq!(
        keys(patch),
        names(&["apiVersion", "kind", "metadata", "spec"])
    );
    assert_eq!(keys(&patch["metadata"]), names(&["name", "namespace"]));
    assert_eq!(keys(&patch["spec"]), names(&["template"]));
    assert_eq!(keys(&patch["spec"]["template"]), names(&["spec"]));
    assert_eq!(
        keys(&patch["spec"]["template"]["spec"]),
        names(&["containers", "volumes"]),
        "the patch changes pod-wide settings (supplementalGroups, host namespaces, …)"
    );
    // Pod-wide settings (identity, host namespaces, security context) are the base's.
    for (key, value) in base.as_object().expect("a pod spec") {
        if key != "containers" && key != "volumes" {
            assert_eq!(&overlay[key], value, "the overlay changes the pod's {key}");
        }
    }
    assert_eq!(
        array(&overlay["volumes"]).len(),
        array(&base["volumes"]).len() + 1,
        "the overlay adds one volume, the certifier's socket directory"
    );
    for v in array(&base["volumes"]) {
        assert!(
            array(&overlay["volumes"]).contains(&v),
            "the overlay changes {}",
            v["name"]
        );
    }
    for name in ["join-core", "token-issuer"] {
        assert_eq!(
            overlay_container(name),
            container(name),
            "the overlay changes {name}"
        );
    }
    // attest-proxy: the certifier's flags and its socket directory, read-only; nothing else.
    let mut proxy = overlay_container("attest-proxy");
    let mut base_proxy = container("attest-proxy");
    let added: Vec<String> = flags_of(&proxy)
        .into_iter()
        .filter(|a| !flags_of(&base_proxy).contains(a))
        .collect();
    assert!(
        added
            .iter()
            .all(|a| a.starts_with("--certifier-") || a.starts_with("--server-key-")),
        "the overlay gives attest-proxy {added:?}"
    );
    let mounts: Vec<Value> = array(&proxy["volumeMounts"])
        .into_iter()
        .filter(|m| !array(&base_proxy["volumeMounts"]).contains(m))
        .collect();
    assert_eq!(
        mounts,
        vec![
            json!({"name": "certifier-socket", "mountPath": "/run/joinservice/certifier", "readOnly": true})
        ]
    );
    for c in [&mut proxy, &mut base_proxy] {
        let c = c.as_object_mut().expect("a container");
        c.remove("args");
        c.remove("env");
        c.remove("volumeMounts");
    }
    assert_eq!(
        proxy, base_proxy,
        "the overlay changes attest-proxy beyond its flags and mounts"
    );
}

#[test]
fn the_socket_ends_agree_on_path_and_peer_uid() {
    assert_socket_ends_agree(&spec());
    // attest-proxy keeps everything else the base gives it.
    let proxy = overlay_container("attest-proxy");
    for a in args(&container("attest-proxy")) {
        assert!(args(&proxy).contains(&a), "the overlay drops {a}");
    }
}

/// attest-proxy and the certifier of `spec` name the same socket, each other's uid and the same
/// variant; the certifier alone writes the socket's directory, attest-proxy alone reads it.
fn assert_socket_ends_agree(spec: &Value) {
    let proxy = container_of(spec, "attest-proxy");
    let certifier = container_of(spec, "certifier");
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
            array(&container_of(spec, other)["volumeMounts"])
                .iter()
                .all(|m| m["name"] != "certifier-socket"),
            "{other} mounts the certifier's socket"
        );
    }
}

#[test]
fn every_argument_is_a_flag_the_binary_accepts() {
    assert_args_parse(&array(&spec()["containers"]));
}

/// Every object of the device plugin example, as its kustomization lists them.
fn plugin_objects() -> Vec<Value> {
    let k = &read_docs(&plugin_dir().join("kustomization.yaml"))[0];
    array(&k["resources"])
        .iter()
        .flat_map(|f| read_docs(&plugin_dir().join(f.as_str().expect("a path"))))
        .collect()
}

fn plugin_object(kind: &str) -> Value {
    let mut all: Vec<Value> = plugin_objects()
        .into_iter()
        .filter(|o| o["kind"] == kind)
        .collect();
    assert_eq!(all.len(), 1, "the plugin example has one {kind}");
    all.remove(0)
}

fn plugin_pod_spec() -> Value {
    plugin_object("DaemonSet")["spec"]["template"]["spec"].clone()
}

fn plugin_container() -> Value {
    let containers = array(&plugin_pod_spec()["containers"]);
    assert_eq!(containers.len(), 1, "the plugin pod runs one container");
    containers[0].clone()
}

/// The device types a generic-device-plugin container configures, one per `--device` flag
/// (squat's generic device plugin reads the flag's value as YAML).
fn devices_of(plugin: &Value) -> Vec<Value> {
    let args = args(plugin);
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--device=") || a.starts_with("--config")),
        "device types come from --device flags, each followed by its YAML"
    );
    args.iter()
        .zip(args.iter().skip(1))
        .filter(|(flag, _)| *flag == "--device")
        .map(|(_, value)| serde_yaml::from_str(value).expect("--device is YAML"))
        .collect()
}

/// The plugin's one device type.
fn plugin_device() -> Value {
    let mut devices = devices_of(&plugin_container());
    assert_eq!(devices.len(), 1, "the plugin exposes one device type");
    devices.remove(0)
}

/// The extended resource a plugin container advertises for `device`: `<domain>/<name>`.
fn resource_of(plugin: &Value, device: &Value) -> String {
    let domain = flag(plugin, "domain").unwrap_or_else(|| "squat.ai".to_owned());
    let name = device["name"].as_str().expect("the device has a name");
    format!("{domain}/{name}")
}

/// The extended resource the plugin advertises.
fn plugin_resource() -> String {
    resource_of(&plugin_container(), &plugin_device())
}

#[test]
fn the_device_plugin_lives_in_a_namespace_of_its_own() {
    let k = &read_docs(&plugin_dir().join("kustomization.yaml"))[0];
    let listed = str_set(&array(&k["resources"]));
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(plugin_dir()).expect("the plugin example") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8");
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            on_disk.insert(name);
        }
    }
    assert_eq!(listed, on_disk, "kustomization resources vs. files");
    assert!(k.get("namespace").is_none());

    let objects = plugin_objects();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        str_set(objects.iter().map(|o| &o["kind"])),
        names(&["Namespace", "ServiceAccount", "DaemonSet", "NetworkPolicy"]),
        "{kinds:?}"
    );
    assert_eq!(objects.len(), 4, "{kinds:?}");
    for o in &objects {
        if o["kind"] == "Namespace" {
            assert_eq!(o["metadata"]["name"], PLUGIN_NAMESPACE);
        } else {
            assert_eq!(
                o["metadata"]["namespace"], PLUGIN_NAMESPACE,
                "{}",
                o["kind"]
            );
        }
    }
    assert_ne!(PLUGIN_NAMESPACE, daemonset()["metadata"]["namespace"]);
    // Host paths and root are admitted only at the privileged Pod Security level: it applies to
    // this namespace, which holds nothing else, never to the join service's.
    assert_eq!(
        plugin_object("Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    // It needs no network (the kubelet talks to it over Unix sockets) and no API access.
    let policy = plugin_object("NetworkPolicy");
    assert_eq!(policy["spec"]["podSelector"], json!({}));
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert!(policy["spec"].get("ingress").is_none() && policy["spec"].get("egress").is_none());
    let account = plugin_object("ServiceAccount");
    assert_eq!(account["automountServiceAccountToken"], Value::Bool(false));
    // The image is pinned by digest (a placeholder until the operator sets the reviewed one).
    let images = array(&k["images"]);
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["name"], plugin_container()["image"]);
    assert!(
        images[0]["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "the plugin's image is pinned by digest"
    );
}

#[test]
fn the_device_plugin_has_exactly_the_privileges_it_declares() {
    let spec = plugin_pod_spec();
    // Nothing beyond what is checked below: no init container, no sysctl, no host alias, …
    assert_eq!(
        keys(&spec),
        names(&[
            "priorityClassName",
            "nodeSelector",
            "tolerations",
            "serviceAccountName",
            "automountServiceAccountToken",
            "enableServiceLinks",
            "hostNetwork",
            "hostPID",
            "hostIPC",
            "securityContext",
            "containers",
            "volumes",
        ])
    );
    assert_eq!(
        spec["securityContext"],
        json!({"seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert_eq!(
        keys(&plugin_container()),
        names(&[
            "name",
            "image",
            "imagePullPolicy",
            "args",
            "resources",
            "securityContext",
            "volumeMounts",
        ])
    );
    assert_eq!(
        spec["serviceAccountName"],
        plugin_object("ServiceAccount")["metadata"]["name"]
    );
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(spec[host], Value::Bool(true), "the plugin uses {host}");
    }
    // Declared: root, so that it may create its socket in the kubelet's root-owned directory and
    // connect to kubelet.sock; but no capability, no privilege, nothing writable but that
    // directory.
    let c = plugin_container();
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsUser"], json!(0));
    assert_eq!(sc["privileged"], Value::Bool(false));
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false));
    assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true));
    assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(sc.get("procMount").is_none() && sc.get("seLinuxOptions").is_none());
    assert!(c.get("env").is_none() && c.get("envFrom").is_none());
    assert!(
        c.get("ports").is_none(),
        "nothing needs to reach the plugin"
    );
    assert!(c.get("volumeDevices").is_none());
    assert_eq!(
        required_flag(&c, "listen")
            .rsplit_once(':')
            .expect("host:port")
            .0,
        "127.0.0.1",
        "its metrics listener stays on loopback"
    );
    assert!(extended_resources(&c).is_empty());
    // Exactly two host paths: the kubelet's device-plugin directory, writable (the sockets), and
    // the device node, read-only and only to see that it exists (the container's device cgroup
    // does not admit it, so the plugin cannot open it).
    let volumes = array(&spec["volumes"]);
    assert_eq!(
        volumes,
        vec![
            json!({"name": "device-plugins",
                   "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}),
            json!({"name": "tpmrm0", "hostPath": {"path": "/dev/tpmrm0", "type": "CharDevice"}}),
        ]
    );
    assert_eq!(
        array(&c["volumeMounts"]),
        vec![
            json!({"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"}),
            json!({"name": "tpmrm0", "mountPath": "/dev/tpmrm0", "readOnly": true}),
        ]
    );
    // It runs where the certifier runs, and only there.
    let join_service = pod_spec();
    assert_eq!(spec["nodeSelector"], join_service["nodeSelector"]);
    assert_eq!(spec["tolerations"], join_service["tolerations"]);
}

#[test]
fn the_device_plugin_grants_the_tpm_once_per_node_to_what_the_certifier_requests() {
    let device = plugin_device();
    assert_eq!(
        device,
        json!({"name": "tpmrm0", "groups": [{"count": 1, "paths": [
            {"path": "/dev/tpmrm0", "permissions": "rw"}
        ]}]}),
        "one device node, handed to one container at a time, read and write but no mknod"
    );
    let certifier = overlay_container("certifier");
    assert_eq!(
        extended_resources(&certifier).keys().collect::<Vec<_>>(),
        vec![&format!("limits.{}", plugin_resource())]
    );
    // The device the plugin grants is the one the certifier opens.
    let tcti = required_flag(&certifier, "tcti");
    assert_eq!(
        tcti.split_once(':'),
        Some((
            "device",
            device["groups"][0]["paths"][0]["path"]
                .as_str()
                .expect("path")
        ))
    );
}

/// The instructions of one stage of a Dockerfile, continuation lines joined, comments dropped.
#[derive(Debug)]
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<String>,
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter_map(|i| i.strip_prefix(keyword))
            .filter_map(|rest| rest.strip_prefix(' '))
            .collect()
    }
}

/// deploy/Dockerfile's global ARGs (before the first FROM) and its stages.
fn dockerfile() -> (BTreeMap<String, String>, Vec<Stage>) {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let (body, continued) = match line.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        current.push_str(body.trim());
        current.push(' ');
        if !continued {
            let instruction = current.trim().to_owned();
            if !instruction.is_empty() {
                instructions.push(instruction);
            }
            current.clear();
        }
    }
    let mut args = BTreeMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    for i in instructions {
        if let Some(from) = i.strip_prefix("FROM ") {
            let words: Vec<&str> = from.split_whitespace().collect();
            let name = match words.as_slice() {
                [_] => None,
                [_, as_, name] if as_.eq_ignore_ascii_case("AS") => Some((*name).to_owned()),
                _ => panic!("unexpected FROM {from}"),
            };
            stages.push(Stage {
                from: words[0].to_owned(),
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(i);
        } else if let Some((key, value)) = i.strip_prefix("ARG ").and_then(|a| a.split_once('=')) {
            args.insert(key.to_owned(), value.to_owned());
        }
    }
    (args, stages)
}

fn stage<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
    stages
        .iter()
        .find(|s| s.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("deploy/Dockerfile has no stage {name}"))
}

/// The libraries the distroless/cc (Debian 12) runtime image ships: glibc (with the dynamic
/// loader), libgcc_s, libstdc++, libgomp and OpenSSL's libssl3 (which holds libcrypto), as its
/// package list says.
const RUNTIME_BASE_LIBRARIES: [&str; 13] = [
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libresolv.so.2",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libgomp.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
];

const RUNTIME_IMAGE: &str = "gcr.io/distroless/cc-debian12:nonroot";

#[test]
fn the_certifier_image_is_a_target_of_its_own_without_shell_or_root() {
    let (args, stages) = dockerfile();
    assert_eq!(args["RUNTIME_IMAGE"], RUNTIME_IMAGE);
    let runtime = stage(&stages, "certifier");
    assert_eq!(runtime.from, "${RUNTIME_IMAGE}");
    // Only what the builder staged: the binary and its libraries. No RUN: nothing in the image
    // needs a shell, and distroless has none (nor a package manager).
    assert_eq!(
        runtime.all("COPY"),
        vec!["--from=certifier-builder /out/ /"]
    );
    assert!(
        runtime.all("RUN").is_empty(),
        "the runtime stage runs commands"
    );
    let user = runtime.all("USER");
    let user = user.last().expect("the certifier stage names its user");
    let (uid, gid) = user.split_once(':').expect("uid:gid");
    let (uid, gid): (u32, u32) = (
        uid.parse().expect("a numeric uid"),
        gid.parse().expect("a numeric gid"),
    );
    assert!(uid != 0 && gid != 0, "the certifier image runs as root");
    assert_eq!(
        runtime.all("ENTRYPOINT"),
        vec![r#"["/usr/local/bin/certifier"]"#]
    );

    let builder = stage(&stages, "certifier-builder");
    let run = builder.all("RUN").join(" ");
    assert!(
        run.contains("libtss2-dev"),
        "the builder installs libtss2-dev"
    );
    assert!(run.contains("cargo build --release --locked --bin certifier "));
    assert_eq!(
        run.matches("--bin ").count(),
        1,
        "the builder builds only the certifier"
    );
    assert!(run.contains("install -D -m 0755 -t /out/usr/local/bin target/release/certifier"));
    // The libraries go where the runtime's loader looks for them (and the TCTI loader's
    // dlopen() with them): the multiarch library directory.
    assert!(run.contains("libdir=/usr/lib/$(gcc -print-multiarch)"));
    assert!(run.contains(r#"install -D -m 0644 "$libdir/$lib" "/out$libdir/$lib""#));

    // The default target, the service image, is unchanged: no certifier, no TSS.
    let last = stages.last().expect("stages");
    assert_eq!(last.name, None, "the default target is the service image");
    assert_eq!(
        last.all("COPY"),
        vec!["--from=builder /out/ /usr/local/bin/"]
    );
    let service_builder = stage(&stages, "builder").all("RUN").join(" ");
    assert!(!service_builder.contains("certifier") && !service_builder.contains("tss2"));
}

/// The shared libraries the certifier's builder stage copies into its image, by file name.
fn staged_libraries() -> BTreeSet<String> {
    let (_, stages) = dockerfile();
    stage(&stages, "certifier-builder")
        .all("RUN")
        .iter()
        .flat_map(|run| run.split_whitespace())
        .map(|word| word.trim_matches(|c| c == '"' || c == ';'))
        .filter(|word| is_soname(word))
        .map(str::to_owned)
        .collect()
}

/// `lib<name>.so.<version>`.
fn is_soname(word: &str) -> bool {
    word.starts_with("lib")
        && word.split_once(".so.").is_some_and(|(_, version)| {
            !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
}

/// The built certifier, where cargo puts it: beside the directory of this test's executable.
fn certifier_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's executable");
    let mut dir = exe.parent().expect("a directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("certifier");
    assert!(
        bin.is_file(),
        "{} not found: build it first (cargo build -p certifier; scripts/test.sh builds every \
         binary before the tests)",
        bin.display()
    );
    bin
}

/// `readelf -d`'s DT_NEEDED entries of an ELF file.
fn dt_needed(path: &Path) -> BTreeSet<String> {
    let out = Command::new("readelf")
        .args(["-d", "--wide"])
        .arg(path)
        .output()
        .expect("running readelf (binutils; scripts/install-deps.sh installs it)");
    assert!(
        out.status.success(),
        "readelf -d {}: {out:?}",
        path.display()
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(|l| {
            let (_, rest) = l.split_once('[').expect("Shared library: [name]");
            rest.trim_end_matches(']').to_owned()
        })
        .collect()
}

#[test]
fn the_certifier_image_provides_every_library_the_certifier_loads() {
    let bin = certifier_binary();
    let needed = dt_needed(&bin);
    assert!(
        needed.contains("libtss2-esys.so.0") && needed.contains("libtss2-tctildr.so.0"),
        "the certifier links ESYS and the TCTI loader: {needed:?}"
    );

    // What the certifier loads when it opens the TPM the overlay names: run it with the
    // overlay's TCTI on a device path that does not exist, so it loads everything it would load
    // in the pod (DT_NEEDED, theirs, and the TCTI module the loader dlopen()s by name) and then
    // fails to open the device. The dynamic loader reports each object it maps.
    let tcti = required_flag(&overlay_container("certifier"), "tcti");
    let (module, _) = tcti.split_once(':').expect("<module>:<config>");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(&bin)
        .arg("--peer-uid=10001")
        .arg(format!(
            "--socket={}",
            dir.path().join("certifier.sock").display()
        ))
        .arg(format!(
            "--tcti={module}:{}",
            dir.path().join("no-tpm").display()
        ))
        .env("LD_DEBUG", "files")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("running the certifier");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("opening the TPM at"),
        "the certifier should have failed to open the absent device: {stderr}"
    );
    let loaded: BTreeSet<String> = stderr
        .lines()
        .filter(|l| l.ends_with("generating link map"))
        .filter_map(|l| Some(l.split_once("file=")?.1.split_once(" [")?.0))
        .map(|file| file.rsplit('/').next().unwrap_or(file).to_owned())
        .collect();
    let tcti_module = format!("libtss2-tcti-{module}.so.0");
    assert!(
        loaded.contains(&tcti_module),
        "the TCTI loader did not load {tcti_module}: {loaded:?}"
    );
    // The dynamic loader is DT_NEEDED too, but it is what maps the others, not one of them.
    let is_loader = |lib: &String| lib.starts_with("ld-linux");
    assert!(
        needed
            .iter()
            .filter(|l| !is_loader(l))
            .all(|l| loaded.contains(l)),
        "the run did not load every DT_NEEDED library: {needed:?} vs. {loaded:?}"
    );

    let missing: BTreeSet<String> = needed
        .union(&loaded)
        .filter(|lib| !RUNTIME_BASE_LIBRARIES.contains(&lib.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        staged_libraries(),
        missing,
        "the certifier image's libraries (deploy/Dockerfile, certifier-builder) must be exactly \
         those the certifier loads that {RUNTIME_IMAGE} lacks"
    );
}

// The hardware overlays: ../attested-service with an SEV-SNP or a TDX certifier, and the device
// plugin of an SEV-SNP control plane.

/// An overlay of deploy/examples/attested-service for one hardware variant.
struct Hardware {
    /// Its folder under deploy/examples.
    dir: &'static str,
    /// The variant attest-proxy and the certifier run as.
    variant: &'static str,
    /// The extended resources the certifier requests, each as a limit of one.
    devices: &'static [&'static str],
    /// The host paths the certifier gets as volumes (beyond devices).
    host_paths: &'static [&'static str],
    /// The certifier's uid and gid.
    uid: u64,
    gid: u64,
}

const AWS_SEV_SNP: Hardware = Hardware {
    dir: "examples/attested-service-aws-sev-snp",
    variant: "aws-sev-snp",
    devices: &["squat.ai/tpmrm0", "squat.ai/sev-guest"],
    host_paths: &[],
    uid: 10005,
    gid: TSS_GID,
};

/// Linux's configfs-tsm report directory on the node (`configfs_tsm::DEFAULT_ROOT`).
const TSM_REPORT_DIR: &str = "/sys/kernel/config/tsm/report";

const QEMU_TDX: Hardware = Hardware {
    dir: "examples/attested-service-qemu-tdx",
    variant: "qemu-tdx",
    devices: &[],
    host_paths: &[TSM_REPORT_DIR],
    // The owner of the report directory and of every entry the kernel makes in it.
    uid: 0,
    gid: 10005,
};

const HARDWARE: [Hardware; 2] = [AWS_SEV_SNP, QEMU_TDX];

impl Hardware {
    fn dir(&self) -> PathBuf {
        deploy_dir().join(self.dir)
    }

    fn patch(&self) -> PathBuf {
        self.dir().join("certifier.yaml")
    }

    /// The pod as the overlay renders it: the base, ../attested-service's patch, then its own.
    fn spec(&self) -> Value {
        merge_pod_patch(spec(), &self.patch())
    }

    fn container(&self, name: &str) -> Value {
        container_of(&self.spec(), name)
    }
}

/// The hostPath volumes of a pod spec, by name.
fn host_paths(spec: &Value) -> BTreeMap<String, Value> {
    array(&spec["volumes"])
        .into_iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| (v["name"].as_str().expect("name").to_owned(), v))
        .collect()
}

#[test]
fn the_hardware_overlays_build_on_the_attested_service_and_patch_only_the_pod() {
    for hw in HARDWARE {
        let k = &read_docs(&hw.dir().join("kustomization.yaml"))[0];
        assert_eq!(
            keys(k),
            names(&["apiVersion", "kind", "resources", "patches"]),
            "{}: no images, namespace or name changes of its own",
            hw.dir
        );
        assert_eq!(k["resources"], json!(["../attested-service"]), "{}", hw.dir);
        assert_eq!(
            k["patches"],
            json!([{"path": "certifier.yaml",
                    "target": {"kind": "DaemonSet", "name": daemonset()["metadata"]["name"]}}]),
            "{}",
            hw.dir
        );
        // No container gets another image: the certifier keeps the one ../attested-service pins.
        assert!(
            overlay_image_pins(&hw.dir(), &hw.patch()).is_empty(),
            "{} sets an image",
            hw.dir
        );
        let patch = &read_docs(&hw.patch())[0];
        assert_eq!(
            keys(patch),
            names(&["apiVersion", "kind", "metadata", "spec"])
        );
        assert_eq!(keys(&patch["spec"]), names(&["template"]));
        assert_eq!(keys(&patch["spec"]["template"]), names(&["spec"]));
        assert!(
            keys(&patch["spec"]["template"]["spec"]).is_subset(&names(&["containers", "volumes"])),
            "{} changes pod-wide settings",
            hw.dir
        );
        assert_eq!(
            str_set(
                array(&patch["spec"]["template"]["spec"]["containers"])
                    .iter()
                    .map(|c| &c["name"])
            ),
            names(&["attest-proxy", "certifier"]),
            "{} patches attest-proxy's variant and the certifier only",
            hw.dir
        );
    }
}

#[test]
fn only_the_hardware_certifier_gets_devices_or_host_paths() {
    let token_issuer_host = mount_names(&container("token-issuer"))
        .intersection(&host_volumes(&pod_spec()))
        .cloned()
        .collect::<BTreeSet<_>>();
    for hw in HARDWARE {
        let spec = hw.spec();
        let hosts = host_paths(&spec);
        let base_hosts = host_paths(&pod_spec());
        // The host paths are the base's (token-issuer's PKI files) and the certifier's, exactly.
        let added: BTreeMap<_, _> = hosts
            .iter()
            .filter(|(name, _)| !base_hosts.contains_key(*name))
            .collect();
        assert_eq!(
            added
                .values()
                .map(|v| v["hostPath"]["path"].as_str().expect("path"))
                .collect::<BTreeSet<_>>(),
            hw.host_paths.iter().copied().collect::<BTreeSet<_>>(),
            "{}",
            hw.dir
        );
        for (name, v) in &hosts {
            let path = v["hostPath"]["path"].as_str().expect("path");
            assert!(
                path != "/dev" && !path.starts_with("/dev/"),
                "{}: volume {name} is the host's {path}: devices come from the device plugin",
                hw.dir
            );
        }
        for c in array(&spec["containers"]) {
            let name = c["name"].as_str().expect("name");
            let devices = extended_resources(&c);
            let mounted: BTreeSet<String> = mount_names(&c)
                .intersection(&host_volumes(&spec))
                .cloned()
                .collect();
            assert!(c.get("volumeDevices").is_none(), "{name} has volumeDevices");
            match name {
                "certifier" => {
                    let wanted: BTreeMap<String, Value> = hw
                        .devices
                        .iter()
                        .map(|d| (format!("limits.{d}"), json!(1)))
                        .collect();
                    assert_eq!(devices, wanted, "{}: the certifier's devices", hw.dir);
                    let wanted: BTreeSet<String> = added.keys().map(|k| (*k).clone()).collect();
                    assert_eq!(mounted, wanted, "{}: the certifier's host paths", hw.dir);
                }
                "token-issuer" => {
                    assert!(
                        devices.is_empty(),
                        "{}: {name} requests {devices:?}",
                        hw.dir
                    );
                    assert_eq!(
                        mounted, token_issuer_host,
                        "{}: {name}'s host paths",
                        hw.dir
                    );
                }
                _ => {
                    assert!(
                        devices.is_empty(),
                        "{}: {name} requests {devices:?}",
                        hw.dir
                    );
                    assert!(mounted.is_empty(), "{}: {name} mounts {mounted:?}", hw.dir);
                }
            }
        }
    }
}

/// The TDX certifier gets configfs-tsm's report directory and nothing around it: not
/// /sys/kernel/config (other configfs subsystems), not /sys; writable, since a request is a
/// directory made there; at the path its `--tsm-report-dir` names.
#[test]
fn the_tdx_certifier_gets_exactly_the_report_directory() {
    let spec = QEMU_TDX.spec();
    let volume = array(&spec["volumes"])
        .into_iter()
        .find(|v| v["hostPath"]["path"] == TSM_REPORT_DIR)
        .expect("a volume of the report directory");
    assert_eq!(
        volume,
        json!({"name": "tsm-report", "hostPath": {"path": TSM_REPORT_DIR, "type": "Directory"}}),
        "the report directory must exist (configfs mounted, Linux 6.7 or later), never be created"
    );
    let certifier = QEMU_TDX.container("certifier");
    let mount = array(&certifier["volumeMounts"])
        .into_iter()
        .find(|m| m["name"] == "tsm-report")
        .expect("the certifier mounts it");
    assert_eq!(
        mount,
        json!({"name": "tsm-report", "mountPath": required_flag(&certifier, "tsm-report-dir")}),
        "writable, whole, no propagation, where --tsm-report-dir points"
    );
    // Not inside the container's /sys: read-only sysfs, with no configfs mounted below it.
    assert!(!required_flag(&certifier, "tsm-report-dir").starts_with("/sys/"));
    // No TPM: qemu-tdx documents are the quote alone.
    assert!(flag(&certifier, "tcti").is_none());
}

/// The SNP certifier reaches its report through the SEV guest device the plugin grants, never
/// configfs-tsm (whose entries only uid 0 could make): `--tsm-report-dir` names a path that can
/// exist in no container, and `--sev-guest-device` the device the plugin hands out.
#[test]
fn the_snp_certifier_asks_the_sev_guest_device_not_configfs() {
    let certifier = AWS_SEV_SNP.container("certifier");
    let tsm = required_flag(&certifier, "tsm-report-dir");
    // /dev/null is a character device in every container (the OCI runtime creates it), so
    // nothing lies below it and the certifier's "does the report directory exist" is false.
    assert!(tsm.starts_with("/dev/null/"), "{tsm}");
    assert!(!Path::new(&tsm).is_dir());
    for m in array(&certifier["volumeMounts"]) {
        let at = m["mountPath"].as_str().expect("mountPath");
        assert!(!tsm.starts_with(at), "{at} is mounted above {tsm}");
    }
    let plugin = sev_snp_plugin_container();
    let paths: BTreeMap<String, String> = devices_of(&plugin)
        .iter()
        .map(|d| {
            (
                resource_of(&plugin, d),
                d["groups"][0]["paths"][0]["path"]
                    .as_str()
                    .expect("path")
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        paths.get("squat.ai/sev-guest"),
        Some(&required_flag(&certifier, "sev-guest-device"))
    );
    assert_eq!(
        paths.get("squat.ai/tpmrm0").map(|p| format!("device:{p}")),
        Some(required_flag(&certifier, "tcti"))
    );
}

#[test]
fn the_hardware_certifiers_are_confined_and_hold_no_credential() {
    for hw in HARDWARE {
        let spec = hw.spec();
        let containers = array(&spec["containers"]);
        for c in &containers {
            if c["name"] == "certifier" && hw.uid == 0 {
                assert_confined(c);
            } else {
                assert_locked_down(c);
            }
        }
        let uids: BTreeSet<u64> = containers.iter().map(run_as_user).collect();
        assert_eq!(uids.len(), 4, "{}: each container has its own uid", hw.dir);
        let c = hw.container("certifier");
        let sc = &c["securityContext"];
        assert_eq!(run_as_user(&c), hw.uid, "{}", hw.dir);
        assert_eq!(sc["runAsGroup"], json!(hw.gid), "{}", hw.dir);
        assert_eq!(sc["runAsNonRoot"], Value::Bool(hw.uid != 0), "{}", hw.dir);
        assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}), "{}", hw.dir);
        assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false));
        assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true));
        assert!(sc.get("seLinuxOptions").is_none() && sc.get("appArmorProfile").is_none());
        // uid 0 owns the host's report directory only in the host's user namespace.
        assert!(spec.get("hostUsers").is_none(), "{}: hostUsers", hw.dir);
        assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
        assert!(spec["securityContext"].get("supplementalGroups").is_none());
        assert!(c.get("env").is_none() && c.get("envFrom").is_none());
        assert!(c.get("ports").is_none(), "the certifier listens on no port");
        // It mounts its socket's emptyDir and the host paths above: no Secret, token or ConfigMap.
        for volume in mounted_volumes(&spec, &c) {
            let kind = keys(&volume);
            assert!(
                kind == names(&["name", "emptyDir"]) || kind == names(&["name", "hostPath"]),
                "{}: the certifier mounts {volume}",
                hw.dir
            );
        }
    }
}

/// The container's flags (args and flag variables), sorted, with the value of each of `flags`
/// (`--flag=value`) blanked.
fn args_without(c: &Value, flags: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = flags_of(c)
        .into_iter()
        .map(
            |a| match flags.iter().find(|f| a.starts_with(&format!("--{f}="))) {
                Some(f) => format!("--{f}=…"),
                None => a,
            },
        )
        .collect();
    all.sort();
    all
}

#[test]
fn the_hardware_overlays_change_only_the_variant_and_the_certifiers_devices() {
    let attested = spec();
    for hw in HARDWARE {
        let overlay = hw.spec();
        for (key, value) in attested.as_object().expect("a pod spec") {
            if key != "containers" && key != "volumes" {
                assert_eq!(&overlay[key], value, "{} changes the pod's {key}", hw.dir);
            }
        }
        let volumes = array(&overlay["volumes"]);
        for v in array(&attested["volumes"]) {
            assert!(volumes.contains(&v), "{} changes {}", hw.dir, v["name"]);
        }
        assert_eq!(
            volumes.len(),
            array(&attested["volumes"]).len() + hw.host_paths.len(),
            "{} adds volumes beyond the certifier's host paths",
            hw.dir
        );
        for name in ["join-core", "token-issuer"] {
            assert_eq!(
                container_of(&overlay, name),
                container_of(&attested, name),
                "{} changes {name}",
                hw.dir
            );
        }
        // attest-proxy: the variant, and the certifier's uid; the rest as it was.
        let proxy = container_of(&overlay, "attest-proxy");
        let was = container_of(&attested, "attest-proxy");
        assert_eq!(required_flag(&proxy, "variant"), hw.variant);
        assert_eq!(required_flag(&proxy, "certifier-uid"), hw.uid.to_string());
        let blank = ["variant", "certifier-uid"];
        assert_eq!(
            args_without(&proxy, &blank),
            args_without(&was, &blank),
            "{}",
            hw.dir
        );
        let strip = |mut c: Value| {
            let c_map = c.as_object_mut().expect("a container");
            c_map.remove("args");
            c_map.remove("env");
            c
        };
        assert_eq!(strip(proxy), strip(was), "{} changes attest-proxy", hw.dir);

        // The certifier: its variant and hardware flags, devices, uid and host paths; its image,
        // command, socket, peer, budget and lockdown as they were.
        let certifier = container_of(&overlay, "certifier");
        let was = container_of(&attested, "certifier");
        assert_eq!(required_flag(&certifier, "variant"), hw.variant);
        let hardware_flags = ["variant", "tcti", "tsm-report-dir", "sev-guest-device"];
        let common_args = |c: &Value| -> Vec<String> {
            args(c)
                .into_iter()
                .filter(|a| {
                    !hardware_flags
                        .iter()
                        .any(|f| a.starts_with(&format!("--{f}=")))
                })
                .collect()
        };
        assert_eq!(common_args(&certifier), common_args(&was), "{}", hw.dir);
        let mut certifier = certifier.as_object().expect("a container").clone();
        let mut was = was.as_object().expect("a container").clone();
        for c in [&mut certifier, &mut was] {
            c.remove("args");
            let limits = c["resources"]["limits"].as_object_mut().expect("limits");
            limits.retain(|name, _| ORDINARY_RESOURCES.contains(&name.as_str()));
            let sc = c["securityContext"]
                .as_object_mut()
                .expect("securityContext");
            for id in ["runAsUser", "runAsGroup", "runAsNonRoot"] {
                sc.remove(id);
            }
            let mounts = c["volumeMounts"].as_array_mut().expect("volumeMounts");
            mounts.retain(|m| m["name"] == "certifier-socket");
        }
        assert_eq!(
            certifier, was,
            "{} changes the certifier beyond its hardware",
            hw.dir
        );
    }
}

#[test]
fn every_argument_of_the_hardware_overlays_is_a_flag_the_binary_accepts() {
    for hw in HARDWARE {
        assert_args_parse(&array(&hw.spec()["containers"]));
    }
}

#[test]
fn the_socket_ends_agree_in_the_hardware_overlays() {
    for hw in HARDWARE {
        assert_socket_ends_agree(&hw.spec());
    }
}

fn sev_snp_plugin_dir() -> PathBuf {
    deploy_dir().join("examples/sev-snp-device-plugin")
}

/// The device plugin's pod as deploy/examples/sev-snp-device-plugin renders it.
fn sev_snp_plugin_pod_spec() -> Value {
    merge_pod_patch(
        plugin_pod_spec(),
        &sev_snp_plugin_dir().join("sev-guest.yaml"),
    )
}

fn sev_snp_plugin_container() -> Value {
    let containers = array(&sev_snp_plugin_pod_spec()["containers"]);
    assert_eq!(containers.len(), 1, "the plugin pod runs one container");
    containers[0].clone()
}

/// One plugin, one more device: the SEV guest device on the TPM's terms, its host node
/// read-only; every other privilege as the TPM plugin declares it.
#[test]
fn the_sev_snp_device_plugin_adds_the_sev_guest_device_and_nothing_else() {
    let k = &read_docs(&sev_snp_plugin_dir().join("kustomization.yaml"))[0];
    assert_eq!(
        keys(k),
        names(&["apiVersion", "kind", "resources", "patches"])
    );
    assert_eq!(k["resources"], json!(["../tpm-device-plugin"]));
    assert_eq!(
        k["patches"],
        json!([{"path": "sev-guest.yaml",
                "target": {"kind": "DaemonSet", "name": plugin_object("DaemonSet")["metadata"]["name"]}}])
    );

    let base = plugin_pod_spec();
    let spec = sev_snp_plugin_pod_spec();
    for (key, value) in base.as_object().expect("a pod spec") {
        if key != "containers" && key != "volumes" {
            assert_eq!(
                &spec[key], value,
                "the overlay changes the plugin pod's {key}"
            );
        }
    }
    let sev = json!({"name": "sev-guest", "groups": [{"count": 1, "paths": [
        {"path": "/dev/sev-guest", "permissions": "rw"}
    ]}]});
    let c = sev_snp_plugin_container();
    assert_eq!(devices_of(&c), vec![plugin_device(), sev]);
    let mut volumes = array(&base["volumes"]);
    volumes.push(json!({"name": "sev-guest",
                        "hostPath": {"path": "/dev/sev-guest", "type": "CharDevice"}}));
    assert_eq!(array(&spec["volumes"]), volumes);
    let mut mounts = array(&plugin_container()["volumeMounts"]);
    mounts.push(json!({"name": "sev-guest", "mountPath": "/dev/sev-guest", "readOnly": true}));
    assert_eq!(array(&c["volumeMounts"]), mounts);
    // The args are the TPM plugin's with the second --device; nothing else of the container moves.
    let mut args = args(&c);
    let at = args
        .iter()
        .rposition(|a| a == "--device")
        .expect("--device");
    args.drain(at..at + 2);
    assert_eq!(args, self::args(&plugin_container()));
    let strip = |c: &Value| {
        let mut c = c.as_object().expect("a container").clone();
        c.remove("args");
        c.remove("volumeMounts");
        c
    };
    assert_eq!(strip(&c), strip(&plugin_container()));

    // What it advertises is what the SNP certifier requests.
    let advertised: BTreeSet<String> = devices_of(&c).iter().map(|d| resource_of(&c, d)).collect();
    assert_eq!(
        advertised,
        AWS_SEV_SNP
            .devices
            .iter()
            .map(|d| (*d).to_owned())
            .collect()
    );
}
