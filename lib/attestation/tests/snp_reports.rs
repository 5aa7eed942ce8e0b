//! The SEV-SNP verifier against real reports from real machines
//! (`testdata/snp/README` in the shared test vectors; copied into `testdata/snp`).

#![allow(clippy::unwrap_used)]

use attestation::snp::{
    Cert, Product, Report, SigningKey, SnpError, Tcb, Trust, certs, certs_from_pem, verify_report,
};

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/testdata/snp/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn cert(path: &str) -> Cert {
    let bytes = read(path);
    if bytes.starts_with(b"-----") {
        certs_from_pem(&bytes).unwrap().remove(0)
    } else {
        Cert::from_der(bytes).unwrap()
    }
}

/// The ASK/ASVK and ARK of a KDS-style chain file (intermediate first).
fn chain(path: &str) -> (Cert, Cert) {
    let mut certs = certs_from_pem(&read(path)).unwrap();
    assert_eq!(certs.len(), 2, "{path}");
    let ark = certs.pop().unwrap();
    (certs.pop().unwrap(), ark)
}

/// Seconds since the epoch of a UTC date.
fn at(date: &str) -> i64 {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(date, &format)
        .unwrap()
        .midnight()
        .assume_utc()
        .unix_timestamp()
}

const TODAY: &str = "2026-11-25";

fn verify(
    report: &[u8],
    leaf: &Cert,
    chain_file: &str,
    when: &str,
) -> Result<attestation::snp::VerifiedReport, SnpError> {
    let report = Report::parse(report)?;
    let (intermediate, ark) = chain(chain_file);
    verify_report(
        &report,
        leaf,
        &intermediate,
        &ark,
        &Trust::builtin(),
        at(when),
    )
}

#[test]
fn a_bare_metal_milan_report_verifies() {
    let verified = verify(
        &read("milan-virtee/report.bin"),
        &cert("milan-virtee/vcek.der"),
        "azure-certchain.pem",
        TODAY,
    )
    .unwrap();
    assert_eq!(verified.product(), Product::Milan);
    assert_eq!(verified.report.version(), 2);
    assert_eq!(verified.report.vmpl(), 0);
    assert_eq!(verified.report.policy(), 0x30000);
    assert_eq!(verified.signer.key, SigningKey::Vcek);
    let tcb = Tcb {
        fmc: None,
        bootloader: 3,
        tee: 0,
        snp: 8,
        microcode: 115,
    };
    assert_eq!(verified.signer.tcb, tcb);
    assert_eq!(verified.report.reported_tcb(Product::Milan), tcb);
    assert_eq!(verified.report.launch_tcb(Product::Milan), tcb);
}

#[test]
fn tampering_with_the_milan_report_or_its_vcek_fails() {
    let mut report = read("milan-virtee/report.bin");
    report[21] ^= 1;
    assert_eq!(
        verify(
            &report,
            &cert("milan-virtee/vcek.der"),
            "azure-certchain.pem",
            TODAY
        )
        .unwrap_err(),
        SnpError::ReportSignature
    );
    let mut vcek = read("milan-virtee/vcek.der");
    vcek[40] ^= 1;
    let error = match Cert::from_der(vcek) {
        Err(e) => e,
        Ok(vcek) => verify(
            &read("milan-virtee/report.bin"),
            &vcek,
            "azure-certchain.pem",
            TODAY,
        )
        .unwrap_err(),
    };
    assert!(
        matches!(
            error,
            SnpError::ChainSignature {
                which: "signer",
                ..
            } | SnpError::Certificate(_)
        ),
        "{error}"
    );
}

#[test]
fn the_azure_trustee_report_verifies_and_its_tampering_cases_fail() {
    let vcek = cert("milan-azure-trustee/test-vcek.der");
    let good = read("milan-azure-trustee/test-report.bin");
    let verified = verify(&good, &vcek, "azure-certchain.pem", TODAY).unwrap();
    assert_eq!(verified.report.policy(), 0x3001f);
    assert!(hex::encode(verified.report.id_key_digest()).starts_with("035621"));

    let mut report = good.clone();
    report[42] = report[42].wrapping_add(1);
    assert_eq!(
        verify(&report, &vcek, "azure-certchain.pem", TODAY).unwrap_err(),
        SnpError::ReportSignature
    );

    let mut report = good.clone();
    report[0x180] = report[0x180].wrapping_add(1);
    assert!(matches!(
        verify(&report, &vcek, "azure-certchain.pem", TODAY).unwrap_err(),
        SnpError::TcbMismatch { .. }
    ));

    for fake in [
        "milan-azure-trustee/test-vcek-invalid-legacy.der",
        "milan-azure-trustee/test-vcek-invalid-new.der",
    ] {
        let error = verify(&good, &cert(fake), "azure-certchain.pem", TODAY).unwrap_err();
        assert!(
            matches!(
                error,
                SnpError::ChainSignature {
                    which: "signer",
                    ..
                }
            ),
            "{fake}: {error}"
        );
    }
}

#[test]
fn an_azure_report_verifies_after_slicing_off_trailing_bytes() {
    let raw = read("azure-attestation.bin");
    assert_eq!(
        Report::parse(&raw).unwrap_err(),
        SnpError::ReportLength(raw.len()),
        "a report is exactly 1184 bytes"
    );
    verify(
        &raw[..1184],
        &cert("azure-vcek.pem"),
        "azure-certchain.pem",
        TODAY,
    )
    .unwrap();
}

#[test]
fn the_azure_hcl_report_carries_a_report_that_verifies() {
    let hcl = read("azure-milan-vtpm/hcl-report.bin");
    let mut chain = certs_from_pem(&read("azure-milan-vtpm/vcek.pem")).unwrap();
    let ark = chain.pop().unwrap();
    let ask = chain.pop().unwrap();
    let vcek = chain.pop().unwrap();
    let report = Report::parse(&hcl[0x20..0x20 + 1184]).unwrap();
    verify_report(&report, &vcek, &ask, &ark, &Trust::builtin(), at(TODAY)).unwrap();
}

#[test]
fn constellations_aws_vlek_report_verifies_inside_its_window_only() {
    let report = read("constellation-aws/report.bin");
    let vlek = cert("constellation-aws/vlek.pem");
    let verified = verify(&report, &vlek, "azure-vlekcertchain.pem", "2025-06-01").unwrap();
    assert_eq!(verified.report.version(), 3);
    assert_eq!(verified.signer.key, SigningKey::Vlek);
    assert_eq!(verified.signer.hw_id, None);
    assert!(
        verified
            .signer
            .csp_id
            .as_deref()
            .unwrap()
            .contains("cc-eu-west-1")
    );
    let tcb = |bl, tee, snp, microcode| Tcb {
        fmc: None,
        bootloader: bl,
        tee,
        snp,
        microcode,
    };
    assert_eq!(verified.signer.tcb, tcb(4, 0, 24, 217));
    assert_eq!(
        verified.report.launch_tcb(Product::Milan),
        tcb(4, 0, 24, 219)
    );
    assert_eq!(
        verified.report.committed_tcb(Product::Milan),
        tcb(4, 0, 24, 219)
    );
    assert_eq!(
        verified.report.current_tcb(Product::Milan),
        tcb(4, 0, 24, 220)
    );
    assert_eq!(
        hex::encode(verified.report.report_data()),
        "87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf506154af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f"
    );

    // Expired today.
    assert!(matches!(
        verify(&report, &vlek, "azure-vlekcertchain.pem", TODAY).unwrap_err(),
        SnpError::Expired {
            which: "signer",
            ..
        }
    ));
    // The signature's first byte changed.
    let mut tampered = report.clone();
    tampered[0x2A0] ^= 1;
    assert_eq!(
        verify(&tampered, &vlek, "azure-vlekcertchain.pem", "2025-06-01").unwrap_err(),
        SnpError::ReportSignature
    );
    // A VLEK report cannot be passed off with the VCEK chain.
    assert!(verify(&report, &vlek, "azure-certchain.pem", "2025-06-01").is_err());
}

#[test]
fn the_vlek_report_verifies_with_its_own_vlek_only() {
    let report = read("vlek-report.bin");
    verify(
        &report,
        &cert("vlek-cc-test.der"),
        "azure-vlekcertchain.pem",
        "2023-10-01",
    )
    .unwrap();
    // azure-vlek.pem is another VLEK (valid 2023-07-19 to 2024-07-19).
    let error = verify(
        &report,
        &cert("azure-vlek.pem"),
        "azure-vlekcertchain.pem",
        "2023-10-01",
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            SnpError::ReportSignature | SnpError::TcbMismatch { .. }
        ),
        "{error}"
    );
}

#[test]
fn a_genoa_report_verifies_with_genoas_chain() {
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
    let verified = verify(
        &hcl[0x20..0x20 + 1184],
        &vcek,
        "amd-roots/genoa-ask-ark.pem",
        TODAY,
    )
    .unwrap();
    assert_eq!(verified.product(), Product::Genoa);
    assert_eq!(
        verified.signer.tcb,
        Tcb {
            fmc: None,
            bootloader: 10,
            tee: 0,
            snp: 23,
            microcode: 84
        }
    );
    // Milan's chain does not certify a Genoa VCEK.
    assert!(verify(&hcl[0x20..0x20 + 1184], &vcek, "azure-certchain.pem", TODAY).is_err());
}

#[test]
fn a_turin_vcek_chains_to_turins_ark_with_an_eight_byte_hwid() {
    let vcek = cert("turin-vcek/vcek.der");
    let (ask, ark) = chain("amd-roots/turin-ask-ark.pem");
    let facts = certs::verify_chain(&vcek, &ask, &ark, Trust::builtin().arks(), at(TODAY)).unwrap();
    assert_eq!(facts.product, Product::Turin);
    assert_eq!(facts.hw_id.as_ref().map(Vec::len), Some(8));
    assert_eq!(
        facts.tcb,
        Tcb {
            fmc: Some(0),
            bootloader: 0,
            tee: 0,
            snp: 0,
            microcode: 9
        }
    );
}

#[test]
fn asvk_chains_verify_for_genoa_and_turin() {
    for file in [
        "amd-roots/genoa-asvk-ark.pem",
        "amd-roots/turin-asvk-ark.pem",
    ] {
        let (asvk, ark) = chain(file);
        assert!(asvk.common_name().starts_with("SEV-VLEK-"), "{file}");
        assert!(
            Trust::builtin().arks().iter().any(|a| a.der() == ark.der()),
            "{file}"
        );
    }
}

#[test]
fn a_root_the_configuration_does_not_trust_is_refused() {
    let report = Report::parse(&read("milan-virtee/report.bin")).unwrap();
    let (ask, ark) = chain("azure-certchain.pem");
    let (_, genoa_ark) = chain("amd-roots/genoa-ask-ark.pem");
    let only_genoa = Trust::from_pem(&read("amd-roots/genoa-ask-ark.pem")[..]).unwrap();
    // from_pem takes every certificate in the bundle; trust just Genoa's ARK.
    let only_genoa_ark = Trust::from_pem(
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, genoa_ark.der())
        )
        .as_bytes(),
    )
    .unwrap();
    for trust in [only_genoa, only_genoa_ark] {
        let error = verify_report(
            &report,
            &cert("milan-virtee/vcek.der"),
            &ask,
            &ark,
            &trust,
            at(TODAY),
        )
        .unwrap_err();
        assert!(matches!(error, SnpError::UntrustedRoot(_)), "{error}");
    }
}

#[test]
fn unknown_versions_and_reserved_bytes_are_refused() {
    let good = read("milan-virtee/report.bin");
    for version in [0u32, 1, 6, 0xffff_ffff] {
        let mut report = good.clone();
        report[..4].copy_from_slice(&version.to_le_bytes());
        assert_eq!(
            Report::parse(&report).unwrap_err(),
            SnpError::ReportVersion(version)
        );
    }
    for offset in [0x4C, 0x188, 0x19F, 0x1EB, 0x1F8, 0x29F, 0x330, 0x49F] {
        let mut report = good.clone();
        report[offset] = 1;
        assert_eq!(
            Report::parse(&report).unwrap_err(),
            SnpError::ReportReserved(offset),
            "{offset:#x}"
        );
    }
    // Policy bit 17 must be one; bits above 25 zero; flags above bit 4 zero; signature high bytes zero.
    for (offset, value) in [(0x0A, 0x00u8), (0x0F, 0x80), (0x48, 0x20), (0x2A0 + 48, 1)] {
        let mut report = good.clone();
        report[offset] = value;
        assert!(
            matches!(
                Report::parse(&report).unwrap_err(),
                SnpError::ReportField(_)
            ),
            "{offset:#x}"
        );
    }
    assert_eq!(
        Report::parse(&good[..100]).unwrap_err(),
        SnpError::ReportLength(100)
    );
}

#[test]
fn the_built_in_arks_are_amds() {
    let digests: Vec<String> = Trust::builtin()
        .arks()
        .iter()
        .map(|a| hex::encode(a.sha256()))
        .collect();
    assert_eq!(
        digests,
        [
            "69d063b45344d26a2e94e1f4210de49ef555308287d4c174445c95639a540bcd",
            "4c6598d19c18719c5dfd4a7d335f674e5bfe1d8f800cea2cf270c10d103db2f1",
            "1f084161a44bb6d93778a904877d4819cafa5d05ef4193b2ded9dd9c73dd3f6a",
        ]
    );
    for product in [Product::Milan, Product::Genoa, Product::Turin] {
        assert_eq!(
            Trust::builtin().ark_for(product).unwrap().common_name(),
            format!("ARK-{product}")
        );
    }
}
