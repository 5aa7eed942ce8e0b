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
use crate::tpm::{self, HashAlg};
use crate::vtpm::{compare_pcrs, verify_document};
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
/// parse, and name an SEV machine on current GCE firmware. The log was already replayed against
/// every verified quote, so its PCR 0 events are the quoted ones.
fn check_platform(event_log: &[u8]) -> Result<(Technology, u32), Error> {
    if event_log.is_empty() {
        return Err(Error::GcePlatform(
            "the document has no event log, so nothing records the platform Google's firmware measured".to_owned(),
        ));
    }
    let log = crate::eventlog::EventLog::parse(event_log).map_err(Error::EventLog)?;
    let state = platform::platform_state(&log, HashAlg::Sha256)
        .map_err(|e| Error::GcePlatform(e.to_string()))?;
    let technology = platform::check_sev(&state).map_err(Error::GcePlatform)?;
    Ok((technology, state.gce_version.unwrap_or_default()))
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
        let (technology, firmware) = check_platform(&attestation.event_log)?;
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
