//! gcp-sev-es: the vTPM document of a GCE confidential VM on AMD SEV (or SEV-ES), as
//! Constellation's GCP nodes make it.
//!
//! There is no hardware report: SEV and SEV-ES give a guest nothing signed by AMD, and Google's
//! vTPM runs outside the guest's encrypted memory. Everything rests on Google:
//! - the attestation key is trusted because the GCE API (`instances.getShieldedInstanceIdentity`
//!   for the instance the InstanceInfo names: `{"zone", "project_id", "instance_name"}`) answers
//!   with it as the instance's signing key;
//! - the machine is a confidential VM because Google's firmware measured that into PCR 0
//!   (`EV_NONHOST_INFO`: AMD SEV or SEV-ES, under GCE firmware version 1 or later; see
//!   [`crate::gce::platform`]), as Constellation checks; and, beyond Constellation, because the
//!   GCE API's `instances.get` says `confidentialInstanceConfig.enableConfidentialCompute`;
//! - with `allowedGcpProjects` (beyond Constellation) only instances of the cluster's projects
//!   may join; without it any project's may, an attacker's own included.
//!
//! The order keeps Google's API for last: the quotes verify with the document's AK and bind
//! this connection (qualifying data = SHA-256(InstanceInfo ‖ extraData), so the instance named
//! is the one the quote was made with), the InstanceInfo names a well-formed instance of an
//! allowed project, the event log replays to the quoted PCRs and records an SEV machine, the
//! measurements match; only then is the API asked, so a forged document costs no call.

use std::sync::Arc;

use crate::gce::platform::{self, Technology};
use crate::gce::{self, GceIdentity, GceInstance, GceKeyError, GcpProjects, InstanceRef};
use crate::policy::Policy;
use crate::tpm;
use crate::vtpm::{VerifiedQuote, compare_pcrs, verify_document};
use crate::{Error, Validator, Variant, Verified};

/// What a gcp-sev-es document without InstanceInfo is refused with.
const NO_INSTANCE_INFO: &str = "the document has no InstanceInfo (the GCE instance)";

/// Validates gcp-sev-es documents.
#[derive(Clone, Debug)]
pub struct GcpSevEsValidator {
    policy: Policy,
    gcp_projects: GcpProjects,
    gce: Option<Arc<dyn GceIdentity>>,
}

impl GcpSevEsValidator {
    pub fn new(policy: Policy) -> Self {
        GcpSevEsValidator {
            policy,
            gcp_projects: GcpProjects::default(),
            gce: None,
        }
    }

    /// The validator an attestation config describes: its measurements (at least one enforced)
    /// and `allowedGcpProjects`. Returns it with the digest covering both.
    pub fn from_attestation_config(
        json: &[u8],
    ) -> Result<(GcpSevEsValidator, String), crate::PolicyError> {
        let policy = Policy::enforcing_from_attestation_config(json)?;
        let gcp_projects = GcpProjects::from_attestation_config(json)?;
        let digest =
            policy.digest_with(&format!("variant:gcp-sev-es\n{}", gcp_projects.canonical()));
        Ok((
            GcpSevEsValidator::new(policy).with_gcp_projects(gcp_projects),
            digest,
        ))
    }

    /// Admits only instances of `projects` (`allowedGcpProjects`).
    pub fn with_gcp_projects(mut self, projects: GcpProjects) -> Self {
        self.gcp_projects = projects;
        self
    }

    /// Where the GCE API is asked; without one every document is refused.
    pub fn with_gce_identity(mut self, gce: Arc<dyn GceIdentity>) -> Self {
        self.gce = Some(gce);
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// The instance a gcp-sev-es InstanceInfo names.
pub fn instance_of(instance_info: &[u8]) -> Result<InstanceRef, Error> {
    let named = GceInstance::parse(instance_info).map_err(Error::Binding)?;
    InstanceRef::from_instance_info(&named).map_err(|e| Error::Binding(e.to_string()))
}

fn unavailable_or(error: GceKeyError, refused: impl FnOnce(String) -> Error) -> Error {
    match error {
        GceKeyError::NotFound(what) => refused(format!("the GCE API knows no instance {what}")),
        unavailable @ GceKeyError::Unavailable(_) => {
            Error::CollateralUnavailable(unavailable.to_string())
        }
    }
}

/// What the GCE API says about `instance`: its signing key must be `ak`, and it must be an SEV
/// confidential VM. Returns its confidential-computing configuration, for the audit line.
pub fn check_gce_api(
    instance: &InstanceRef,
    ak: &tpm::Public,
    gce: &dyn GceIdentity,
) -> Result<gce::ConfidentialCompute, Error> {
    let vouched = gce.signing_key(instance).map_err(|e| {
        unavailable_or(e, |why| {
            Error::Binding(format!("{why}, so nothing vouches for the attestation key"))
        })
    })?;
    let ak_spki = ak
        .spki_der()
        .map_err(|e| Error::Binding(format!("the AK has no SubjectPublicKeyInfo: {e}")))?;
    match gce::same_key(&vouched, &ak_spki) {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::Binding(format!(
                "the attestation key is not the signing key the GCE API vouches for {instance}"
            )));
        }
        Err(reason) => return Err(Error::Binding(reason)),
    }
    let confidential = gce
        .confidential_compute(instance)
        .map_err(|e| unavailable_or(e, Error::GcePlatform))?;
    confidential.check_sev().map_err(Error::GcePlatform)?;
    Ok(confidential)
}

/// The technology PCR 0 records, checked: the log must be there (a GCE vTPM always has one),
/// parse, and name an SEV machine on current GCE firmware. The log was replayed against every
/// verified quote, so only those banks' digests are the quoted ones: the record is read with
/// each of them, and each must pass (a log may carry digests of banks no quote vouches for).
/// The replay compares only the PCRs a quote selects, so each quote must select PCR 0: for an
/// unquoted PCR 0 the log's record is nobody's word.
fn check_platform(event_log: &[u8], quotes: &[VerifiedQuote]) -> Result<(Technology, u32), Error> {
    if event_log.is_empty() {
        return Err(Error::GcePlatform(
            "the document has no event log, so nothing records the platform Google's firmware measured".to_owned(),
        ));
    }
    let log = crate::eventlog::EventLog::parse(event_log).map_err(Error::EventLog)?;
    let mut verdict = None;
    for quote in quotes {
        if !quote.pcrs.contains_key(&0) {
            return Err(Error::GcePlatform(format!(
                "the {} quote does not cover PCR 0, so nothing vouches for the firmware's record in the event log",
                quote.bank
            )));
        }
        let state = platform::platform_state(&log, quote.bank)
            .map_err(|e| Error::GcePlatform(e.to_string()))?;
        let technology = platform::check_sev(&state).map_err(Error::GcePlatform)?;
        let this = (technology, state.gce_version.unwrap_or_default());
        if verdict.is_some_and(|v| v != this) {
            return Err(Error::GcePlatform(format!(
                "the event log's {} digests record another platform than the other banks'",
                quote.bank
            )));
        }
        verdict = Some(this);
    }
    verdict.ok_or(Error::Missing("the attestation has no quotes"))
}

impl Validator for GcpSevEsValidator {
    fn variant(&self) -> Variant {
        Variant::GcpSevEs
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        let attestation = doc.attestation.as_ref().ok_or(Error::Missing(
            "the \"Attestation\" field is absent or null",
        ))?;
        let ak = tpm::Public::parse(&attestation.ak_pub).map_err(Error::AkPublic)?;
        let instance = instance_of(doc.hardware_evidence(NO_INSTANCE_INFO)?)?;
        if !self.gcp_projects.admits(&instance.project) {
            return Err(Error::Binding(format!(
                "GCP project {} is not in allowedGcpProjects (a setting beyond Constellation's)",
                instance.project
            )));
        }
        let (technology, firmware) = check_platform(&attestation.event_log, &quotes)?;
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        let gce = self.gce.as_deref().ok_or_else(|| {
            Error::Binding("this validator has no way to ask the GCE API".to_owned())
        })?;
        let confidential = check_gce_api(&instance, &ak, gce)?;
        Ok(Verified {
            variant: Variant::GcpSevEs,
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes: vec![
                format!("GCE firmware v{firmware}, {technology} (PCR 0's non-host info)"),
                format!("AK vouched for by the GCE API for {instance}"),
                format!("the GCE API's confidentialInstanceConfig: {confidential}"),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tpm::HashAlg;

    /// A crypto-agile log with SHA-256 and SHA-384 digests: the firmware version, a non-host
    /// info whose data says `shown` while its SHA-384 digest is of `measured_384`, and PCR 0's
    /// separator.
    fn log(shown: u8, measured_384: u8) -> Vec<u8> {
        let u32le = |out: &mut Vec<u8>, v: usize| out.extend_from_slice(&(v as u32).to_le_bytes());
        let banks = [HashAlg::Sha256, HashAlg::Sha384];
        let mut spec = b"Spec ID Event03\0".to_vec();
        u32le(&mut spec, 0);
        spec.extend_from_slice(&[0, 2, 0, 2]);
        u32le(&mut spec, banks.len());
        for bank in banks {
            spec.extend_from_slice(&bank.id().to_le_bytes());
            spec.extend_from_slice(&(bank.digest_len() as u16).to_le_bytes());
        }
        spec.push(0);
        let mut out = Vec::new();
        u32le(&mut out, 0);
        u32le(&mut out, 3);
        out.extend_from_slice(&[0; 20]);
        u32le(&mut out, spec.len());
        out.extend_from_slice(&spec);
        let digest = |bank: HashAlg, data: &[u8]| {
            aws_lc_rs::digest::digest(bank.digest_algorithm(), data)
                .as_ref()
                .to_vec()
        };
        let events: [(u32, Vec<u8>, Vec<u8>); 3] = [
            (
                0x08,
                platform::gce_firmware_version_string(1),
                platform::gce_firmware_version_string(1),
            ),
            (
                0x11,
                platform::nonhost_info(shown).to_vec(),
                platform::nonhost_info(measured_384).to_vec(),
            ),
            (0x04, vec![0; 4], vec![0; 4]),
        ];
        for (event_type, data, data_384) in events {
            u32le(&mut out, 0);
            u32le(&mut out, event_type as usize);
            u32le(&mut out, banks.len());
            out.extend_from_slice(&HashAlg::Sha256.id().to_le_bytes());
            out.extend_from_slice(&digest(HashAlg::Sha256, &data));
            out.extend_from_slice(&HashAlg::Sha384.id().to_le_bytes());
            out.extend_from_slice(&digest(HashAlg::Sha384, &data_384));
            u32le(&mut out, data.len());
            out.extend_from_slice(&data);
        }
        out
    }

    /// A quote of `bank` that covers PCR 0 (its value does not matter here: the log was
    /// replayed against it before the record is read).
    fn verified(bank: HashAlg) -> VerifiedQuote {
        VerifiedQuote {
            bank,
            pcrs: [(0, vec![0; bank.digest_len()])].into(),
        }
    }

    #[test]
    fn the_record_is_read_only_from_a_quote_that_covers_pcr_0() {
        // An honest log, but the quote selects PCR 4 only: the replay compared nothing the
        // firmware record extends, so the log's claim about PCR 0 is nobody's word.
        let honest = log(1, 1);
        let without_pcr_0 = VerifiedQuote {
            bank: HashAlg::Sha256,
            pcrs: [(4, vec![0; 32])].into(),
        };
        let err = check_platform(&honest, std::slice::from_ref(&without_pcr_0)).unwrap_err();
        assert!(
            matches!(&err, Error::GcePlatform(m) if m.contains("does not cover PCR 0")),
            "{err}"
        );
        // One quote that does cover it does not make up for one that does not.
        assert!(check_platform(&honest, &[verified(HashAlg::Sha384), without_pcr_0]).is_err());
    }

    #[test]
    fn the_record_is_read_with_the_banks_a_quote_vouches_for() {
        // Honest: both banks say AMD SEV.
        let honest = log(1, 1);
        for quotes in [
            vec![verified(HashAlg::Sha256)],
            vec![verified(HashAlg::Sha384)],
            vec![verified(HashAlg::Sha256), verified(HashAlg::Sha384)],
        ] {
            assert_eq!(
                check_platform(&honest, &quotes).unwrap(),
                (Technology::AmdSev, 1)
            );
        }
        // The firmware measured no confidential computing into the SHA-384 bank, the only one
        // quoted, and the log shows SEV with a SHA-256 digest to match: the SHA-256 digests
        // are nobody's word, so the record is read with SHA-384 and refused.
        let swapped = log(1, 0);
        let err = check_platform(&swapped, &[verified(HashAlg::Sha384)]).unwrap_err();
        assert!(
            matches!(&err, Error::GcePlatform(m) if m.contains("does not carry the digest of its own data")),
            "{err}"
        );
        assert!(
            check_platform(
                &swapped,
                &[verified(HashAlg::Sha256), verified(HashAlg::Sha384)]
            )
            .is_err()
        );
        assert!(check_platform(&honest, &[]).is_err());
    }
}
