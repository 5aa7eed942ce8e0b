//! Simulated SNP hardware produces reports the real verifier accepts, trusted only through
//! `amdRootKey`, and every policy check refuses what it must.

#![allow(clippy::unwrap_used)]

use attestation::snp::{
    Cert, Crl, MinimumTcbs, Product, Report, SnpConfig, SnpError, SnpPolicyError, Tcb, Trust,
    VerifiedReport, certs_from_pem, verify_report,
};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SimulatedSigner};

const NOW: i64 = 1_795_564_800; // 2026-11-25

fn tcb(bl: u8, tee: u8, snp: u8, ucode: u8) -> Tcb {
    Tcb {
        fmc: None,
        bootloader: bl,
        tee,
        snp,
        microcode: ucode,
    }
}

fn trust(amd: &SimulatedAmd) -> Trust {
    Trust::from_pem(amd.ark_pem().as_bytes()).unwrap()
}

fn verify(
    amd: &SimulatedAmd,
    signer: &SimulatedSigner,
    intermediate: &[u8],
    report: &[u8],
    trust: &Trust,
) -> Result<VerifiedReport, SnpError> {
    verify_report(
        &Report::parse(report)?,
        &Cert::from_der(signer.cert_der().to_vec())?,
        &Cert::from_der(intermediate.to_vec())?,
        &Cert::from_der(amd.ark_der().to_vec())?,
        trust,
        NOW,
    )
}

fn chip_id(seed: u8) -> [u8; 64] {
    std::array::from_fn(|i| seed.wrapping_add(u8::try_from(i).unwrap()))
}

fn config(amd: &SimulatedAmd, min: Tcb) -> SnpConfig {
    let json = serde_json::json!({
        "bootloaderVersion": min.bootloader, "teeVersion": min.tee,
        "snpVersion": min.snp, "microcodeVersion": min.microcode,
        "amdRootKey": amd.ark_pem(),
    });
    let mut config = SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap();
    config.minimum_tcb = MinimumTcbs::all(config.minimum_tcb.milan);
    config
}

#[test]
fn every_product_and_signer_kind_verifies_under_its_own_root_only() {
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        let amd = SimulatedAmd::new(product).unwrap();
        let min = tcb(3, 0, 8, 115);
        let vcek = amd.chip(chip_id(7), min, 0).unwrap();
        let report = vcek.report(&ReportFields::default()).unwrap();
        let verified = verify(&amd, &vcek, amd.ask_der(), &report, &trust(&amd)).unwrap();
        assert_eq!(verified.product(), product);
        assert_eq!(config(&amd, min).check(&verified), Ok(vec![]));

        let vlek = amd.vlek("cc-test.example", min).unwrap();
        let report = vlek.report(&ReportFields::default()).unwrap();
        let verified = verify(&amd, &vlek, amd.asvk_der(), &report, &trust(&amd)).unwrap();
        assert_eq!(verified.signer.csp_id.as_deref(), Some("cc-test.example"));

        // AMD's built-in roots do not trust the simulated ARK: only configuration does.
        let error = verify(
            &amd,
            &vcek,
            amd.ask_der(),
            &vcek.report(&ReportFields::default()).unwrap(),
            &Trust::builtin(),
        )
        .unwrap_err();
        assert!(
            matches!(error, SnpError::UntrustedRoot(_)),
            "{product}: {error}"
        );
    }
}

#[test]
fn the_kds_style_chains_parse_in_order() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let chain = certs_from_pem(amd.vcek_chain_pem().as_bytes()).unwrap();
    assert_eq!(
        chain.iter().map(Cert::common_name).collect::<Vec<_>>(),
        ["SEV-Milan", "ARK-Milan"]
    );
    let chain = certs_from_pem(amd.vlek_chain_pem().as_bytes()).unwrap();
    assert_eq!(
        chain.iter().map(Cert::common_name).collect::<Vec<_>>(),
        ["SEV-VLEK-Milan", "ARK-Milan"]
    );
}

#[test]
fn policy_checks_refuse_what_they_must() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let min = tcb(3, 0, 8, 115);
    let vcek = amd.chip(chip_id(1), min, 0).unwrap();
    let check = |fields: ReportFields, config: &SnpConfig| {
        let report = vcek.report(&fields).unwrap();
        let verified = verify(&amd, &vcek, amd.ask_der(), &report, &trust(&amd)).unwrap();
        config.check(&verified)
    };
    let base = config(&amd, min);
    let with = |f: fn(&mut ReportFields)| {
        let mut fields = ReportFields::default();
        f(&mut fields);
        fields
    };
    assert_eq!(
        check(with(|f| f.policy |= 1 << 19), &base).unwrap_err(),
        SnpPolicyError::Debug
    );
    assert_eq!(
        check(with(|f| f.policy |= 1 << 18), &base).unwrap_err(),
        SnpPolicyError::MigrationAgent
    );
    assert_eq!(
        check(with(|f| f.vmpl = 1), &base).unwrap_err(),
        SnpPolicyError::Vmpl(1)
    );
    assert!(matches!(
        check(with(|f| f.launch_tcb = Some(tcb(3, 0, 7, 115))), &base).unwrap_err(),
        SnpPolicyError::TcbBelowMinimum {
            which: "launch",
            ..
        }
    ));
    assert!(matches!(
        check(with(|f| f.current_tcb = Some(tcb(3, 0, 8, 114))), &base).unwrap_err(),
        SnpPolicyError::CurrentBelowCommitted { .. }
    ));
    // Provisional: current above committed.
    assert_eq!(
        check(with(|f| f.current_tcb = Some(tcb(3, 0, 9, 116))), &base),
        Ok(vec![])
    );
    // A chip whose VCEK was issued for a TCB below the minimum.
    let old = amd.chip(chip_id(2), tcb(2, 0, 8, 115), 0).unwrap();
    let report = old.report(&ReportFields::default()).unwrap();
    let verified = verify(&amd, &old, amd.ask_der(), &report, &trust(&amd)).unwrap();
    assert!(matches!(
        base.check(&verified).unwrap_err(),
        SnpPolicyError::TcbBelowMinimum {
            which: "reported",
            ..
        }
    ));
}

#[test]
fn a_report_presented_with_another_chips_vcek_fails() {
    let amd = SimulatedAmd::new(Product::Genoa).unwrap();
    let a = amd.chip(chip_id(1), tcb(3, 0, 8, 115), 0).unwrap();
    let b = amd.chip(chip_id(2), tcb(3, 0, 8, 115), 0).unwrap();
    let report = a.report(&ReportFields::default()).unwrap();
    assert_eq!(
        verify(&amd, &b, amd.ask_der(), &report, &trust(&amd)).unwrap_err(),
        SnpError::ChipId
    );
    // A VCEK presented with the ASVK, or a VLEK with the ASK, is no chain.
    assert!(verify(&amd, &a, amd.asvk_der(), &report, &trust(&amd)).is_err());
}

#[test]
fn the_crl_revokes_intermediates_and_named_signers_and_must_be_current() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let cert = |der: &[u8]| Cert::from_der(der.to_vec()).unwrap();
    let (ark, ask, asvk) = (
        cert(amd.ark_der()),
        cert(amd.ask_der()),
        cert(amd.asvk_der()),
    );
    let vcek = amd.chip(chip_id(3), tcb(3, 0, 8, 115), 0).unwrap();
    let named = amd.chip(chip_id(4), tcb(3, 0, 8, 115), 9).unwrap();
    let vlek = amd.vlek("cc", tcb(3, 0, 8, 115)).unwrap();
    let (vcek, named, vlek) = (
        cert(vcek.cert_der()),
        cert(named.cert_der()),
        cert(vlek.cert_der()),
    );
    let day = 86_400;
    let now = u64::try_from(NOW).unwrap();
    let crl = |revoked: &[u8], from: u64, to: u64| {
        Crl::from_der(amd.crl(revoked, from, to).unwrap()).unwrap()
    };

    let empty = crl(&[], now - day, now + day);
    assert_eq!(empty.check(&ark, &ask, &vcek, NOW, 0), Ok(()));
    assert_eq!(empty.next_update(), NOW + 86_400);

    // The ASK revoked: every VCEK under it; the ASVK's VLEKs are untouched.
    let ask_revoked = crl(&[2], now - day, now + day);
    assert!(matches!(
        ask_revoked.check(&ark, &ask, &vcek, NOW, 0).unwrap_err(),
        SnpError::Revoked { which, .. } if which == "SEV-Milan"
    ));
    assert_eq!(ask_revoked.check(&ark, &asvk, &vlek, NOW, 0), Ok(()));

    // A signer with a serial of its own can be revoked; serial 0 names no single chip.
    let named_revoked = crl(&[9], now - day, now + day);
    assert!(matches!(
        named_revoked.check(&ark, &ask, &named, NOW, 0).unwrap_err(),
        SnpError::Revoked { which, .. } if which == "SEV-VCEK"
    ));
    let zero_listed = crl(&[0], now - day, now + day);
    assert_eq!(zero_listed.check(&ark, &ask, &vcek, NOW, 0), Ok(()));

    // Stale, or not yet valid.
    for stale in [
        crl(&[], now - 2 * day, now - day),
        crl(&[], now + day, now + 2 * day),
    ] {
        assert!(matches!(
            stale.check(&ark, &ask, &vcek, NOW, 0).unwrap_err(),
            SnpError::CrlNotCurrent { .. }
        ));
    }

    // Stale by a day, accepted when the caller allows two (a cache serving through an outage),
    // refused when it allows half a day.
    let day_old = crl(&[], now - 3 * day, now - day);
    assert_eq!(day_old.check(&ark, &ask, &vcek, NOW, 2 * 86_400), Ok(()));
    assert!(matches!(
        day_old.check(&ark, &ask, &vcek, NOW, 43_200).unwrap_err(),
        SnpError::CrlNotCurrent { .. }
    ));

    // Signed by another product's ARK.
    let genoa = SimulatedAmd::new(Product::Genoa).unwrap();
    let foreign = Crl::from_der(genoa.crl(&[], now - day, now + day).unwrap()).unwrap();
    assert!(matches!(
        foreign.check(&ark, &ask, &vcek, NOW, 0).unwrap_err(),
        SnpError::Crl(_)
    ));

    // A flipped byte in the signature.
    let mut der = amd.crl(&[], now - day, now + day).unwrap();
    let at = der.len() - 10;
    der[at] ^= 1;
    let tampered = Crl::from_der(der).unwrap();
    assert!(matches!(
        tampered.check(&ark, &ask, &vcek, NOW, 0).unwrap_err(),
        SnpError::Crl(_)
    ));
}

#[test]
fn another_process_stands_for_the_same_simulated_amd_from_its_certificates() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let again =
        SimulatedAmd::from_certificates_pem(Product::Milan, &amd.certificates_pem()).unwrap();
    assert_eq!(again.ark_der(), amd.ark_der());
    assert_eq!(again.vlek_chain_pem(), amd.vlek_chain_pem());
    // What the copy signs verifies under the original's root, which a second `new` is not.
    let min = tcb(3, 0, 8, 115);
    let chip = again.chip(chip_id(7), min, 0).unwrap();
    let report = chip.report(&ReportFields::default()).unwrap();
    verify(&amd, &chip, amd.ask_der(), &report, &trust(&amd)).unwrap();
    let other = SimulatedAmd::new(Product::Milan).unwrap();
    assert_ne!(other.ark_der(), amd.ark_der());

    // Certificates not made with the simulation's keys, or for another product, are refused.
    let builtin = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../lib/attestation/testdata/snp/azure-vlekcertchain.pem"
    ))
    .unwrap();
    assert!(SimulatedAmd::from_certificates_pem(Product::Milan, &builtin).is_err());
    assert!(SimulatedAmd::from_certificates_pem(Product::Genoa, &amd.certificates_pem()).is_err());
}

/// Turin counts its SVNs on a scale of its own and adds an FMC: its minimum is
/// `minimumTcb.Turin`, FMC included; without one a Turin report is refused by name, whatever
/// Milan's minimum (Constellation's four fields) says.
#[test]
fn turin_has_its_own_minimum_with_its_fmc_and_none_is_refused_by_name() {
    let amd = SimulatedAmd::new(Product::Turin).unwrap();
    let at = Tcb {
        fmc: Some(2),
        ..tcb(1, 0, 4, 9)
    };
    let vcek = amd.chip(chip_id(3), at, 0).unwrap();
    let report = vcek.report(&ReportFields::default()).unwrap();
    let verified = verify(&amd, &vcek, amd.ask_der(), &report, &trust(&amd)).unwrap();
    assert_eq!(verified.report.reported_tcb(Product::Turin), at);
    let load = |minimum: serde_json::Value| {
        let json = serde_json::json!({
            "bootloaderVersion": 0, "teeVersion": 0, "snpVersion": 0, "microcodeVersion": 0,
            "minimumTcb": minimum, "amdRootKey": amd.ark_pem(),
        });
        SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap()
    };
    let turin = |fmc: u8, ucode: u8| {
        load(serde_json::json!({ "Turin": {
            "fmcVersion": fmc, "bootloaderVersion": 1, "teeVersion": 0, "snpVersion": 4,
            "microcodeVersion": ucode,
        }}))
    };
    assert_eq!(turin(2, 9).check(&verified), Ok(vec![]));
    assert_eq!(turin(0, 9).check(&verified), Ok(vec![]));
    assert_eq!(
        turin(3, 9).check(&verified),
        Err(SnpPolicyError::TcbBelowMinimum {
            which: "reported",
            tcb: at,
            minimum: Tcb {
                fmc: Some(3),
                ..tcb(1, 0, 4, 9)
            },
        })
    );
    assert!(matches!(
        turin(2, 10).check(&verified),
        Err(SnpPolicyError::TcbBelowMinimum { .. })
    ));
    // Genoa's minimum says nothing about Turin.
    let genoa_only = load(serde_json::json!({ "Genoa": {
        "bootloaderVersion": 0, "teeVersion": 0, "snpVersion": 0, "microcodeVersion": 0,
    }}));
    assert_eq!(
        genoa_only.check(&verified),
        Err(SnpPolicyError::NoMinimumTcb(Product::Turin))
    );
}
