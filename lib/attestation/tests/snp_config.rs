//! The SNP settings of the attestation config, applied to real verified reports.

#![allow(clippy::unwrap_used)]

use attestation::snp::{
    Cert, Enforcement, Report, SnpConfig, SnpConfigError, SnpPolicyError, Tcb, Trust,
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
            field: "bootloaderVersion"
        }
    );
    assert_eq!(
        err(r#"{"bootloaderVersion":0,"teeVersion":0,"snpVersion":0}"#),
        SnpConfigError::MissingVersion {
            field: "microcodeVersion"
        }
    );
    assert!(matches!(
        err(r#"{"bootloaderVersion":0,"teeVersion":256,"snpVersion":0,"microcodeVersion":0}"#),
        SnpConfigError::BadVersion {
            field: "teeVersion",
            ..
        }
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
        PolicyError::Snp(SnpConfigError::Latest { field: "bootloaderVersion" })
    ));
}
