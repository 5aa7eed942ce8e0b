//! Keeps the evidence of the nodes attest-proxy decided on, off the join path.
//!
//! A connection's verification hands its decision and the certificate's evidence to a bounded
//! queue and goes on; one thread of its own takes the document out of the certificate and
//! writes the record into the [`attestation::evidence::Store`] (bounded by count, bytes and
//! age; directory 0700, files 0600). When the queue is full the record is dropped and counted:
//! a join never waits for a disk. Dry runs (`POST /dry-run`, `attest-tool dry-run`) and the
//! reload guard ([`crate::policy::Guard`]) read the directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};

use attestation::Variant;
use attestation::audit::Decision;
use attestation::evidence::{Bounds, Record, Store, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// Why a decision's evidence was not kept.
const QUEUE_FULL: DropLabels = DropLabels {
    reason: "queue_full",
};
const NO_DOCUMENT: DropLabels = DropLabels {
    reason: "no_document",
};
const WRITE_FAILED: DropLabels = DropLabels {
    reason: "write_failed",
};

/// What a decision was made on, as the writer needs it: the connection's nonce, and the
/// document of the variant with the user data it has to bind.
pub trait Judged: Send + Sync {
    fn nonce(&self) -> &[u8];
    fn document(&self, variant: Variant) -> Option<(Vec<u8>, [u8; 32])>;
}

impl Judged for atls::PeerEvidence {
    fn nonce(&self) -> &[u8] {
        atls::PeerEvidence::nonce(self)
    }

    fn document(&self, variant: Variant) -> Option<(Vec<u8>, [u8; 32])> {
        atls::PeerEvidence::document(self, variant)
    }
}

/// One decision waiting to be written.
struct Pending {
    decision: Decision,
    variant: Variant,
    evidence: Arc<dyn Judged>,
}

/// The queue into the writer thread and what it counts.
#[derive(Clone, Debug)]
struct Counts {
    kept: Counter,
    dropped: Family<DropLabels, Counter>,
    records: Gauge,
    bytes: Gauge,
}

/// The handle connections keep evidence through.
#[derive(Debug)]
pub struct Keeper {
    sender: SyncSender<Pending>,
    dir: PathBuf,
    counts: Counts,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("peer", &self.decision.peer)
            .finish_non_exhaustive()
    }
}

impl Keeper {
    /// Opens the store in `dir` (failing start when the directory cannot be used: a proxy
    /// told to keep evidence must not silently keep none) and starts the writer thread, which
    /// ends when the keeper is dropped.
    pub fn start(dir: &Path, bounds: Bounds, queue: usize) -> Result<Keeper, StoreError> {
        let store = Store::open(dir, bounds)?;
        let counts = Counts {
            kept: Counter::default(),
            dropped: Family::default(),
            records: Gauge::default(),
            bytes: Gauge::default(),
        };
        for labels in [&QUEUE_FULL, &NO_DOCUMENT, &WRITE_FAILED] {
            drop(counts.dropped.get_or_create(labels));
        }
        set_size(&counts, &store);
        tracing::info!(dir = %dir.display(), records = store.len(), ?bounds, "keeping decided evidence for dry runs");
        let (sender, receiver) = std::sync::mpsc::sync_channel(queue.max(1));
        let writer_counts = counts.clone();
        std::thread::Builder::new()
            .name("evidence-writer".to_owned())
            .spawn(move || write_all(store, &receiver, &writer_counts))
            .map_err(|source| StoreError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        Ok(Keeper {
            sender,
            dir: dir.to_owned(),
            counts,
        })
    }

    /// The directory the records are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues the evidence `decision` was made on; never blocks. A full queue drops it.
    pub fn keep(&self, decision: Decision, variant: Variant, evidence: Arc<dyn Judged>) {
        let pending = Pending {
            decision,
            variant,
            evidence,
        };
        match self.sender.try_send(pending) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.counts.dropped.get_or_create(&QUEUE_FULL).inc();
            }
            // The writer is gone (it cannot panic on a record; only at shutdown).
            Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.get_or_create(&WRITE_FAILED).inc();
            }
        }
    }

    /// Registers `evidence_kept_total`, `evidence_dropped_total{reason}`,
    /// `evidence_records` and `evidence_bytes`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "evidence_kept",
            "Decisions whose evidence was written to the evidence directory",
            self.counts.kept.clone(),
        );
        registry.register(
            "evidence_dropped",
            "Decisions whose evidence was not kept: queue_full (the writer fell behind), no_document (the certificate carried none to keep), write_failed",
            self.counts.dropped.clone(),
        );
        registry.register(
            "evidence_records",
            "Records in the evidence directory",
            self.counts.records.clone(),
        );
        registry.register(
            "evidence_bytes",
            "Bytes of the records in the evidence directory",
            self.counts.bytes.clone(),
        );
    }
}

fn set_size(counts: &Counts, store: &Store) {
    counts
        .records
        .set(i64::try_from(store.len()).unwrap_or(i64::MAX));
    counts
        .bytes
        .set(i64::try_from(store.bytes()).unwrap_or(i64::MAX));
}

/// How often the writer applies the age bound while no decision comes.
const PRUNE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// The writer thread: takes the document out of each certificate and writes its record.
fn write_all(mut store: Store, receiver: &Receiver<Pending>, counts: &Counts) {
    loop {
        let pending = match receiver.recv_timeout(PRUNE_INTERVAL) {
            Ok(pending) => pending,
            Err(RecvTimeoutError::Timeout) => {
                store.prune(std::time::SystemTime::now());
                set_size(counts, &store);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some((document, user_data)) = pending.evidence.document(pending.variant) else {
            // A certificate that does not parse or carries no document: nothing a policy could
            // decide differently.
            counts.dropped.get_or_create(&NO_DOCUMENT).inc();
            continue;
        };
        let record = Record::new(
            pending.decision,
            pending.evidence.nonce(),
            &user_data,
            &document,
        );
        match store.put(&record) {
            Ok(()) => {
                counts.kept.inc();
            }
            Err(error) => {
                counts.dropped.get_or_create(&WRITE_FAILED).inc();
                tracing::warn!(error = %crate::status::chain(&error), "cannot keep a decision's evidence");
            }
        }
        set_size(counts, &store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime};

    use attestation::audit::{Evidence, Subject};

    /// Evidence whose document the writer gets only once the test lets it: the writer can be
    /// held in the middle of a record.
    struct Gated {
        document: Option<Vec<u8>>,
        gate: Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl Judged for Gated {
        fn nonce(&self) -> &[u8] {
            &[1; 32]
        }

        fn document(&self, _variant: Variant) -> Option<(Vec<u8>, [u8; 32])> {
            let _ = self.gate.lock().unwrap().recv();
            self.document.clone().map(|d| (d, [2; 32]))
        }
    }

    fn gated(document: Option<&[u8]>) -> (Arc<Gated>, std::sync::mpsc::Sender<()>) {
        let (open, gate) = std::sync::mpsc::channel();
        let evidence = Gated {
            document: document.map(<[u8]>::to_vec),
            gate: Mutex::new(gate),
        };
        (Arc::new(evidence), open)
    }

    fn decision(peer: &str) -> Decision {
        let subject = Subject {
            time: SystemTime::now(),
            peer: peer.to_owned(),
            variant: Variant::QemuVtpm,
            policy: "p".repeat(64),
            evidence: Evidence::Certificate(peer.as_bytes()),
        };
        Decision::rejected(subject, &std::io::Error::other("test")).with_check("test")
    }

    fn scrape(keeper: &Keeper) -> String {
        let mut registry = Registry::default();
        keeper.register_metrics(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    fn wait_for(keeper: &Keeper, line: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !scrape(keeper).lines().any(|l| l == line) {
            assert!(
                std::time::Instant::now() < deadline,
                "{line}\n{}",
                scrape(keeper)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            max_records: 10,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(3600),
        }
    }

    #[test]
    fn a_full_queue_drops_the_record_without_waiting_and_counts_it() {
        let tmp = tempfile::tempdir().unwrap();
        let keeper = Keeper::start(&tmp.path().join("evidence"), bounds(), 1).unwrap();
        // The writer takes the first and waits in it; the second fills the queue of one.
        let (first, open_first) = gated(Some(b"first"));
        let (second, open_second) = gated(Some(b"second"));
        keeper.keep(decision("first"), Variant::QemuVtpm, first);
        // Until the writer has taken the first, the second would find the queue full.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&second) == 1 {
            keeper.keep(decision("second"), Variant::QemuVtpm, second.clone());
            if Arc::strong_count(&second) > 1 {
                break;
            }
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        let dropped_before = scrape(&keeper);
        let (third, _open_third) = gated(Some(b"third"));
        let started = std::time::Instant::now();
        keeper.keep(decision("third"), Variant::QemuVtpm, third);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "keep must not wait"
        );
        let text = scrape(&keeper);
        let count = |text: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix("evidence_dropped_total{reason=\"queue_full\"} ")
                        .map(|n| n.parse::<u64>().unwrap())
                })
                .unwrap()
        };
        assert_eq!(count(&text), count(&dropped_before) + 1, "{text}");
        open_first.send(()).unwrap();
        open_second.send(()).unwrap();
        wait_for(&keeper, "evidence_kept_total 2");
        wait_for(&keeper, "evidence_records 2");
        let kept = attestation::evidence::read_dir(&tmp.path().join("evidence")).unwrap();
        let peers: Vec<&str> = kept
            .records
            .iter()
            .map(|r| r.decision.peer.as_str())
            .collect();
        assert_eq!(peers, ["first", "second"]);
    }

    #[test]
    fn evidence_without_a_document_and_a_failed_write_are_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("evidence");
        let keeper = Keeper::start(&dir, bounds(), 4).unwrap();
        let (none, open) = gated(None);
        open.send(()).unwrap();
        keeper.keep(decision("no-document"), Variant::QemuVtpm, none);
        wait_for(&keeper, "evidence_dropped_total{reason=\"no_document\"} 1");
        // The directory gone (a volume unmounted): the write fails, the proxy goes on.
        std::fs::remove_dir_all(&dir).unwrap();
        let (gone, open) = gated(Some(b"doc"));
        open.send(()).unwrap();
        keeper.keep(decision("gone"), Variant::QemuVtpm, gone);
        wait_for(&keeper, "evidence_dropped_total{reason=\"write_failed\"} 1");
        assert!(scrape(&keeper).contains("evidence_kept_total 0"));
    }
}
