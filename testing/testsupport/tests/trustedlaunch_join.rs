//! azure-trustedlaunch nodes join through the real processes: each node is join-client's issuer
//! on a real TPM (swtpm) on which Azure's Trusted Launch setup is played (the AK at 0x81000003,
//! the simulated Azure vTPM CA's certificate for it in NV index 0x01C101D0, the CA fetched over
//! HTTP from the URL the certificate names), and attest-proxy trusts the simulated root through
//! the config's azureVtpmRoots. A node joins and rejoins, in process and as the real join-client
//! binary; a node whose AK certificate expired,
//! one certified by another root with Azure's names, and one whose certificate is for another
//! key are refused, each by name, and get nothing.

#![allow(clippy::unwrap_used)]

use attestation::Variant;
use soft_issuer::SoftIssuer;
use soft_issuer::azure_vtpm::{SimulatedAzureVtpmCa, Window};
use testsupport::azure::CaPublisherStandin;
use testsupport::harness::{Options, System, join_request, refusal};
use testsupport::trustedlaunch::{TrustedLaunchSite, issuer, measured_swtpm};
use tonic::Code;

const DISK: &str = "8e7d6c5b-4a39-4281-9f0e-d1c2b3a4f5e6";

/// Joins with the node on `swtpm` and expects a refusal whose message holds `expected`, and
/// that nothing was created for it.
async fn refused(system: &System, swtpm: &testsupport::swtpm::Swtpm, name: &str, expected: &str) {
    let before = system.join_objects().await.len();
    let client = system.client(issuer(swtpm).unwrap()).unwrap();
    let status = refusal(client.join(join_request(name, DISK).unwrap()).await);
    assert_eq!(status.code(), Code::Unauthenticated, "{name}: {status:?}");
    assert!(
        status.message().contains(expected),
        "{name}: {}",
        status.message()
    );
    assert_eq!(
        system.join_objects().await.len(),
        before,
        "{name} created something"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trustedlaunch_nodes_join_and_rejoin_and_bad_certificates_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let site = TrustedLaunchSite::start(dir.path()).unwrap();
    let system = System::start(Options {
        attestation_config: Some(site.attestation_config_path()),
        variant: Some(Variant::AzureTrustedLaunch),
        ..Options::default()
    })
    .await
    .unwrap();

    // The system's swtpm (the harness's boot measurements) as an Azure Trusted Launch vTPM.
    site.boot(&system.swtpm, "tl-node-1", Window::current())
        .unwrap();
    {
        let client = system.client(issuer(&system.swtpm).unwrap()).unwrap();
        let joined = client
            .join(join_request("worker-tl-1", DISK).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", system.logs()));
        assert!(!joined.state_disk_key.is_empty());
        let rejoined = client.rejoin(DISK).await.unwrap();
        assert_eq!(rejoined.state_disk_key, joined.state_disk_key);
    }
    assert!(
        system
            .proxy
            .log()
            .contains("tl-node-1.TrustedVM.Azure.windows.net"),
        "{}",
        system.proxy.log()
    );
    assert_eq!(site.publisher.requests(), 2, "one CA fetch per attestation");

    // The real join-client binary on another Trusted Launch vTPM: join, then rejoin.
    let cli_vm = site.vm("tl-cli", Window::current()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let join_client = testsupport::process::bin("join-client").unwrap();
    let common = |command: &str| {
        let mut c = std::process::Command::new(&join_client);
        c.arg(command)
            .args(["--endpoint", &system.proxy_addr.to_string()])
            .args(["--tcti", &cli_vm.tcti()])
            .args(["--variant", "azure-trustedlaunch"])
            .args(["--disk-uuid", "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"])
            .arg("--out")
            .arg(out.path())
            .args(["--retry-for", "0s"])
            .env("RUST_LOG", "warn");
        c
    };
    let joined = common("join")
        .args(["--node-name", "worker-tl-cli", "--ip", "10.0.0.9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&joined.stderr);
    assert!(joined.status.success(), "{stderr}\n{}", system.logs());
    let rejoined = common("rejoin").output().unwrap();
    let stderr = String::from_utf8_lossy(&rejoined.stderr);
    assert!(rejoined.status.success(), "{stderr}");
    assert!(
        system
            .proxy
            .log()
            .contains("tl-cli.TrustedVM.Azure.windows.net"),
        "{}",
        system.proxy.log()
    );

    // An AK certificate that expired yesterday.
    let expired = site.vm("tl-node-2", Window::expired()).unwrap();
    refused(
        &system,
        &expired,
        "worker-tl-2",
        "the AK certificate CN=tl-node-2.TrustedVM.Azure.windows.net is not valid at",
    )
    .await;

    // Certified by another root that carries Azure's names, with its CA published beside it.
    let impostor = SimulatedAzureVtpmCa::impostor().unwrap();
    let impostor_site = CaPublisherStandin::start(impostor.ca_der().to_vec()).unwrap();
    let foreign = measured_swtpm().unwrap();
    testsupport::azure::boot_trustedlaunch(
        &foreign,
        &impostor,
        "tl-node-3",
        Window::current(),
        &[&impostor_site.url()],
    )
    .unwrap();
    refused(
        &system,
        &foreign,
        "worker-tl-3",
        "does not chain to a trusted Azure vTPM root",
    )
    .await;

    // A genuine certificate, but for another key than the one that quotes.
    let other_key = measured_swtpm().unwrap();
    testsupport::azure::persist_hcl_ak(&other_key).unwrap();
    let stranger = SoftIssuer::rsa_2048().unwrap();
    let cert = site
        .azure
        .ak_cert(
            stranger.ak_public(),
            "tl-node-4",
            Window::current(),
            &[&site.publisher.url()],
        )
        .unwrap();
    testsupport::azure::write_ak_cert(&other_key, &cert).unwrap();
    refused(
        &system,
        &other_key,
        "worker-tl-4",
        "certifies another key than the attestation key",
    )
    .await;

    // Each refusal is in attest-proxy's audit log under its check's name.
    let log = system.proxy.log();
    for check in [
        "ak_cert_expired",
        "ak_cert_untrusted_root",
        "ak_cert_key_mismatch",
    ] {
        assert!(log.contains(check), "{check}: {log}");
    }
}
