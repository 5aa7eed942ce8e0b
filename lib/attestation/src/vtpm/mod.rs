//! The vTPM document every TPM-based variant shares: a TPM quote per PCR bank, signed by an
//! attestation key, bound to the verifier's nonce and the node's user data, with the TCG event
//! log that explains the PCR values.
//!
//! [`document`] holds the wire types shared with the node-side issuer; [`verify_document`]
//! checks a document up to, not including, the question of whether its attestation key is
//! trusted: that is the variant's (`crate::variants`). The order of checks follows the trust
//! chain: parse within limits, verify each quote's signature, then what the signature covers
//! (magic, tag, nonce binding, PCR selection and digest), then the event log. A variant compares
//! the verified PCR values with the measurement policy only after it has trusted the key.

pub mod document;
mod signature;

use std::collections::BTreeMap;

use subtle::ConstantTimeEq;

use crate::tpm::{self, HashAlg, ParseError};
use crate::{Error, eventlog};

pub use document::{Attestation, AttestationDocument, Pcrs, Quote};

/// The largest document accepted. A real one is a few kilobytes plus the event log (tens of
/// kilobytes, a third more in base64); aTLS carries it in a certificate, which TLS bounds too.
pub const MAX_DOCUMENT_SIZE: usize = 1 << 20;

/// The most quotes a document may carry: one per bank, and TPMs implement at most a handful.
pub const MAX_QUOTES: usize = 8;

/// `extraData` of Constellation's vTPM documents: SHA-256(UserData ‖ nonce).
pub fn make_extra_data(user_data: &[u8], nonce: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(user_data);
    ctx.update(nonce);
    to_array(ctx.finish())
}

/// The TPM quote's qualifying data: SHA-256(InstanceInfo ‖ extraData). Hashing the instance
/// info in binds it to the quote as well (it is empty for qemu-vtpm).
pub fn make_qualifying_data(instance_info: &[u8], extra_data: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(instance_info);
    ctx.update(extra_data);
    to_array(ctx.finish())
}

fn to_array(d: aws_lc_rs::digest::Digest) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The PCR values of one verified quote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedQuote {
    pub bank: HashAlg,
    pub pcrs: BTreeMap<u32, Vec<u8>>,
}

/// Compares the verified PCRs with `policy`, once the variant has trusted the key that signed
/// them: the policy's value size names the bank it was written for (an empty policy still needs
/// a verified SHA-256 quote, so there is something trustworthy to report). Returns the warn-only
/// mismatches; any enforced one refuses.
pub fn compare_pcrs(
    policy: &crate::Policy,
    quotes: &[VerifiedQuote],
) -> Result<Vec<crate::MeasurementMismatch>, Error> {
    let bank = policy
        .digest_len()
        .and_then(HashAlg::from_digest_len)
        .unwrap_or(HashAlg::Sha256);
    let quote = quotes
        .iter()
        .find(|q| q.bank == bank)
        .ok_or(Error::MissingBank(bank))?;
    let (enforced, warnings) = policy.compare(&quote.pcrs);
    if !enforced.is_empty() {
        return Err(Error::Measurements {
            enforced,
            warn_only: warnings,
        });
    }
    Ok(warnings)
}

/// Everything but the policy: parses `document`, verifies every non-SHA-1 quote against the
/// attestation key presented in it and the binding to `nonce`, replays the event log if there
/// is one, and returns the document with the verified PCR values per bank.
pub fn verify_document(
    document: &[u8],
    nonce: &[u8],
) -> Result<(AttestationDocument, Vec<VerifiedQuote>), Error> {
    let doc = AttestationDocument::parse(document)?;
    let att = doc.attestation.as_ref().ok_or(Error::Missing(
        "the \"Attestation\" field is absent or null",
    ))?;
    if att.quotes.is_empty() {
        return Err(Error::Missing("the attestation has no quotes"));
    }
    if att.quotes.len() > MAX_QUOTES {
        return Err(Error::Malformed(format!(
            "{} quotes, more than the maximum of {MAX_QUOTES}",
            att.quotes.len()
        )));
    }
    if att.ak_pub.is_empty() {
        return Err(Error::Missing(
            "the attestation has no attestation key (ak_pub)",
        ));
    }
    let ak_public = tpm::Public::parse(&att.ak_pub).map_err(Error::AkPublic)?;
    let ak = signature::AkKey::from_public(&ak_public)?;

    let extra_data = make_extra_data(doc.user_data.as_deref().unwrap_or_default(), nonce);
    let qualifying = make_qualifying_data(
        doc.instance_info.as_deref().unwrap_or_default(),
        &extra_data,
    );

    let mut verified: Vec<VerifiedQuote> = Vec::new();
    let mut saw_sha1 = false;
    for (index, quote) in att.quotes.iter().enumerate() {
        let (bank, pcrs) = quote_bank(index, quote)?;
        if bank == HashAlg::Sha1 {
            // Never verified and never used: a SHA-1 bank can be forged by collision.
            saw_sha1 = true;
            continue;
        }
        if verified.iter().any(|v| v.bank == bank) {
            return Err(Error::DuplicateBank(bank));
        }
        verified.push(check_quote(index, bank, quote, pcrs, &ak, &qualifying)?);
    }
    if verified.is_empty() {
        return Err(if saw_sha1 {
            Error::Sha1Only
        } else {
            Error::Missing("the attestation has no quotes")
        });
    }
    if !att.event_log.is_empty() {
        for quote in &verified {
            eventlog::check_against_quote(&att.event_log, quote.bank, &quote.pcrs)?;
        }
    }
    Ok((doc, verified))
}

/// Verifies one quote on its own: `quote.raw_sig` must be the attestation key's signature over
/// `quote.quote`, which must be a TPM-generated quote whose qualifying data is exactly
/// `qualifying_data` and whose PCR digest covers exactly `quote.pcrs`. Returns those PCR values,
/// now verified.
///
/// This is the building block of [`verify_document`], which derives the qualifying data from
/// the nonce and user data; it takes raw qualifying data so evidence made by other issuers
/// (go-tpm-tools, a cloud's own tooling) can be checked too. Unlike [`verify_document`] it also
/// verifies SHA-1 banks: whether to trust one is the caller's decision.
pub fn verify_quote(
    ak_pub: &[u8],
    quote: &Quote,
    qualifying_data: &[u8],
) -> Result<VerifiedQuote, Error> {
    let ak_public = tpm::Public::parse(ak_pub).map_err(Error::AkPublic)?;
    let ak = signature::AkKey::from_public(&ak_public)?;
    let (bank, pcrs) = quote_bank(0, quote)?;
    check_quote(0, bank, quote, pcrs, &ak, qualifying_data)
}

/// The bank a quote's PCR values claim, and those values (not yet verified).
fn quote_bank(index: usize, quote: &Quote) -> Result<(HashAlg, &Pcrs), Error> {
    let pcrs = quote
        .pcrs
        .as_ref()
        .ok_or(Error::Missing("a quote has no PCR values"))?;
    let bank = u16::try_from(pcrs.hash)
        .ok()
        .and_then(HashAlg::from_id)
        .ok_or(Error::UnsupportedBank {
            index,
            hash: i64::from(pcrs.hash),
        })?;
    Ok((bank, pcrs))
}

fn check_quote(
    index: usize,
    bank: HashAlg,
    quote: &Quote,
    pcrs: &Pcrs,
    ak: &signature::AkKey,
    qualifying: &[u8],
) -> Result<VerifiedQuote, Error> {
    // Parsing before the signature check only decides which error the operator sees (a wrong
    // magic or tag is named as such); nothing parsed is trusted until the signature verifies.
    let attest = tpm::Attest::parse(&quote.quote).map_err(|source| match source {
        ParseError::BadMagic(magic) => Error::NotTpmGenerated { index, magic },
        ParseError::NotAQuote(tag) => Error::NotAQuote { index, tag },
        source => Error::Quote { index, source },
    })?;
    let sig = tpm::Signature::parse(&quote.raw_sig)
        .map_err(|source| Error::SignatureFormat { index, source })?;
    let sig_hash = ak.verify(index, bank, &sig, &quote.quote)?;

    // Constant time, so a forger learns nothing from timing about how close a guess came.
    if !bool::from(attest.extra_data.as_slice().ct_eq(qualifying)) {
        return Err(Error::NonceMismatch { index, bank });
    }

    let selection_error = |reason: String| Error::PcrSelection {
        index,
        bank,
        reason,
    };
    let [selection] = attest.quote.pcr_select.as_slice() else {
        return Err(selection_error(format!(
            "the quote selects {} banks, expected exactly one",
            attest.quote.pcr_select.len()
        )));
    };
    if selection.hash != bank.id() {
        return Err(selection_error(format!(
            "the quote selects bank 0x{:04x}, the PCR values claim {bank}",
            selection.hash
        )));
    }
    let indices = selection.indices();
    if indices.is_empty() {
        return Err(selection_error("the quote selects no PCRs".to_owned()));
    }
    let supplied: Vec<u32> = pcrs.pcrs.keys().copied().collect();
    if supplied != indices {
        return Err(selection_error(format!(
            "quoted PCRs {indices:?}, supplied PCRs {supplied:?}"
        )));
    }
    // The TPM digests the selected values in selection order with the signing scheme's hash
    // (TPM2_Quote uses inScheme's hash, which may differ from the bank's).
    let mut ctx = aws_lc_rs::digest::Context::new(sig_hash.digest_algorithm());
    for value in pcrs.pcrs.values() {
        if value.len() != bank.digest_len() {
            return Err(selection_error(format!(
                "a PCR value has {} bytes, the {bank} bank has {}",
                value.len(),
                bank.digest_len()
            )));
        }
        ctx.update(value);
    }
    if ctx.finish().as_ref() != attest.quote.pcr_digest.as_slice() {
        return Err(Error::PcrDigest { index, bank });
    }
    // Only values that went into the signed digest leave this function: the policy is compared
    // with these and nothing else.
    Ok(VerifiedQuote {
        bank,
        pcrs: pcrs.pcrs.clone(),
    })
}
