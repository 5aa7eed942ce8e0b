//! azure-trustedlaunch documents from a real TPM (swtpm) on which Azure's Trusted Launch setup is
//! played (testsupport::azure: the AK persisted at 0x81000003, its certificate from the
//! simulated Azure vTPM CA in NV index 0x01C101D0), with the CA fetched over real HTTP from the
//! URL the certificate names: the real validator accepts them; a publisher that answers 404 or
//! garbage, is not there, or a certificate naming no URL, fails the issue with what happened,
//! and a second URL is tried when the first fails.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use attestation::variants::azure_trustedlaunch::TrustedLaunchValidator;
use attestation::{Issuer, Variant};
use soft_issuer::azure_vtpm::{SimulatedAzureVtpmCa, Window};
use testsupport::azure::{CaPublisherStandin, PublisherFault};
use testsupport::harness::extended_once;
use testsupport::swtpm::Swtpm;
use tpm_issuer::azure::trustedlaunch::{HttpCaFetcher, TrustedLaunchIssuer};

mod common;
use common::{assert_accepted, assert_refused};

fn issuer(swtpm: &Swtpm) -> TrustedLaunchIssuer {
    TrustedLaunchIssuer::new(
        tpm_issuer::azure::open_tpm(&swtpm.tcti()).unwrap(),
        Box::new(HttpCaFetcher::new(Duration::from_secs(5))),
    )
}

fn validator(azure: &SimulatedAzureVtpmCa, pcr9: [u8; 32]) -> TrustedLaunchValidator {
    let config = serde_json::json!({
        "measurements": {"9": {"expected": hex::encode(pcr9), "warnOnly": false}},
        "azureVtpmRoots": [azure.root_pem()],
    });
    TrustedLaunchValidator::from_attestation_config(config.to_string().as_bytes())
        .unwrap()
        .0
}

fn issue_error(issuer: &TrustedLaunchIssuer) -> String {
    issuer
        .issue(b"user data", &[1; 32])
        .unwrap_err()
        .to_string()
}

#[test]
fn documents_with_the_vtpms_ak_certificate_and_its_fetched_ca_pass_the_validator() {
    let azure = SimulatedAzureVtpmCa::new().unwrap();
    let publisher = CaPublisherStandin::start(azure.ca_der().to_vec()).unwrap();
    let swtpm = Swtpm::start().unwrap();
    swtpm.extend_pcr(9, &[0x99; 32]).unwrap();
    testsupport::azure::boot_trustedlaunch(
        &swtpm,
        &azure,
        "vm-17",
        Window::current(),
        &[&publisher.url()],
    )
    .unwrap();
    let issuer = issuer(&swtpm);
    assert_eq!(issuer.variant(), Variant::AzureTrustedLaunch);

    let accepting = validator(&azure, extended_once(&[0x99; 32]));
    assert_accepted(&issuer, &accepting, "vm-17.TrustedVM.Azure.windows.net");
    assert_eq!(publisher.requests(), 2, "one fetch per document");
    // The InstanceInfo is Constellation's: the NV index's certificate and the published CA.
    let info = issuer.instance_info().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(json.as_object().unwrap().len(), 2, "{json}");
    assert!(
        json["AkCert"].is_string() && json["CA"].is_string(),
        "{json}"
    );

    // A policy for other PCRs refuses the same document by its measurement.
    assert_refused(
        &issuer,
        &validator(&azure, [0x55; 32]),
        "measurements do not match",
    );
    // A config trusting another root refuses it by the chain.
    let impostor = SimulatedAzureVtpmCa::impostor().unwrap();
    assert_refused(
        &issuer,
        &validator(&impostor, extended_once(&[0x99; 32])),
        "no trusted root of that name signed it",
    );

    for (fault, expected) in [
        (PublisherFault::Status(404), "answered HTTP 404"),
        (
            PublisherFault::Garbage,
            "answered with something that is not a DER certificate",
        ),
    ] {
        publisher.set_fault(fault);
        let err = issue_error(&issuer);
        assert!(err.contains("azure-trustedlaunch"), "{err}");
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn the_next_url_is_tried_and_a_certificate_without_one_fails_by_name() {
    let azure = SimulatedAzureVtpmCa::new().unwrap();
    // Nothing listens on a port just released.
    let gone = {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        format!("http://{}/ca.crt", listener.local_addr().unwrap())
    };
    let publisher = CaPublisherStandin::start(azure.ca_der().to_vec()).unwrap();
    let swtpm = Swtpm::start().unwrap();
    testsupport::azure::boot_trustedlaunch(
        &swtpm,
        &azure,
        "vm-2",
        Window::current(),
        &[&gone, &publisher.url()],
    )
    .unwrap();
    let issuer_two = issuer(&swtpm);
    let info = issuer_two.instance_info().unwrap();
    assert!(!info.is_empty());
    assert_eq!(
        publisher.requests(),
        1,
        "the second URL after the first failed"
    );
    publisher.set_fault(PublisherFault::Status(500));
    let err = issue_error(&issuer_two);
    assert!(
        err.contains("no caIssuers URL of the AK certificate gave its CA"),
        "{err}"
    );
    assert!(err.contains("is unreachable"), "{err}");
    assert!(err.contains("answered HTTP 500"), "{err}");

    let without = Swtpm::start().unwrap();
    testsupport::azure::boot_trustedlaunch(&without, &azure, "vm-3", Window::current(), &[])
        .unwrap();
    let err = issue_error(&issuer(&without));
    assert!(err.contains("names no caIssuers URL"), "{err}");

    // A vTPM without the certificate is not a Trusted Launch vTPM.
    let bare = Swtpm::start().unwrap();
    testsupport::azure::persist_hcl_ak(&bare).unwrap();
    let err = issue_error(&issuer(&bare));
    assert!(err.contains("NV index 0x01c101d0"), "{err}");
}
