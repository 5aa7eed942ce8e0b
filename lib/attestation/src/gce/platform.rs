//! The GCE platform a vTPM's event log records: Google's virtual firmware measures its version
//! (`EV_S_CRTM_VERSION`) and the machine's confidential-computing technology
//! (`EV_NONHOST_INFO`) into PCR 0 before anything else runs. gcp-sev-es reads them to know the
//! machine is an AMD SEV confidential VM, as Constellation does through go-tpm-tools'
//! `MachineState.Platform`.
//!
//! What the log says is worth what the quote is: the log must replay to the quoted PCR 0 (the
//! vTPM document's checks), and only events before PCR 0's separator count, because anything
//! after it was measured by software the firmware loaded. Each event read here must carry the
//! digest of its own data, so a log cannot keep a genuine digest while showing other data. The
//! formats (go-tpm-tools' `server` package, the facts only):
//! - the firmware version is UCS-2 little-endian `GCE Virtual Firmware v<decimal>` with a
//!   terminating NUL; any other S-CRTM version string names no GCE firmware version;
//! - the non-host info is 32 bytes: `GCE NonHostInfo\0`, one byte of technology
//!   (0 none, 1 AMD SEV, 2 AMD SEV-ES, 4 AMD SEV-SNP, 5 Intel TDX), 15 reserved bytes;
//! - a separator's data is `00000000` or `FFFFFFFF` (four bytes); an event carrying a
//!   separator's digest under another type is refused, as go-tpm-tools refuses it.

use std::fmt;

use crate::eventlog::EventLog;
use crate::tpm::HashAlg;

const EV_SEPARATOR: u32 = 0x0000_0004;
const EV_S_CRTM_VERSION: u32 = 0x0000_0008;
const EV_NONHOST_INFO: u32 = 0x0000_0011;

/// The signature the non-host info event's data starts with.
pub const NONHOST_INFO_SIGNATURE: &[u8; 16] = b"GCE NonHostInfo\0";
/// `GCE Virtual Firmware v` in UCS-2 little-endian, the prefix of every GCE firmware version.
const FIRMWARE_PREFIX: &str = "GCE Virtual Firmware v";

/// The confidential-computing technology the firmware recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Technology {
    /// A Shielded VM that is not confidential.
    None,
    AmdSev,
    AmdSevEs,
    AmdSevSnp,
    IntelTdx,
    /// A value go-tpm-tools does not know.
    Unknown(u8),
}

impl Technology {
    fn from_byte(byte: u8) -> Technology {
        match byte {
            0 => Technology::None,
            1 => Technology::AmdSev,
            2 => Technology::AmdSevEs,
            4 => Technology::AmdSevSnp,
            5 => Technology::IntelTdx,
            other => Technology::Unknown(other),
        }
    }
}

impl fmt::Display for Technology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Technology::None => f.write_str("no confidential computing"),
            Technology::AmdSev => f.write_str("AMD SEV"),
            Technology::AmdSevEs => f.write_str("AMD SEV-ES"),
            Technology::AmdSevSnp => f.write_str("AMD SEV-SNP"),
            Technology::IntelTdx => f.write_str("Intel TDX"),
            Technology::Unknown(byte) => write!(f, "unknown technology {byte}"),
        }
    }
}

/// What PCR 0's events before the separator record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlatformState {
    /// The GCE virtual firmware version, if the S-CRTM version names one.
    pub gce_version: Option<u32>,
    /// The technology of the non-host info event; `None` without one.
    pub technology: Option<Technology>,
}

/// Why PCR 0's events cannot be read as a platform record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlatformError {
    #[error("the event log has no {0} digests to read PCR 0's events with")]
    NoDigest(HashAlg),
    #[error(
        "event {event} of PCR 0 (type 0x{event_type:08x}) does not carry the digest of its own data"
    )]
    Unverified { event: usize, event_type: u32 },
    #[error(
        "event {event} of PCR 0 carries a separator's digest under type 0x{event_type:08x}, not EV_SEPARATOR"
    )]
    DisguisedSeparator { event: usize, event_type: u32 },
    #[error("event {event} of PCR 0 is a separator whose data is neither 00000000 nor FFFFFFFF")]
    BadSeparator { event: usize },
}

fn digest(bank: HashAlg, data: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(bank.digest_algorithm(), data)
        .as_ref()
        .to_vec()
}

/// Reads PCR 0's platform record from `log` with the `bank` digests (the bank of the quote the
/// log was checked against).
pub fn platform_state(log: &EventLog, bank: HashAlg) -> Result<PlatformState, PlatformError> {
    let separators = [
        digest(bank, &[0, 0, 0, 0]),
        digest(bank, &[0xff, 0xff, 0xff, 0xff]),
    ];
    let mut state = PlatformState {
        gce_version: None,
        technology: None,
    };
    for (index, event) in log.events.iter().enumerate() {
        if event.pcr != 0 {
            continue;
        }
        let logged = event
            .digests
            .iter()
            .find(|(alg, _)| *alg == bank.id())
            .map(|(_, d)| d.as_slice())
            .ok_or(PlatformError::NoDigest(bank))?;
        let verified = logged == digest(bank, &event.data).as_slice();
        let looks_like_separator = separators.iter().any(|s| s.as_slice() == logged);
        if event.event_type == EV_SEPARATOR || looks_like_separator {
            if event.event_type != EV_SEPARATOR {
                return Err(PlatformError::DisguisedSeparator {
                    event: index,
                    event_type: event.event_type,
                });
            }
            if !verified {
                return Err(PlatformError::Unverified {
                    event: index,
                    event_type: event.event_type,
                });
            }
            if event.data != [0, 0, 0, 0] && event.data != [0xff, 0xff, 0xff, 0xff] {
                return Err(PlatformError::BadSeparator { event: index });
            }
            // Whatever PCR 0 records after its separator came from software the firmware ran.
            break;
        }
        if matches!(event.event_type, EV_S_CRTM_VERSION | EV_NONHOST_INFO) && !verified {
            return Err(PlatformError::Unverified {
                event: index,
                event_type: event.event_type,
            });
        }
        match event.event_type {
            EV_S_CRTM_VERSION => state.gce_version = gce_firmware_version(&event.data),
            EV_NONHOST_INFO => state.technology = nonhost_technology(&event.data),
            _ => {}
        }
    }
    Ok(state)
}

/// The version number of a GCE S-CRTM version string, or `None` if it is not one.
pub fn gce_firmware_version(data: &[u8]) -> Option<u32> {
    if data.len() % 2 != 0 {
        return None;
    }
    let units: Vec<u16> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let (&last, text) = units.split_last()?;
    if last != 0 {
        return None;
    }
    let text = String::from_utf16(text).ok()?;
    let digits = text.strip_prefix(FIRMWARE_PREFIX)?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The UCS-2 S-CRTM version string of GCE firmware `version`, as Google's firmware measures it.
pub fn gce_firmware_version_string(version: u32) -> Vec<u8> {
    format!("{FIRMWARE_PREFIX}{version}\0")
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect()
}

/// The technology a non-host info event names, or `None` if the data is not one.
pub fn nonhost_technology(data: &[u8]) -> Option<Technology> {
    let rest = data.strip_prefix(NONHOST_INFO_SIGNATURE.as_slice())?;
    rest.first().copied().map(Technology::from_byte)
}

/// The 32-byte non-host info event data recording `technology` (a byte, as the firmware writes
/// it).
pub fn nonhost_info(technology: u8) -> [u8; 32] {
    let mut data = [0u8; 32];
    data[..16].copy_from_slice(NONHOST_INFO_SIGNATURE);
    data[16] = technology;
    data
}

/// The firmware version gcp-sev-es requires at least, as Constellation does.
pub const MINIMUM_GCE_VERSION: u32 = 1;

/// gcp-sev-es's check of the platform record: GCE firmware of at least
/// [`MINIMUM_GCE_VERSION`], and AMD SEV or SEV-ES. Constellation requires AMD SEV exactly;
/// SEV-ES (the same memory encryption with the register state encrypted too) is accepted here
/// as well, since Google records it for machines that are only stronger. An SEV-SNP or TDX
/// machine is refused: it attests with a hardware report as its own variant.
pub fn check_sev(state: &PlatformState) -> Result<Technology, String> {
    match state.gce_version {
        Some(v) if v >= MINIMUM_GCE_VERSION => {}
        Some(v) => {
            return Err(format!(
                "GCE firmware version {v} is older than {MINIMUM_GCE_VERSION}"
            ));
        }
        None => {
            return Err(
                "PCR 0 records no GCE virtual firmware version (EV_S_CRTM_VERSION): not a GCE machine"
                    .to_owned(),
            );
        }
    }
    match state.technology {
        Some(tech @ (Technology::AmdSev | Technology::AmdSevEs)) => Ok(tech),
        Some(tech @ (Technology::AmdSevSnp | Technology::IntelTdx)) => Err(format!(
            "the firmware records {tech}: such a machine attests as its own variant, not gcp-sev-es"
        )),
        Some(tech) => Err(format!(
            "the firmware records {tech}, not an AMD SEV confidential VM"
        )),
        None => Err(
            "PCR 0 records no GCE non-host info (EV_NONHOST_INFO): not a GCE confidential VM"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn firmware_versions_read_as_go_tpm_tools_writes_them() {
        for v in [1, 2, 10, 4_000_000_000] {
            assert_eq!(
                gce_firmware_version(&gce_firmware_version_string(v)),
                Some(v)
            );
        }
        let mut no_nul = gce_firmware_version_string(2);
        no_nul.truncate(no_nul.len() - 2);
        assert_eq!(gce_firmware_version(&no_nul), None);
        assert_eq!(gce_firmware_version(b""), None);
        assert_eq!(gce_firmware_version(&[0x47]), None);
        let other: Vec<u8> = "EDK II\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(gce_firmware_version(&other), None);
        let letters: Vec<u8> = "GCE Virtual Firmware vX\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(gce_firmware_version(&letters), None);
    }

    #[test]
    fn nonhost_info_names_the_technology() {
        assert_eq!(
            nonhost_technology(&nonhost_info(1)),
            Some(Technology::AmdSev)
        );
        assert_eq!(
            nonhost_technology(&nonhost_info(2)),
            Some(Technology::AmdSevEs)
        );
        assert_eq!(
            nonhost_technology(&nonhost_info(9)),
            Some(Technology::Unknown(9))
        );
        assert_eq!(nonhost_technology(NONHOST_INFO_SIGNATURE), None);
        assert_eq!(nonhost_technology(b"GCE NonHostInfo!\x01"), None);
    }

    #[test]
    fn only_current_gce_sev_machines_pass() {
        let state = |v, t| PlatformState {
            gce_version: v,
            technology: t,
        };
        assert_eq!(
            check_sev(&state(Some(1), Some(Technology::AmdSev))),
            Ok(Technology::AmdSev)
        );
        assert_eq!(
            check_sev(&state(Some(2), Some(Technology::AmdSevEs))),
            Ok(Technology::AmdSevEs)
        );
        for (s, needle) in [
            (state(Some(0), Some(Technology::AmdSev)), "older than 1"),
            (
                state(None, Some(Technology::AmdSev)),
                "no GCE virtual firmware",
            ),
            (state(Some(1), Some(Technology::None)), "not an AMD SEV"),
            (state(Some(1), None), "no GCE non-host info"),
            (
                state(Some(1), Some(Technology::AmdSevSnp)),
                "its own variant",
            ),
            (
                state(Some(1), Some(Technology::Unknown(7))),
                "unknown technology 7",
            ),
        ] {
            let err = check_sev(&s).unwrap_err();
            assert!(err.contains(needle), "{s:?}: {err}");
        }
    }
}
