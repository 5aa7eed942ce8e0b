//! The software key must never be reachable from the service: none of its binaries may link
//! this crate, directly or through another crate (dev-dependencies of tests are fine).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

/// The host's target triple: the metadata is resolved for it alone, so every crate it names has
/// been downloaded by the build that made this test (a full resolve also wants the crates of
/// other platforms, which an offline machine that only built for its own does not have).
fn host_triple() -> String {
    let out = std::process::Command::new(std::env::var("RUSTC").unwrap_or("rustc".to_owned()))
        .arg("-vV")
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

#[test]
fn no_service_crate_depends_on_soft_issuer() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host_triple(),
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // Package id → ids of its normal and build dependencies.
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].as_str() != Some("dev"))
            })
            .map(|d| d["pkg"].as_str().unwrap().to_owned())
            .collect();
        graph.insert(node["id"].as_str().unwrap().to_owned(), deps);
    }
    let id_of = |name: &str| -> String {
        meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no package {name}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let soft = id_of("soft-issuer");
    for service in [
        "attest-proxy",
        "join-core",
        "token-issuer",
        "gce-identity",
        "certifier",
        "atls",
        "attestation",
    ] {
        let mut seen = BTreeSet::new();
        let mut todo = vec![id_of(service)];
        while let Some(id) = todo.pop() {
            if seen.insert(id.clone()) {
                todo.extend(graph[&id].iter().cloned());
            }
        }
        assert!(!seen.contains(&soft), "{service} links soft-issuer");
        assert!(
            seen.len() > 1,
            "{service} has no dependencies: the graph is wrong"
        );
    }
}
