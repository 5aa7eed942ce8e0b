//! gcp-sev-es offline: the GCE API's answers come from files the operator saved (e.g. with
//! `gcloud compute instances get-shielded-identity --format=json` and `gcloud compute instances
//! describe --format=json`), in place of gce-identity.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use attestation::GcpSevEsValidator;
use attestation::gce::{ConfidentialCompute, StaticGceIdentity, signing_key_from_identity_json};
use attestation::vtpm::AttestationDocument;

use crate::read;

/// The validator attest-proxy builds for gcp-sev-es from `config`, answering for the instance
/// `document` names with the saved `identity` and `instance` answers (each absent: the decision
/// says the API could not be asked); and the policy digest audit lines name.
pub fn document_validator(
    config: &[u8],
    document: &[u8],
    identity: Option<&Path>,
    instance: Option<&Path>,
) -> anyhow::Result<(GcpSevEsValidator, String)> {
    let (validator, digest) = GcpSevEsValidator::from_attestation_config(config)?;
    let named = AttestationDocument::parse(document)
        .ok()
        .and_then(|doc| doc.instance_info)
        .and_then(|info| attestation::variants::gcp_sev_es::instance_of(&info).ok());
    let gce = match (identity, instance, named) {
        (Some(identity), Some(instance), Some(named)) => {
            let key = signing_key_from_identity_json(&read(identity)?)
                .map_err(anyhow::Error::msg)
                .with_context(|| {
                    format!("{} is no shielded instance identity", identity.display())
                })?;
            let confidential = ConfidentialCompute::from_instance_json(&read(instance)?)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("{} is no instance", instance.display()))?;
            StaticGceIdentity::new()
                .with_key(named.clone(), key)
                .with_confidential_compute(named, confidential)
        }
        // A document naming no instance is refused for that before the API is asked.
        (Some(_), Some(_), None) => StaticGceIdentity::new(),
        _ => StaticGceIdentity::new()
            .unavailable("offline: give the API's answers with --gce-identity and --gce-instance"),
    };
    Ok((validator.with_gce_identity(Arc::new(gce)), digest))
}
