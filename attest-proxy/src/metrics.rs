//! attest-proxy's Prometheus metrics: attestation decisions, handshake and verification times,
//! connections shed before any TLS work (by the bound that refused them), and how full the
//! admission bounds are.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use attestation::audit;

use crate::admission::{Admission, Shed};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    result: &'static str,
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabels {
    reason: &'static str,
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
    shed: Family<ShedLabels, Counter>,
    waiting: Gauge,
    handshakes_in_progress: Gauge,
    rate_limited_sources: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            decisions: Family::default(),
            handshakes: Family::new_with_constructor(|| {
                Histogram::new(plumbing::admin::LATENCY_BUCKETS)
            }),
            verification: Histogram::new(plumbing::admin::LATENCY_BUCKETS),
            shed: Family::default(),
            waiting: Gauge::default(),
            handshakes_in_progress: Gauge::default(),
            rate_limited_sources: Gauge::default(),
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
            "Connections closed before any TLS work, by reason: at accept peer_attestations (their \
             source had too many in progress), waiting (the global bound on connections that have \
             not sent their first record), peer_rate (their source's rate limit); when their first \
             record arrived handshakes (the global bound on handshakes in progress)",
            metrics.shed.clone(),
        );
        registry.register(
            "connections_waiting",
            "Connections accepted whose first TLS record has not fully arrived",
            metrics.waiting.clone(),
        );
        registry.register(
            "handshakes_in_progress",
            "Connections between their first TLS record and the end of their attestation",
            metrics.handshakes_in_progress.clone(),
        );
        registry.register(
            "rate_limited_sources",
            "Source addresses the per-source rate limit holds a bucket for",
            metrics.rate_limited_sources.clone(),
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
    pub(crate) fn shed(&self, reason: Shed) {
        self.shed
            .get_or_create(&ShedLabels {
                reason: reason.label(),
            })
            .inc();
    }

    /// Records how full the admission bounds are now.
    pub(crate) fn admission(&self, admission: &Admission) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.waiting.set(gauge(admission.waiting()));
        self.handshakes_in_progress
            .set(gauge(admission.handshakes_in_progress()));
        self.rate_limited_sources
            .set(gauge(admission.rate_limited_sources()));
    }
}
