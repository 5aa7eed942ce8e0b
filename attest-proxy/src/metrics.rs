//! attest-proxy's Prometheus metrics: attestation decisions, handshake and verification times,
//! and connections shed before any TLS work.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use attestation::audit;

/// Handshakes take milliseconds; the deadline is seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    result: &'static str,
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The metrics; cheap to clone (every family is shared).
#[derive(Clone, Debug)]
pub struct Metrics {
    decisions: Family<DecisionLabels, Counter>,
    handshakes: Family<OutcomeLabels, Histogram>,
    verification: Histogram,
    shed: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            decisions: Family::default(),
            handshakes: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            verification: Histogram::new(BUCKETS),
            shed: Counter::default(),
        }
    }
}

/// How a TLS handshake ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// The client presented a certificate; verification follows.
    Completed,
    /// The handshake failed (bad TLS, no certificate, oversized certificate, ...).
    Failed,
    /// The client did not finish within the handshake deadline.
    TimedOut,
}

impl Metrics {
    /// Metrics registered in `registry` (the admin endpoint's).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "attestations",
            "Attestation decisions, by result (accepted or rejected) and the check that failed",
            metrics.decisions.clone(),
        );
        registry.register(
            "handshake_duration_seconds",
            "aTLS handshakes (without verification), by outcome",
            metrics.handshakes.clone(),
        );
        registry.register(
            "verification_duration_seconds",
            "Attestation verification on the verify pool, queueing included",
            metrics.verification.clone(),
        );
        registry.register(
            "connections_shed",
            "Connections closed at accept because their source had too many attestations in progress",
            metrics.shed.clone(),
        );
        metrics
    }

    /// Counts one decision (the same one the audit line records).
    pub fn decision(&self, decision: &audit::Decision) {
        let result = match decision.result {
            audit::Outcome::Accepted => "accepted",
            audit::Outcome::Rejected => "rejected",
        };
        let check = decision.check.clone().unwrap_or_else(|| "none".to_owned());
        self.decisions
            .get_or_create(&DecisionLabels { result, check })
            .inc();
    }

    /// Times one handshake.
    pub fn handshake(&self, outcome: Handshake, took: Duration) {
        let outcome = match outcome {
            Handshake::Completed => "completed",
            Handshake::Failed => "failed",
            Handshake::TimedOut => "timeout",
        };
        self.handshakes
            .get_or_create(&OutcomeLabels { outcome })
            .observe(took.as_secs_f64());
    }

    /// Times one verification.
    pub fn verification(&self, took: Duration) {
        self.verification.observe(took.as_secs_f64());
    }

    /// Counts one connection shed at accept.
    pub fn shed(&self) {
        self.shed.inc();
    }
}
