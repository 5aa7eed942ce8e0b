//! The SNP settings of the attestation config, applied to real verified reports.

#![allow(clippy::unwrap_used)]

use attestation::snp::{
    Cert, Enforcement, Product, Report, SnpConfig, SnpConfigError, SnpPolicyError, Tcb, Trust,
    VerifiedReport, certs_from_pem, verify_report,
};

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/testdata/snp/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn verified(report: &str, leaf: &str, chain: &str, at: i64) -> VerifiedReport {
    let mut certs = certs_from_pem(&read(chain)).unwrap();
    let ark = certs.pop().unwrap();
    let intermediate = certs.pop().unwrap();
    let leaf = read(leaf);
    let leaf = if leaf.starts_with(b"-----") {
        certs_from_pem(&leaf).unwrap().remove(0)
    } else {
        Cert::from_der(leaf).unwrap()
    };
    let report = Report::parse(&read(report)).unwrap();
    verify_report(&report, &leaf, &intermediate, &ark, &Trust::builtin(), at).unwrap()
}

/// 2026-11-25 and 2025-06-01, seconds since the epoch.
const TODAY: i64 = 1_795_564_800;
const JUNE_2025: i64 = 1_748_736_000;

/// Azure's report: policy 0x3001f, all TCBs 3/0/8/115.
fn azure() -> VerifiedReport {
    verified(
        "milan-azure-trustee/test-report.bin",
        "milan-azure-trustee/test-vcek.der",
        "azure-certchain.pem",
        TODAY,
    )
}

/// Constellation's AWS report: reported 4/0/24/217, launch and committed 219, current 220.
fn aws() -> VerifiedReport {
    verified(
        "constellation-aws/report.bin",
        "constellation-aws/vlek.pem",
        "azure-vlekcertchain.pem",
        JUNE_2025,
    )
}

fn config(json: &str) -> SnpConfig {
    SnpConfig::from_attestation_config(json.as_bytes()).unwrap()
}

const AZURE_DIGEST: &str = "035621";

fn azure_digest() -> String {
    hex::encode(azure().report.id_key_digest())
}

#[test]
fn a_report_at_the_minimum_passes_and_one_below_it_fails() {
    let at = |bl, tee, snp, ucode| {
        config(&format!(
            r#"{{"measurements":{{}},"bootloaderVersion":{bl},"teeVersion":{tee},"snpVersion":{snp},"microcodeVersion":{ucode}}}"#
        ))
    };
    assert_eq!(at(3, 0, 8, 115).check(&azure()), Ok(vec![]));
    assert_eq!(at(0, 0, 0, 0).check(&azure()), Ok(vec![]));
    for config in [
        at(4, 0, 8, 115),
        at(3, 1, 8, 115),
        at(3, 0, 9, 115),
        at(3, 0, 8, 116),
    ] {
        assert!(matches!(
            config.check(&azure()).unwrap_err(),
            SnpPolicyError::TcbBelowMinimum {
                which: "reported",
                ..
            }
        ));
    }
    // AWS: reported 217 is what the VLEK was issued for; launch and committed are 219.
    assert_eq!(at(4, 0, 24, 217).check(&aws()), Ok(vec![]));
    let error = at(4, 0, 24, 218).check(&aws()).unwrap_err();
    assert_eq!(
        error,
        SnpPolicyError::TcbBelowMinimum {
            which: "reported",
            tcb: Tcb {
                fmc: None,
                bootloader: 4,
                tee: 0,
                snp: 24,
                microcode: 217
            },
            minimum: Tcb {
                fmc: None,
                bootloader: 4,
                tee: 0,
                snp: 24,
                microcode: 218
            },
        }
    );
}

#[test]
fn provisional_firmware_is_permitted() {
    // Current 220 is above committed 219: a provisional update, which Constellation permits.
    let aws = aws();
    let product = aws.product();
    assert!(
        aws.report.current_tcb(product).microcode > aws.report.committed_tcb(product).microcode
    );
    let config =
        config(r#"{"bootloaderVersion":4,"teeVersion":0,"snpVersion":24,"microcodeVersion":200}"#);
    assert_eq!(config.check(&aws), Ok(vec![]));
}

#[test]
fn smt_is_refused_when_the_config_says_so() {
    let config = config(
        r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0,"microcodeVersion":0,"smtAllowed":false}"#,
    );
    assert_eq!(config.check(&aws()).unwrap_err(), SnpPolicyError::Smt);
}

#[test]
fn the_id_key_digest_is_checked_against_the_firmware_signer_config() {
    let digest = azure_digest();
    assert!(digest.starts_with(AZURE_DIGEST));
    let with = |digests: &str, policy: &str| {
        config(&format!(
            r#"{{"bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115,
                "firmwareSignerConfig":{{"acceptedKeyDigests":[{digests}],"enforcementPolicy":"{policy}"}}}}"#
        ))
    };
    let other = format!("\"{}\"", "00".repeat(48));
    assert_eq!(
        with(&format!("{other},\"{digest}\""), "Equal").check(&azure()),
        Ok(vec![])
    );
    assert_eq!(
        with(&other, "Equal").check(&azure()).unwrap_err(),
        SnpPolicyError::IdKeyDigest(digest.clone())
    );
    let maa = with(&other, "MAAFallback");
    assert_eq!(
        maa.firmware_signer.as_ref().unwrap().enforcement,
        Enforcement::MaaFallback
    );
    assert_eq!(
        maa.check(&azure()).unwrap_err(),
        SnpPolicyError::IdKeyDigest(digest.clone())
    );
    let notes = with(&other, "WarnOnly").check(&azure()).unwrap();
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains(&digest), "{notes:?}");
}

#[test]
fn bad_configs_are_refused_with_the_field_named() {
    let err = |json: &str| SnpConfig::from_attestation_config(json.as_bytes()).unwrap_err();
    assert_eq!(
        err(r#"{"bootloaderVersion":"latest","teeVersion":0,"snpVersion":0,"microcodeVersion":0}"#),
        SnpConfigError::Latest {
            field: "bootloaderVersion".into()
        }
    );
    assert_eq!(
        err(r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0}"#),
        SnpConfigError::MissingVersion {
            field: "microcodeVersion".into()
        }
    );
    assert!(matches!(
        err(r#"{"bootloaderVersion":0,"teeVersion":256,"snpVersion":0,"microcodeVersion":0}"#),
        SnpConfigError::BadVersion { ref field, .. } if field == "teeVersion"
    ));
    assert!(matches!(
        err(
            r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0,"microcodeVersion":0,"amdRootKey":"not pem"}"#
        ),
        SnpConfigError::RootKey(_)
    ));
    assert!(matches!(
        err(
            r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0,"microcodeVersion":0,
               "firmwareSignerConfig":{"acceptedKeyDigests":["abcd"]}}"#
        ),
        SnpConfigError::FirmwareSigner(_)
    ));
}

#[test]
fn amd_root_key_replaces_the_built_in_roots() {
    let ark_pem = String::from_utf8(read("milan-ark.pem")).unwrap();
    let json = serde_json::json!({
        "bootloaderVersion": 0, "teeVersion": 0, "snpVersion": 0, "microcodeVersion": 0,
        "amdRootKey": ark_pem,
    });
    let config = SnpConfig::from_attestation_config(json.to_string().as_bytes()).unwrap();
    assert!(config.custom_root);
    assert_eq!(config.trust.arks().len(), 1);
    assert_eq!(config.trust.arks()[0].common_name(), "ARK-Milan");
    assert!(!config_default().custom_root);
    assert_eq!(config_default().trust.arks().len(), 3);
}

fn config_default() -> SnpConfig {
    config(r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0,"microcodeVersion":0}"#)
}

#[test]
fn an_snp_variant_config_needs_an_enforced_measurement_and_its_digest_covers_the_snp_settings() {
    use attestation::PolicyError;
    use attestation::snp::StaticCollateral;
    use attestation::variants::sev_snp::{Binding, SevSnpValidator};
    use std::sync::Arc;

    let load = |json: &str| {
        SevSnpValidator::from_attestation_config(
            Binding::Aws,
            json.as_bytes(),
            Arc::new(StaticCollateral::new()),
        )
    };
    let pcr = format!(
        r#""measurements":{{"4":{{"expected":"{}","warnOnly":false}}}}"#,
        "44".repeat(32)
    );
    let tcb = |ucode: u8| {
        format!(r#""bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":{ucode}"#)
    };
    let (_, a) = load(&format!("{{{pcr},{}}}", tcb(115))).unwrap();
    let (_, b) = load(&format!("{{{pcr},{}}}", tcb(116))).unwrap();
    let (_, c) = load(&format!("{{{pcr},{},\"smtAllowed\":false}}", tcb(115))).unwrap();
    assert_ne!(a, b, "the minimum TCB is part of the digest");
    assert_ne!(a, c, "SMT is part of the digest");
    let (_, again) = load(&format!("{{{},{pcr}}}", tcb(115))).unwrap();
    assert_eq!(a, again, "key order does not matter");

    assert!(matches!(
        load(&format!(r#"{{"measurements":{{}},{}}}"#, tcb(115))).unwrap_err(),
        PolicyError::NothingEnforced
    ));
    assert!(matches!(
        load(&format!("{{{pcr},\"bootloaderVersion\":\"latest\",\"teeVersion\":0,\"snpVersion\":8,\"microcodeVersion\":1}}")).unwrap_err(),
        PolicyError::Snp(SnpConfigError::Latest { ref field }) if field == "bootloaderVersion"
    ));
}

const MILAN_MIN: &str =
    r#""bootloaderVersion":3,"teeVersion":0,"snpVersion":8,"microcodeVersion":115"#;

/// Azure's Genoa report (TCBs 10/0/23/84), verified with Genoa's chain.
fn genoa() -> VerifiedReport {
    let evidence: serde_json::Value =
        serde_json::from_slice(&read("azure-genoa-vtpm/evidence-genoa.json")).unwrap();
    let hcl: Vec<u8> = evidence["report"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect();
    let vcek = certs_from_pem(evidence["vcek"].as_str().unwrap().as_bytes())
        .unwrap()
        .remove(0);
    let mut chain = certs_from_pem(&read("amd-roots/genoa-ask-ark.pem")).unwrap();
    let ark = chain.pop().unwrap();
    let ask = chain.pop().unwrap();
    let report = Report::parse(&hcl[0x20..0x20 + 1184]).unwrap();
    verify_report(&report, &vcek, &ask, &ark, &Trust::builtin(), TODAY).unwrap()
}

#[test]
fn azure_sev_snp_is_refused_without_a_firmware_signer_config() {
    use attestation::Variant;
    use attestation::snp::StaticCollateral;
    use attestation::variants::sev_snp::{Binding, SevSnpValidator};
    use attestation::{PolicyError, Variant::AzureSevSnp};
    use std::sync::Arc;

    let pcr = format!(
        r#""measurements":{{"4":{{"expected":"{}","warnOnly":false}}}}"#,
        "44".repeat(32)
    );
    let digest = azure_digest();
    for signer in [
        String::new(),
        r#","firmwareSignerConfig":null"#.to_owned(),
        format!(
            r#","firmwareSignerConfig":{{"acceptedKeyDigests":["{digest}"],"enforcementPolicy":"WarnOnly"}}"#
        ),
    ] {
        let json = format!("{{{pcr},{MILAN_MIN}{signer}}}");
        let error = SnpConfig::for_variant(AzureSevSnp, json.as_bytes()).unwrap_err();
        assert!(
            matches!(
                error,
                SnpConfigError::Unpinned {
                    field: "firmwareSignerConfig",
                    ..
                }
            ) && error.to_string().contains("Stricter than Constellation"),
            "{signer}: {error}"
        );
        // The loader attest-proxy and join-client build validators with refuses it too.
        let error = SevSnpValidator::from_attestation_config(
            Binding::Azure,
            json.as_bytes(),
            Arc::new(StaticCollateral::new()),
        )
        .unwrap_err();
        assert!(
            matches!(error, PolicyError::Snp(SnpConfigError::Unpinned { .. })),
            "{error}"
        );
        // The other SNP variants bind their firmware otherwise (VLEK of AWS, GCE API).
        for variant in [Variant::AwsSevSnp, Variant::GcpSevSnp] {
            let without = format!("{{{pcr},{MILAN_MIN}}}");
            SnpConfig::for_variant(variant, without.as_bytes()).unwrap();
        }
    }
    // With Constellation's field, or with the launch measurement pinned instead: accepted.
    for pin in [
        format!(r#""firmwareSignerConfig":{{"acceptedKeyDigests":["{digest}"]}}"#),
        format!(
            r#""firmwareSignerConfig":{{"acceptedKeyDigests":["{digest}"],"enforcementPolicy":"MAAFallback"}}"#
        ),
        format!(
            r#""launchMeasurements":["{}"]"#,
            hex::encode(azure().report.measurement())
        ),
    ] {
        let json = format!("{{{pcr},{MILAN_MIN},{pin}}}");
        let config = SnpConfig::for_variant(AzureSevSnp, json.as_bytes()).unwrap();
        assert_eq!(config.check(&azure()), Ok(vec![]), "{pin}");
    }
}

#[test]
fn the_firmware_pins_accept_the_real_reports_values_and_refuse_others_by_name() {
    let with = |pins: &str| config(&format!("{{{MILAN_MIN},{pins}}}"));
    let azure = azure();
    let report = &azure.report;
    let measurement = hex::encode(report.measurement());
    let author = hex::encode(report.author_key_digest());
    let host_data = hex::encode(report.host_data());
    let chip = hex::encode(report.chip_id());
    let other48 = "ab".repeat(48);
    assert_eq!(
        with(&format!(
            r#""launchMeasurements":["{other48}","{measurement}"],"acceptedAuthorKeyDigests":["{author}"],"hostData":"{host_data}","allowedChipIds":["{}","{chip}"]"#,
            "cd".repeat(64)
        ))
        .check(&azure),
        Ok(vec![])
    );
    assert_eq!(
        with(&format!(r#""launchMeasurements":["{other48}"]"#)).check(&azure),
        Err(SnpPolicyError::Measurement(measurement.clone()))
    );
    assert_eq!(
        with(&format!(r#""acceptedAuthorKeyDigests":["{other48}"]"#)).check(&azure),
        Err(SnpPolicyError::AuthorKeyDigest(author))
    );
    assert_eq!(
        with(&format!(r#""hostData":"{}""#, "ef".repeat(32))).check(&azure),
        Err(SnpPolicyError::HostData(host_data))
    );
    assert_eq!(
        with(&format!(r#""allowedChipIds":["{}"]"#, "cd".repeat(64))).check(&azure),
        Err(SnpPolicyError::ChipId(chip.clone()))
    );
    // AWS's reports mask CHIP_ID: an allow-list of chips never passes them.
    let aws_min = r#""bootloaderVersion":4,"teeVersion":0,"snpVersion":24,"microcodeVersion":217"#;
    let aws_config = |pins: &str| config(&format!("{{{aws_min},{pins}}}"));
    assert!(matches!(
        aws_config(&format!(r#""allowedChipIds":["{chip}"]"#)).check(&aws()),
        Err(SnpPolicyError::ChipId(_))
    ));
    // Constellation's AWS vector, by the MEASUREMENT its README gives.
    let aws_measurement = "5a5cdbad8f540ce4abca0120faec86f62ef7128a4ac711add34d468b5957c82aa2f24e8f111dadc3689b787b88ed0715";
    assert_eq!(
        aws_config(&format!(r#""launchMeasurements":["{aws_measurement}"]"#)).check(&aws()),
        Ok(vec![])
    );
    assert_eq!(
        aws_config(&format!(r#""launchMeasurements":["{measurement}"]"#)).check(&aws()),
        Err(SnpPolicyError::Measurement(aws_measurement.to_owned()))
    );
    // Malformed pins are named.
    let err = |json: String| SnpConfig::from_attestation_config(json.as_bytes()).unwrap_err();
    for (pins, field) in [
        (
            r#""launchMeasurements":[]"#.to_owned(),
            "launchMeasurements",
        ),
        (
            r#""launchMeasurements":["abcd"]"#.to_owned(),
            "launchMeasurements",
        ),
        (
            format!(r#""acceptedAuthorKeyDigests":["{}"]"#, "ab".repeat(32)),
            "acceptedAuthorKeyDigests",
        ),
        (format!(r#""hostData":"{other48}""#), "hostData"),
        (
            format!(r#""allowedChipIds":["{other48}"]"#),
            "allowedChipIds",
        ),
    ] {
        assert!(
            matches!(err(format!("{{{MILAN_MIN},{pins}}}")), SnpConfigError::BadPin { field: f, .. } if f == field),
            "{pins}"
        );
    }
}

#[test]
fn each_product_has_its_own_minimum_and_one_without_is_refused_by_name() {
    let genoa = genoa();
    // Constellation's four fields alone: Milan's minimum, none for Genoa.
    let error = config(&format!("{{{MILAN_MIN}}}"))
        .check(&genoa)
        .unwrap_err();
    assert_eq!(error, SnpPolicyError::NoMinimumTcb(Product::Genoa));
    assert!(
        error.to_string().contains("minimumTcb.Genoa")
            && error.to_string().contains("Stricter than Constellation"),
        "{error}"
    );
    let with_genoa = |bl, tee, snp, ucode| {
        config(&format!(
            r#"{{"bootloaderVersion":99,"teeVersion":99,"snpVersion":99,"microcodeVersion":255,
                "minimumTcb":{{"Genoa":{{"bootloaderVersion":{bl},"teeVersion":{tee},"snpVersion":{snp},"microcodeVersion":{ucode}}}}}}}"#
        ))
    };
    // Genoa's minimum decides for Genoa, whatever Milan's is.
    assert_eq!(with_genoa(10, 0, 23, 84).check(&genoa), Ok(vec![]));
    for config in [
        with_genoa(11, 0, 23, 84),
        with_genoa(10, 1, 23, 84),
        with_genoa(10, 0, 24, 84),
        with_genoa(10, 0, 23, 85),
    ] {
        assert!(matches!(
            config.check(&genoa),
            Err(SnpPolicyError::TcbBelowMinimum { .. })
        ));
    }
    // ... and Milan's for Milan.
    assert!(matches!(
        with_genoa(0, 0, 0, 0).check(&azure()),
        Err(SnpPolicyError::TcbBelowMinimum { .. })
    ));
    // Malformed per-product minimums are named.
    let err = |minimum: &str| {
        SnpConfig::from_attestation_config(
            format!(r#"{{{MILAN_MIN},"minimumTcb":{minimum}}}"#).as_bytes(),
        )
        .unwrap_err()
        .to_string()
    };
    let tcb4 = r#""bootloaderVersion":0,"teeVersion":0,"snpVersion":0,"microcodeVersion":0"#;
    assert!(
        err(&format!(r#"{{"Turin":{{{tcb4}}}}}"#))
            .contains("minimumTcb.Turin.fmcVersion is missing")
    );
    assert!(err(&format!(r#"{{"Genoa":{{{tcb4},"fmcVersion":0}}}}"#)).contains("Genoa.fmcVersion"));
    assert!(err(&format!(r#"{{"Milan":{{{tcb4}}}}}"#)).contains("top-level"));
    assert!(err(&format!(r#"{{"Bergamo":{{{tcb4}}}}}"#)).contains("not Genoa or Turin"));
    assert!(err(r#"{"Genoa":{"bootloaderVersion":"latest","teeVersion":0,"snpVersion":0,"microcodeVersion":0}}"#).contains("minimumTcb.Genoa.bootloaderVersion is \"latest\""));
}
