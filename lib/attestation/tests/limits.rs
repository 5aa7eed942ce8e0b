//! Every input size limit is a named constant, and every one is enforced: just over the limit is
//! refused with the error that names it, at the limit is not refused for its size. These bound
//! the memory and time one unauthenticated peer can make the validator spend (the fuzz targets
//! in fuzz/ generate inputs up to the same bounds).

#![allow(clippy::unwrap_used)]

use attestation::eventlog::{
    EventLog, EventLogError, LogFormat, MAX_ALGORITHMS, MAX_EVENT_LOG_SIZE, MAX_EVENTS,
    MAX_LISTED_DIGEST_SIZE, MAX_PCR_INDEX,
};
use attestation::policy::{MAX_CONFIG_SIZE, PolicyError};
use attestation::tpm::{
    self, Attest, MAX_DIGEST_SIZE, MAX_ECC_KEY_BYTES, MAX_NAME_SIZE, MAX_PCR_SELECT_BYTES,
    MAX_PCR_SELECTIONS, MAX_RSA_KEY_BYTES, ParseError, Public, Signature, alg,
};
use attestation::vtpm::{MAX_DOCUMENT_SIZE, MAX_QUOTES, verify_document};
use attestation::{Error, Policy};

#[test]
fn document_size() {
    let too_big = vec![b' '; MAX_DOCUMENT_SIZE + 1];
    assert!(matches!(
        verify_document(&too_big, b"n"),
        Err(Error::TooLarge { size, limit: MAX_DOCUMENT_SIZE }) if size == MAX_DOCUMENT_SIZE + 1
    ));
    // At the limit the JSON parser gets to say what is wrong.
    let mut at_limit = b"{}".to_vec();
    at_limit.resize(MAX_DOCUMENT_SIZE, b' ');
    assert!(matches!(
        verify_document(&at_limit, b"n"),
        Err(Error::Missing(_))
    ));
}

#[test]
fn quote_count() {
    let quote = r#"{"quote":"AA==","raw_sig":"AA==","pcrs":{"hash":11,"pcrs":{"0":"AA=="}}}"#;
    let doc = |n: usize| {
        format!(
            r#"{{"Attestation":{{"ak_pub":"AA==","quotes":[{}]}}}}"#,
            vec![quote; n].join(",")
        )
    };
    let err = verify_document(doc(MAX_QUOTES + 1).as_bytes(), b"n").unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
    // At the limit the document gets as far as its (invalid) key.
    let err = verify_document(doc(MAX_QUOTES).as_bytes(), b"n").unwrap_err();
    assert!(matches!(err, Error::AkPublic(_)), "{err}");
}

/// A legacy-format (SHA-1) event extending `pcr`.
fn legacy_event(pcr: u32) -> Vec<u8> {
    let mut e = pcr.to_le_bytes().to_vec();
    e.extend_from_slice(&0x0000_000du32.to_le_bytes()); // EV_IPL
    e.extend_from_slice(&[0xab; 20]);
    e.extend_from_slice(&0u32.to_le_bytes());
    e
}

#[test]
fn event_log_size_and_event_count() {
    let too_big = vec![0u8; MAX_EVENT_LOG_SIZE + 1];
    assert_eq!(
        EventLog::parse(&too_big),
        Err(EventLogError::TooLarge {
            size: MAX_EVENT_LOG_SIZE + 1,
            limit: MAX_EVENT_LOG_SIZE
        })
    );
    let log = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| legacy_event(4)).collect() };
    assert!(log(MAX_EVENTS + 1).len() <= MAX_EVENT_LOG_SIZE);
    assert_eq!(
        EventLog::parse(&log(MAX_EVENTS + 1)),
        Err(EventLogError::TooManyEvents)
    );
    assert_eq!(
        EventLog::parse(&log(MAX_EVENTS)).unwrap().events.len(),
        MAX_EVENTS
    );
}

#[test]
fn event_log_pcr_index() {
    let mut log = legacy_event(4);
    log.extend(legacy_event(MAX_PCR_INDEX));
    EventLog::parse(&log).unwrap();
    log.extend(legacy_event(MAX_PCR_INDEX + 1));
    assert!(matches!(
        EventLog::parse(&log),
        Err(EventLogError::BadPcrIndex { event: 2, .. })
    ));
}

/// A crypto-agile log header (legacy-format EV_NO_ACTION event with a Spec ID structure)
/// listing `algorithms` as (id, digest size).
fn spec_id_header(algorithms: &[(u16, u16)]) -> Vec<u8> {
    let mut spec = b"Spec ID Event03\0".to_vec();
    spec.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 2]);
    spec.extend_from_slice(&u32::try_from(algorithms.len()).unwrap().to_le_bytes());
    for (id, size) in algorithms {
        spec.extend_from_slice(&id.to_le_bytes());
        spec.extend_from_slice(&size.to_le_bytes());
    }
    spec.push(0);
    let mut log = 0u32.to_le_bytes().to_vec();
    log.extend_from_slice(&3u32.to_le_bytes());
    log.extend_from_slice(&[0; 20]);
    log.extend_from_slice(&u32::try_from(spec.len()).unwrap().to_le_bytes());
    log.extend(spec);
    log
}

#[test]
fn event_log_header() {
    // Unknown algorithms (ids past the hashes) with the largest listed digest size.
    let size = u16::try_from(MAX_LISTED_DIGEST_SIZE).unwrap();
    let many: Vec<(u16, u16)> = (0..MAX_ALGORITHMS)
        .map(|i| (0x1000 + u16::try_from(i).unwrap(), size))
        .collect();
    let log = EventLog::parse(&spec_id_header(&many)).unwrap();
    assert!(
        matches!(log.format, LogFormat::CryptoAgile { ref algorithms } if algorithms.len() == MAX_ALGORITHMS)
    );

    let mut too_many = many.clone();
    too_many.push((0x2000, 32));
    assert!(matches!(
        EventLog::parse(&spec_id_header(&too_many)),
        Err(EventLogError::BadHeader(reason)) if reason.contains("algorithm count")
    ));
    assert!(matches!(
        EventLog::parse(&spec_id_header(&[(0x1000, size + 1)])),
        Err(EventLogError::BadHeader(reason)) if reason.contains("digest size")
    ));
}

fn too_large(r: Result<impl std::fmt::Debug, ParseError>, field: &str, limit: usize) {
    match r {
        Err(ParseError::TooLarge { what, limit: l, .. }) => {
            assert_eq!((what, l), (field, limit));
        }
        other => panic!("{field}: {other:?}"),
    }
}

/// A TPM2B of `len` bytes (the length prefix plus as many bytes).
fn tpm2b(len: usize) -> Vec<u8> {
    let mut out = u16::try_from(len).unwrap().to_be_bytes().to_vec();
    out.resize(2 + len, 0x11);
    out
}

fn attest(
    signer: usize,
    extra: usize,
    selections: u32,
    select_bytes: u8,
    digest: usize,
) -> Vec<u8> {
    let mut b = tpm::TPM_GENERATED.to_be_bytes().to_vec();
    b.extend_from_slice(&tpm::ST_ATTEST_QUOTE.to_be_bytes());
    b.extend(tpm2b(signer));
    b.extend(tpm2b(extra));
    b.extend_from_slice(&[0; 17]); // clock info
    b.extend_from_slice(&[0; 8]); // firmware version
    b.extend_from_slice(&selections.to_be_bytes());
    for _ in 0..selections {
        b.extend_from_slice(&alg::SHA256.to_be_bytes());
        b.push(select_bytes);
        b.extend(std::iter::repeat_n(0xff, usize::from(select_bytes)));
    }
    b.extend(tpm2b(digest));
    b
}

#[test]
fn tpms_attest_fields() {
    Attest::parse(&attest(
        MAX_NAME_SIZE,
        MAX_DIGEST_SIZE,
        1,
        MAX_PCR_SELECT_BYTES as u8,
        MAX_DIGEST_SIZE,
    ))
    .unwrap();
    let cases = [
        (
            attest(MAX_NAME_SIZE + 1, 32, 1, 3, 32),
            "qualified signer",
            MAX_NAME_SIZE,
        ),
        (
            attest(34, MAX_DIGEST_SIZE + 1, 1, 3, 32),
            "extra data",
            MAX_DIGEST_SIZE,
        ),
        (
            attest(34, 32, 1, 3, MAX_DIGEST_SIZE + 1),
            "PCR digest",
            MAX_DIGEST_SIZE,
        ),
        (
            attest(34, 32, 1, MAX_PCR_SELECT_BYTES as u8 + 1, 32),
            "PCR selection bitmap",
            MAX_PCR_SELECT_BYTES,
        ),
    ];
    for (bytes, field, limit) in cases {
        too_large(Attest::parse(&bytes), field, limit);
    }
    Attest::parse(&attest(34, 32, MAX_PCR_SELECTIONS as u32, 3, 32)).unwrap();
    too_large(
        Attest::parse(&attest(34, 32, MAX_PCR_SELECTIONS as u32 + 1, 3, 32)),
        "PCR selection list",
        MAX_PCR_SELECTIONS,
    );
}

#[test]
fn tpmt_signature_fields() {
    let sig = |scheme: u16, parts: &[usize]| {
        let mut b = scheme.to_be_bytes().to_vec();
        b.extend_from_slice(&alg::SHA256.to_be_bytes());
        for &p in parts {
            b.extend(tpm2b(p));
        }
        b
    };
    Signature::parse(&sig(alg::RSASSA, &[MAX_RSA_KEY_BYTES])).unwrap();
    too_large(
        Signature::parse(&sig(alg::RSASSA, &[MAX_RSA_KEY_BYTES + 1])),
        "RSA signature",
        MAX_RSA_KEY_BYTES,
    );
    too_large(
        Signature::parse(&sig(alg::RSAPSS, &[MAX_RSA_KEY_BYTES + 1])),
        "RSA signature",
        MAX_RSA_KEY_BYTES,
    );
    Signature::parse(&sig(alg::ECDSA, &[MAX_ECC_KEY_BYTES, MAX_ECC_KEY_BYTES])).unwrap();
    too_large(
        Signature::parse(&sig(alg::ECDSA, &[MAX_ECC_KEY_BYTES + 1, 32])),
        "ECDSA r",
        MAX_ECC_KEY_BYTES,
    );
    too_large(
        Signature::parse(&sig(alg::ECDSA, &[32, MAX_ECC_KEY_BYTES + 1])),
        "ECDSA s",
        MAX_ECC_KEY_BYTES,
    );
}

#[test]
fn tpmt_public_fields() {
    let header = |key_type: u16, policy: usize| {
        let mut b = key_type.to_be_bytes().to_vec();
        b.extend_from_slice(&alg::SHA256.to_be_bytes());
        b.extend_from_slice(&0x0005_0072u32.to_be_bytes());
        b.extend(tpm2b(policy));
        b.extend_from_slice(&alg::NULL.to_be_bytes()); // symmetric
        b
    };
    let rsa = |modulus: usize| {
        let mut b = header(alg::RSA, 0);
        b.extend_from_slice(&alg::NULL.to_be_bytes()); // scheme
        b.extend_from_slice(&2048u16.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend(tpm2b(modulus));
        b
    };
    let ecc = |x: usize, y: usize| {
        let mut b = header(alg::ECC, 0);
        b.extend_from_slice(&alg::NULL.to_be_bytes()); // scheme
        b.extend_from_slice(&tpm::curve::NIST_P256.to_be_bytes());
        b.extend_from_slice(&alg::NULL.to_be_bytes()); // KDF
        b.extend(tpm2b(x));
        b.extend(tpm2b(y));
        b
    };
    Public::parse(&rsa(MAX_RSA_KEY_BYTES)).unwrap();
    too_large(
        Public::parse(&rsa(MAX_RSA_KEY_BYTES + 1)),
        "RSA modulus",
        MAX_RSA_KEY_BYTES,
    );
    Public::parse(&ecc(MAX_ECC_KEY_BYTES, MAX_ECC_KEY_BYTES)).unwrap();
    too_large(
        Public::parse(&ecc(MAX_ECC_KEY_BYTES + 1, 32)),
        "ECC point x",
        MAX_ECC_KEY_BYTES,
    );
    too_large(
        Public::parse(&ecc(32, MAX_ECC_KEY_BYTES + 1)),
        "ECC point y",
        MAX_ECC_KEY_BYTES,
    );
    let mut policy_too_long = header(alg::ECC, MAX_DIGEST_SIZE + 1);
    policy_too_long.extend_from_slice(&[0; 8]);
    too_large(
        Public::parse(&policy_too_long),
        "auth policy",
        MAX_DIGEST_SIZE,
    );
}

#[test]
fn attestation_config_size() {
    let mut config = br#"{"measurements": {}}"#.to_vec();
    config.resize(MAX_CONFIG_SIZE, b' ');
    assert!(Policy::from_attestation_config(&config).unwrap().is_empty());
    config.push(b' ');
    assert!(matches!(
        Policy::from_attestation_config(&config),
        Err(PolicyError::TooLarge {
            limit: MAX_CONFIG_SIZE,
            ..
        })
    ));
}

#[test]
fn gce_instance_info_size() {
    use attestation::gce::{GceInstance, MAX_GCE_INSTANCE_INFO};
    let mut at_limit =
        br#"{"zone":"us-east1-b","project_id":"my-project","instance_name":"w"}"#.to_vec();
    at_limit.resize(MAX_GCE_INSTANCE_INFO, b' ');
    assert_eq!(GceInstance::parse(&at_limit).unwrap().instance_name, "w");
    at_limit.push(b' ');
    let err = GceInstance::parse(&at_limit).unwrap_err();
    assert!(err.contains("more than the limit"), "{err}");
}
