//! The qemu-tdx issuer against a simulated kernel (soft-issuer's `FakeConfigfsTsm` with a
//! simulated TDX machine behind it, whose file operations are the production `RealFs` on a
//! temporary directory): its documents pass the real validator with the simulated Intel's
//! collateral; each broken interface gives its own error, and no request leaves its entry
//! behind.

#![allow(clippy::unwrap_used)]

use std::io;
use std::sync::Arc;

use attestation::{Issuer, Validator, Variant};
use configfs_tsm::{Request, Tsm, TsmError};
use pcs_standin::SimulatedIntel;
use soft_issuer::tdx::{QuoteVersion, TdFields, TdxMachine, qemu_validator};
use soft_issuer::tsm::FakeConfigfsTsm;
use tdx_issuer::{ConfigfsTdx, QemuTdxIssuer, TdxQuoteError, report_data};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];

struct Site {
    intel: SimulatedIntel,
    machine: Arc<TdxMachine>,
}

fn site() -> Site {
    let intel = SimulatedIntel::new().unwrap();
    let machine = Arc::new(TdxMachine::new(&intel, Default::default()).unwrap());
    Site { intel, machine }
}

fn issuer(fake: &FakeConfigfsTsm) -> QemuTdxIssuer<&FakeConfigfsTsm> {
    QemuTdxIssuer::with_source(ConfigfsTdx::with_fs(fake, fake.root()))
}

/// A guest whose host answers every request with `outblob`.
fn answering(outblob: Vec<u8>) -> FakeConfigfsTsm {
    FakeConfigfsTsm::new_tdx(Box::new(move |_| Ok(outblob.clone()))).unwrap()
}

#[test]
fn a_td_gives_documents_the_real_validator_accepts_for_their_nonce() {
    let s = site();
    for version in [QuoteVersion::V4, QuoteVersion::V5] {
        let td = TdFields {
            version,
            ..TdFields::default()
        };
        let fake = FakeConfigfsTsm::tdx(s.machine.clone(), td).unwrap();
        let doc = issuer(&fake).issue(USER_DATA, NONCE).unwrap();

        let validator = qemu_validator(&s.intel, &s.machine).unwrap();
        let verified = validator.validate(&doc, NONCE).unwrap();
        assert_eq!(verified.variant, Variant::QemuTdx);
        assert_eq!(verified.user_data, USER_DATA);
        assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
        // Bound to this nonce: another one is refused.
        let err = validator.validate(&doc, b"another nonce").unwrap_err();
        assert!(err.to_string().contains("REPORT_DATA"), "{err}");

        // Constellation's document: these two keys, in Go's field order.
        let text = String::from_utf8(doc).unwrap();
        assert!(text.starts_with("{\"RawQuote\":\""), "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 2);
        assert!(text.find("\"RawQuote\"") < text.find("\"UserData\""));
        assert_eq!(fake.reports_made(), 1);
        assert_eq!(fake.entries_present().unwrap(), 0);
    }
}

#[test]
fn another_tsm_is_refused_by_name() {
    let s = site();
    let fake = FakeConfigfsTsm::tdx(s.machine.clone(), TdFields::default())
        .unwrap()
        .with_provider("sev_guest");
    let err = issuer(&fake).issue(USER_DATA, NONCE).unwrap_err();
    assert!(
        err.reason.contains(
            "asking configfs-tsm at {} for a TD quote: configfs-tsm's provider is \"sev_guest\", not \"tdx_guest\""
                .replace("{}", &fake.root().display().to_string())
                .as_str()
        ),
        "{err}"
    );
    let source = err
        .source
        .as_ref()
        .unwrap()
        .downcast_ref::<TdxQuoteError>()
        .unwrap();
    assert!(
        matches!(
            source,
            TdxQuoteError::Tsm {
                source: TsmError::WrongProvider {
                    expected: "tdx_guest",
                    found,
                },
                ..
            } if found == "sev_guest"
        ),
        "{source}"
    );
    assert_eq!(fake.reports_made(), 0);
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn a_racing_writer_is_noticed_and_the_request_repeated_in_a_new_entry() {
    let s = site();
    let fake = FakeConfigfsTsm::tdx(s.machine.clone(), TdFields::default())
        .unwrap()
        .with_racing_writer(1);
    let doc = issuer(&fake).issue(USER_DATA, NONCE).unwrap();
    qemu_validator(&s.intel, &s.machine)
        .unwrap()
        .validate(&doc, NONCE)
        .unwrap();
    // The racer's quote (its write came before the outblob read), then ours.
    assert_eq!(fake.reports_made(), 2);
    assert_eq!(fake.entries_present().unwrap(), 0);

    let fake = FakeConfigfsTsm::tdx(s.machine.clone(), TdFields::default())
        .unwrap()
        .with_racing_writer(100);
    let source = ConfigfsTdx::with_fs(&fake, fake.root());
    let err = source.quote(&[7; 64]).unwrap_err();
    // No privlevel on TDX: our one write made generation 1, the racer's 2.
    assert!(
        matches!(
            &err,
            TdxQuoteError::Tsm { source: TsmError::Raced { attempts: 3, last }, .. }
                if last.contains("generation is 2, expected 1")
        ),
        "{err:?}"
    );
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn a_short_outblob_or_one_that_is_no_td_quote_is_refused_by_name() {
    let s = site();
    let rd = report_data(USER_DATA, NONCE);
    let quote = s.machine.quote(&TdFields::default(), &rd).unwrap();

    let err = issuer(&answering(vec![4, 0, 2, 0]))
        .issue_document(USER_DATA, NONCE)
        .unwrap_err();
    assert!(
        matches!(err, TdxQuoteError::Short { len: 4, needed: 48 }),
        "{err}"
    );

    // The header and half the body: REPORT_DATA would end at 48 + 520 + 64.
    let err = issuer(&answering(quote[..300].to_vec()))
        .issue_document(USER_DATA, NONCE)
        .unwrap_err();
    assert!(
        matches!(
            err,
            TdxQuoteError::Short {
                len: 300,
                needed: 632
            }
        ),
        "{err}"
    );

    let mut sgx = quote.clone();
    sgx[4..8].copy_from_slice(&0u32.to_le_bytes());
    let err = issuer(&answering(sgx))
        .issue_document(USER_DATA, NONCE)
        .unwrap_err();
    assert!(matches!(err, TdxQuoteError::NotTdx(0)), "{err}");
    assert!(err.to_string().contains("not TDX (0x81)"), "{err}");

    let mut v3 = quote.clone();
    v3[0..2].copy_from_slice(&3u16.to_le_bytes());
    let err = issuer(&answering(v3))
        .issue_document(USER_DATA, NONCE)
        .unwrap_err();
    assert!(matches!(err, TdxQuoteError::Version(3)), "{err}");

    // The quote itself is fine.
    issuer(&answering(quote))
        .issue_document(USER_DATA, NONCE)
        .unwrap();
}

#[test]
fn a_quote_over_other_report_data_is_refused() {
    let s = site();
    let machine = s.machine.clone();
    let fake = FakeConfigfsTsm::new_tdx(Box::new(move |_| {
        machine
            .quote(&TdFields::default(), &[0x33; 64])
            .map_err(io::Error::other)
    }))
    .unwrap();
    let err = issuer(&fake).issue(USER_DATA, NONCE).unwrap_err();
    assert!(
        err.reason.contains("REPORT_DATA is not what was asked for"),
        "{err}"
    );
    assert!(matches!(
        err.source.as_ref().unwrap().downcast_ref::<TdxQuoteError>(),
        Some(TdxQuoteError::ReportDataMismatch)
    ));
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn the_host_failing_the_quote_is_the_kernels_error_on_the_outblob() {
    // tdx-guest answers a failed GetQuote hypercall with EIO.
    let fake =
        FakeConfigfsTsm::new_tdx(Box::new(|_| Err(io::Error::from_raw_os_error(5)))).unwrap();
    let err = issuer(&fake).issue_document(USER_DATA, NONCE).unwrap_err();
    match &err {
        TdxQuoteError::Tsm {
            source:
                TsmError::Attribute {
                    path,
                    action: "read",
                    source,
                },
            ..
        } => {
            assert!(path.ends_with("outblob"), "{}", path.display());
            assert_eq!(source.raw_os_error(), Some(5));
        }
        other => panic!("{other}"),
    }
    assert_eq!(fake.entries_present().unwrap(), 0);
}

#[test]
fn no_configfs_is_said_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tsm/report");
    let err = QemuTdxIssuer::new(&missing)
        .issue_document(USER_DATA, NONCE)
        .unwrap_err();
    assert!(
        matches!(&err, TdxQuoteError::Tsm { source: TsmError::NoConfigfs(p), .. } if *p == missing),
        "{err}"
    );
}

#[test]
fn the_kernel_quotes_only_a_whole_report_data() {
    // tdx-guest refuses an inblob of other than 64 bytes when the quote is read, which is why
    // the issuer pads extraData to 64 itself.
    let s = site();
    let fake = FakeConfigfsTsm::tdx(s.machine.clone(), TdFields::default()).unwrap();
    let tsm = Tsm::with_fs(&fake, fake.root(), tdx_issuer::TDX_GUEST_PROVIDER);
    let err = tsm
        .request(&Request {
            inblob: &[1; 32],
            privlevel: None,
            auxblob: false,
        })
        .unwrap_err();
    assert!(
        matches!(&err, TsmError::Attribute { path, action: "read", source }
            if path.ends_with("outblob") && source.raw_os_error() == Some(22)),
        "{err:?}"
    );
    // Nor has a TD a privlevel to write.
    let err = tsm
        .request(&Request {
            inblob: &[1; 64],
            privlevel: Some(0),
            auxblob: false,
        })
        .unwrap_err();
    assert!(
        matches!(&err, TsmError::Attribute { path, action: "write", source }
            if path.ends_with("privlevel") && source.kind() == io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert_eq!(fake.reports_made(), 0);
    assert_eq!(fake.entries_present().unwrap(), 0);
}
