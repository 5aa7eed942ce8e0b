//! The record of every release of the control-plane CA keys: one audit log line (target
//! `audit`) and one Kubernetes Event, so a release is visible to whoever reads the pod's logs
//! and to whoever runs `kubectl get events -n kube-system`, even if the pod is gone.
//!
//! Each names the node, the uid of the process that asked on token-issuer's socket (the kernel's
//! `SO_PEERCRED`, not anything the caller says), the SHA-256 of the attestation evidence
//! attest-proxy verified for the node (forwarded as `x-attested-evidence-sha256` and passed on
//! by join-core; it matches the `evidence` digest of attest-proxy's own audit line for that
//! connection), and why the cluster admitted a control-plane node ([`Admitted`]).
//!
//! The Event is written before the keys are handed back; if it cannot be written, the join
//! fails and is rolled back, so no release goes unrecorded in the cluster. The converse does not
//! hold: if join-core hangs up after the Event is written, the join is rolled back and the
//! Event stays, recording a release whose answer nobody received (the audit line is written
//! only for an answer that is sent).

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::control_plane::Admitted;
use crate::kube_api::{KubeError, bounded};

/// Namespace of the Events.
pub const NAMESPACE: &str = "kube-system";
/// The Event reason.
pub const REASON: &str = "ControlPlaneFilesReleased";
/// The Event action.
pub const ACTION: &str = "ReleaseControlPlaneFiles";
/// The reporting component (a qualified name, as the API server requires).
pub const REPORTING_COMPONENT: &str = "joinservice.edgeless.systems/token-issuer";

/// One release of the control-plane files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The node (from the validated CSR).
    pub node_name: String,
    /// The uid of the process on the other end of token-issuer's socket.
    pub peer_uid: Option<u32>,
    /// SHA-256 (hex) of the attestation evidence attest-proxy verified.
    pub evidence_sha256: String,
    /// The node's address as attest-proxy saw it.
    pub peer_address: String,
    /// Why the cluster admitted it.
    pub admitted: Admitted,
}

impl Release {
    fn uid_text(&self) -> String {
        self.peer_uid
            .map_or_else(|| "unknown".to_owned(), |uid| uid.to_string())
    }

    /// The Event's message.
    pub fn message(&self) -> String {
        format!(
            "control-plane CA keys released for node {node} (requested by uid {uid}, attestation evidence sha256 {evidence}, peer {peer}); {present} of {expected} expected control-plane Nodes present{surge}",
            node = self.node_name,
            uid = self.uid_text(),
            evidence = self.evidence_sha256,
            peer = self.peer_address,
            present = self.admitted.present,
            expected = self.admitted.expected,
            surge = if self.admitted.surge {
                ", admitted as the upgrade's surge node"
            } else {
                ""
            },
        )
    }

    /// Writes the audit log line.
    pub fn log(&self) {
        tracing::info!(
            target: "audit",
            event = REASON,
            node = %self.node_name,
            peer_uid = %self.uid_text(),
            evidence_sha256 = %self.evidence_sha256,
            peer = %self.peer_address,
            control_plane_present = self.admitted.present,
            control_plane_expected = self.admitted.expected,
            surge = self.admitted.surge,
            "control-plane files released"
        );
    }
}

/// Whether `digest` is a SHA-256 in lowercase hex.
pub fn is_sha256_hex(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The Events API as token-issuer uses it: create only.
#[derive(Clone, Debug)]
pub struct AuditEvents {
    api: Api<Event>,
    instance: String,
    timeout: Duration,
}

impl AuditEvents {
    /// Events in [`NAMESPACE`] through `client`, reported by `instance` (the pod name), each call
    /// bounded by `timeout`.
    pub fn new(client: kube::Client, instance: impl Into<String>, timeout: Duration) -> Self {
        Self {
            api: Api::namespaced(client, NAMESPACE),
            instance: instance.into(),
            timeout,
        }
    }

    /// The Event recording `release` at `now`.
    pub fn event(&self, release: &Release, now: time::OffsetDateTime) -> Result<Event, KubeError> {
        let suffix: u64 = rand::random();
        let object = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": format!("control-plane-files-released.{suffix:016x}"),
                "namespace": NAMESPACE,
            },
            // A Node is cluster-scoped: no namespace. The API server accepts that for an event
            // in kube-system only for new-style events, i.e. with eventTime and the reporting
            // fields set.
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": release.node_name},
            "reason": REASON,
            "action": ACTION,
            "message": release.message(),
            "type": "Normal",
            "eventTime": micro_time(now),
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self.instance,
        });
        serde_json::from_value(object)
            .map_err(|e| KubeError::Transport(Box::new(kube::Error::SerdeError(e))))
    }

    /// Creates the Event for `release`.
    pub async fn record(&self, release: &Release) -> Result<(), KubeError> {
        let event = self.event(release, time::OffsetDateTime::now_utc())?;
        bounded(
            "create_event",
            self.timeout,
            self.api.create(&PostParams::default(), &event),
        )
        .await
        .map(drop)
    }
}

/// `metav1.MicroTime` text: RFC 3339 in UTC with six fractional digits.
fn micro_time(t: time::OffsetDateTime) -> String {
    let f = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    let t = t.to_offset(time::UtcOffset::UTC);
    t.format(&f)
        .or_else(|_| t.format(&time::format_description::well_known::Rfc3339))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_has_six_digits() {
        let t = time::macros::datetime!(2026-01-02 03:04:05.678901234 UTC);
        assert_eq!(micro_time(t), "2026-01-02T03:04:05.678901Z");
    }

    #[test]
    fn digests_are_lowercase_sha256_hex() {
        assert!(is_sha256_hex(&"ab".repeat(32)));
        assert!(!is_sha256_hex(&"AB".repeat(32)));
        assert!(!is_sha256_hex("abc"));
        assert!(!is_sha256_hex(""));
    }
}
