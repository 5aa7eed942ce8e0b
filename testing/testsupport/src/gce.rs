//! Google's part of a GCE confidential VM, played on a swtpm: what the vTPM holds and what the
//! firmware measures before the node's issuer runs. Google's AK template goes into NV index
//! 0x01c10001 (read with owner authorization, as go-tpm-tools reads it), and the firmware's
//! PCR 0 record (its version, the non-host info naming the confidential technology, the
//! separators of PCRs 0–7) is extended into the SHA-256, SHA-384 and SHA-512 banks and returned
//! as the event log the kernel would expose.

use anyhow::Context as _;
use attestation::tpm::HashAlg;
use soft_issuer::gce::{boot_events, event_log_for_banks};
use tss_esapi::traits::Marshall;

use crate::swtpm::Swtpm;

/// The banks the firmware's record is extended into (the swtpm's, SHA-1 aside).
const BANKS: [(HashAlg, &str); 3] = [
    (HashAlg::Sha256, "sha256"),
    (HashAlg::Sha384, "sha384"),
    (HashAlg::Sha512, "sha512"),
];

/// Writes Google's RSA AK template (an RSA-2048 restricted RSASSA-SHA256 signing key) into NV
/// index [`tpm_issuer::gce::AK_TEMPLATE_NV_INDEX_RSA`].
pub fn write_ak_template(swtpm: &Swtpm) -> anyhow::Result<()> {
    let template = tpm_issuer::ak_template(tpm_issuer::AkSpec::RSA_DEFAULT)?.marshall()?;
    swtpm
        .write_owner_nv(tpm_issuer::gce::AK_TEMPLATE_NV_INDEX_RSA, &template)
        .context("writing Google's AK template")
}

/// Boots a GCE VM of `technology` (go-tpm-tools' byte) on firmware `version` on `swtpm`: writes
/// the AK template, extends the firmware's record, and returns the event log.
pub fn boot(swtpm: &Swtpm, version: u32, technology: u8) -> anyhow::Result<Vec<u8>> {
    write_ak_template(swtpm)?;
    let events = boot_events(version, technology);
    for event in &events {
        let digests: Vec<(&str, Vec<u8>)> = BANKS
            .iter()
            .map(|(bank, name)| (*name, event.digest(*bank)))
            .collect();
        let banks: Vec<(&str, &[u8])> = digests.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        swtpm.extend_pcr_banks(event.pcr, &banks)?;
    }
    Ok(event_log_for_banks(&events, &BANKS.map(|(bank, _)| bank)))
}
