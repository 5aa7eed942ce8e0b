//! A simulated GCE confidential VM for gcp-sev-es: the boot events Google's virtual firmware
//! measures into PCR 0 (its version, the non-host info naming the confidential technology, the
//! separator), as a crypto-agile event log, and a node whose documents carry that log and the
//! InstanceInfo Constellation's GCP issuer writes (`{"zone", "project_id", "instance_name"}`).
//!
//! Trusted nowhere by itself: the validator trusts the AK only because the GCE API (its
//! stand-in, told this node's key) vouches for it.

use attestation::gce::platform::{gce_firmware_version_string, nonhost_info};
use attestation::gce::{GceInstance, InstanceRef};
use attestation::tpm::HashAlg;
use attestation::{IssueError, Issuer, Variant};

use crate::{SoftIssuer, SoftIssuerError};

const EV_SEPARATOR: u32 = 0x0000_0004;
const EV_S_CRTM_VERSION: u32 = 0x0000_0008;
const EV_NONHOST_INFO: u32 = 0x0000_0011;

/// The confidential technology byte of the non-host info event (go-tpm-tools' enum).
pub mod technology {
    pub const NONE: u8 = 0;
    pub const AMD_SEV: u8 = 1;
    pub const AMD_SEV_ES: u8 = 2;
    pub const AMD_SEV_SNP: u8 = 4;
}

/// One measured event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootEvent {
    pub pcr: u32,
    pub event_type: u32,
    pub data: Vec<u8>,
}

impl BootEvent {
    /// The digest extended for this event in the `bank` bank (the hash of its data).
    pub fn digest(&self, bank: HashAlg) -> Vec<u8> {
        aws_lc_rs::digest::digest(bank.digest_algorithm(), &self.data)
            .as_ref()
            .to_vec()
    }
}

/// What GCE firmware `version` measures on a machine of `technology`: PCR 0's version string,
/// non-host info and separator, and the separators of PCRs 1–7.
pub fn boot_events(version: u32, technology: u8) -> Vec<BootEvent> {
    let mut events = vec![
        BootEvent {
            pcr: 0,
            event_type: EV_S_CRTM_VERSION,
            data: gce_firmware_version_string(version),
        },
        BootEvent {
            pcr: 0,
            event_type: EV_NONHOST_INFO,
            data: nonhost_info(technology).to_vec(),
        },
    ];
    events.extend((0..8).map(|pcr| BootEvent {
        pcr,
        event_type: EV_SEPARATOR,
        data: vec![0; 4],
    }));
    events
}

/// `events` as a crypto-agile TCG event log with SHA-256 digests.
pub fn event_log(events: &[BootEvent]) -> Vec<u8> {
    event_log_for_banks(events, &[HashAlg::Sha256])
}

/// `events` as a crypto-agile TCG event log with a digest per bank of `banks`.
pub fn event_log_for_banks(events: &[BootEvent], banks: &[HashAlg]) -> Vec<u8> {
    fn u32le(out: &mut Vec<u8>, v: usize) {
        out.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
    }
    let mut spec = b"Spec ID Event03\0".to_vec();
    u32le(&mut spec, 0); // platform class
    spec.extend_from_slice(&[0, 2, 0, 2]); // version minor, major, errata, uintn size
    u32le(&mut spec, banks.len());
    for bank in banks {
        spec.extend_from_slice(&bank.id().to_le_bytes());
        spec.extend_from_slice(&u16::try_from(bank.digest_len()).unwrap_or(0).to_le_bytes());
    }
    spec.push(0); // vendor info size
    let mut log = Vec::new();
    u32le(&mut log, 0);
    u32le(&mut log, 3); // EV_NO_ACTION
    log.extend_from_slice(&[0; 20]);
    u32le(&mut log, spec.len());
    log.extend_from_slice(&spec);
    for event in events {
        u32le(&mut log, event.pcr as usize);
        u32le(&mut log, event.event_type as usize);
        u32le(&mut log, banks.len());
        for bank in banks {
            log.extend_from_slice(&bank.id().to_le_bytes());
            log.extend_from_slice(&event.digest(*bank));
        }
        u32le(&mut log, event.data.len());
        log.extend_from_slice(&event.data);
    }
    log
}

/// A gcp-sev-es node: a software AK whose documents carry a GCE boot log and name `instance`.
#[derive(Clone, Debug)]
pub struct GceSevEsNode {
    ak: SoftIssuer,
    instance_info: Vec<u8>,
}

impl GceSevEsNode {
    /// A node on GCE firmware `version` with confidential `technology`, naming `instance`.
    pub fn new(
        ak: SoftIssuer,
        instance: &InstanceRef,
        version: u32,
        technology: u8,
    ) -> Result<GceSevEsNode, SoftIssuerError> {
        let ak = ak.with_event_log(event_log(&boot_events(version, technology)))?;
        let info = GceInstance {
            zone: instance.zone.clone(),
            project_id: instance.project.clone(),
            instance_name: instance.instance.clone(),
            ..GceInstance::default()
        };
        Ok(GceSevEsNode {
            ak,
            instance_info: info.to_json(),
        })
    }

    /// The same node sending exactly `instance_info` (for tampering tests).
    pub fn with_instance_info(mut self, instance_info: Vec<u8>) -> GceSevEsNode {
        self.instance_info = instance_info;
        self
    }

    /// The same node with PCR values of its own choosing on top of the boot log's.
    pub fn with_pcrs(
        mut self,
        pcrs: impl IntoIterator<Item = (u32, [u8; 32])>,
    ) -> Result<GceSevEsNode, SoftIssuerError> {
        self.ak = self.ak.with_pcrs(pcrs)?;
        Ok(self)
    }

    /// The AK as the GCE API returns it in `signingKey.ekPub` (DER SubjectPublicKeyInfo).
    pub fn ak_spki_der(&self) -> Result<Vec<u8>, String> {
        attestation::tpm::Public::parse(self.ak.ak_public())
            .map_err(|e| e.to_string())?
            .spki_der()
            .map_err(|e| e.to_string())
    }

    /// The AK's software issuer (its PCRs are the ones policies must expect).
    pub fn ak(&self) -> &SoftIssuer {
        &self.ak
    }

    pub fn instance_info(&self) -> &[u8] {
        &self.instance_info
    }
}

impl Issuer for GceSevEsNode {
    fn variant(&self) -> Variant {
        Variant::GcpSevEs
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.ak
            .issue_document_with_instance_info(user_data, nonce, Some(&self.instance_info))
            .map_err(|e| IssueError::from_error(Variant::GcpSevEs, e))
    }
}
