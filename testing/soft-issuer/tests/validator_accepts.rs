//! Documents from the software key go through the real qemu-vtpm validator: accepted when nonce
//! and PCRs are right, refused with the specific error when they are not.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use attestation::tpm::HashAlg;
use attestation::vtpm::{AttestationDocument, Pcrs};
use attestation::{
    AkTrust, Error, Issuer, Measurement, Policy, QemuVtpmValidator, Validator, Variant,
};
use soft_issuer::{KeyType, SoftIssuer};

const NONCE: &[u8] = b"0123456789abcdef0123456789abcdef";
const USER_DATA: &[u8] = &[0x5a; 32];

fn policy(entries: &[(u32, [u8; 32], bool)]) -> Policy {
    Policy::new(
        entries
            .iter()
            .map(|&(index, expected, warn_only)| {
                (
                    index,
                    Measurement {
                        expected: expected.to_vec(),
                        warn_only,
                    },
                )
            })
            .collect(),
    )
    .unwrap()
}

fn issuers() -> Vec<SoftIssuer> {
    [KeyType::EcdsaP256, KeyType::Rsa2048]
        .into_iter()
        .map(|t| {
            SoftIssuer::new(t)
                .unwrap()
                .with_pcrs([(4, [0x44; 32]), (9, [0x99; 32])])
                .unwrap()
        })
        .collect()
}

#[test]
fn documents_verify_for_both_key_types() {
    let validator = QemuVtpmValidator::new(
        policy(&[(4, [0x44; 32], false), (9, [0x99; 32], false)]),
        AkTrust::AnyKey,
    );
    for issuer in issuers() {
        assert_eq!(issuer.variant(), Variant::QemuVtpm);
        let doc = issuer.issue(USER_DATA, NONCE).unwrap();
        let verified = validator.validate(&doc, NONCE).unwrap();
        assert_eq!(verified.user_data, USER_DATA, "{:?}", issuer.key_type());
        assert!(verified.warnings.is_empty());
        // Every quote is a fresh signature over a fresh clock value.
        let again = issuer.issue(USER_DATA, NONCE).unwrap();
        assert_ne!(doc, again);
        validator.validate(&again, NONCE).unwrap();
    }
}

#[test]
fn the_document_has_the_tpm_shape() {
    for issuer in issuers() {
        let doc: AttestationDocument =
            serde_json::from_slice(&issuer.issue(USER_DATA, NONCE).unwrap()).unwrap();
        let att = doc.attestation.unwrap();
        assert_eq!(att.ak_pub, issuer.ak_public());
        assert_eq!(att.quotes.len(), 1);
        let pcrs = att.quotes[0].pcrs.as_ref().unwrap();
        assert_eq!(pcrs.hash, 0x000b);
        assert_eq!(pcrs.pcrs.len(), 24);
        let attest = attestation::tpm::Attest::parse(&att.quotes[0].quote).unwrap();
        assert_eq!(attest.magic, attestation::tpm::TPM_GENERATED);
        let sig = attestation::tpm::Signature::parse(&att.quotes[0].raw_sig).unwrap();
        match (issuer.key_type(), sig) {
            (KeyType::EcdsaP256, attestation::tpm::Signature::Ecdsa { r, s, .. }) => {
                assert_eq!((r.len(), s.len()), (32, 32));
            }
            (KeyType::Rsa2048, attestation::tpm::Signature::RsaSsa { sig, .. }) => {
                assert_eq!(sig.len(), 256);
            }
            (t, sig) => panic!("{t:?} signed with {}", sig.scheme_name()),
        }
        assert_eq!(doc.instance_info, None);
        assert_eq!(doc.user_data.as_deref(), Some(USER_DATA));
    }
}

#[test]
fn a_matching_quote_from_an_untrusted_key_is_refused() {
    // The forgery the key trust exists for: right PCR values, right nonce, valid signature, but
    // a key the operator never listed.
    let good = policy(&[(4, [0x44; 32], false), (9, [0x99; 32], false)]);
    let [forger, trusted] = <[SoftIssuer; 2]>::try_from(issuers()).unwrap();
    let validator = QemuVtpmValidator::new(good, AkTrust::keys([trusted.ak_public()]));
    validator
        .validate(&trusted.issue(USER_DATA, NONCE).unwrap(), NONCE)
        .unwrap();
    let err = validator
        .validate(&forger.issue(USER_DATA, NONCE).unwrap(), NONCE)
        .unwrap_err();
    let want = hex::encode(attestation::ak_digest(forger.ak_public()));
    assert!(
        matches!(&err, Error::UntrustedAk { digest } if *digest == want),
        "{err}"
    );
    // The key is checked before the measurements: a forger learns nothing about the policy
    // (public anyway) from which check fails, and the operator sees the real reason.
    let wrong_pcrs = QemuVtpmValidator::new(
        policy(&[(4, [0x45; 32], false)]),
        AkTrust::keys([trusted.ak_public()]),
    );
    let err = wrong_pcrs
        .validate(&forger.issue(USER_DATA, NONCE).unwrap(), NONCE)
        .unwrap_err();
    assert!(matches!(err, Error::UntrustedAk { .. }), "{err}");
}

#[test]
fn a_wrong_nonce_is_refused() {
    let validator = QemuVtpmValidator::new(Policy::default(), AkTrust::AnyKey);
    for issuer in issuers() {
        let doc = issuer.issue(USER_DATA, NONCE).unwrap();
        let err = validator.validate(&doc, b"another nonce").unwrap_err();
        assert!(
            matches!(
                err,
                Error::NonceMismatch {
                    index: 0,
                    bank: HashAlg::Sha256
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn wrong_pcrs_are_refused_and_warn_only_ones_reported() {
    for issuer in issuers() {
        let doc = issuer.issue(USER_DATA, NONCE).unwrap();
        let enforced = QemuVtpmValidator::new(policy(&[(4, [0x45; 32], false)]), AkTrust::AnyKey);
        let err = enforced.validate(&doc, NONCE).unwrap_err();
        let Error::Measurements { enforced, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(enforced.len(), 1);
        assert_eq!(enforced[0].index, 4);
        assert_eq!(enforced[0].actual.as_deref(), Some(&[0x44; 32][..]));

        let warn = QemuVtpmValidator::new(
            policy(&[(4, [0x44; 32], false), (9, [0; 32], true)]),
            AkTrust::AnyKey,
        );
        let verified = warn.validate(&doc, NONCE).unwrap();
        assert_eq!(verified.warnings.len(), 1);
        assert_eq!(verified.warnings[0].index, 9);
    }
}

#[test]
fn tampered_pcr_values_in_the_document_are_refused() {
    let issuer = SoftIssuer::ecdsa_p256().unwrap();
    let doc = issuer.issue(USER_DATA, NONCE).unwrap();
    let mut parsed: AttestationDocument = serde_json::from_slice(&doc).unwrap();
    let quote = &mut parsed.attestation.as_mut().unwrap().quotes[0];
    quote.pcrs.as_mut().unwrap().pcrs.insert(4, vec![0x44; 32]);
    let doc = serde_json::to_vec(&parsed).unwrap();
    let err = QemuVtpmValidator::new(policy(&[(4, [0x44; 32], false)]), AkTrust::AnyKey)
        .validate(&doc, NONCE)
        .unwrap_err();
    assert!(matches!(err, Error::PcrDigest { index: 0, .. }), "{err}");
}

/// Constellation verifies one bank's quote and compares the policy with another bank's values.
/// Here every non-SHA-1 quote must verify, and the policy only ever sees values that did.
#[test]
fn the_policy_only_sees_values_of_a_verified_quote() {
    let issuer = SoftIssuer::ecdsa_p256().unwrap();
    let doc = issuer.issue(USER_DATA, NONCE).unwrap();
    let mut parsed: AttestationDocument = serde_json::from_slice(&doc).unwrap();
    let att = parsed.attestation.as_mut().unwrap();
    // A SHA-384 "quote" whose values match a SHA-384 policy, carrying the SHA-256 quote's
    // valid signature: it does not cover these values.
    let mut forged = att.quotes[0].clone();
    forged.pcrs = Some(Pcrs {
        hash: i32::from(HashAlg::Sha384.id()),
        pcrs: (0..24)
            .map(|i| (i, vec![0x38; 48]))
            .collect::<BTreeMap<_, _>>(),
    });
    att.quotes.push(forged.clone());
    let doc = serde_json::to_vec(&parsed).unwrap();
    let sha384_policy = Policy::new(
        [(
            4,
            Measurement {
                expected: vec![0x38; 48],
                warn_only: false,
            },
        )]
        .into(),
    )
    .unwrap();
    let err = QemuVtpmValidator::new(sha384_policy.clone(), AkTrust::AnyKey)
        .validate(&doc, NONCE)
        .unwrap_err();
    assert!(matches!(err, Error::PcrSelection { index: 1, .. }), "{err}");

    // A SHA-1 quote is never verified, so it can never be what a policy is compared with.
    let mut parsed: AttestationDocument =
        serde_json::from_slice(&issuer.issue(USER_DATA, NONCE).unwrap()).unwrap();
    let att = parsed.attestation.as_mut().unwrap();
    forged.pcrs = Some(Pcrs {
        hash: i32::from(HashAlg::Sha1.id()),
        pcrs: (0..24).map(|i| (i, vec![0x38; 20])).collect(),
    });
    att.quotes.push(forged);
    let doc = serde_json::to_vec(&parsed).unwrap();
    let err = QemuVtpmValidator::new(sha384_policy, AkTrust::AnyKey)
        .validate(&doc, NONCE)
        .unwrap_err();
    assert!(matches!(err, Error::MissingBank(HashAlg::Sha384)), "{err}");
}

#[test]
fn an_event_log_sets_the_pcrs_and_replays_in_the_validator() {
    let log = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../lib/attestation/testdata/eventlogs/rhel8-uefi.bin"
    ))
    .unwrap();
    let issuer = SoftIssuer::rsa_2048().unwrap().with_event_log(log).unwrap();
    assert_eq!(
        hex::encode(&issuer.pcrs()[&7]),
        "5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da"
    );
    let doc = issuer.issue(USER_DATA, NONCE).unwrap();
    let mut expected = [0u8; 32];
    expected.copy_from_slice(&issuer.pcrs()[&7]);
    QemuVtpmValidator::new(policy(&[(7, expected, false)]), AkTrust::AnyKey)
        .validate(&doc, NONCE)
        .unwrap();
}

#[test]
fn bad_inputs_are_refused() {
    assert!(
        SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(24, [0; 32])])
            .is_err()
    );
    assert!(SoftIssuer::rsa_2048_from_pkcs8(b"not a key").is_err());
    assert!(SoftIssuer::ecdsa_p256_from_pkcs8(soft_issuer::TEST_RSA_2048_PKCS8).is_err());
    assert!(
        SoftIssuer::rsa_2048()
            .unwrap()
            .with_event_log(vec![1, 2, 3])
            .is_err()
    );
}

/// A node that sends the event log of its boot but edits what one event says (here the
/// SecureBoot variable's data, whose digest is defined as the hash of that data) is refused,
/// even though every digest, and so the replay, is unchanged.
#[test]
fn altered_event_data_is_refused_by_the_validator() {
    let log = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../lib/attestation/testdata/eventlogs/rhel8-uefi.bin"
    ))
    .unwrap();
    let issuer = SoftIssuer::ecdsa_p256()
        .unwrap()
        .with_event_log(log.clone())
        .unwrap();
    let doc = issuer.issue(USER_DATA, NONCE).unwrap();
    let validator = QemuVtpmValidator::new(Policy::default(), AkTrust::AnyKey);
    validator.validate(&doc, NONCE).unwrap();

    // "SecureBoot" in UTF-16, as the EFI variable event names it; its one-byte value follows.
    let name: Vec<u8> = "SecureBoot"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let at = log.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    assert_eq!(log[at], 1, "Secure Boot is on in this log");
    let mut parsed: AttestationDocument = serde_json::from_slice(&doc).unwrap();
    parsed.attestation.as_mut().unwrap().event_log[at] = 0;
    let err = validator
        .validate(&serde_json::to_vec(&parsed).unwrap(), NONCE)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::EventLog(attestation::eventlog::EventLogError::DataMismatch {
                bank: HashAlg::Sha256,
                ..
            })
        ),
        "{err}"
    );
}
