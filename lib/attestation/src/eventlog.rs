//! The TCG PC Client firmware event log, replayed to check it against quoted PCRs.
//!
//! Firmware and boot loader record every measurement they extend into a PCR in this log
//! (`/sys/kernel/security/tpm0/binary_bios_measurements`). The quote is what the TPM vouches
//! for; the log only explains it. Replaying the log and requiring it to reproduce the quoted
//! values keeps a node from sending a log that tells a different story than its PCRs, so
//! anything later read from the log can be trusted as far as the quote is.
//!
//! Two formats exist (TCG PC Client Platform Firmware Profile, section 10): the legacy one, where
//! every event (`TCG_PCR_EVENT`) carries one SHA-1 digest, and the crypto-agile one, which starts
//! with a legacy-format `Spec ID Event03` header naming the hash algorithms and then carries a
//! digest per algorithm in every event (`TCG_PCR_EVENT2`). All integers are little-endian.

use std::collections::BTreeMap;

use crate::Error;
use crate::tpm::HashAlg;

/// The largest log parsed; real ones are tens of kilobytes.
pub const MAX_EVENT_LOG_SIZE: usize = 512 * 1024;
/// Event logs have hundreds of events; this bounds work on hostile input.
pub const MAX_EVENTS: usize = 10_000;
/// PCR indices a firmware log can name (PC Client TPMs have 24).
pub const MAX_PCR_INDEX: u32 = 23;
/// The header lists each algorithm's digest size, so unknown algorithms can be skipped; this
/// bounds that size.
pub const MAX_LISTED_DIGEST_SIZE: usize = 128;
/// The number of algorithms a header may list (one per hash the TPM implements).
pub const MAX_ALGORITHMS: usize = 16;

const EV_NO_ACTION: u32 = 0x0000_0003;
const EV_SEPARATOR: u32 = 0x0000_0004;
const EV_S_CRTM_VERSION: u32 = 0x0000_0008;
const EV_EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
const EV_EFI_GPT_EVENT: u32 = 0x8000_0006;
const EV_EFI_ACTION: u32 = 0x8000_0007;

/// Event types whose digest the PC Client profile defines as the hash of the event data itself,
/// so the data a log shows can be checked against what was extended. Other types digest
/// something else (a PE image, a firmware blob, a command line without grub's prefix, or, for
/// EV_EFI_VARIABLE_BOOT and EV_EFI_VARIABLE_AUTHORITY, only part of the data on some firmware
/// and shims, which the real logs in testdata show), so their data cannot be checked this way.
/// Without this check a log could keep every digest (and so replay correctly) while showing
/// altered data: a different Secure Boot state or partition table than the one measured.
pub const DATA_BOUND_EVENT_TYPES: [u32; 5] = [
    EV_SEPARATOR,
    EV_S_CRTM_VERSION,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_EFI_GPT_EVENT,
    EV_EFI_ACTION,
];
const SPEC_ID_SIGNATURE: &[u8; 16] = b"Spec ID Event03\0";
const STARTUP_LOCALITY_SIGNATURE: &[u8; 16] = b"StartupLocality\0";

/// Why an event log could not be parsed or replayed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventLogError {
    #[error("event log of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("event log is truncated inside event {event} ({what})")]
    Truncated { event: usize, what: &'static str },
    #[error("event log has more than {MAX_EVENTS} events")]
    TooManyEvents,
    #[error("event {event} extends PCR {pcr}, beyond PCR {MAX_PCR_INDEX}")]
    BadPcrIndex { event: usize, pcr: u32 },
    #[error("event log header (Spec ID event) is malformed: {0}")]
    BadHeader(String),
    #[error(
        "event {event} has a digest for algorithm 0x{alg:04x}, which the log header does not list"
    )]
    UnknownDigest { event: usize, alg: u16 },
    #[error("event {event} has no {bank} digest")]
    MissingDigest { event: usize, bank: HashAlg },
    #[error("event log has no {0} digests (legacy SHA-1 log, or bank not logged)")]
    BankNotLogged(HashAlg),
    #[error(
        "event {event} (type 0x{event_type:08x}): its data does not hash to its {bank} digest (altered event data)"
    )]
    DataMismatch {
        event: usize,
        event_type: u32,
        bank: HashAlg,
    },
}

/// The log's format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// SHA-1 only (`TCG_PCR_EVENT` throughout).
    LegacySha1,
    /// Crypto-agile, with the algorithms and digest sizes from the Spec ID header.
    CryptoAgile { algorithms: Vec<(u16, usize)> },
}

/// One measurement event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub pcr: u32,
    pub event_type: u32,
    /// (TPM algorithm id, digest).
    pub digests: Vec<(u16, Vec<u8>)>,
    pub data: Vec<u8>,
}

/// A parsed event log. The crypto-agile header event is consumed into [`LogFormat`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLog {
    pub format: LogFormat,
    pub events: Vec<Event>,
}

struct Reader<'a> {
    buf: &'a [u8],
    event: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], EventLogError> {
        if self.buf.len() < n {
            return Err(EventLogError::Truncated {
                event: self.event,
                what,
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EventLogError> {
        Ok(self.bytes(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, EventLogError> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.bytes(2, what)?);
        Ok(u16::from_le_bytes(a))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EventLogError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.bytes(4, what)?);
        Ok(u32::from_le_bytes(a))
    }

    /// A u32-length-prefixed blob, bounded by what is left of the input.
    fn sized(&mut self, what: &'static str) -> Result<&'a [u8], EventLogError> {
        let len = self.u32(what)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.bytes(len, what)
    }
}

/// Reads a legacy `TCG_PCR_EVENT`.
fn read_legacy_event(r: &mut Reader<'_>) -> Result<Event, EventLogError> {
    let pcr = r.u32("PCR index")?;
    let event_type = r.u32("event type")?;
    let digest = r.bytes(20, "SHA-1 digest")?.to_vec();
    let data = r.sized("event data")?.to_vec();
    Ok(Event {
        pcr,
        event_type,
        digests: vec![(HashAlg::Sha1.id(), digest)],
        data,
    })
}

fn parse_spec_id(data: &[u8]) -> Result<Vec<(u16, usize)>, EventLogError> {
    let bad = |s: &str| EventLogError::BadHeader(s.to_owned());
    let mut r = Reader {
        buf: data,
        event: 0,
    };
    let sig = r.bytes(16, "signature").map_err(|_| bad("too short"))?;
    if sig != SPEC_ID_SIGNATURE {
        return Err(bad("not a Spec ID Event03"));
    }
    // platformClass, specVersionMinor, specVersionMajor, specErrata, uintnSize.
    r.bytes(8, "version").map_err(|_| bad("too short"))?;
    let count = r.u32("algorithm count").map_err(|_| bad("too short"))?;
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count == 0 || count > MAX_ALGORITHMS {
        return Err(bad("algorithm count out of range"));
    }
    let mut algorithms = Vec::with_capacity(count);
    for _ in 0..count {
        let alg = r
            .u16("algorithm")
            .map_err(|_| bad("truncated algorithm list"))?;
        let size = usize::from(
            r.u16("digest size")
                .map_err(|_| bad("truncated algorithm list"))?,
        );
        if size == 0 || size > MAX_LISTED_DIGEST_SIZE {
            return Err(bad("digest size out of range"));
        }
        if let Some(known) = HashAlg::from_id(alg)
            && known.digest_len() != size
        {
            return Err(bad("digest size does not match the algorithm"));
        }
        if algorithms.iter().any(|&(a, _)| a == alg) {
            return Err(bad("algorithm listed twice"));
        }
        algorithms.push((alg, size));
    }
    let vendor_len = usize::from(r.u8("vendor info size").map_err(|_| bad("too short"))?);
    r.bytes(vendor_len, "vendor info")
        .map_err(|_| bad("truncated vendor info"))?;
    Ok(algorithms)
}

impl EventLog {
    /// Parses a log in either format.
    pub fn parse(bytes: &[u8]) -> Result<EventLog, EventLogError> {
        if bytes.len() > MAX_EVENT_LOG_SIZE {
            return Err(EventLogError::TooLarge {
                size: bytes.len(),
                limit: MAX_EVENT_LOG_SIZE,
            });
        }
        let mut r = Reader {
            buf: bytes,
            event: 0,
        };
        let first = read_legacy_event(&mut r)?;
        let is_agile = first.event_type == EV_NO_ACTION
            && first.pcr == 0
            && first.data.starts_with(SPEC_ID_SIGNATURE);
        let mut events = Vec::new();
        if !is_agile {
            events.push(first);
            while !r.buf.is_empty() {
                r.event = events.len();
                if events.len() >= MAX_EVENTS {
                    return Err(EventLogError::TooManyEvents);
                }
                events.push(read_legacy_event(&mut r)?);
            }
            check_pcrs(&events)?;
            return Ok(EventLog {
                format: LogFormat::LegacySha1,
                events,
            });
        }
        let algorithms = parse_spec_id(&first.data)?;
        while !r.buf.is_empty() {
            r.event = events.len() + 1;
            if events.len() >= MAX_EVENTS {
                return Err(EventLogError::TooManyEvents);
            }
            let pcr = r.u32("PCR index")?;
            let event_type = r.u32("event type")?;
            let count = r.u32("digest count")?;
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            if count > algorithms.len() {
                return Err(EventLogError::BadHeader(format!(
                    "event {} has {count} digests, the header lists {} algorithms",
                    r.event,
                    algorithms.len()
                )));
            }
            let mut digests = Vec::with_capacity(count);
            for _ in 0..count {
                let alg = r.u16("digest algorithm")?;
                let size = algorithms
                    .iter()
                    .find(|&&(a, _)| a == alg)
                    .map(|&(_, size)| size)
                    .ok_or(EventLogError::UnknownDigest {
                        event: r.event,
                        alg,
                    })?;
                digests.push((alg, r.bytes(size, "digest")?.to_vec()));
            }
            let data = r.sized("event data")?.to_vec();
            events.push(Event {
                pcr,
                event_type,
                digests,
                data,
            });
        }
        check_pcrs(&events)?;
        Ok(EventLog {
            format: LogFormat::CryptoAgile { algorithms },
            events,
        })
    }

    /// Replays the log for `bank`: the value of every PCR the log extends. PCRs start at zero,
    /// except that a StartupLocality event sets PCR 0's initial value to the locality. Events
    /// whose digest is defined as the hash of their data ([`DATA_BOUND_EVENT_TYPES`]) must carry
    /// data that hashes to their digest in this bank.
    pub fn replay(&self, bank: HashAlg) -> Result<BTreeMap<u32, Vec<u8>>, EventLogError> {
        let logged = match &self.format {
            LogFormat::LegacySha1 => bank == HashAlg::Sha1,
            LogFormat::CryptoAgile { algorithms } => {
                algorithms.iter().any(|&(a, _)| a == bank.id())
            }
        };
        if !logged {
            return Err(EventLogError::BankNotLogged(bank));
        }
        let mut pcr0_locality = 0u8;
        let mut pcrs: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        for (i, event) in self.events.iter().enumerate() {
            if event.event_type == EV_NO_ACTION {
                // Not extended; only the locality marker matters for replay.
                if event.pcr == 0
                    && event.data.len() >= 17
                    && event.data.starts_with(STARTUP_LOCALITY_SIGNATURE)
                {
                    pcr0_locality = event.data[16];
                }
                continue;
            }
            // The header event is index 0 in a crypto-agile log's numbering.
            let number = match self.format {
                LogFormat::LegacySha1 => i,
                LogFormat::CryptoAgile { .. } => i + 1,
            };
            let digest = event
                .digests
                .iter()
                .find(|(a, _)| *a == bank.id())
                .map(|(_, d)| d)
                .ok_or(EventLogError::MissingDigest {
                    event: number,
                    bank,
                })?;
            if DATA_BOUND_EVENT_TYPES.contains(&event.event_type)
                && bank.digest(&event.data) != *digest
            {
                return Err(EventLogError::DataMismatch {
                    event: number,
                    event_type: event.event_type,
                    bank,
                });
            }
            let current = pcrs.entry(event.pcr).or_insert_with(|| {
                let mut init = vec![0u8; bank.digest_len()];
                if event.pcr == 0
                    && let Some(last) = init.last_mut()
                {
                    *last = pcr0_locality;
                }
                init
            });
            let mut ctx = aws_lc_rs::digest::Context::new(bank.digest_algorithm());
            ctx.update(current);
            ctx.update(digest);
            *current = ctx.finish().as_ref().to_vec();
        }
        Ok(pcrs)
    }
}

fn check_pcrs(events: &[Event]) -> Result<(), EventLogError> {
    for (event, e) in events.iter().enumerate() {
        if e.pcr > MAX_PCR_INDEX && e.event_type != EV_NO_ACTION {
            return Err(EventLogError::BadPcrIndex { event, pcr: e.pcr });
        }
    }
    Ok(())
}

/// Replays `log` for `bank` and requires every PCR it extends that the quote covers to equal
/// the quoted value. `quoted` must be the PCR values of a quote whose signature was verified;
/// otherwise this proves nothing.
pub fn check_against_quote(
    log: &[u8],
    bank: HashAlg,
    quoted: &BTreeMap<u32, Vec<u8>>,
) -> Result<(), Error> {
    let replayed = EventLog::parse(log)
        .and_then(|l| l.replay(bank))
        .map_err(Error::EventLog)?;
    for (index, value) in &replayed {
        if let Some(q) = quoted.get(index)
            && q != value
        {
            return Err(Error::EventLogMismatch {
                bank,
                index: *index,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> Vec<u8> {
        let path = format!("{}/testdata/eventlogs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn rhel8_replays_to_the_known_pcrs() {
        let log = EventLog::parse(&testdata("rhel8-uefi.bin")).unwrap();
        assert!(matches!(log.format, LogFormat::CryptoAgile { .. }));
        let sha256 = log.replay(HashAlg::Sha256).unwrap();
        let expected = [
            (
                0,
                "24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
            ),
            (
                1,
                "454220afaa80c83c3839f6cccd8b3c88bf4f562316a9dda1121c578c9e005a53",
            ),
            (
                2,
                "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            ),
            (
                3,
                "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            ),
            (
                4,
                "758a3d35f1b0ff5b135dacd07db0c8132c0ac665d944090d4bf96e66447a245c",
            ),
            (
                5,
                "53d0ee36163219201e686167bbb71ec505b3ba2917b9d9183ed84aad26cfeb89",
            ),
            (
                6,
                "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            ),
            (
                7,
                "5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da",
            ),
            (
                8,
                "25c3874041ebd4e9a21b6ed71b624a7bfa99907a8dcea7f129a4c64cbaf5829a",
            ),
            (
                9,
                "d43b2f61eb18b4791812ff5f20ab20e4ef621ba683370bedf5dbdf518b3a8078",
            ),
            (
                14,
                "d8f57ebcc1a23cc46832696e1a657f720e1be8f5b405bb7204682114e363b455",
            ),
        ];
        for (pcr, hex_value) in expected {
            assert_eq!(hex::encode(&sha256[&pcr]), hex_value, "SHA-256 PCR {pcr}");
        }
        let sha1 = log.replay(HashAlg::Sha1).unwrap();
        for (pcr, hex_value) in [
            (0, "0f2d3a2a1adaa479aeeca8f5df76aadc41b862ea"),
            (4, "7fbe2df30156ca4934109f48d850ab327110f8fa"),
            (7, "d7a632f8990b2171e987041b0a3c69fc1b2a4f27"),
            (14, "1f5149668c40524e01be9cbc3ad527645943f148"),
        ] {
            assert_eq!(hex::encode(&sha1[&pcr]), hex_value, "SHA-1 PCR {pcr}");
        }
    }

    #[test]
    fn all_real_logs_parse() {
        for name in [
            "arch-linux-workstation.bin",
            "cos-101-amd-sev.bin",
            "rhel8-uefi.bin",
            "ubuntu-2404-amd-sevsnp.bin",
        ] {
            let log = EventLog::parse(&testdata(name)).unwrap();
            assert!(
                matches!(log.format, LogFormat::CryptoAgile { .. }),
                "{name}"
            );
            assert!(!log.replay(HashAlg::Sha256).unwrap().is_empty(), "{name}");
        }
        let legacy = EventLog::parse(&testdata("debian-10.bin")).unwrap();
        assert_eq!(legacy.format, LogFormat::LegacySha1);
        assert!(!legacy.replay(HashAlg::Sha1).unwrap().is_empty());
        assert_eq!(
            legacy.replay(HashAlg::Sha256),
            Err(EventLogError::BankNotLogged(HashAlg::Sha256))
        );
    }

    #[test]
    fn mismatching_quote_is_reported() {
        let raw = testdata("rhel8-uefi.bin");
        let mut quoted = EventLog::parse(&raw)
            .unwrap()
            .replay(HashAlg::Sha256)
            .unwrap();
        check_against_quote(&raw, HashAlg::Sha256, &quoted).unwrap();
        quoted.insert(4, vec![0; 32]);
        assert!(matches!(
            check_against_quote(&raw, HashAlg::Sha256, &quoted),
            Err(Error::EventLogMismatch { index: 4, .. })
        ));
    }

    /// The true SHA-256 PCRs of rhel8-uefi.bin (`rhel8_replays_to_the_known_pcrs` pins them to
    /// the values the test vectors' source lists).
    fn rhel8_true_pcrs() -> BTreeMap<u32, Vec<u8>> {
        EventLog::parse(&testdata("rhel8-uefi.bin"))
            .unwrap()
            .replay(HashAlg::Sha256)
            .unwrap()
    }

    fn position_of(haystack: &[u8], needle: &[u8]) -> usize {
        let positions: Vec<usize> = haystack
            .windows(needle.len())
            .enumerate()
            .filter(|(_, w)| *w == needle)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(positions.len(), 1, "needle must occur exactly once");
        positions[0]
    }

    #[test]
    fn an_altered_digest_is_rejected_against_the_true_pcrs() {
        let raw = testdata("rhel8-uefi.bin");
        let truth = rhel8_true_pcrs();
        let log = EventLog::parse(&raw).unwrap();
        // The first boot application loaded (PCR 4): its digest is of a PE image, which the log
        // cannot show, so only the replay can catch a change.
        let event = log
            .events
            .iter()
            .find(|e| e.pcr == 4 && e.event_type == 0x8000_0003)
            .unwrap();
        let digest = &event.digests.iter().find(|(a, _)| *a == 0x000b).unwrap().1;
        let mut altered = raw.clone();
        altered[position_of(&raw, digest) + 7] ^= 0x01;
        assert_eq!(
            check_against_quote(&altered, HashAlg::Sha256, &truth)
                .unwrap_err()
                .to_string(),
            "event log does not replay to the quoted SHA-256 PCR 4"
        );
        check_against_quote(&raw, HashAlg::Sha256, &truth).unwrap();
    }

    #[test]
    fn altered_event_data_is_rejected_against_the_true_pcrs() {
        let raw = testdata("rhel8-uefi.bin");
        let truth = rhel8_true_pcrs();
        let log = EventLog::parse(&raw).unwrap();
        // The SecureBoot variable (PCR 7): flipping its value to "off" keeps every digest, so
        // the log still replays; only the data-to-digest binding catches it.
        let (number, event) = log
            .events
            .iter()
            .enumerate()
            .find(|(_, e)| e.pcr == 7 && e.event_type == EV_EFI_VARIABLE_DRIVER_CONFIG)
            .unwrap();
        let mut altered = raw.clone();
        let at = position_of(&raw, &event.data) + event.data.len() - 1;
        altered[at] ^= 0x01;
        let err = check_against_quote(&altered, HashAlg::Sha256, &truth).unwrap_err();
        assert!(
            matches!(
                err,
                Error::EventLog(EventLogError::DataMismatch { event, bank: HashAlg::Sha256, .. })
                    if event == number + 1
            ),
            "{err}"
        );
        // Every data-bound event in every real log is bound in every bank it logs.
        for name in [
            "arch-linux-workstation.bin",
            "cos-101-amd-sev.bin",
            "rhel8-uefi.bin",
            "ubuntu-2404-amd-sevsnp.bin",
            "debian-10.bin",
        ] {
            let log = EventLog::parse(&testdata(name)).unwrap();
            let banks: &[HashAlg] = match log.format {
                LogFormat::LegacySha1 => &[HashAlg::Sha1],
                LogFormat::CryptoAgile { .. } => &[HashAlg::Sha1, HashAlg::Sha256],
            };
            for &bank in banks {
                log.replay(bank)
                    .unwrap_or_else(|e| panic!("{name} {bank}: {e}"));
            }
        }
    }

    #[test]
    fn truncations_and_garbage_are_errors_not_panics() {
        let raw = testdata("rhel8-uefi.bin");
        // Every cut inside the first few events, and a sample of later ones.
        for len in (0..2000).chain((2000..raw.len()).step_by(97)) {
            if let Ok(log) = EventLog::parse(&raw[..len]) {
                let _ = log.replay(HashAlg::Sha256);
            }
        }
        let mut corrupted = raw.clone();
        for i in (0..corrupted.len()).step_by(13) {
            corrupted[i] ^= 0xa5;
            if let Ok(log) = EventLog::parse(&corrupted) {
                let _ = log.replay(HashAlg::Sha256);
            }
        }
    }
}
