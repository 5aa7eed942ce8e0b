//! azure-tdx documents from a real TPM (swtpm) on which Azure's paravisor is played
//! (testsupport::azure: the AK persisted at 0x81000003, an HCL report in NV index 0x01400001
//! holding a TD report of a simulated TD), with the quote from a stand-in for Azure's quote
//! service over real HTTP: the real validator accepts them with the simulated Intel's
//! collateral, and refuses runtime data naming another key; a quote service that answers 404 or
//! 500, garbage or nothing, or is not there, fails the issue with what happened.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::variants::tdx::{TdxKind, TdxValidator};
use attestation::{Issuer, Variant};
use pcs_standin::SimulatedIntel;
use soft_issuer::tdx::{
    MRSEAM, MRTD, PckSpec, QuoteVersion, TdFields, TdxMachine, current_collateral,
};
use testsupport::azure::{QuoteFault, QuoteServiceStandin};
use testsupport::harness::extended_once;
use testsupport::swtpm::Swtpm;
use tpm_issuer::azure::tdx::{AzureTdxIssuer, ImdsQuoteClient};

mod common;
use common::{assert_accepted, assert_refused};

struct Site {
    intel: SimulatedIntel,
    machine: Arc<TdxMachine>,
    quotes: QuoteServiceStandin,
}

fn site() -> Site {
    let intel = SimulatedIntel::new().unwrap();
    let machine = Arc::new(TdxMachine::new(&intel, PckSpec::default()).unwrap());
    let quotes = QuoteServiceStandin::start(machine.clone(), QuoteVersion::V4).unwrap();
    Site {
        intel,
        machine,
        quotes,
    }
}

fn issuer(swtpm: &Swtpm, url: &str, timeout: Duration) -> AzureTdxIssuer {
    AzureTdxIssuer::new(
        tpm_issuer::azure::open_tpm(&swtpm.tcti()).unwrap(),
        Box::new(ImdsQuoteClient::new(url, timeout).unwrap()),
    )
}

fn validator(site: &Site, pcr9: [u8; 32]) -> TdxValidator {
    let config = serde_json::json!({
        "measurements": {"9": {"expected": hex::encode(pcr9), "warnOnly": false}},
        "intelRootKey": site.intel.root_pem(),
        "mrtds": [hex::encode(MRTD)],
        "mrSeams": [hex::encode(MRSEAM)],
    });
    let collateral = attestation::tdx::StaticCollateral::new()
        .with(current_collateral(&site.intel, &site.machine).unwrap());
    TdxValidator::from_attestation_config(
        TdxKind::Azure,
        config.to_string().as_bytes(),
        Arc::new(collateral),
    )
    .unwrap()
    .0
}

#[test]
fn documents_from_the_hcl_report_and_the_quote_service_pass_the_azure_validator() {
    let site = site();
    let swtpm = Swtpm::start().unwrap();
    swtpm.extend_pcr(9, &[0x99; 32]).unwrap();
    testsupport::azure::boot_tdx(&swtpm, &TdFields::default(), None).unwrap();
    let issuer = issuer(&swtpm, &site.quotes.url(), Duration::from_secs(10));
    assert_eq!(issuer.variant(), Variant::AzureTdx);

    let accepting = validator(&site, extended_once(&[0x99; 32]));
    assert_accepted(&issuer, &accepting, &hex::encode(soft_issuer::tdx::MRTD));
    assert_eq!(site.quotes.requests(), 2, "one quote per document");
    assert_refused(&issuer, &validator(&site, [0x42; 32]), "measurement 9");
}

#[test]
fn runtime_data_naming_another_key_is_refused() {
    let site = site();
    let swtpm = Swtpm::start().unwrap();
    let other = soft_issuer::SoftIssuer::rsa_2048().unwrap();
    let runtime = soft_issuer::snp::azure_runtime_data_for(&other).unwrap();
    testsupport::azure::boot_tdx(&swtpm, &TdFields::default(), Some(runtime)).unwrap();
    assert_refused(
        &issuer(&swtpm, &site.quotes.url(), Duration::from_secs(10)),
        &validator(&site, [0; 32]),
        "the runtime data's keys[0] is not the attestation key",
    );
}

#[test]
fn a_failing_quote_service_fails_the_issue_with_what_happened() {
    let site = site();
    let swtpm = Swtpm::start().unwrap();
    testsupport::azure::boot_tdx(&swtpm, &TdFields::default(), None).unwrap();
    let url = site.quotes.url();
    let issuer = issuer(&swtpm, &url, Duration::from_millis(500));
    let prefix = "getting a TD quote for the HCL's TD report: ";
    for (fault, expected) in [
        (
            QuoteFault::Status(404),
            format!("Azure's quote service at {url} answered HTTP 404: simulated IMDS failure 404"),
        ),
        (
            QuoteFault::Status(500),
            format!("Azure's quote service at {url} answered HTTP 500: simulated IMDS failure 500"),
        ),
        (
            QuoteFault::Garbage,
            format!("Azure's quote service at {url} answered without a usable quote: not JSON"),
        ),
        (
            QuoteFault::Hang,
            format!("Azure's quote service at {url} did not answer within 500ms"),
        ),
    ] {
        site.quotes.set_fault(fault);
        let err = issuer.issue(b"u", &[1; 32]).unwrap_err();
        assert_eq!(err.variant, Variant::AzureTdx);
        assert!(
            err.reason.starts_with(&format!("{prefix}{expected}")),
            "{fault:?}: {}",
            err.reason
        );
    }
    // Back to normal, it issues again.
    site.quotes.set_fault(QuoteFault::None);
    issuer.issue(b"u", &[1; 32]).unwrap();

    // Nobody listening.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/acc/tdquote", listener.local_addr().unwrap())
    };
    drop(issuer);
    let err = self::issuer(&swtpm, &closed, Duration::from_secs(5))
        .issue(b"u", &[1; 32])
        .unwrap_err();
    assert!(
        err.reason.starts_with(&format!(
            "{prefix}cannot reach Azure's quote service at {closed}"
        )),
        "{}",
        err.reason
    );
}

#[test]
fn an_snp_hcl_report_is_not_a_td_report() {
    let site = site();
    let swtpm = Swtpm::start().unwrap();
    let amd = soft_issuer::snp::SimulatedAmd::new(attestation::snp::Product::Milan).unwrap();
    let vcek = amd.chip([1; 64], testsupport::snp::TCB, 0).unwrap();
    testsupport::azure::boot_snp(&swtpm, &vcek, Default::default(), None).unwrap();
    let err = issuer(&swtpm, &site.quotes.url(), Duration::from_secs(5))
        .issue(b"u", &[1; 32])
        .unwrap_err();
    assert_eq!(
        err.reason,
        "Azure's HCL report is unusable: its report type is 2, not TDX (4)"
    );
    assert_eq!(site.quotes.requests(), 0);
}

#[test]
fn the_quote_service_url_must_be_plain_http() {
    for url in [
        "https://169.254.169.254/acc/tdquote",
        "not a url",
        "/acc/tdquote",
    ] {
        let err = ImdsQuoteClient::new(url, Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the quote service URL {url:?} is not an http:// URL")
        );
    }
}
