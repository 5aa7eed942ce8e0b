//! Every kustomization under deploy/ (the base, each example overlay and, through them, each
//! component) renders with kubectl's kustomize and applies to the real kube-apiserver in a
//! server-side dry run, with no error and no warning: the API server validates every object as
//! it would on `kubectl apply -k`, admission included, and stores nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testsupport::control_plane::{ControlPlane, Options, Pki, bin_dir_control_plane};

fn deploy_dir() -> PathBuf {
    Path::new(deploy::MANIFEST_DIR)
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap()
}

/// Every directory under `dir` holding a kustomization.yaml, with its kind.
fn kustomizations(dir: &Path, found: &mut Vec<(PathBuf, serde_json::Value)>) {
    let file = dir.join("kustomization.yaml");
    if file.is_file() {
        let text = std::fs::read_to_string(&file).unwrap();
        let value: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        found.push((dir.to_path_buf(), value));
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            kustomizations(&path, found);
        }
    }
}

/// `kubectl` with the admin kubeconfig.
fn kubectl(kubeconfig: &Path) -> Command {
    let mut command = Command::new(bin_dir_control_plane().unwrap().join("kubectl"));
    command.env("KUBECONFIG", kubeconfig);
    command
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kustomization_applies_to_the_real_api_server_in_a_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&dir.path().join("pki")).unwrap();
    let plane = ControlPlane::start(&pki, dir.path(), &Options::default())
        .await
        .unwrap();
    // What the manifests build on: the node operator's CRDs, as in a Constellation cluster.
    plane.prepare_constellation([]).await.unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    std::fs::write(&kubeconfig, plane.admin_kubeconfig()).unwrap();

    let mut found = Vec::new();
    kustomizations(&deploy_dir(), &mut found);
    let (components, roots): (Vec<_>, Vec<_>) = found
        .into_iter()
        .partition(|(_, k)| k["kind"] == "Component");
    assert!(roots.len() > 1 && !components.is_empty(), "{roots:?}");

    let mut used = BTreeSet::new();
    for (root, kustomization) in &roots {
        for component in kustomization["components"].as_array().into_iter().flatten() {
            used.insert(
                root.join(component.as_str().unwrap())
                    .canonicalize()
                    .unwrap(),
            );
        }
        let rendered = kubectl(&kubeconfig)
            .arg("kustomize")
            .arg(root)
            .output()
            .unwrap();
        assert!(
            rendered.status.success(),
            "kubectl kustomize {}: {}",
            root.display(),
            String::from_utf8_lossy(&rendered.stderr)
        );
        // A namespace an overlay brings must exist for the dry run of what goes into it (a dry
        // run creates nothing): those alone are applied for real first.
        for document in serde_yaml::Deserializer::from_slice(&rendered.stdout) {
            let object: serde_json::Value = serde::Deserialize::deserialize(document).unwrap();
            if object["kind"] == "Namespace" {
                plane.apply(object).await.unwrap();
            }
        }
        let mut apply = kubectl(&kubeconfig)
            .args([
                "apply",
                "--server-side",
                "--dry-run=server",
                "--field-manager=joinservice-dry-run",
                "-f",
                "-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        apply
            .stdin
            .take()
            .unwrap()
            .write_all(&rendered.stdout)
            .unwrap();
        let applied = apply.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&applied.stderr);
        assert!(
            applied.status.success(),
            "{}: the API server refused it:\n{stderr}",
            root.display()
        );
        assert!(
            !stderr.to_ascii_lowercase().contains("warning"),
            "{}: the API server warned:\n{stderr}",
            root.display()
        );
        let stdout = String::from_utf8_lossy(&applied.stdout);
        assert!(
            stdout.contains("(server dry run)"),
            "{}: {stdout}",
            root.display()
        );
    }
    // Components a used component brings are used too.
    loop {
        let before = used.len();
        for (component, kustomization) in &components {
            if used.contains(&component.canonicalize().unwrap()) {
                for inner in kustomization["components"].as_array().into_iter().flatten() {
                    used.insert(
                        component
                            .join(inner.as_str().unwrap())
                            .canonicalize()
                            .unwrap(),
                    );
                }
            }
        }
        if used.len() == before {
            break;
        }
    }
    for (component, _) in &components {
        assert!(
            used.contains(&component.canonicalize().unwrap()),
            "{} is applied by no kustomization, so this test never tried it",
            component.display()
        );
    }
}
