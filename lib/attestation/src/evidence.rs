//! Kept evidence: what attest-proxy decided on lately, with what a validator needs to decide
//! again, so that a new policy can be tried on the nodes the cluster really has before it is
//! enforced ([`crate::dry_run`]).
//!
//! One [`Record`] per decided connection, one line of JSON per record in a directory of its own:
//! the attestation document exactly as the certificate carried it, the nonce the connection
//! sent, the user data the document had to bind (SHA-256 of the certificate's
//! SubjectPublicKeyInfo), and the audit record of the decision made ([`Decision`]: time, peer,
//! variant, policy, result, failed check). No key is in it: the node's private key never leaves
//! the node, and the certificate itself is not kept (its self-signature and dates are properties
//! of the connection, not of the policy). A document is not secret, but it says what a node
//! runs and, for hardware variants, which chip or instance it is; whatever a node put into its
//! document (an Azure node may add an MAA token) is kept with it.
//!
//! Records are appended to segment files, each line one record written whole by one `write`, so
//! that keeping a decision costs one system call, not a file of its own; a reader takes only
//! newline-terminated lines, so it never sees half a record. A segment
//! takes at most a sixteenth of each bound (and 64 records, 1 MiB, one minute), then the next
//! record begins a new one; a restart never appends to an earlier run's segment.
//!
//! The [`Store`] is bounded three ways, oldest segment first: by count, by the bytes of its files
//! and by age. The directory is 0700 and each file 0600, both owned by the process's uid, and a
//! directory owned by another uid is refused: evidence is public, but another uid must not be
//! able to plant records that a dry run or a held reload would count. Segment names begin with
//! the decision time of their first record in milliseconds, so the store's order is known from
//! a listing.

use std::collections::VecDeque;
use std::fs::{DirBuilder, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::audit::{Decision, Outcome};
use crate::{Validator, Variant, Verified};

/// The record format this code writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// The largest record file read back: a document is at most a certificate's worth (64 KiB), in
/// base64, with its decision.
pub const MAX_RECORD_SIZE: u64 = 256 * 1024;

/// One decided connection, as kept on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// [`RECORD_FORMAT`].
    pub format: u32,
    /// The nonce the connection sent the node, hex.
    pub nonce: String,
    /// The user data the document had to bind (SHA-256 of the certificate key), hex.
    pub user_data: String,
    /// The attestation document as the certificate extension carried it, standard base64.
    pub document: String,
    /// The decision made, as the audit line recorded it.
    pub decision: Decision,
}

/// Why a record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record format {0} is not {RECORD_FORMAT}")]
    Format(u32),
    #[error("record field {field} is not valid {encoding}")]
    Encoding {
        field: &'static str,
        encoding: &'static str,
    },
    #[error("record names variant {0:?}, which this build does not know")]
    Variant(String),
    #[error("record time {0:?} is not RFC 3339")]
    Time(String),
}

impl Record {
    /// The record of `decision`, made on `document` for `nonce`, which had to bind `user_data`.
    pub fn new(decision: Decision, nonce: &[u8], user_data: &[u8], document: &[u8]) -> Self {
        Self {
            format: RECORD_FORMAT,
            nonce: hex::encode(nonce),
            user_data: hex::encode(user_data),
            document: base64::engine::general_purpose::STANDARD.encode(document),
            decision,
        }
    }

    /// The variant the decision was made for.
    pub fn variant(&self) -> Result<Variant, RecordError> {
        self.decision
            .variant
            .parse()
            .map_err(|_| RecordError::Variant(self.decision.variant.clone()))
    }

    /// When the decision was made.
    pub fn time(&self) -> Result<SystemTime, RecordError> {
        humantime::parse_rfc3339(&self.decision.time)
            .map_err(|_| RecordError::Time(self.decision.time.clone()))
    }

    /// Whether the node was accepted.
    pub fn accepted(&self) -> bool {
        self.decision.result == Outcome::Accepted
    }

    /// Decides again with `validator`: the document for the recorded nonce, then the binding to
    /// the recorded user data, exactly as the connection's verification did after the
    /// certificate checks. Time-dependent checks (collateral freshness, revocation) are the
    /// validator's and run at its clock: now, unless the validator was built with another.
    pub fn redecide(&self, validator: &dyn Validator) -> Result<Verified, Redecision> {
        if self.format != RECORD_FORMAT {
            return Err(Redecision::Record(RecordError::Format(self.format)));
        }
        let hex_field = |field: &'static str, text: &str| {
            hex::decode(text).map_err(|_| {
                Redecision::Record(RecordError::Encoding {
                    field,
                    encoding: "hex",
                })
            })
        };
        let nonce = hex_field("nonce", &self.nonce)?;
        let user_data = hex_field("user_data", &self.user_data)?;
        let document = base64::engine::general_purpose::STANDARD
            .decode(&self.document)
            .map_err(|_| {
                Redecision::Record(RecordError::Encoding {
                    field: "document",
                    encoding: "base64",
                })
            })?;
        let verified = validator
            .validate(&document, &nonce)
            .map_err(Redecision::Attestation)?;
        // The binding is public data; no need for constant time in a dry run.
        if verified.user_data != user_data {
            return Err(Redecision::UserData);
        }
        Ok(verified)
    }
}

/// Why a re-decision refused a record.
#[derive(Debug, thiserror::Error)]
pub enum Redecision {
    /// The record itself is unusable.
    #[error("the kept record is unusable")]
    Record(#[source] RecordError),
    /// The validator refused the document.
    #[error("attestation rejected")]
    Attestation(#[source] crate::Error),
    /// The document verified but binds other user data than the connection's key.
    #[error("the document does not bind the connection's certificate key")]
    UserData,
}

/// How much a [`Store`] keeps; the oldest records go first when any bound is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Records kept at most.
    pub max_records: usize,
    /// Bytes of record files kept at most.
    pub max_bytes: u64,
    /// Records older than this are removed.
    pub max_age: Duration,
}

/// Why the store cannot be used or a record not kept.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot use evidence directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "evidence directory {path} is owned by uid {owner}, not this process's uid {own}: give it to this uid or choose another directory"
    )]
    NotOwned { path: PathBuf, owner: u32, own: u32 },
    #[error("cannot write evidence record {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("evidence record of {size} bytes exceeds the store's {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
}

/// One segment file: its name, the decision time of its first record (ms since the epoch, the
/// start of its name), how many records it holds and its size.
#[derive(Clone, Debug)]
struct Segment {
    name: String,
    millis: u64,
    records: usize,
    size: u64,
}

/// When the open segment is full and the next record begins a new one: a sixteenth of each
/// bound, so that removing the oldest segment whole never takes more than a sixteenth of what
/// the bounds allow, and at most 64 records, 1 MiB or one minute of decisions.
#[derive(Clone, Copy, Debug)]
struct SegmentLimits {
    records: usize,
    bytes: u64,
    span_millis: u64,
}

impl SegmentLimits {
    fn of(bounds: Bounds) -> Self {
        Self {
            records: (bounds.max_records / 16).clamp(1, 64),
            bytes: (bounds.max_bytes / 16).min(1 << 20),
            span_millis: u64::try_from((bounds.max_age / 16).as_millis())
                .unwrap_or(u64::MAX)
                .min(60_000),
        }
    }
}

/// The bounded directory of records. Writing is blocking file I/O: attest-proxy calls it from a
/// thread of its own, never on a connection's path.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    bounds: Bounds,
    limits: SegmentLimits,
    /// Oldest first; the last is the one `open` appends to, while it is open.
    segments: VecDeque<Segment>,
    records: usize,
    bytes: u64,
    open: Option<std::fs::File>,
    /// Distinguishes segments begun in the same millisecond.
    counter: u64,
}

const SUFFIX: &str = ".jsonl";

/// The largest segment file read back: the writer begins a new one at 1 MiB.
pub const MAX_SEGMENT_SIZE: u64 = 4 << 20;

/// The uid of this process (the owner of `/proc/self`).
fn own_uid() -> std::io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The decision time a segment's file name starts with.
fn millis_of_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SUFFIX)?;
    let (millis, counter) = stem.split_once('-')?;
    counter.parse::<u64>().ok()?;
    millis.parse().ok()
}

/// The complete records (newline-terminated lines) in a segment an earlier run left.
fn complete_records(path: &Path) -> std::io::Result<usize> {
    let bytes = std::fs::read(path)?;
    Ok(bytes.iter().filter(|&&b| b == b'\n').count())
}

impl Store {
    /// Opens (creating it 0700 if needed) the store in `dir`, tightens the directory to 0700 and
    /// its segments to 0600, and applies the bounds to what an earlier run left, which is never
    /// appended to: this run begins a segment of its own. Files that are not segments and
    /// segments without a complete record are removed.
    pub fn open(dir: &Path, bounds: Bounds) -> Result<Store, StoreError> {
        let dir_error = |source| StoreError::Dir {
            path: dir.to_owned(),
            source,
        };
        match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(dir_error(e)),
        }
        let meta = std::fs::symlink_metadata(dir).map_err(dir_error)?;
        if !meta.is_dir() {
            return Err(dir_error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a directory",
            )));
        }
        let own = own_uid().map_err(dir_error)?;
        if meta.uid() != own {
            return Err(StoreError::NotOwned {
                path: dir.to_owned(),
                owner: meta.uid(),
                own,
            });
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_error)?;
        let mut segments = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(dir_error)? {
            let entry = entry.map_err(dir_error)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let meta = entry.metadata().map_err(dir_error)?;
            let millis = match millis_of_name(&name) {
                Some(millis)
                    if meta.is_file() && meta.uid() == own && meta.len() <= MAX_SEGMENT_SIZE =>
                {
                    millis
                }
                _ => {
                    remove_quietly(&entry.path());
                    continue;
                }
            };
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))
                .map_err(dir_error)?;
            match complete_records(&entry.path()).map_err(dir_error)? {
                0 => remove_quietly(&entry.path()),
                records => segments.push(Segment {
                    name,
                    millis,
                    records,
                    size: meta.len(),
                }),
            }
        }
        segments.sort_by(|a, b| (a.millis, &a.name).cmp(&(b.millis, &b.name)));
        let mut store = Store {
            dir: dir.to_owned(),
            bounds,
            limits: SegmentLimits::of(bounds),
            records: segments.iter().map(|s| s.records).sum(),
            bytes: segments.iter().map(|s| s.size).sum(),
            segments: segments.into(),
            open: None,
            counter: 0,
        };
        store.prune(SystemTime::now());
        Ok(store)
    }

    /// The directory the records are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records kept now.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Whether no record is kept.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Bytes of the segment files kept now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Keeps `record` (one line appended to the open segment, or to a new one, file 0600), then
    /// removes the oldest segments beyond the bounds. A record larger than the byte bound on its
    /// own is refused.
    pub fn put(&mut self, record: &Record) -> Result<(), StoreError> {
        let time = record.time().unwrap_or_else(|_| SystemTime::now());
        let mut line = serde_json::to_vec(record).map_err(|e| StoreError::Write {
            path: self.dir.clone(),
            source: e.into(),
        })?;
        line.push(b'\n');
        let size = u64::try_from(line.len()).unwrap_or(u64::MAX);
        if size > self.bounds.max_bytes || size > MAX_RECORD_SIZE {
            return Err(StoreError::TooLarge {
                size,
                limit: self.bounds.max_bytes.min(MAX_RECORD_SIZE),
            });
        }
        let millis = millis(time);
        if !self.takes(millis, size) {
            self.begin(millis)?;
        }
        let (Some(file), Some(segment)) = (self.open.as_mut(), self.segments.back_mut()) else {
            return Err(StoreError::Write {
                path: self.dir.clone(),
                source: std::io::Error::other("no open segment"),
            });
        };
        // One write of the whole line: a reader sees the record whole or, while it is being
        // written, not yet.
        if let Err(source) = file.write_all(&line) {
            // Part of the line may be in the file: the next record begins a new segment, and
            // readers name this one's incomplete end.
            self.open = None;
            return Err(StoreError::Write {
                path: self.dir.join(&segment.name),
                source,
            });
        }
        segment.records += 1;
        segment.size += size;
        self.records += 1;
        self.bytes += size;
        self.prune(SystemTime::now());
        Ok(())
    }

    /// Whether the open segment takes a record of `size` bytes decided at `millis`.
    fn takes(&self, millis: u64, size: u64) -> bool {
        match (&self.open, self.segments.back()) {
            (Some(_), Some(last)) => {
                last.records < self.limits.records
                    && last.size + size <= self.limits.bytes
                    && millis.saturating_sub(last.millis) < self.limits.span_millis
            }
            _ => false,
        }
    }

    /// Begins a new segment, named by the decision time of its first record.
    fn begin(&mut self, millis: u64) -> Result<(), StoreError> {
        self.open = None;
        // A segment of the same millisecond from an earlier run may hold the next name.
        for _ in 0..1_000 {
            self.counter = self.counter.wrapping_add(1);
            let name = format!("{millis:013}-{:06}{SUFFIX}", self.counter % 1_000_000);
            let path = self.dir.join(&name);
            match OpenOptions::new()
                .append(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    self.open = Some(file);
                    self.segments.push_back(Segment {
                        name,
                        millis,
                        records: 0,
                        size: 0,
                    });
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(StoreError::Write { path, source }),
            }
        }
        Err(StoreError::Write {
            path: self.dir.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "no free segment name for this millisecond",
            ),
        })
    }

    /// Removes the oldest segments while any bound is exceeded, and every segment whose first
    /// record is older than the age bound at `now` (so no record outlives the bound; the
    /// youngest of such a segment go up to a sixteenth of it early).
    pub fn prune(&mut self, now: SystemTime) {
        let oldest_allowed = millis(now)
            .saturating_sub(u64::try_from(self.bounds.max_age.as_millis()).unwrap_or(u64::MAX));
        while let Some(first) = self.segments.front() {
            let over = self.records > self.bounds.max_records
                || self.bytes > self.bounds.max_bytes
                || first.millis < oldest_allowed;
            if !over {
                break;
            }
            if self.segments.len() == 1 {
                self.open = None;
            }
            if let Some(first) = self.segments.pop_front() {
                self.records = self.records.saturating_sub(first.records);
                self.bytes = self.bytes.saturating_sub(first.size);
                remove_quietly(&self.dir.join(&first.name));
            }
        }
    }
}

/// Removes a file; one already gone is what was wanted, and any other failure leaves a file
/// the next start removes or counts again.
fn remove_quietly(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// What [`read_dir`] found: the records, oldest first, and the records that could not be read,
/// each with its file and why.
#[derive(Debug, Default)]
pub struct Read {
    pub records: Vec<Record>,
    pub skipped: Vec<(PathBuf, String)>,
}

/// The records in `dir`, oldest first. A segment removed between the listing and its reading
/// (pruned meanwhile) is left out silently, and so is the end of the newest segment while its
/// line is still being written.
pub fn read_dir(dir: &Path) -> std::io::Result<Read> {
    let mut names: Vec<(u64, String)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            millis_of_name(&name).map(|millis| (millis, name))
        })
        .collect();
    names.sort();
    let newest = names.len().saturating_sub(1);
    let mut read = Read::default();
    for (index, (_, name)) in names.iter().enumerate() {
        let path = dir.join(name);
        let bytes = match read_segment(&path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(reason) => {
                read.skipped.push((path, reason));
                continue;
            }
        };
        for (n, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
            let Some(line) = line.strip_suffix(b"\n") else {
                if index != newest {
                    read.skipped.push((
                        path.clone(),
                        format!("record {}: incomplete (its write was cut short)", n + 1),
                    ));
                }
                break;
            };
            if u64::try_from(line.len()).unwrap_or(u64::MAX) > MAX_RECORD_SIZE {
                read.skipped.push((
                    path.clone(),
                    format!(
                        "record {}: {} bytes exceed the record limit of {MAX_RECORD_SIZE}",
                        n + 1,
                        line.len()
                    ),
                ));
                continue;
            }
            match serde_json::from_slice::<Record>(line) {
                Ok(record) => read.records.push(record),
                Err(e) => read
                    .skipped
                    .push((path.clone(), format!("record {}: not a record: {e}", n + 1))),
            }
        }
    }
    // Segments overlap in time by a few records at most; the order readers see is the
    // decisions'.
    read.records.sort_by_key(|record| record.time().ok());
    Ok(read)
}

/// A segment's bytes (`None`: removed since the listing), or why it cannot be read.
fn read_segment(path: &Path) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > MAX_SEGMENT_SIZE {
        return Err(format!(
            "{size} bytes exceed the segment limit of {MAX_SEGMENT_SIZE}"
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(MAX_SEGMENT_SIZE)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Evidence, Subject};

    fn decision(at: SystemTime, peer: &str) -> Decision {
        let subject = Subject {
            time: at,
            peer: peer.to_owned(),
            variant: Variant::QemuVtpm,
            policy: "p".repeat(64),
            evidence: Evidence::Certificate(peer.as_bytes()),
        };
        Decision::rejected(subject, &std::io::Error::other("test")).with_check("test")
    }

    fn record(at: SystemTime, peer: &str, document_len: usize) -> Record {
        Record::new(
            decision(at, peer),
            &[1; 32],
            &[2; 32],
            &vec![b'd'; document_len],
        )
    }

    fn bounds(max_records: usize, max_bytes: u64, max_age: Duration) -> Bounds {
        Bounds {
            max_records,
            max_bytes,
            max_age,
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    fn peers(dir: &Path) -> Vec<String> {
        let Read { records, skipped } = read_dir(dir).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        records.into_iter().map(|r| r.decision.peer).collect()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_count_bound_drops_the_oldest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(3, 1 << 20, DAY)).unwrap();
        let now = SystemTime::now();
        for i in 0..5u64 {
            store
                .put(&record(
                    now + Duration::from_millis(i),
                    &format!("n{i}"),
                    10,
                ))
                .unwrap();
        }
        assert_eq!(store.len(), 3);
        assert_eq!(peers(&dir), ["n2", "n3", "n4"]);
        // What a restart finds is what was kept, under the bounds of the new run.
        let reopened = Store::open(&dir, bounds(2, 1 << 20, DAY)).unwrap();
        assert_eq!(reopened.len(), 2);
        assert_eq!(peers(&dir), ["n3", "n4"]);
    }

    #[test]
    fn records_of_the_same_millisecond_from_two_runs_are_both_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let now = SystemTime::now();
        for peer in ["first-run", "second-run"] {
            let mut store = Store::open(&dir, bounds(10, 1 << 20, DAY)).unwrap();
            store.put(&record(now, peer, 10)).unwrap();
        }
        assert_eq!(peers(&dir), ["first-run", "second-run"]);
    }

    #[test]
    fn the_byte_bound_drops_the_oldest_and_refuses_a_record_larger_than_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let one = u64::try_from(
            serde_json::to_vec(&record(SystemTime::now(), "n0", 3000))
                .unwrap()
                .len(),
        )
        .unwrap();
        let mut store = Store::open(&dir, bounds(100, one * 2 + one / 2, DAY)).unwrap();
        let now = SystemTime::now();
        for i in 0..4u64 {
            store
                .put(&record(
                    now + Duration::from_millis(i),
                    &format!("n{i}"),
                    3000,
                ))
                .unwrap();
            assert!(store.bytes() <= one * 2 + one / 2, "{}", store.bytes());
        }
        assert_eq!(peers(&dir), ["n2", "n3"]);
        let on_disk: u64 = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(on_disk, store.bytes());
        let error = store.put(&record(now, "huge", 20_000)).unwrap_err();
        assert!(matches!(error, StoreError::TooLarge { .. }), "{error}");
        assert_eq!(peers(&dir), ["n2", "n3"]);
    }

    #[test]
    fn the_age_bound_drops_old_records_at_put_and_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(100, 1 << 20, DAY)).unwrap();
        let now = SystemTime::now();
        store.put(&record(now - DAY * 3, "three-days", 10)).unwrap();
        assert!(store.is_empty(), "a record past the age bound is not kept");
        store.put(&record(now - DAY / 2, "half-a-day", 10)).unwrap();
        store.put(&record(now, "now", 10)).unwrap();
        assert_eq!(peers(&dir), ["half-a-day", "now"]);
        store.prune(now + DAY - Duration::from_secs(60));
        assert_eq!(peers(&dir), ["now"]);
        drop(store);
        let store = Store::open(&dir, bounds(100, 1 << 20, Duration::from_secs(1))).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        drop(store);
        Store::open(&dir, bounds(100, 1 << 20, Duration::from_secs(1))).unwrap();
        assert!(peers(&dir).is_empty());
    }

    #[test]
    fn directory_and_files_are_for_this_uid_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(10, 1 << 20, DAY)).unwrap();
        assert_eq!(mode(&dir), 0o700);
        store.put(&record(SystemTime::now(), "n", 10)).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            assert_eq!(mode(&entry.unwrap().path()), 0o600);
        }
        // A directory and a file made looser (by hand, by a volume) are tightened at open; an
        // interrupted write's temporary file and anything else not a record are removed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(dir.join(".0000000000001-000001.json.tmp"), b"half").unwrap();
        std::fs::write(dir.join("planted"), b"x").unwrap();
        drop(store);
        let store = Store::open(&dir, bounds(10, 1 << 20, DAY)).unwrap();
        assert_eq!(store.len(), 1);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A path that is not a directory is named.
        let not_dir = tmp.path().join("file");
        std::fs::write(&not_dir, b"").unwrap();
        let error = Store::open(&not_dir, bounds(10, 1 << 20, DAY)).unwrap_err();
        assert!(
            error.to_string().contains("cannot use evidence directory"),
            "{error}"
        );
    }

    #[test]
    fn a_directory_of_another_uid_is_refused() {
        // Only root can hand a directory to another uid; elsewhere a root-owned one serves.
        let own = own_uid().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = if own == 0 {
            let dir = tmp.path().join("evidence");
            std::fs::create_dir(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            dir
        } else {
            PathBuf::from("/")
        };
        let error = Store::open(&dir, bounds(10, 1 << 20, DAY)).unwrap_err();
        assert!(
            matches!(error, StoreError::NotOwned { own: o, .. } if o == own),
            "{error}"
        );
    }

    #[test]
    fn unreadable_records_are_named_and_the_rest_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(10, 1 << 20, DAY)).unwrap();
        let kept = record(SystemTime::now(), "n", 10);
        store.put(&kept).unwrap();
        std::fs::write(dir.join("0000000000001-000009.jsonl"), b"{not json\n").unwrap();
        let Read { records, skipped } = read_dir(&dir).unwrap();
        assert_eq!(records, [kept]);
        assert_eq!(skipped.len(), 1);
        assert!(
            skipped[0].1.starts_with("record 1: not a record"),
            "{skipped:?}"
        );
    }

    #[test]
    fn records_share_segments_within_the_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(1024, 1 << 30, DAY)).unwrap();
        let now = SystemTime::now();
        for i in 0..130u64 {
            let at = now + Duration::from_millis(i);
            store.put(&record(at, &format!("n{i:03}"), 10)).unwrap();
        }
        // 64 records to a segment (a sixteenth of 1,024, at most 64).
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3);
        assert_eq!(store.len(), 130);
        let expected: Vec<_> = (0..130).map(|i| format!("n{i:03}")).collect();
        assert_eq!(peers(&dir), expected);
        // A minute later the next record begins a new segment, however few the last one has.
        store
            .put(&record(now + Duration::from_secs(61), "later", 10))
            .unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 4);
        // The count bound removes the oldest segment whole, 64 records.
        let mut store = Store::open(&dir, bounds(100, 1 << 30, DAY)).unwrap();
        assert_eq!(store.len(), 131 - 64);
        store
            .put(&record(now + Duration::from_secs(62), "last", 10))
            .unwrap();
        assert_eq!(store.len(), 131 - 64 + 1);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            4,
            "a new run, a new segment"
        );
        let peers = peers(&dir);
        assert_eq!(peers.first().map(String::as_str), Some("n064"));
        assert_eq!(peers.last().map(String::as_str), Some("last"));
    }

    #[test]
    fn an_incomplete_last_line_is_named_unless_it_is_being_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let mut store = Store::open(&dir, bounds(1024, 1 << 30, DAY)).unwrap();
        let now = SystemTime::now();
        store.put(&record(now, "whole", 10)).unwrap();
        let segment = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        // Half a record at the end of the newest segment: a write in progress, left out.
        let half = br#"{"format":1,"nonce":"#;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&segment)
            .unwrap()
            .write_all(half)
            .unwrap();
        let read = read_dir(&dir).unwrap();
        assert_eq!(read.records.len(), 1);
        assert!(read.skipped.is_empty(), "{:?}", read.skipped);
        // Once a newer segment exists, that end was cut short for good: named.
        drop(store);
        let mut store = Store::open(&dir, bounds(1024, 1 << 30, DAY)).unwrap();
        store
            .put(&record(now + Duration::from_millis(1), "next", 10))
            .unwrap();
        let read = read_dir(&dir).unwrap();
        let peers: Vec<_> = read
            .records
            .iter()
            .map(|r| r.decision.peer.as_str())
            .collect();
        assert_eq!(peers, ["whole", "next"]);
        assert_eq!(read.skipped.len(), 1, "{:?}", read.skipped);
        assert_eq!(read.skipped[0].0, segment);
        assert_eq!(
            read.skipped[0].1,
            "record 2: incomplete (its write was cut short)"
        );
    }

    #[test]
    fn a_damaged_record_names_its_field() {
        let mut damaged = record(SystemTime::now(), "n", 10);
        damaged.nonce = "zz".to_owned();
        let validator = crate::QemuVtpmValidator::from_config(
            crate::QemuVtpmConfig::from_attestation_config(
                format!(
                    r#"{{"measurements": {{"4": "{}"}}, "trustAnyAk": true}}"#,
                    hex::encode([4u8; 32])
                )
                .as_bytes(),
            )
            .unwrap(),
        );
        let error = damaged.redecide(&validator).unwrap_err();
        assert_eq!(
            crate::audit::chain(&error),
            "the kept record is unusable: record field nonce is not valid hex"
        );
    }
}
