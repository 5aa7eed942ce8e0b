//! The TDX verifier remembers the signatures that verified, and nothing else: a quote's
//! platform and Intel signatures are verified once, and a changed quote or changed collateral is
//! refused after its genuine twin was remembered. One test in its own process, so that the
//! process-wide memo's counters are this test's alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;

use attestation::tdx::collateral::PcsResponses;
use attestation::tdx::{Collateral, TdQuote, TdxError, Trust, remembered_signatures, verify_quote};

fn read(path: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tdx/automata-00806f050000")
        .join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn collateral(tcb_info: &[u8]) -> Collateral {
    let root = read("Intel_SGX_Provisioning_Certification_RootCA.cer");
    let root =
        pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, &root).unwrap();
    let chain = String::from_utf8(read("signing_cert.pem")).unwrap() + &root;
    Collateral::from_pcs(PcsResponses {
        tcb_info,
        tcb_info_issuer_chain: &chain,
        qe_identity: &read("qeidentityv2_apiv4.json"),
        qe_identity_issuer_chain: &chain,
        pck_crl: &read("pck_platform_crl.der"),
        pck_crl_issuer_chain: "",
        root_ca_crl: &read("intel_root_ca_crl.der"),
    })
    .unwrap()
}

/// The automata collateral's first current second.
const AT: i64 = 1739418641;
/// Offsets in the v4 quote (header 48, TD report 584, signature data length 4).
const QUOTE_SIGNATURE: usize = 48 + 584 + 4;
const QE_REPORT: usize = QUOTE_SIGNATURE + 64 + 64 + 6;
const QE_REPORT_SIGNATURE: usize = QE_REPORT + 384;

#[test]
fn a_quotes_platform_signatures_are_verified_once_and_nothing_unverified_is_remembered() {
    let memo = remembered_signatures();
    let bytes = read("quote_tdx_00806f050000.dat");
    let tcb_info = read("tcbinfov3_00806f050000.json");
    let genuine = collateral(&tcb_info);
    let quote = TdQuote::parse(&bytes).unwrap();

    let first = verify_quote(&quote, &genuine, &Trust::builtin(), AT).unwrap();
    let verified_once = memo.verified();
    assert!(
        verified_once >= 8,
        "a TDX quote carries the PCK chain's, the CRLs', the TCB info's, the QE identity's, the \
         QE report's and its own signature; {verified_once} verified"
    );
    assert_eq!(memo.hits(), 0);

    // The same quote again: every signature answered from the memo, the same verdict.
    let again = verify_quote(&quote, &genuine, &Trust::builtin(), AT).unwrap();
    assert_eq!(again.status, first.status);
    assert_eq!(memo.verified(), verified_once);
    assert_eq!(memo.hits(), verified_once);

    // Changed quotes, after their genuine twin was remembered: the changed signature (or what
    // it signs) is verified, refused, and not remembered, every time.
    for (offset, expected) in [
        (48 + 136, TdxError::QuoteSignature),
        (QUOTE_SIGNATURE + 5, TdxError::QuoteSignature),
        (QE_REPORT + 300, TdxError::QeReportSignature),
        (QE_REPORT_SIGNATURE + 5, TdxError::QeReportSignature),
    ] {
        let mut tampered = bytes.clone();
        tampered[offset] ^= 1;
        let tampered = TdQuote::parse(&tampered).unwrap();
        for _ in 0..2 {
            assert_eq!(
                verify_quote(&tampered, &genuine, &Trust::builtin(), AT).unwrap_err(),
                expected,
                "byte {offset}"
            );
        }
    }
    assert_eq!(
        memo.verified(),
        verified_once,
        "a failed signature is not remembered"
    );

    // The PCK chain's two signatures, which a verifier checks before it looks up any collateral:
    // verified with the first quote of a platform, remembered for the next.
    let before = memo.verified();
    quote.verify_pck_signatures(&Trust::builtin()).unwrap();
    assert_eq!(memo.verified(), before + 2);
    quote.verify_pck_signatures(&Trust::builtin()).unwrap();
    assert_eq!(memo.verified(), before + 2);

    // Collateral whose signed TCB info changed by one character, after the genuine one was
    // remembered: refused, every time.
    let forged = String::from_utf8(tcb_info).unwrap().replacen(
        "\"tcbEvaluationDataNumber\":17",
        "\"tcbEvaluationDataNumber\":18",
        1,
    );
    let forged = collateral(forged.as_bytes());
    for _ in 0..2 {
        assert_eq!(
            verify_quote(&quote, &forged, &Trust::builtin(), AT).unwrap_err(),
            TdxError::TcbInfoSignature
        );
    }
}
