//! `JoiningNode` objects: the record of each join that Constellation's node operator reads to
//! annotate the new Node with its components and to spot joins that never finished.
//!
//! - Workers: server-side apply under the node name (already a lower-case DNS-1123 name, see
//!   [`crate::csr`]), deadline 48 h. Apply, so a node that retries its join simply refreshes
//!   its record.
//! - Control-plane nodes: create under the one name `control-plane`, deadline 10 min. The
//!   create is the lock that lets only one control-plane node join at a time (etcd grows one
//!   member at a time). A second joiner gets [`JoiningError::ControlPlaneBusy`] and retries. A
//!   record whose deadline has passed belongs to a join that died, and a record held by the
//!   very node now joining (same node name) belongs to its own earlier attempt; either is
//!   deleted with `uid` and `resourceVersion` preconditions (so a record someone renewed
//!   meanwhile is never removed) and the create is tried once more.
//!
//! Rollback ([`JoiningNodes::forget`]) deletes a record only if it still is the one this join
//! wrote (same spec name and deadline), again with preconditions, so a failed join never removes
//! another join's record.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{DynamicObject, ObjectMeta};
use serde_json::{Value, json};

use crate::cluster_version::edgeless_resource;
use crate::kube_api::{KubeError, bounded};

/// The name every control-plane join is recorded under.
pub const CONTROL_PLANE_NAME: &str = "control-plane";
/// How long a worker has to appear as a Node (Constellation's value).
pub const WORKER_DEADLINE: time::Duration = time::Duration::hours(48);
/// How long a control-plane node holds the join lock (Constellation's value).
pub const CONTROL_PLANE_DEADLINE: time::Duration = time::Duration::minutes(10);
/// The field manager of our server-side applies.
pub const FIELD_MANAGER: &str = "join-service";

/// Why recording a join failed. Each variant names the step and the object.
#[derive(Debug, thiserror::Error)]
pub enum JoiningError {
    /// Applying a worker's record failed.
    #[error("applying JoiningNode {name}: {source}")]
    Apply {
        /// The object's name.
        name: String,
        /// The Kubernetes failure.
        #[source]
        source: KubeError,
    },
    /// Creating the control-plane record failed.
    #[error("creating JoiningNode {CONTROL_PLANE_NAME}: {0}")]
    Create(#[source] KubeError),
    /// Another control-plane node is joining.
    #[error(
        "another control-plane node ({holder}) is joining until {deadline}; only one control-plane node joins at a time, retry later"
    )]
    ControlPlaneBusy {
        /// The node holding the lock.
        holder: String,
        /// Its deadline, RFC 3339.
        deadline: String,
    },
    /// Reading the existing control-plane record failed.
    #[error("reading existing JoiningNode {CONTROL_PLANE_NAME}: {0}")]
    ReadExisting(#[source] KubeError),
    /// Deleting an expired control-plane record failed.
    #[error("deleting expired JoiningNode {CONTROL_PLANE_NAME}: {0}")]
    DeleteExpired(#[source] KubeError),
}

impl JoiningError {
    /// Whether the object may exist although the call reported failure.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Apply { source, .. } | Self::Create(source) => source.outcome_unknown(),
            Self::ControlPlaneBusy { .. } | Self::ReadExisting(_) | Self::DeleteExpired(_) => false,
        }
    }
}

/// The record of one join: what is written, and what rollback removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The object's name.
    pub name: String,
    /// `spec.name`: the node.
    pub node_name: String,
    /// `spec.iscontrolplane`.
    pub control_plane: bool,
    /// `spec.deadline`, RFC 3339.
    pub deadline: String,
}

impl Record {
    /// The record of `node_name` joining at `now`.
    pub fn new(node_name: &str, control_plane: bool, now: time::OffsetDateTime) -> Self {
        let (name, deadline) = if control_plane {
            (CONTROL_PLANE_NAME.to_owned(), now + CONTROL_PLANE_DEADLINE)
        } else {
            (node_name.to_ascii_lowercase(), now + WORKER_DEADLINE)
        };
        Self {
            name,
            node_name: node_name.to_owned(),
            control_plane,
            deadline: crate::bootstrap::rfc3339_seconds(deadline),
        }
    }

    fn object(&self, components_reference: &str) -> Value {
        json!({
            "apiVersion": format!("{}/{}", crate::cluster_version::GROUP, crate::cluster_version::VERSION),
            "kind": "JoiningNode",
            "metadata": {"name": self.name},
            "spec": {
                "name": self.node_name,
                "componentsreference": components_reference,
                "iscontrolplane": self.control_plane,
                "deadline": self.deadline,
            },
        })
    }
}

/// The `JoiningNode` API as token-issuer uses it.
#[derive(Clone, Debug)]
pub struct JoiningNodes {
    api: Api<DynamicObject>,
    timeout: Duration,
}

impl JoiningNodes {
    /// Through `client`, each call bounded by `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            api: Api::all_with(client, &edgeless_resource("JoiningNode", "joiningnodes")),
            timeout,
        }
    }

    /// Writes `record`: apply for workers, the create-lock for control-plane nodes.
    pub async fn record(
        &self,
        record: &Record,
        components_reference: &str,
        now: time::OffsetDateTime,
    ) -> Result<(), JoiningError> {
        if record.control_plane {
            self.record_control_plane(record, components_reference, now)
                .await
        } else {
            self.record_worker(record, components_reference).await
        }
    }

    /// Server-side apply, forced: the join service owns these fields.
    async fn record_worker(
        &self,
        record: &Record,
        components_reference: &str,
    ) -> Result<(), JoiningError> {
        let object = record.object(components_reference);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        bounded(
            "apply_joiningnode",
            self.timeout,
            self.api
                .patch(&record.name, &params, &Patch::Apply(&object)),
        )
        .await
        .map(drop)
        .map_err(|source| JoiningError::Apply {
            name: record.name.clone(),
            source,
        })
    }

    /// Takes the control-plane join lock for `node_name`, clearing an expired one.
    async fn record_control_plane(
        &self,
        record: &Record,
        components_reference: &str,
        now: time::OffsetDateTime,
    ) -> Result<(), JoiningError> {
        let object: DynamicObject = serde_json::from_value(record.object(components_reference))
            .map_err(|e| {
                // Our own literal always deserializes; report rather than panic all the same.
                JoiningError::Create(KubeError::Transport(Box::new(kube::Error::SerdeError(e))))
            })?;
        // At most two attempts: the second only after removing an expired record.
        for attempt in 0..2 {
            match bounded(
                "create_joiningnode",
                self.timeout,
                self.api.create(&PostParams::default(), &object),
            )
            .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(JoiningError::Create(e)),
            }
            let existing = match bounded(
                "get_joiningnode",
                self.timeout,
                self.api.get(CONTROL_PLANE_NAME),
            )
            .await
            {
                Ok(existing) => existing,
                // Gone in between: the other join finished or was rolled back.
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(JoiningError::ReadExisting(e)),
            };
            let holder = spec_str(&existing, "name");
            let their_deadline = spec_str(&existing, "deadline");
            // Our own create, stored although its answer was a 503/504 that kube-rs retried.
            if holder == record.node_name && their_deadline == record.deadline {
                return Ok(());
            }
            let expired = match time::OffsetDateTime::parse(
                &their_deadline,
                &time::format_description::well_known::Rfc3339,
            ) {
                Ok(d) => d <= now,
                // A record without a usable deadline could never expire; treat it as expired
                // rather than block control-plane joins forever.
                Err(_) => true,
            };
            // The same node retrying its join (its first attempt failed after the lock was
            // taken, or its answer was lost): the lock is its own, so it takes it afresh with a
            // new deadline rather than wait out its own 10 minutes. Another node never does.
            let own = holder == record.node_name;
            if !(expired || own) || attempt == 1 {
                return Err(JoiningError::ControlPlaneBusy {
                    holder,
                    deadline: their_deadline,
                });
            }
            if own {
                tracing::info!(holder = %holder, deadline = %their_deadline, "control-plane node retries its join; renewing its own JoiningNode");
            } else {
                tracing::warn!(holder = %holder, deadline = %their_deadline, "removing expired control-plane JoiningNode");
            }
            match self.delete_exact(&existing.metadata).await {
                Ok(()) => {}
                // Renewed or replaced meanwhile: someone else holds the lock now.
                Err(e) if e.code() == Some(409) => {
                    return Err(JoiningError::ControlPlaneBusy {
                        holder,
                        deadline: their_deadline,
                    });
                }
                Err(e) => return Err(JoiningError::DeleteExpired(e)),
            }
        }
        // Twice created-then-gone under us: joins are racing; let this one retry.
        Err(JoiningError::ControlPlaneBusy {
            holder: "another node".to_owned(),
            deadline: "its deadline".to_owned(),
        })
    }

    /// Deletes the object described by `meta`, only if it is still that version of it. Absent
    /// counts as deleted.
    async fn delete_exact(&self, meta: &ObjectMeta) -> Result<(), KubeError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: meta.uid.clone(),
                resource_version: meta.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        let name = meta.name.clone().unwrap_or_default();
        match bounded(
            "delete_joiningnode",
            self.timeout,
            self.api.delete(&name, &params),
        )
        .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(drop),
        }
    }

    /// Removes `record` if the stored object still is the one this join wrote. Returns whether
    /// something was deleted.
    pub async fn forget(&self, record: &Record) -> Result<bool, KubeError> {
        let current =
            match bounded("get_joiningnode", self.timeout, self.api.get(&record.name)).await {
                Ok(o) => o,
                Err(e) if e.is_not_found() => return Ok(false),
                Err(e) => return Err(e),
            };
        if spec_str(&current, "name") != record.node_name
            || spec_str(&current, "deadline") != record.deadline
        {
            return Ok(false);
        }
        match self.delete_exact(&current.metadata).await {
            Ok(()) => Ok(true),
            // Changed since we read it: it is no longer ours to remove.
            Err(e) if e.code() == Some(409) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn spec_str(object: &DynamicObject, field: &str) -> String {
    object
        .data
        .get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
