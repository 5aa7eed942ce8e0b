//! The `kube-standin` binary as a real process: prints its URL, writes a usable kubeconfig.

#![allow(clippy::unwrap_used)] // Test code; a panic is the failure report.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::test]
async fn binary_serves_and_writes_kubeconfig() {
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-standin"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t0ken",
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.trim().starts_with("https://127.0.0.1:"), "{line}");

    let kc = Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let api: kube::Api<Secret> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let mut s = Secret::default();
    s.metadata.name = Some("hello".into());
    api.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    child.kill().unwrap();
    child.wait().unwrap();
}
