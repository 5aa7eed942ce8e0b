//! The forgery the qemu-vtpm key trust exists for, end to end: the measurement policy is public,
//! so anyone can make an attestation key of their own and sign a quote over exactly the PCR
//! values it expects (soft-issuer does that). Against the harness's default policy, which pins
//! its swtpm's keys, such a node must not join and must be told which key was refused; a proxy
//! must not start with a policy that trusts no key or enforces no measurement; and the
//! development mode that trusts any key must be loud about it.

// Helpers outside #[test] functions unwrap too; a panic is the failure report here.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use soft_issuer::{KeyType, SoftIssuer};
use testsupport::harness::{self, Options, System, join_request, refusal};
use tonic::Code;

const DISK: &str = "3f2e1d0c-9b8a-4f6e-8d5c-4b3a2f1e0d9c";
const CONFIG_FILE: &str = "attestationConfig";

/// A software key quoting exactly the PCR values the harness's policy enforces.
fn forger(key_type: KeyType) -> SoftIssuer {
    SoftIssuer::new(key_type)
        .unwrap()
        .with_pcrs(harness::boot_pcrs())
        .unwrap()
}

async fn wait_for_log(system: &System, needles: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !system
        .proxy
        .log()
        .lines()
        .any(|line| needles.iter().all(|n| line.contains(n)))
    {
        assert!(
            Instant::now() < deadline,
            "no log line with {needles:?}\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_metric(system: &System, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while harness::metric(system.admin.proxy, name).await.unwrap() != value {
        assert!(
            Instant::now() < deadline,
            "{name} never became {value}\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fast_reload() -> Vec<String> {
    vec!["--policy-poll-interval".into(), "50ms".into()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_quote_with_the_right_pcrs_does_not_join_the_pinned_default() {
    let system = System::start(Options {
        proxy_args: fast_reload(),
        ..Options::default()
    })
    .await
    .unwrap();
    assert!(!system.ak_trust.is_any());

    for key_type in [KeyType::EcdsaP256, KeyType::Rsa2048] {
        let forger = forger(key_type);
        let digest = hex::encode(attestation::ak_digest(forger.ak_public()));
        let client = system.client(Arc::new(forger)).unwrap();
        let status = refusal(client.join(join_request("forged", DISK).unwrap()).await);
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(
            status
                .message()
                .contains(&format!("attestation key sha256:{digest} is not trusted")),
            "{key_type:?}: {status:?}"
        );
        wait_for_log(&system, &["\"check\":\"ak_untrusted\"", &digest]).await;
    }
    assert!(
        system.join_objects().await.is_empty(),
        "{:?}",
        system.join_objects().await
    );

    // The swtpm's own key is the one pinned: a real node joins.
    {
        let client = system.client(system.issuer().unwrap()).unwrap();
        client
            .join(join_request("worker-1", DISK).unwrap())
            .await
            .unwrap();
    }

    // A reload to a policy that enforces nothing is refused like any invalid file; the
    // forger is still refused and the real node still joins.
    let dir = system.paths.attestation_config.parent().unwrap();
    let mut nothing_enforced: serde_json::Value =
        serde_json::from_str(&system.attestation_config(&[])).unwrap();
    for m in nothing_enforced["measurements"]
        .as_object_mut()
        .unwrap()
        .values_mut()
    {
        m["warnOnly"] = true.into();
    }
    harness::project_config_map(
        dir,
        &[(CONFIG_FILE, nothing_enforced.to_string().as_bytes())],
    )
    .unwrap();
    wait_for_log(
        &system,
        &["measurement policy file refused", "enforces no measurement"],
    )
    .await;
    let client = system.client(Arc::new(forger(KeyType::EcdsaP256))).unwrap();
    let status = refusal(client.join(join_request("forged", DISK).unwrap()).await);
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let client = system.client(system.issuer().unwrap()).unwrap();
    client
        .join(join_request("worker-2", DISK).unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_to_start_without_key_trust_or_an_enforced_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let mut no_key_trust: serde_json::Value = serde_json::from_str(&harness::attestation_config(
        &attestation::AkTrust::AnyKey,
        &[],
    ))
    .unwrap();
    no_key_trust.as_object_mut().unwrap().remove("trustAnyAk");
    let cases = [
        (no_key_trust.to_string(), "trusts no attestation key"),
        (
            r#"{"measurements": {}, "trustAnyAk": true}"#.to_owned(),
            "enforces no measurement",
        ),
    ];
    for (i, (contents, reason)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("config-{i}.json"));
        std::fs::write(&path, &contents).unwrap();
        let error = match System::start(Options {
            attestation_config: Some(path),
            ..Options::default()
        })
        .await
        {
            Ok(_) => panic!("attest-proxy started with {contents}"),
            Err(error) => format!("{error:#}"),
        };
        assert!(error.contains("attest-proxy exited"), "{error}");
        assert!(error.contains(reason), "{contents}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusting_any_key_works_but_warns_in_the_log_the_metric_and_readiness() {
    let system = System::start(Options {
        trust_any_ak: true,
        proxy_args: fast_reload(),
        ..Options::default()
    })
    .await
    .unwrap();
    assert!(system.ak_trust.is_any());
    wait_for_log(
        &system,
        &["WARN", "trusts ANY attestation key (trustAnyAk)"],
    )
    .await;
    wait_for_metric(&system, "attest_proxy_trust_any_ak", 1.0).await;
    let (status, body) = plumbing::admin::get(system.admin.proxy, "/readyz")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("warn attestation-keys: ") && body.contains("trusts any attestation key"),
        "{body}"
    );
    // What the warning is about: the forged quote joins.
    {
        let client = system.client(Arc::new(forger(KeyType::EcdsaP256))).unwrap();
        client
            .join(join_request("forged", DISK).unwrap())
            .await
            .unwrap();
    }

    // Pinning the swtpm's keys by a reload ends the warning; going back warns again.
    let dir = system.paths.attestation_config.parent().unwrap();
    let pinned = harness::attestation_config(&harness::swtpm_ak_trust(&system.swtpm).unwrap(), &[]);
    harness::project_config_map(dir, &[(CONFIG_FILE, pinned.as_bytes())]).unwrap();
    wait_for_metric(&system, "attest_proxy_trust_any_ak", 0.0).await;
    let (status, body) = plumbing::admin::get(system.admin.proxy, "/readyz")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("attestation-keys"), "{body}");
    let client = system.client(Arc::new(forger(KeyType::EcdsaP256))).unwrap();
    let status = refusal(client.join(join_request("forged-2", DISK).unwrap()).await);
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let warnings_before = system
        .proxy
        .log()
        .matches("trusts ANY attestation key")
        .count();
    harness::project_config_map(
        dir,
        &[(CONFIG_FILE, system.attestation_config(&[]).as_bytes())],
    )
    .unwrap();
    wait_for_metric(&system, "attest_proxy_trust_any_ak", 1.0).await;
    wait_for_log(&system, &["measurement policy reloaded"]).await;
    let warnings_after = system
        .proxy
        .log()
        .matches("trusts ANY attestation key")
        .count();
    assert!(
        warnings_after > warnings_before,
        "no warning on the reload\n{}",
        system.proxy.log()
    );
}
