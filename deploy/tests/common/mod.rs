//! Reading the manifests: every YAML document of every file the base kustomization lists
//! (`deploy/base`, which `kubectl apply -k deploy/` applies and the overlays build on).

#![allow(dead_code)] // Each test binary uses a different part.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The service account token-issuer runs as, as RBAC and the admission policy name it.
pub const TOKEN_ISSUER_USER: &str = "system:serviceaccount:kube-system:join-token-issuer";

/// `deploy/`: the crate, the Dockerfile, the thin kustomization and `examples/`.
pub fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `deploy/base/`: the manifests and the kustomization every entry point builds on.
pub fn base_dir() -> PathBuf {
    PathBuf::from(deploy::MANIFEST_DIR)
}

/// Parses a YAML file into JSON values, one per document (empty documents skipped).
pub fn read_docs(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
            value
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The base's kustomization (`deploy/base/kustomization.yaml`).
pub fn kustomization() -> Value {
    let docs = read_docs(&base_dir().join("kustomization.yaml"));
    assert_eq!(docs.len(), 1, "kustomization.yaml holds one document");
    docs.into_iter().next().expect("one document")
}

/// The files `resources:` lists, in order.
pub fn resource_files() -> Vec<String> {
    kustomization()["resources"]
        .as_array()
        .expect("kustomization has resources")
        .iter()
        .map(|r| r.as_str().expect("resource is a path").to_owned())
        .collect()
}

/// Every object `kubectl apply -k deploy/` creates.
pub fn objects() -> Vec<Value> {
    resource_files()
        .iter()
        .flat_map(|f| read_docs(&base_dir().join(f)))
        .collect()
}

pub fn objects_of(kind: &str) -> Vec<Value> {
    objects()
        .into_iter()
        .filter(|o| o["kind"] == kind)
        .collect()
}

pub fn one_of(kind: &str) -> Value {
    let mut all = objects_of(kind);
    assert_eq!(all.len(), 1, "expected exactly one {kind}");
    all.remove(0)
}

pub fn daemonset() -> Value {
    one_of("DaemonSet")
}

pub fn pod_spec() -> Value {
    daemonset()["spec"]["template"]["spec"].clone()
}

pub fn containers() -> Vec<Value> {
    pod_spec()["containers"]
        .as_array()
        .expect("containers")
        .clone()
}

pub fn container(name: &str) -> Value {
    containers()
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

pub fn str_set<'a>(values: impl IntoIterator<Item = &'a Value>) -> BTreeSet<String> {
    values
        .into_iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

pub fn array(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// The container's args as strings.
pub fn args(c: &Value) -> Vec<String> {
    array(&c["args"])
        .iter()
        .map(|a| a.as_str().expect("args are strings").to_owned())
        .collect()
}

/// The clap command of the binary one of the service's containers runs, by container name;
/// `None` for a container of another program (a device plugin).
pub fn command_of(container: &str) -> Option<clap::Command> {
    use clap::CommandFactory;
    Some(match container {
        "attest-proxy" => attest_proxy::Config::command(),
        "join-core" => join_core::Config::command(),
        "token-issuer" => token_issuer::Config::command(),
        "gce-identity" => gce_identity::Config::command(),
        "ec2-identity" => ec2_identity::Config::command(),
        "certifier" => certifier::Config::command(),
        _ => return None,
    })
}

/// The container's `env` entries that set one of its binary's flags, as `(long name, value)`:
/// the binary reads each such variable as that flag. Panics on an entry naming a flag's
/// variable without a literal value (a flag's value never comes from a Secret or a field).
pub fn env_flags(c: &Value) -> Vec<(String, String)> {
    let Some(command) = command_of(c["name"].as_str().expect("name")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in array(&c["env"]) {
        let name = e["name"].as_str().expect("env name");
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|v| v == name))
        else {
            continue;
        };
        let value = e["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: {name} sets a flag without a literal value", c["name"]));
        let long = arg.get_long().expect("every flag is long");
        found.push((long.to_owned(), value.to_owned()));
    }
    found
}

/// Every flag a container's binary is given: its args, then each `env` entry that sets a flag,
/// as `--flag=value`.
pub fn flags_of(c: &Value) -> Vec<String> {
    let mut flags = args(c);
    flags.extend(
        env_flags(c)
            .into_iter()
            .map(|(flag, value)| format!("--{flag}={value}")),
    );
    flags
}

/// The value of `--flag` for a container: from its args (`--flag=value` or `--flag value`) or
/// from the `env` variable the binary reads as that flag; panics if it is given twice.
pub fn flag(c: &Value, name: &str) -> Option<String> {
    let args = args(c);
    let long = format!("--{name}");
    let mut found = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            found.push(v.to_owned());
        } else if *a == long {
            found.push(it.next().cloned().unwrap_or_default());
        }
    }
    found.extend(
        env_flags(c)
            .into_iter()
            .filter(|(flag, _)| flag == name)
            .map(|(_, value)| value),
    );
    assert!(found.len() <= 1, "{long} given more than once: {found:?}");
    found.pop()
}

/// A flag that must be present.
pub fn required_flag(c: &Value, name: &str) -> String {
    flag(c, name).unwrap_or_else(|| panic!("container {} lacks --{name}", c["name"]))
}

/// The pod volume named `name`.
pub fn volume(name: &str) -> Value {
    array(&pod_spec()["volumes"])
        .into_iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

/// Names of the containers mounting volume `name`.
pub fn mounted_by(name: &str) -> BTreeSet<String> {
    containers()
        .iter()
        .filter(|c| array(&c["volumeMounts"]).iter().any(|m| m["name"] == name))
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

pub fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

pub fn run_as_user(c: &Value) -> u64 {
    c["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap_or_else(|| panic!("container {} sets no runAsUser", c["name"]))
}

/// A container runs unprivileged: not root, read-only root filesystem, no privilege escalation,
/// no capabilities, the runtime's seccomp profile, no host ports.
pub fn assert_locked_down(c: &Value) {
    let name = &c["name"];
    assert_eq!(
        c["securityContext"]["runAsNonRoot"],
        Value::Bool(true),
        "{name}: runAsNonRoot"
    );
    assert_ne!(run_as_user(c), 0, "{name} runs as root");
    assert_confined(c);
}

/// Everything [`assert_locked_down`] asks but a non-root uid: not privileged, not group root,
/// read-only root filesystem, no privilege escalation, no capabilities, the runtime's seccomp
/// profile, no host ports. What a container running as uid 0 must still hold to.
pub fn assert_confined(c: &Value) {
    let name = &c["name"];
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], Value::Bool(true), "{name} is privileged");
    assert!(
        sc["runAsGroup"].as_u64().is_some_and(|gid| gid != 0),
        "{name} runs with group root, or the image's group"
    );
    assert_eq!(
        sc["readOnlyRootFilesystem"],
        Value::Bool(true),
        "{name}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc["allowPrivilegeEscalation"],
        Value::Bool(false),
        "{name}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc["seccompProfile"]["type"], "RuntimeDefault",
        "{name}: seccomp"
    );
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{name} drops all capabilities"
    );
    assert!(
        array(&sc["capabilities"]["add"]).is_empty(),
        "{name} adds capabilities"
    );
    assert!(sc.get("procMount").is_none(), "{name} sets procMount");
    for p in array(&c["ports"]) {
        assert!(p.get("hostPort").is_none(), "{name} binds a host port");
    }
}

/// Every container's args and flag variables parse as its binary's flags: the command's binary
/// name, then the args, as the kubelet passes them, with each `env` entry that sets a flag (an
/// unknown or misspelt flag would crash-loop the pod).
pub fn assert_args_parse(containers: &[Value]) {
    for c in containers {
        let name = c["name"].as_str().expect("name").to_owned();
        let from_env = env_flags(c)
            .into_iter()
            .map(|(flag, value)| format!("--{flag}={value}"));
        let argv: Vec<String> = std::iter::once(name.clone())
            .chain(args(c))
            .chain(from_env)
            .collect();
        let command = command_of(&name).unwrap_or_else(|| panic!("unexpected container {name}"));
        if let Err(error) = command.try_get_matches_from(argv) {
            panic!("{name}: {error}");
        }
    }
}

/// Every `env` entry of the container sets one of its binary's flags to a literal value: no
/// Secret, no field of the pod, nothing else reaches it through its environment.
pub fn assert_env_only_sets_flags(c: &Value) {
    assert!(c.get("envFrom").is_none(), "{}: envFrom", c["name"]);
    let flags = env_flags(c);
    assert_eq!(
        flags.len(),
        array(&c["env"]).len(),
        "{}: env entries that set no flag: {:?}",
        c["name"],
        c["env"]
    );
}

/// An `images:` entry pins its image by digest, not by a tag a registry can move.
pub fn assert_pinned_by_digest(image: &Value) {
    assert!(
        image.get("newTag").is_none(),
        "the image is pinned by digest, not by a tag a registry can move: {image:?}"
    );
    let digest = image["digest"].as_str().expect("the image has a digest");
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{digest} is a sha256 digest"
    );
}

/// The `images:` entries of the overlay at `overlay` that pin the containers its DaemonSet patch
/// `patch` adds or sets an image on, each pinned by digest. kustomize runs a kustomization's
/// image rewrite on what that kustomization has loaded when it runs, so the base's `images:` never
/// reaches a container an overlay's patch adds: the overlay must pin it itself, or the kubelet
/// pulls the bare name (Docker Hub's `library/<name>:latest`).
pub fn overlay_image_pins(overlay: &Path, patch: &Path) -> Vec<Value> {
    let k = &read_docs(&overlay.join("kustomization.yaml"))[0];
    let pins = array(&k["images"]);
    let patch = &read_docs(patch)[0]["spec"]["template"]["spec"];
    let mut used = Vec::new();
    for c in array(&patch["containers"])
        .iter()
        .chain(array(&patch["initContainers"]).iter())
    {
        let Some(image) = c.get("image") else {
            continue;
        };
        let pin = pins
            .iter()
            .find(|p| p["name"] == *image)
            .unwrap_or_else(|| {
                panic!(
                    "container {} runs {image}, which {}'s images: does not pin",
                    c["name"],
                    overlay.display()
                )
            });
        assert_pinned_by_digest(pin);
        used.push(pin.clone());
    }
    used
}

/// kustomize's strategic merge of two maps: keys merged recursively, a null removes the key,
/// anything else (lists of strings such as `args` among them) replaces.
fn merge_map(into: &mut Value, patch: &Value) {
    let (Some(into), Some(patch)) = (into.as_object_mut(), patch.as_object()) else {
        *into = patch.clone();
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            into.remove(key);
        } else if value.is_object() && into.get(key).is_some_and(Value::is_object) {
            merge_map(into.get_mut(key).expect("present"), value);
        } else {
            into.insert(key.clone(), value.clone());
        }
    }
}

fn by_name(list: &mut Vec<Value>, item: Value) {
    match list.iter_mut().find(|x| x["name"] == item["name"]) {
        Some(existing) => {
            for (key, value) in item.as_object().expect("an object") {
                if key == "volumeMounts" {
                    let mounts = existing[key].as_array_mut().expect("volumeMounts");
                    mounts.extend(array(value));
                } else if key == "env" {
                    let mut env = array(&existing[key]);
                    for variable in array(value) {
                        by_name(&mut env, variable);
                    }
                    existing[key] = Value::Array(env);
                } else if value.is_object() {
                    merge_map(&mut existing[key], value);
                } else {
                    existing[key] = value.clone();
                }
            }
        }
        None => list.push(item),
    }
}

/// The base pod spec with the DaemonSet patch at `patch` merged as kustomize's strategic merge
/// does (containers, volumes and `env` entries by name, `args` replaced, `volumeMounts` appended, maps such as
/// `resources` merged key by key, a null removing a key).
pub fn merged_pod_spec(patch: &Path) -> Value {
    merge_pod_patch(pod_spec(), patch)
}

/// `spec`, a pod spec, with the pod template of the workload patch at `patch` merged into it
/// (see [`merged_pod_spec`]): how an overlay of an overlay is read.
pub fn merge_pod_patch(mut spec: Value, patch: &Path) -> Value {
    let patch = read_docs(patch);
    assert_eq!(patch.len(), 1);
    let patch = &patch[0]["spec"]["template"]["spec"];
    let mut containers = array(&spec["containers"]);
    for c in array(&patch["containers"]) {
        by_name(&mut containers, c);
    }
    let mut volumes = array(&spec["volumes"]);
    for v in array(&patch["volumes"]) {
        by_name(&mut volumes, v);
    }
    spec["containers"] = Value::Array(containers);
    spec["volumes"] = Value::Array(volumes);
    spec
}

/// The example attestation config `examples/<name>` with every placeholder measurement replaced
/// by 32 bytes of hex.
pub fn measured_example(name: &str) -> Value {
    let text = std::fs::read_to_string(deploy_dir().join("examples").join(name))
        .expect("the example config");
    let mut config: Value = serde_json::from_str(&text).expect("JSON");
    for (_, m) in config["measurements"]
        .as_object_mut()
        .expect("measurements")
        .iter_mut()
    {
        m["expected"] = Value::String("ab".repeat(32));
    }
    config
}
