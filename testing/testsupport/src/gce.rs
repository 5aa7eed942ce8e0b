//! Google's part of a GCE confidential VM, played on a swtpm: what the vTPM holds and what the
//! firmware measures before the node's issuer runs. Google's AK template goes into NV index
//! 0x01c10001 (read with owner authorization, as go-tpm-tools reads it), and the firmware's
//! PCR 0 record (its version, the non-host info naming the confidential technology, the
//! separators of PCRs 0–7) is extended into the SHA-256, SHA-384 and SHA-512 banks and returned
//! as the event log the kernel would expose.
//!
//! For load, [`EsMachines`] makes gcp-sev-es nodes without a TPM: software AKs on simulated GCE
//! confidential VMs, each a new instance registered with the GCE stand-in.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use attestation::snp::InstanceRef;
use attestation::tpm::HashAlg;
use soft_issuer::gce::{GceSevEsNode, boot_events, event_log_for_banks, technology};
use tss_esapi::traits::Marshall;

use crate::snp::{GCE_PROJECT, GCE_ZONE, GceRegistry};
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

/// The GCE firmware version gcp-sev-es's simulated VMs boot.
const ES_FIRMWARE: u32 = 1;

/// A gcp-sev-es node with a new software AK on a simulated GCE confidential VM (AMD SEV,
/// firmware [`ES_FIRMWARE`]) naming `instance`. The GCE API vouches for its key only once it is
/// registered ([`GceRegistry::register`]).
pub fn es_node(instance: &InstanceRef) -> anyhow::Result<GceSevEsNode> {
    Ok(GceSevEsNode::new(
        soft_issuer::SoftIssuer::ecdsa_p256()?,
        instance,
        ES_FIRMWARE,
        technology::AMD_SEV,
    )?)
}

/// The attestation config every [`es_node`] satisfies: the firmware record's PCR 0 (the same
/// for every such VM) and [`GCE_PROJECT`] alone (`allowedGcpProjects`).
pub fn es_attestation_config() -> anyhow::Result<String> {
    let probe = es_node(&InstanceRef {
        project: GCE_PROJECT.to_owned(),
        zone: GCE_ZONE.to_owned(),
        instance: "probe".to_owned(),
    })?;
    let pcr0 = probe
        .ak()
        .pcrs()
        .get(&0)
        .map(hex::encode)
        .context("the simulated VM's PCR 0")?;
    Ok(serde_json::json!({
        "measurements": {"0": {"expected": pcr0, "warnOnly": false}},
        "allowedGcpProjects": [GCE_PROJECT],
    })
    .to_string())
}

/// gcp-sev-es nodes for load: each [`EsMachines::node`] is a new instance
/// (`<random prefix>-<n>` in [`GCE_PROJECT`], [`GCE_ZONE`]) with its own ECDSA P-256 AK,
/// registered with the GCE stand-in before it can connect, as a storm of new VMs is. The
/// prefix is new for every set, so two runs against one service never present one instance
/// with two keys.
#[derive(Debug)]
pub struct EsMachines {
    gce: GceRegistry,
    prefix: String,
    next: AtomicUsize,
}

impl EsMachines {
    pub fn new(gce: GceRegistry) -> EsMachines {
        EsMachines {
            gce,
            prefix: format!(
                "es{}",
                hex::encode(rand::Rng::random::<[u8; 4]>(&mut rand::rng()))
            ),
            next: AtomicUsize::new(0),
        }
    }

    /// The next node, its instance registered.
    pub fn node(&self) -> anyhow::Result<GceSevEsNode> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let instance = InstanceRef {
            project: GCE_PROJECT.to_owned(),
            zone: GCE_ZONE.to_owned(),
            instance: format!("{}-{index}", self.prefix),
        };
        let node = es_node(&instance)?;
        let spki = node.ak_spki_der().map_err(anyhow::Error::msg)?;
        self.gce.register(&instance, &spki)?;
        Ok(node)
    }
}
