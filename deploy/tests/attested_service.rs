//! deploy/examples/attested-service: the overlay that adds the certifier, the device plugin that
//! grants it the TPM, and the certifier's image. Only the certifier reaches the TPM device, as a
//! device plugin resource (no host path under /dev, no privilege); attest-proxy keeps no device
//! and stays as the base has it; the two ends of the certifier's socket agree on path and uids;
//! the plugin has exactly the privileges it declares, in a namespace of its own; the certifier's
//! image provides every library the built certifier loads, and runs as non-root.

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
    for m in array(&c["volumeMounts"]) {
        let volume = array(&spec["volumes"])
            .into_iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume {}", m["name"]));
        assert_eq!(
            keys(&volume),
            names(&["name", "emptyDir"]),
            "the certifier mounts {}",
            m["name"]
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
    let added: Vec<String> = args(&proxy)
        .into_iter()
        .filter(|a| !args(&base_proxy).contains(a))
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
        c.remove("volumeMounts");
    }
    assert_eq!(
        proxy, base_proxy,
        "the overlay changes attest-proxy beyond its args and mounts"
    );
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

/// The plugin's one device type, as its `--device` flag configures it (squat's generic device
/// plugin reads the flag's value as YAML).
fn plugin_device() -> Value {
    let args = args(&plugin_container());
    let values: Vec<&String> = args
        .iter()
        .zip(args.iter().skip(1))
        .filter(|(flag, _)| *flag == "--device")
        .map(|(_, value)| value)
        .collect();
    assert_eq!(values.len(), 1, "the plugin exposes one device type");
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--device=") || a.starts_with("--config")),
        "device types come from the one --device flag"
    );
    serde_yaml::from_str(values[0]).expect("--device is YAML")
}

/// The extended resource the plugin advertises: `<domain>/<name>`.
fn plugin_resource() -> String {
    let domain = flag(&plugin_container(), "domain").unwrap_or_else(|| "squat.ai".to_owned());
    let name = plugin_device()["name"]
        .as_str()
        .expect("the device has a name")
        .to_owned();
    format!("{domain}/{name}")
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
