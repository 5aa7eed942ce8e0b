//! join-core's Prometheus metrics: tickets by result and reason, and backend call latencies.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::{RequestError, TicketError};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TicketLabels {
    method: &'static str,
    result: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
    outcome: &'static str,
}

/// The metrics; cheap to clone (every family is shared).
#[derive(Clone, Debug)]
pub struct Metrics {
    tickets: Family<TicketLabels, Counter>,
    ticket_duration: Family<MethodLabels, Histogram>,
    backend_duration: Family<BackendLabels, Histogram>,
}

fn histogram() -> Histogram {
    Histogram::new(plumbing::admin::LATENCY_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            tickets: Family::default(),
            ticket_duration: Family::new_with_constructor(histogram),
            backend_duration: Family::new_with_constructor(histogram),
        }
    }
}

/// The backends join-core calls, as the `backend` label names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The key service (one observation per attempt, retries included).
    KeyService,
    /// token-issuer.
    TokenIssuer,
}

impl Metrics {
    /// Metrics registered in `registry` (the admin endpoint's).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "tickets",
            "Ticket requests answered, by method, result (issued or refused) and reason",
            metrics.tickets.clone(),
        );
        registry.register(
            "ticket_duration_seconds",
            "Time to answer a ticket request, by method",
            metrics.ticket_duration.clone(),
        );
        registry.register(
            "backend_call_duration_seconds",
            "Calls to the key service and token-issuer, by backend and outcome (ok, or the failure)",
            metrics.backend_duration.clone(),
        );
        metrics
    }

    /// Records one answered ticket request; `error` is `None` for an issued ticket.
    pub fn ticket(&self, method: &'static str, error: Option<&TicketError>, took: Duration) {
        let (result, reason) = match error {
            None => ("issued", "ok"),
            Some(error) => ("refused", reason(error)),
        };
        self.tickets
            .get_or_create(&TicketLabels {
                method,
                result,
                reason,
            })
            .inc();
        self.ticket_duration
            .get_or_create(&MethodLabels { method })
            .observe(took.as_secs_f64());
    }

    /// Records one call (one attempt, for retried calls) to a backend.
    pub fn backend_call(&self, backend: Backend, outcome: &'static str, took: Duration) {
        let backend = match backend {
            Backend::KeyService => "key_service",
            Backend::TokenIssuer => "token_issuer",
        };
        self.backend_duration
            .get_or_create(&BackendLabels { backend, outcome })
            .observe(took.as_secs_f64());
    }
}

/// A short, stable name of the step that refused a ticket: the `reason` label.
fn reason(error: &TicketError) -> &'static str {
    match error {
        TicketError::Request(RequestError::NotForwarded { .. })
        | TicketError::Request(RequestError::MalformedIdentity { .. }) => "unauthenticated",
        TicketError::Request(RequestError::DiskUuid { .. }) => "invalid_disk_uuid",
        TicketError::Request(RequestError::CertificateRequest { .. }) => "invalid_csr",
        TicketError::Request(RequestError::HostPublicKey { .. }) => "invalid_host_key",
        TicketError::Request(RequestError::Principals { .. }) => "invalid_principals",
        TicketError::Kms { .. } => "key_service",
        TicketError::KubeadmConfig(_) => "kubeadm_config",
        TicketError::Ssh(_) => "ssh_certificate",
        TicketError::TokenIssuer(_) => "token_issuer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_counted_by_result_and_reason() {
        let mut registry = Registry::with_prefix("join_core");
        let metrics = Metrics::register(&mut registry);
        metrics.ticket("IssueJoinTicket", None, Duration::from_millis(3));
        let refused = TicketError::Request(RequestError::DiskUuid {
            reason: "empty".into(),
        });
        metrics.ticket("IssueJoinTicket", Some(&refused), Duration::from_millis(1));
        metrics.backend_call(Backend::KeyService, "ok", Duration::from_millis(2));

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"join_core_tickets_total{method="IssueJoinTicket",result="issued",reason="ok"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"join_core_tickets_total{method="IssueJoinTicket",result="refused",reason="invalid_disk_uuid"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"join_core_backend_call_duration_seconds_count{backend="key_service",outcome="ok"} 1"#),
            "{text}"
        );
    }
}
