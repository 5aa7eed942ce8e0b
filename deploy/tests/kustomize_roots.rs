//! Every kustomization under deploy/ loads with kustomize's own rules, so the `kubectl apply -k`
//! commands the docs give work as written. No kubectl here: the rules are checked on the files.
//!
//! - A directory in `resources:` (or `bases:`, `components:`) is a kustomization root of its own.
//!   kustomize refuses one that equals or contains a root already on the path that led to it
//!   ("cycle detected: candidate root … contains visited root …"), so an overlay cannot live
//!   inside the folder of the base it builds on.
//! - A file (resource or patch) must lie inside its kustomization's root (kubectl's default load
//!   restrictor), and every path named must exist.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

/// The names kustomize accepts for a kustomization file, in the order it looks for them.
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Keys whose entries are resources: files or other kustomization roots.
const ROOT_KEYS: [&str; 3] = ["resources", "bases", "components"];

fn kustomization_file(dir: &Path) -> Option<PathBuf> {
    KUSTOMIZATION_FILES
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
}

/// Every directory under `dir` (itself included) holding a kustomization.
fn kustomization_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    if kustomization_file(dir).is_some() {
        found.push(dir.to_owned());
    }
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            kustomization_dirs(&path, found);
        }
    }
}

fn strings(k: &Value, key: &str, file: &Path, problems: &mut Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    for entry in array(&k[key]) {
        match entry.as_str() {
            Some(s) => out.push(s.to_owned()),
            None => problems.push(format!(
                "{}: {key} entry {entry} is not a path",
                file.display()
            )),
        }
    }
    out
}

/// The patch files a kustomization names: `patches[].path` (a patch may be inline instead),
/// the older `patchesStrategicMerge[]` and `patchesJson6902[].path`.
fn patch_files(k: &Value, file: &Path, problems: &mut Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = ["patches", "patchesJson6902"]
        .iter()
        .flat_map(|key| array(&k[*key]))
        .filter_map(|p| p["path"].as_str().map(str::to_owned))
        .collect();
    out.extend(strings(k, "patchesStrategicMerge", file, problems));
    out
}

/// Loads the kustomization rooted at `root` as kustomize does, following every directory it
/// names; `visited` holds the roots that led here. Each rule broken goes into `problems`.
fn check_root(root: &Path, visited: &[PathBuf], problems: &mut Vec<String>) {
    let Some(file) = kustomization_file(root) else {
        problems.push(format!("{} holds no kustomization", root.display()));
        return;
    };
    let docs = read_docs(&file);
    let [k] = docs.as_slice() else {
        problems.push(format!("{}: not exactly one YAML document", file.display()));
        return;
    };
    let mut chain = visited.to_vec();
    chain.push(root.to_owned());

    for key in ROOT_KEYS {
        for entry in strings(k, key, &file, problems) {
            let Ok(target) = root.join(&entry).canonicalize() else {
                problems.push(format!(
                    "{}: {key} entry {entry} does not exist",
                    file.display()
                ));
                continue;
            };
            if target.is_dir() {
                if let Some(seen) = chain.iter().find(|seen| seen.starts_with(&target)) {
                    problems.push(format!(
                        "{}: {key} entry {entry} is {}, which contains {}, a root already \
                         loaded on the way here: kustomize reports \"cycle detected\"",
                        file.display(),
                        target.display(),
                        seen.display()
                    ));
                    continue;
                }
                check_root(&target, &chain, problems);
            } else if !target.starts_with(root) {
                problems.push(format!(
                    "{}: {key} entry {entry} lies outside {}: kustomize loads files only from \
                     inside the kustomization's root",
                    file.display(),
                    root.display()
                ));
            }
        }
    }
    for entry in patch_files(k, &file, problems) {
        match root.join(&entry).canonicalize() {
            Ok(target) if target.is_file() && target.starts_with(root) => {}
            Ok(target) => problems.push(format!(
                "{}: patch {entry} is {}, not a file inside {}",
                file.display(),
                target.display(),
                root.display()
            )),
            Err(_) => problems.push(format!("{}: patch {entry} does not exist", file.display())),
        }
    }
}

/// What kustomize would refuse in any kustomization under `dir`.
fn problems_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().expect("the directory exists");
    let mut roots = Vec::new();
    kustomization_dirs(&dir, &mut roots);
    let mut problems = Vec::new();
    for root in roots {
        check_root(&root, &[], &mut problems);
    }
    problems
}

#[test]
fn every_kustomization_under_deploy_loads_without_a_cycle_or_a_missing_path() {
    let deploy = deploy_dir().canonicalize().expect("deploy/");
    let mut roots = Vec::new();
    kustomization_dirs(&deploy, &mut roots);
    let roots: BTreeSet<String> = roots
        .iter()
        .map(|r| {
            r.strip_prefix(&deploy)
                .expect("under deploy/")
                .display()
                .to_string()
        })
        .collect();
    // The entry points the docs name are among what was checked.
    for expected in [
        "",
        "base",
        "components/aws-sev-snp",
        "components/azure-sev-snp",
        "components/qemu-tdx",
        "components/azure-tdx",
        "components/sev-snp-collateral",
        "components/tdx-collateral",
        "examples/aws-sev-snp",
        "examples/azure-sev-snp",
        "examples/qemu-tdx",
        "examples/azure-tdx",
        "examples/attested-service",
        "examples/attested-service-aws-sev-snp",
        "examples/attested-service-qemu-tdx",
        "examples/gcp-sev-snp",
        "examples/sev-snp-device-plugin",
        "examples/tpm-device-plugin",
    ] {
        assert!(
            roots.contains(expected),
            "no kustomization at deploy/{expected}: {roots:?}"
        );
    }
    let problems = problems_under(&deploy);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `kubectl apply -k deploy/` applies the base and nothing else, so what the tests read from
/// deploy/base is what gets applied.
#[test]
fn the_top_kustomization_is_only_the_base() {
    let docs = read_docs(&deploy_dir().join("kustomization.yaml"));
    assert_eq!(docs.len(), 1);
    let keys: BTreeSet<String> = docs[0]
        .as_object()
        .expect("a mapping")
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, names(&["apiVersion", "kind", "resources"]));
    assert_eq!(docs[0]["resources"], serde_json::json!(["base"]));
    assert_eq!(docs[0]["kind"], "Kustomization");
    for entry in std::fs::read_dir(deploy_dir()).expect("deploy/") {
        let name = entry.expect("entry").file_name();
        let name = name.to_str().expect("utf-8");
        assert!(
            !(name.ends_with(".yaml") || name.ends_with(".yml")) || name == "kustomization.yaml",
            "deploy/{name}: manifests belong in deploy/base (or an overlay in examples/)"
        );
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

const OVERLAY: &str = "resources:\n  - ../..\npatches:\n  - path: patch.yaml\n";

/// The layout the repository had: overlays inside the base's folder, as `../..`. kustomize
/// refuses it, and so must the check.
#[test]
fn an_overlay_inside_its_base_is_a_cycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir.path().join("kustomization.yaml"),
        "resources:\n  - a.yaml\n",
    );
    write(&dir.path().join("a.yaml"), "kind: ConfigMap\n");
    write(&dir.path().join("examples/x/kustomization.yaml"), OVERLAY);
    write(
        &dir.path().join("examples/x/patch.yaml"),
        "kind: ConfigMap\n",
    );
    let problems = problems_under(dir.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("examples/x/kustomization.yaml: resources entry ../..")
            && problems[0].contains("cycle detected"),
        "{problems:?}"
    );

    // The fix: the base in a folder of its own, beside the overlay.
    write(
        &dir.path().join("kustomization.yaml"),
        "resources:\n  - base\n",
    );
    std::fs::remove_file(dir.path().join("a.yaml")).expect("rm");
    write(&dir.path().join("base/a.yaml"), "kind: ConfigMap\n");
    write(
        &dir.path().join("base/kustomization.yaml"),
        "resources:\n  - a.yaml\n",
    );
    write(
        &dir.path().join("examples/x/kustomization.yaml"),
        &OVERLAY.replace("../..", "../../base"),
    );
    assert_eq!(problems_under(dir.path()), Vec::<String>::new());
}

/// A root that leads back to one on its own path (a base naming its overlay) is a cycle too,
/// not just an overlay naming its parent.
#[test]
fn a_cycle_through_two_roots_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir.path().join("base/kustomization.yaml"),
        "resources:\n  - ../overlay\n",
    );
    write(
        &dir.path().join("overlay/kustomization.yaml"),
        "resources:\n  - ../base\n",
    );
    let problems = problems_under(dir.path());
    assert!(!problems.is_empty());
    assert!(
        problems.iter().all(|p| p.contains("cycle detected")),
        "{problems:?}"
    );
}

#[test]
fn a_missing_or_outside_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("shared.yaml"), "kind: ConfigMap\n");
    write(
        &dir.path().join("k/kustomization.yaml"),
        "resources:\n  - gone.yaml\n  - ../shared.yaml\n  - ../nowhere\n\
         patches:\n  - path: p.yaml\n",
    );
    let problems = problems_under(dir.path());
    let expected = [
        "resources entry gone.yaml does not exist",
        "resources entry ../shared.yaml lies outside",
        "resources entry ../nowhere does not exist",
        "patch p.yaml does not exist",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:?}");
    for (problem, expected) in problems.iter().zip(expected) {
        assert!(problem.contains(expected), "{problem} lacks {expected}");
    }
}
