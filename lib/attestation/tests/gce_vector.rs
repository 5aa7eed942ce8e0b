//! A real vTPM attestation from a Google Compute Engine VM (Container-Optimized OS 85, AMD SEV),
//! as go-tpm-tools serialises it (`attest.Attestation` protobuf), quoted with the raw qualifying
//! data `90 09`. It checks the quote verification, the event log replay and the GCE platform
//! record gcp-sev-es reads (firmware v1, AMD SEV) against evidence no code of this project
//! produced.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use attestation::Error;
use attestation::eventlog::{EventLog, check_against_quote};
use attestation::tpm::HashAlg;
use attestation::vtpm::{Pcrs, Quote, verify_quote};
use prost::Message;

const QUALIFYING_DATA: [u8; 2] = [0x90, 0x09];

/// go-tpm-tools `attest.Attestation`, the fields this test reads (field numbers from the proto).
#[derive(Clone, PartialEq, Message)]
struct PbAttestation {
    #[prost(bytes = "vec", tag = "1")]
    ak_pub: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    quotes: Vec<PbQuote>,
    #[prost(bytes = "vec", tag = "3")]
    event_log: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    ak_cert: Vec<u8>,
}

/// go-tpm-tools `tpm.Quote`.
#[derive(Clone, PartialEq, Message)]
struct PbQuote {
    #[prost(bytes = "vec", tag = "1")]
    quote: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    raw_sig: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    pcrs: Option<PbPcrs>,
}

/// go-tpm-tools `tpm.PCRs`; `HashAlgo` uses the TPM algorithm ids.
#[derive(Clone, PartialEq, Message)]
struct PbPcrs {
    #[prost(int32, tag = "1")]
    hash: i32,
    #[prost(btree_map = "uint32, bytes", tag = "2")]
    pcrs: BTreeMap<u32, Vec<u8>>,
}

fn load() -> (Vec<u8>, Vec<Quote>, Vec<u8>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/gce-cos-85-nonce9009.pb"
    );
    let pb = PbAttestation::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    let quotes = pb
        .quotes
        .into_iter()
        .map(|q| Quote {
            quote: q.quote,
            raw_sig: q.raw_sig,
            pcrs: q.pcrs.map(|p| Pcrs {
                hash: p.hash,
                pcrs: p.pcrs,
            }),
        })
        .collect();
    (pb.ak_pub, quotes, pb.event_log)
}

fn bank_of(quote: &Quote) -> HashAlg {
    HashAlg::from_id(u16::try_from(quote.pcrs.as_ref().unwrap().hash).unwrap()).unwrap()
}

#[test]
fn every_quote_verifies_with_its_ak_and_the_raw_qualifying_data() {
    let (ak_pub, quotes, _) = load();
    assert!(!quotes.is_empty());
    let mut banks = Vec::new();
    for quote in &quotes {
        let verified = verify_quote(&ak_pub, quote, &QUALIFYING_DATA).unwrap();
        assert_eq!(verified.bank, bank_of(quote));
        assert_eq!(verified.pcrs, quote.pcrs.as_ref().unwrap().pcrs);
        assert_eq!(verified.pcrs.len(), 24, "go-tpm-tools quotes PCRs 0-23");
        banks.push(verified.bank);
    }
    assert!(banks.contains(&HashAlg::Sha256), "{banks:?}");
}

#[test]
fn the_event_log_replays_to_every_quoted_bank() {
    let (ak_pub, quotes, event_log) = load();
    assert!(!event_log.is_empty());
    let log = EventLog::parse(&event_log).unwrap();
    for quote in &quotes {
        // Replay only against values whose signature was just verified.
        let verified = verify_quote(&ak_pub, quote, &QUALIFYING_DATA).unwrap();
        check_against_quote(&event_log, verified.bank, &verified.pcrs).unwrap();
        let replayed = log.replay(verified.bank).unwrap();
        assert!(replayed.len() >= 8, "{} PCRs replayed", replayed.len());
        for (index, value) in &replayed {
            assert_eq!(
                verified.pcrs.get(index),
                Some(value),
                "{} PCR {index}",
                verified.bank
            );
        }
    }
}

#[test]
fn other_qualifying_data_is_refused() {
    let (ak_pub, quotes, _) = load();
    for qualifying in [&[0x90, 0x08][..], &[0x90], &[0x90, 0x09, 0x00], &[]] {
        let err = verify_quote(&ak_pub, &quotes[0], qualifying).unwrap_err();
        assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
    }
}

#[test]
fn one_changed_byte_of_a_quote_fails_the_signature() {
    let (ak_pub, quotes, _) = load();
    for quote in &quotes {
        // Every byte past the magic and tag (which are named errors of their own): whatever the
        // byte means, the signature no longer covers it. Some changes also break the structure,
        // which is refused before the signature is checked.
        for at in 6..quote.quote.len() {
            let mut q = quote.clone();
            q.quote[at] ^= 0x01;
            let err = verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err();
            assert!(
                matches!(err, Error::BadSignature { .. } | Error::Quote { .. }),
                "byte {at}: {err}"
            );
        }
        let mut q = quote.clone();
        q.quote[0] ^= 0x01;
        assert!(matches!(
            verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err(),
            Error::NotTpmGenerated { .. }
        ));
        let mut q = quote.clone();
        q.quote[5] ^= 0x01;
        assert!(matches!(
            verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err(),
            Error::NotAQuote { .. }
        ));
    }
    // The last bytes are the PCR digest: a change there is exactly a bad signature.
    let mut q = quotes[0].clone();
    let last = q.quote.len() - 1;
    q.quote[last] ^= 0x80;
    let err = verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err();
    assert!(matches!(err, Error::BadSignature { index: 0, .. }), "{err}");
}

#[test]
fn one_changed_byte_of_a_signature_fails() {
    let (ak_pub, quotes, _) = load();
    for quote in &quotes {
        // The signature value itself is at the end of the TPMT_SIGNATURE.
        let mut q = quote.clone();
        let last = q.raw_sig.len() - 1;
        q.raw_sig[last] ^= 0x01;
        let err = verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err();
        assert!(matches!(err, Error::BadSignature { .. }), "{err}");
        let mut q = quote.clone();
        q.raw_sig[20] ^= 0x40;
        let err = verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err();
        assert!(matches!(err, Error::BadSignature { .. }), "{err}");
    }
}

#[test]
fn one_changed_byte_of_a_pcr_value_fails_the_digest() {
    let (ak_pub, quotes, _) = load();
    for quote in &quotes {
        for index in [0u32, 7, 23] {
            let mut q = quote.clone();
            let value = q.pcrs.as_mut().unwrap().pcrs.get_mut(&index).unwrap();
            value[3] ^= 0x01;
            let err = verify_quote(&ak_pub, &q, &QUALIFYING_DATA).unwrap_err();
            assert!(
                matches!(err, Error::PcrDigest { bank, .. } if bank == bank_of(quote)),
                "PCR {index}: {err}"
            );
        }
    }
}

#[test]
fn a_different_attestation_key_fails() {
    let (mut ak_pub, quotes, _) = load();
    // The last byte of the public key's unique field (RSA modulus or ECC y).
    let last = ak_pub.len() - 1;
    ak_pub[last] ^= 0x01;
    let err = verify_quote(&ak_pub, &quotes[0], &QUALIFYING_DATA).unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err}");
}

/// Google's CA certified this AK: its certificate's SubjectPublicKeyInfo (written by Go) is what
/// `Public::spki_der` must produce from the TPMT_PUBLIC, byte for byte (aws-sev-snp binds its
/// SHA-512).
#[test]
fn the_aks_spki_is_the_one_googles_ak_certificate_carries() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/gce-cos-85-nonce9009.pb"
    );
    let pb = PbAttestation::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    assert!(!pb.ak_cert.is_empty());
    let (_, cert) = x509_parser::parse_x509_certificate(&pb.ak_cert).unwrap();
    let public = attestation::tpm::Public::parse(&pb.ak_pub).unwrap();
    assert_eq!(public.spki_der().unwrap(), cert.public_key().raw);
}

#[test]
fn the_real_log_records_a_gce_sev_machine() {
    use attestation::gce::platform::{Technology, check_sev, platform_state};
    let (_, _, event_log) = load();
    let log = EventLog::parse(&event_log).unwrap();
    let state = platform_state(&log, HashAlg::Sha256).unwrap();
    assert_eq!(state.technology, Some(Technology::AmdSev), "{state:?}");
    // The SHA-1 digests tell the same story.
    assert_eq!(platform_state(&log, HashAlg::Sha1).unwrap(), state);
    assert_eq!(state.gce_version, Some(1), "{state:?}");
    assert_eq!(check_sev(&state), Ok(Technology::AmdSev));
}

#[test]
fn an_altered_nonhost_info_is_refused() {
    use attestation::gce::platform::{NONHOST_INFO_SIGNATURE, PlatformError, platform_state};
    let (_, _, event_log) = load();
    let mut log = EventLog::parse(&event_log).unwrap();
    let event = log
        .events
        .iter_mut()
        .find(|e| e.pcr == 0 && e.data.starts_with(NONHOST_INFO_SIGNATURE))
        .unwrap();
    event.data[16] = 2;
    let err = platform_state(&log, HashAlg::Sha256).unwrap_err();
    assert!(matches!(err, PlatformError::Unverified { .. }), "{err}");
}
