//! qemu-vtpm: the vTPM document of a QEMU machine, as Constellation's local clusters make it.

use crate::Error;
use crate::policy::Policy;
use crate::tpm::HashAlg;
use crate::vtpm::verify_document;
use crate::{Validator, Variant, Verified};

/// Validates qemu-vtpm documents against a measurement policy.
///
/// The attestation key is trusted as presented: QEMU's vTPM has no endorsement certificate, so
/// for this variant the quote proves freshness and consistency, and the policy the PCR values.
#[derive(Clone, Debug)]
pub struct QemuVtpmValidator {
    policy: Policy,
}

impl QemuVtpmValidator {
    pub fn new(policy: Policy) -> Self {
        QemuVtpmValidator { policy }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl Validator for QemuVtpmValidator {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        // The policy's value size names the bank it was written for; an empty policy still
        // needs a verified SHA-256 quote so there is something trustworthy to report.
        let bank = self
            .policy
            .digest_len()
            .and_then(HashAlg::from_digest_len)
            .unwrap_or(HashAlg::Sha256);
        let quote = quotes
            .iter()
            .find(|q| q.bank == bank)
            .ok_or(Error::MissingBank(bank))?;
        let (enforced, warnings) = self.policy.compare(&quote.pcrs);
        if !enforced.is_empty() {
            return Err(Error::Measurements {
                enforced,
                warn_only: warnings,
            });
        }
        Ok(Verified {
            variant: Variant::QemuVtpm,
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes: Vec::new(),
        })
    }
}
