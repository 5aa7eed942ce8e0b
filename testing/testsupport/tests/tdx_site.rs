//! The simulated TDX site as attest-proxy meets it: collateral fetched over TLS from the site's
//! PCS stand-in with the PCS client attest-proxy uses, the attestation config the site wrote,
//! and documents from the site's machines, through the real TDX validator. A join through the
//! real processes is `tdx_join.rs`'s.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::tdx::collateral::PcsResponses;
use attestation::tdx::{Collateral, StaticCollateral, TdxError};
use attestation::variants::tdx::{TdxKind, TdxValidator};
use attestation::{Error, Issuer, Validator, Variant};
use collateral::pcs::{PckCa as Ca, PcsCollateral, PcsSource};
use collateral::{Cache, CacheConfig};
use pcs_standin::{PckCa, SimulatedIntel};
use soft_issuer::tdx::{ReportData, TdFields};
use testsupport::tdx::{TdxMachines, TdxSite};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A fresh PCS client and cache (nothing remembered) at the site's stand-in, trusting its CA
/// from the file the site wrote.
fn pcs_collateral(site: &TdxSite, dir: &std::path::Path) -> PcsCollateral {
    let source = PcsSource::new(
        site.pcs.url(),
        &site.pcs.root_crl_url(),
        Some(&dir.join("pcs-ca.pem")),
        Duration::from_secs(5),
    )
    .unwrap();
    let config = CacheConfig {
        dir: None,
        max_stale: Duration::from_secs(60),
        wait: Duration::from_secs(5),
        backoff: Duration::from_millis(300),
        max_entries: None,
        ..CacheConfig::default()
    };
    let cache = Cache::new(Arc::new(source), config, tokio::runtime::Handle::current()).unwrap();
    PcsCollateral::new(cache, Duration::from_secs(60))
}

/// The collateral for `fmspc` and the Platform CA, fetched as attest-proxy fetches it.
async fn fetch(pcs: PcsCollateral, fmspc: String) -> Collateral {
    tokio::task::spawn_blocking(move || {
        let tcb = pcs.tcb_info(&fmspc).unwrap();
        let qe = pcs.qe_identity().unwrap();
        let crl = pcs.pck_crl(Ca::Platform).unwrap();
        let root = pcs.root_ca_crl().unwrap();
        Collateral::from_pcs(PcsResponses {
            tcb_info: &tcb.body,
            tcb_info_issuer_chain: &tcb.issuer_chain,
            qe_identity: &qe.body,
            qe_identity_issuer_chain: &qe.issuer_chain,
            pck_crl: &crl.body,
            pck_crl_issuer_chain: &crl.issuer_chain,
            root_ca_crl: &root,
        })
        .unwrap()
    })
    .await
    .unwrap()
}

fn validator(variant: Variant, config: &[u8], collateral: Collateral) -> TdxValidator {
    let kind = match variant {
        Variant::QemuTdx => TdxKind::Qemu,
        _ => TdxKind::Azure,
    };
    TdxValidator::from_attestation_config(
        kind,
        config,
        Arc::new(StaticCollateral::new().with(collateral)),
    )
    .unwrap()
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sites_collateral_and_config_accept_its_machines_only() {
    for variant in [Variant::QemuTdx, Variant::AzureTdx] {
        let dir = tempfile::tempdir().unwrap();
        let intel = Arc::new(SimulatedIntel::new().unwrap());
        let machines = TdxMachines::new(variant, &intel, 2).unwrap();
        assert_eq!(machines.fmspcs(), ["00806f050000"]);
        let site = TdxSite::start(
            variant,
            intel,
            &machines.fmspcs(),
            dir.path(),
            Duration::from_secs(86_400),
            None,
        )
        .await
        .unwrap();
        let args = site.proxy_args(Duration::from_secs(2));
        for flag in [
            "--pcs-url",
            "--pcs-ca-file",
            "--intel-root-crl-url",
            "--tdx-fmspc",
            "--collateral-dir",
            "--collateral-wait",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        let config = std::fs::read(site.attestation_config_path()).unwrap();
        let fmspc = machines.fmspcs().remove(0);
        let collateral = fetch(pcs_collateral(&site, dir.path()), fmspc.clone()).await;
        let v = validator(variant, &config, collateral);
        for _ in 0..2 {
            let node = machines.node().unwrap();
            assert_eq!(node.variant(), variant);
            let doc = node.issue(b"user data", NONCE).unwrap();
            let verified = v.validate(&doc, NONCE).unwrap();
            assert_eq!(verified.user_data, b"user data");
        }
        // A debug TD on the same hardware is refused.
        let debug = machines
            .node_with(
                TdFields {
                    td_attributes: soft_issuer::tdx::TD_ATTRIBUTES_DEBUG
                        | soft_issuer::tdx::TD_ATTRIBUTES_SEPT_VE_DISABLE,
                    ..TdFields::default()
                },
                ReportData::Bound,
            )
            .unwrap();
        let error = v
            .validate(&debug.issue(b"", NONCE).unwrap(), NONCE)
            .unwrap_err();
        assert!(matches!(error, Error::Tdx(TdxError::Debug)), "{error}");

        // The first host's PCK revoked: collateral fetched afresh refuses it, not the second.
        site.revoke(PckCa::Platform, &[0x1000]).unwrap();
        let collateral = fetch(pcs_collateral(&site, dir.path()), fmspc).await;
        let v = validator(variant, &config, collateral);
        let on = |host| {
            machines
                .node_on(machines.host(host), TdFields::default(), ReportData::Bound)
                .unwrap()
                .issue(b"", NONCE)
                .unwrap()
        };
        let error = v.validate(&on(0), NONCE).unwrap_err();
        assert!(matches!(error, Error::Tdx(TdxError::Revoked(_))), "{error}");
        v.validate(&on(1), NONCE).unwrap();
    }
}
