//! Issuer and validator against a real TPM (swtpm): round trips for every AK scheme the TPM
//! supports, and the rejections an attacker's edits must cause.
//!
//! swtpm serves one connection at a time, so a test drops its issuer before extending a PCR
//! with tpm2-tools; the AK is a primary key, so reopening yields the same key.

// The helpers below are test code too; clippy's in-test exemption only sees #[test] fns.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use attestation::tpm::HashAlg;
use attestation::vtpm::AttestationDocument;
use attestation::{AkTrust, Error, Measurement, Policy, QemuVtpmValidator, Validator};
use testsupport::swtpm::Swtpm;
use tpm_issuer::{AkCurve, AkSpec, RsaSigScheme, TpmIssuer, TpmIssuerConfig};

const NONCE: [u8; 32] = [0x42; 32];
const USER_DATA: [u8; 32] = [0x17; 32];

fn issuer(tpm: &Swtpm, ak: AkSpec) -> TpmIssuer {
    let mut config = TpmIssuerConfig::new(tpm.tcti());
    config.ak = ak;
    TpmIssuer::open(&config).unwrap()
}

fn parse(doc: &[u8]) -> AttestationDocument {
    serde_json::from_slice(doc).unwrap()
}

/// The SHA-256 PCR values a document carries.
fn sha256_pcrs(doc: &[u8]) -> BTreeMap<u32, Vec<u8>> {
    let doc = parse(doc);
    doc.attestation
        .unwrap()
        .quotes
        .into_iter()
        .filter_map(|q| q.pcrs)
        .find(|p| p.hash == 11)
        .unwrap()
        .pcrs
}

/// A policy enforcing the document's current values of `indices`.
fn policy_from(doc: &[u8], indices: &[u32], warn_only: &[u32]) -> Policy {
    let pcrs = sha256_pcrs(doc);
    let m = indices
        .iter()
        .map(|i| {
            (
                *i,
                Measurement {
                    expected: pcrs[i].clone(),
                    warn_only: warn_only.contains(i),
                },
            )
        })
        .collect();
    Policy::new(m).unwrap()
}

fn reencode(doc: &AttestationDocument) -> Vec<u8> {
    serde_json::to_vec(doc).unwrap()
}

#[test]
fn rsa_round_trip_and_document_shape() {
    let tpm = Swtpm::start().unwrap();
    let issuer = issuer(&tpm, AkSpec::RSA_DEFAULT);
    let doc = issuer.issue_document(&USER_DATA, &NONCE).unwrap();
    let text = String::from_utf8(doc.clone()).unwrap();
    assert!(text.starts_with(r#"{"Attestation":{"ak_pub":""#), "{text}");
    assert!(
        text.contains(r#""InstanceInfo":null,"UserData":""#),
        "{text}"
    );
    assert!(!text.contains("event_log"));
    let parsed = parse(&doc);
    let banks: Vec<i32> = parsed
        .attestation
        .as_ref()
        .unwrap()
        .quotes
        .iter()
        .map(|q| q.pcrs.as_ref().unwrap().hash)
        .collect();
    // swtpm allocates SHA-1, SHA-256, SHA-384 and SHA-512; SHA-1 is never quoted.
    assert_eq!(banks, vec![11, 12, 13]);

    // Pinned to this TPM's key, as a production config is.
    let ak = issuer.ak_public().unwrap();
    let validator = QemuVtpmValidator::new(
        policy_from(&doc, &[0, 4, 7, 9, 16], &[]),
        AkTrust::keys([ak.as_slice()]),
    );
    let verified = validator.validate(&doc, &NONCE).unwrap();
    assert_eq!(verified.user_data, USER_DATA);
    assert!(verified.warnings.is_empty());
    assert_eq!(verified.variant, attestation::Variant::QemuVtpm);

    // Through the trait, as aTLS uses it.
    let issuer: &dyn attestation::Issuer = &issuer;
    let doc = issuer.issue(b"other user data", &[1; 32]).unwrap();
    let verified = validator.validate(&doc, &[1; 32]).unwrap();
    assert_eq!(verified.user_data, b"other user data");
}

#[test]
fn the_ak_is_the_same_every_time_the_tpm_is_opened() {
    // Operators pin a machine's AK digest once (and the test harness pins its swtpm's before any
    // node opens it), so reopening the TPM must give the same key, and documents carry it.
    let tpm = Swtpm::start().unwrap();
    let first = issuer(&tpm, AkSpec::RSA_DEFAULT).ak_public().unwrap();
    let second = issuer(&tpm, AkSpec::RSA_DEFAULT);
    assert_eq!(second.ak_public().unwrap(), first);
    let doc = parse(&second.issue_document(&USER_DATA, &NONCE).unwrap());
    assert_eq!(doc.attestation.unwrap().ak_pub, first);
    // Another TPM has another key, refused when the first one's is pinned.
    let other_tpm = Swtpm::start().unwrap();
    let other = issuer(&other_tpm, AkSpec::RSA_DEFAULT);
    let doc = other.issue_document(&USER_DATA, &NONCE).unwrap();
    let validator = QemuVtpmValidator::new(
        policy_from(&doc, &[0, 4], &[]),
        AkTrust::keys([first.as_slice()]),
    );
    let err = validator.validate(&doc, &NONCE).unwrap_err();
    let digest: String = attestation::ak_digest(&other.ak_public().unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        matches!(&err, Error::UntrustedAk { digest: d } if *d == digest),
        "{err}"
    );
}

#[test]
fn ecc_round_trip() {
    let tpm = Swtpm::start().unwrap();
    let issuer = issuer(&tpm, AkSpec::ECC_DEFAULT);
    let doc = issuer.issue_document(&USER_DATA, &NONCE).unwrap();
    let validator = QemuVtpmValidator::new(policy_from(&doc, &[0, 4, 8], &[]), AkTrust::AnyKey);
    assert_eq!(
        validator.validate(&doc, &NONCE).unwrap().user_data,
        USER_DATA
    );
}

#[test]
fn every_signature_scheme_and_hash_verifies() {
    let tpm = Swtpm::start().unwrap();
    let hashes = [HashAlg::Sha256, HashAlg::Sha384, HashAlg::Sha512];
    let mut specs = Vec::new();
    for hash in hashes {
        specs.push(AkSpec::Rsa {
            scheme: RsaSigScheme::Pkcs1v15,
            hash,
        });
        specs.push(AkSpec::Rsa {
            scheme: RsaSigScheme::Pss,
            hash,
        });
        specs.push(AkSpec::Ecc {
            curve: AkCurve::P256,
            hash,
        });
        specs.push(AkSpec::Ecc {
            curve: AkCurve::P384,
            hash,
        });
    }
    for spec in specs {
        // One connection at a time: the issuer is dropped at the end of each iteration.
        let issuer = issuer(&tpm, spec);
        let doc = issuer.issue_document(&USER_DATA, &NONCE).unwrap();
        let validator = QemuVtpmValidator::new(policy_from(&doc, &[0, 1, 2], &[]), AkTrust::AnyKey);
        let verified = validator
            .validate(&doc, &NONCE)
            .unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        assert_eq!(verified.user_data, USER_DATA);
        // A flipped signature byte must fail for every scheme too.
        let mut parsed = parse(&doc);
        let quote = &mut parsed.attestation.as_mut().unwrap().quotes[0];
        let last = quote.raw_sig.len() - 1;
        quote.raw_sig[last] ^= 1;
        assert!(
            matches!(
                validator.validate(&reencode(&parsed), &NONCE),
                Err(Error::BadSignature { index: 0, .. })
            ),
            "{spec:?}"
        );
    }
}

#[test]
fn enforced_pcr_change_is_rejected_and_warn_only_is_reported() {
    let tpm = Swtpm::start().unwrap();
    let before = issuer(&tpm, AkSpec::RSA_DEFAULT)
        .issue_document(&USER_DATA, &NONCE)
        .unwrap();
    tpm.extend_pcr(16, &[0xee; 32]).unwrap();
    tpm.extend_pcr(9, &[0xdd; 32]).unwrap();
    let after = issuer(&tpm, AkSpec::RSA_DEFAULT)
        .issue_document(&USER_DATA, &NONCE)
        .unwrap();

    // PCR 16 enforced, PCR 9 warn-only: rejected, naming only PCR 16.
    let validator =
        QemuVtpmValidator::new(policy_from(&before, &[4, 9, 16], &[9]), AkTrust::AnyKey);
    match validator.validate(&after, &NONCE) {
        Err(Error::Measurements {
            enforced: m,
            warn_only,
        }) => {
            assert_eq!(m.len(), 1);
            assert_eq!(warn_only.len(), 1);
            assert_eq!(warn_only[0].index, 9);
            assert_eq!(m[0].index, 16);
            assert!(!m[0].warn_only);
            assert_eq!(m[0].actual.as_deref(), Some(&sha256_pcrs(&after)[&16][..]));
        }
        other => panic!("expected a measurement mismatch, got {other:?}"),
    }

    // PCR 9 warn-only alone: accepted, with the warning reported.
    let validator = QemuVtpmValidator::new(policy_from(&before, &[4, 9], &[9]), AkTrust::AnyKey);
    let verified = validator.validate(&after, &NONCE).unwrap();
    assert_eq!(verified.warnings.len(), 1);
    assert_eq!(verified.warnings[0].index, 9);
    assert!(verified.warnings[0].warn_only);
}

#[test]
fn tampered_and_replayed_documents_are_rejected() {
    let tpm = Swtpm::start().unwrap();
    let issuer = issuer(&tpm, AkSpec::RSA_DEFAULT);
    let doc = issuer.issue_document(&USER_DATA, &NONCE).unwrap();
    let validator = QemuVtpmValidator::new(policy_from(&doc, &[0, 4], &[]), AkTrust::AnyKey);
    validator.validate(&doc, &NONCE).unwrap();

    // Replay: a quote made for another connection's nonce.
    assert!(matches!(
        validator.validate(&doc, &[0x43; 32]),
        Err(Error::NonceMismatch { .. })
    ));
    // Swapped user data (e.g. another certificate key) breaks the binding the same way.
    let mut parsed = parse(&doc);
    parsed.user_data = Some(vec![0; 32]);
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::NonceMismatch { .. })
    ));

    // A byte of the signed quote (inside the clock info).
    let mut parsed = parse(&doc);
    parsed.attestation.as_mut().unwrap().quotes[0].quote[60] ^= 1;
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::BadSignature { .. })
    ));

    // Magic and tag are checked by name (before the signature, which they also break).
    let mut parsed = parse(&doc);
    parsed.attestation.as_mut().unwrap().quotes[0].quote[0] = 0;
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::NotTpmGenerated { index: 0, .. })
    ));
    let mut parsed = parse(&doc);
    parsed.attestation.as_mut().unwrap().quotes[0].quote[5] = 0x17;
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::NotAQuote {
            index: 0,
            tag: 0x8017
        })
    ));

    // A PCR value: the quote's digest no longer matches.
    let mut parsed = parse(&doc);
    let pcrs = parsed.attestation.as_mut().unwrap().quotes[0]
        .pcrs
        .as_mut()
        .unwrap();
    pcrs.pcrs.insert(4, vec![0xaa; 32]);
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::PcrDigest {
            index: 0,
            bank: HashAlg::Sha256
        })
    ));
    // A PCR dropped from the supplied values.
    let mut parsed = parse(&doc);
    let pcrs = parsed.attestation.as_mut().unwrap().quotes[0]
        .pcrs
        .as_mut()
        .unwrap();
    pcrs.pcrs.remove(&23);
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::PcrSelection { .. })
    ));

    // Only SHA-1 quotes: refused outright.
    let mut parsed = parse(&doc);
    let att = parsed.attestation.as_mut().unwrap();
    att.quotes.truncate(1);
    att.quotes[0].pcrs.as_mut().unwrap().hash = 4;
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::Sha1Only)
    ));

    // Quotes dropped so the policy's bank is missing.
    let mut parsed = parse(&doc);
    parsed.attestation.as_mut().unwrap().quotes.remove(0);
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::MissingBank(HashAlg::Sha256))
    ));

    // Garbage and truncations of the whole document: errors, never panics.
    for len in (0..doc.len()).step_by(7) {
        assert!(validator.validate(&doc[..len], &NONCE).is_err());
    }
    assert!(matches!(
        validator.validate(
            &vec![b' '; attestation::vtpm::MAX_DOCUMENT_SIZE + 1],
            &NONCE
        ),
        Err(Error::TooLarge { .. })
    ));
}

/// A crypto-agile event log (SHA-256/384/512) whose events are also extended into the swtpm,
/// as firmware does while booting.
fn measure_boot(tpm: &Swtpm) -> Vec<u8> {
    fn push_u32(out: &mut Vec<u8>, v: u32) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let algs: [(u16, &'static aws_lc_rs::digest::Algorithm, &str); 3] = [
        (0x0b, &aws_lc_rs::digest::SHA256, "sha256"),
        (0x0c, &aws_lc_rs::digest::SHA384, "sha384"),
        (0x0d, &aws_lc_rs::digest::SHA512, "sha512"),
    ];
    let mut log = Vec::new();
    // Header: a legacy-format EV_NO_ACTION event carrying the Spec ID structure.
    let mut spec = b"Spec ID Event03\0".to_vec();
    push_u32(&mut spec, 0); // platform class
    spec.extend_from_slice(&[0, 2, 0, 2]); // version minor, major, errata, uintn size
    push_u32(&mut spec, algs.len() as u32);
    for (id, alg, _) in &algs {
        spec.extend_from_slice(&id.to_le_bytes());
        spec.extend_from_slice(&(alg.output_len() as u16).to_le_bytes());
    }
    spec.push(0); // vendor info size
    push_u32(&mut log, 0);
    push_u32(&mut log, 3);
    log.extend_from_slice(&[0; 20]);
    push_u32(&mut log, spec.len() as u32);
    log.extend_from_slice(&spec);

    for (pcr, data) in [(8u32, &b"grub.cfg"[..]), (9, b"vmlinuz"), (8, b"cmdline")] {
        push_u32(&mut log, pcr);
        push_u32(&mut log, 0x0d); // EV_IPL
        push_u32(&mut log, algs.len() as u32);
        let mut extend: Vec<(&str, Vec<u8>)> = Vec::new();
        for (id, alg, name) in &algs {
            let digest = aws_lc_rs::digest::digest(alg, data).as_ref().to_vec();
            log.extend_from_slice(&id.to_le_bytes());
            log.extend_from_slice(&digest);
            extend.push((name, digest));
        }
        push_u32(&mut log, data.len() as u32);
        log.extend_from_slice(data);
        let banks: Vec<(&str, &[u8])> = extend.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        tpm.extend_pcr_banks(pcr, &banks).unwrap();
    }
    log
}

#[test]
fn event_log_must_replay_to_the_quoted_pcrs() {
    let tpm = Swtpm::start().unwrap();
    let log = measure_boot(&tpm);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("binary_bios_measurements");
    std::fs::write(&path, &log).unwrap();

    let mut config = TpmIssuerConfig::new(tpm.tcti());
    config.event_log = Some(path.clone());
    let issuer = TpmIssuer::open(&config).unwrap();
    let doc = issuer.issue_document(&USER_DATA, &NONCE).unwrap();
    let validator = QemuVtpmValidator::new(policy_from(&doc, &[8, 9], &[]), AkTrust::AnyKey);
    validator.validate(&doc, &NONCE).unwrap();

    // A log whose last event was swapped for another measurement tells a different story.
    let mut parsed = parse(&doc);
    let n = parsed.attestation.as_ref().unwrap().event_log.len();
    parsed.attestation.as_mut().unwrap().event_log[n - 1] ^= 1; // event data only: digests still replay, so this passes
    validator.validate(&reencode(&parsed), &NONCE).unwrap();
    // The last event's SHA-256 digest: before it come data (7), size (4), SHA-512 (2 + 64) and
    // SHA-384 (2 + 48) entries.
    let sha256_offset = n - 7 - 4 - 64 - 2 - 48 - 2 - 32;
    parsed.attestation.as_mut().unwrap().event_log[sha256_offset] ^= 1;
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::EventLogMismatch {
            bank: HashAlg::Sha256,
            index: 8
        })
    ));
    // A truncated log is a parse error.
    let mut parsed = parse(&doc);
    parsed
        .attestation
        .as_mut()
        .unwrap()
        .event_log
        .truncate(n - 3);
    assert!(matches!(
        validator.validate(&reencode(&parsed), &NONCE),
        Err(Error::EventLog(_))
    ));
}
