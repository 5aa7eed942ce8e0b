//! token-issuer's Prometheus metrics: credentials by result and step, and every Kubernetes call.
//!
//! The families live in one process-wide value ([`METRICS`]) because every Kubernetes call goes
//! through [`crate::kube_api::bounded`], deep in the stores; [`register`] exposes them on the
//! admin endpoint. Several services in one test process share the counts, which is harmless.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::kube_api::KubeError;
use crate::service::IssueError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IssueLabels {
    result: &'static str,
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    call: &'static str,
    outcome: String,
}

/// The families; see the module docs.
#[derive(Debug)]
pub struct Metrics {
    credentials: Family<IssueLabels, Counter>,
    issue_duration: Histogram,
    api_calls: Family<CallLabels, Histogram>,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    credentials: Family::default(),
    issue_duration: Histogram::new(plumbing::admin::LATENCY_BUCKETS),
    api_calls: Family::new_with_constructor(|| Histogram::new(plumbing::admin::LATENCY_BUCKETS)),
});

/// Registers the families in `registry` (the admin endpoint's).
pub fn register(registry: &mut Registry) {
    let m = &*METRICS;
    registry.register(
        "credentials",
        "Node credential requests answered, by result (issued or refused) and the step that refused",
        m.credentials.clone(),
    );
    registry.register(
        "issue_duration_seconds",
        "Time to answer a node credential request",
        m.issue_duration.clone(),
    );
    registry.register(
        "kubernetes_api_call_duration_seconds",
        "Kubernetes API calls, by call and outcome (ok, the HTTP status, unreachable or timeout)",
        m.api_calls.clone(),
    );
}

/// Records one answered credential request.
pub fn issued(error: Option<&IssueError>, took: Duration) {
    let (result, step) = match error {
        None => ("issued", "ok"),
        Some(error) => ("refused", error.step()),
    };
    METRICS
        .credentials
        .get_or_create(&IssueLabels { result, step })
        .inc();
    METRICS.issue_duration.observe(took.as_secs_f64());
}

/// Records one Kubernetes call.
pub fn api_call<T>(call: &'static str, result: &Result<T, KubeError>, took: Duration) {
    let outcome = match result {
        Ok(_) => "ok".to_owned(),
        Err(KubeError::Api { code, .. }) => code.to_string(),
        Err(KubeError::Transport(_)) => "unreachable".to_owned(),
        Err(KubeError::Timeout(_)) => "timeout".to_owned(),
    };
    METRICS
        .api_calls
        .get_or_create(&CallLabels { call, outcome })
        .observe(took.as_secs_f64());
}
