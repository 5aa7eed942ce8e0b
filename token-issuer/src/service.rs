//! The `TokenIssuer` gRPC service and the one place its errors become `tonic::Status`.
//!
//! Order of work, chosen so a refused or failed request leaves nothing behind:
//! 1. validate the CSR (untrusted input);
//! 2. sign the kubelet certificate (local);
//! 3. control-plane joiners: ask the cluster whether it expects a control-plane node
//!    ([`crate::control_plane`]: reads only; refused with `PermissionDenied` when it does not),
//!    then read the control-plane PKI files (local);
//! 4. read the `NodeVersion` and its components ConfigMap (reads, kept for up to a second and
//!    dropped when a join fails at the API server: see [`crate::cluster_version`]);
//! 5. record the join as a `JoiningNode` (first write; for a control-plane node it is also the
//!    lock, so a second concurrent control-plane joiner is refused before any token exists);
//! 6. create the bootstrap token Secret;
//! 7. control-plane joiners: record the release of the control-plane files as a Kubernetes
//!    Event (last write; see [`crate::audit`]), then log the audit line once all succeeded.
//!
//! Every check and read comes before the first write. If step 6 fails, the `JoiningNode` from
//! step 5 is removed; if step 7 fails, the token and the `JoiningNode` are. If a write's outcome is unknown (5xx, timeout, broken connection: it may
//! have happened), what it may have created is removed too. Steps 5–6 and their rollback run in
//! their own task, so a caller that hangs up cannot cut between a write and its rollback; if the
//! caller is gone once both exist, both are removed, because nobody will ever receive them.
//!
//! When a rollback itself fails, the leftovers expire on their own: the token Secret at its
//! `expiration` (15 minutes; kube-controller-manager's token cleaner deletes it), a worker's
//! `JoiningNode` at its 48 h deadline and the control-plane one after 10 minutes (the node
//! operator removes expired records, and the next control-plane join here replaces an expired
//! lock). Each is logged at error level with its name.
//!
//! ## Status codes (all chosen here, in [`kube_code`] and `From<IssueError> for Status`)
//!
//! | failure | code | why |
//! |---|---|---|
//! | CSR refused, key not certifiable | `InvalidArgument` | the node's request; retrying it won't help |
//! | control-plane files asked for without the attestation evidence digest | `InvalidArgument` | every release is recorded with it; join-core must pass on what attest-proxy forwarded |
//! | control-plane files asked for while the cluster has all the control-plane nodes it expects | `PermissionDenied` | the caller is not entitled to the CA keys now; a legitimate node is misconfigured |
//! | ConfigMap `join-control-plane` missing or malformed | `FailedPrecondition` | the operator has not said how many control-plane nodes to expect |
//! | API server 401/403 | `Internal` | our credential or RBAC is wrong: a deployment fault, not the node's (`PermissionDenied` would blame the node) |
//! | API server 404; `NodeVersion`/ConfigMap incomplete | `FailedPrecondition` | the cluster is not set up for joins until an operator fixes it |
//! | another control-plane node is joining | `Aborted` | a concurrency conflict that clears by itself: retry the whole join later (`FailedPrecondition` would say "don't retry until fixed", `AlreadyExists` names an object the node never asked for) |
//! | API server 409 otherwise (token-id collision, stale precondition) | `Aborted` | retrying draws a new token / reads afresh |
//! | API server 429, 5xx, unreachable, timeout | `Unavailable` | transient; retry |
//! | API server 400/422, signing failure, PKI files unreadable | `Internal` | our bug or our pod's mounts |

use std::sync::Arc;

use proto::tokenissuer::token_issuer_server::TokenIssuer;
use proto::tokenissuer::{IssueNodeCredentialsRequest, IssueNodeCredentialsResponse};
use tokio::sync::oneshot;
use tonic::{Code, Request, Response, Status};

use crate::audit::{AuditEvents, Release};
use crate::bootstrap::{BootstrapToken, TOKEN_TTL, TokenStore};
use crate::ca::{ClusterCa, SignError};
use crate::cluster_version::{VersionError, VersionReader};
use crate::control_plane::{ControlPlaneGate, GateError};
use crate::csr::{self, CsrError};
use crate::joining::{JoiningError, JoiningNodes, Record};
use crate::kube_api::KubeError;
use crate::pki::{PkiDir, PkiError};

/// Why issuing credentials failed; each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The CSR was refused.
    #[error("invalid certificate request: {0}")]
    Csr(#[source] CsrError),
    /// Signing the kubelet certificate failed.
    #[error("signing the kubelet certificate: {0}")]
    Sign(#[source] SignError),
    /// A control-plane request without a well-formed attestation evidence digest.
    #[error(
        "control-plane files are released only with the SHA-256 of the attestation evidence on record; attested_evidence_sha256 is {0:?}"
    )]
    MissingEvidence(String),
    /// Recording the release of the control-plane files as an Event failed.
    #[error("recording the control-plane files release as an Event: {0}")]
    AuditEvent(#[source] KubeError),
    /// The cluster does not expect a control-plane node now, or cannot say.
    #[error("control-plane files refused: {0}")]
    ControlPlaneRefused(#[source] GateError),
    /// Reading the control-plane PKI failed.
    #[error("reading the control-plane PKI: {0}")]
    ControlPlaneFiles(#[source] PkiError),
    /// Reading the cluster's version and components failed.
    #[error("reading the cluster version: {0}")]
    ClusterVersion(#[source] VersionError),
    /// Recording the join as a `JoiningNode` failed (or the control-plane lock is held).
    #[error("recording the join: {0}")]
    JoiningNode(#[source] JoiningError),
    /// Creating the bootstrap token Secret failed.
    #[error("creating bootstrap token secret {name}: {source}")]
    CreateToken {
        /// The Secret's name.
        name: String,
        /// The Kubernetes failure.
        #[source]
        source: KubeError,
    },
    /// The writing task died (panic or runtime shutdown).
    #[error("writing the join's Kubernetes objects: task aborted")]
    TaskAborted,
}

impl IssueError {
    /// A short, stable name of the step that failed: the metrics' `step` label.
    pub fn step(&self) -> &'static str {
        match self {
            IssueError::Csr(_) => "csr",
            IssueError::Sign(_) => "sign_kubelet_cert",
            IssueError::MissingEvidence(_) => "evidence_digest",
            IssueError::AuditEvent(_) => "audit_event",
            IssueError::ControlPlaneRefused(GateError::Full { .. }) => "control_plane_full",
            IssueError::ControlPlaneRefused(_) => "control_plane_gate",
            IssueError::ControlPlaneFiles(_) => "control_plane_files",
            IssueError::ClusterVersion(_) => "cluster_version",
            IssueError::JoiningNode(JoiningError::ControlPlaneBusy { .. }) => "control_plane_busy",
            IssueError::JoiningNode(_) => "joining_node",
            IssueError::CreateToken { .. } => "create_token",
            IssueError::TaskAborted => "task_aborted",
        }
    }
}

/// The gRPC code for a failed Kubernetes call.
fn kube_code(e: &KubeError) -> Code {
    match e {
        KubeError::Api {
            code: 401 | 403, ..
        } => Code::Internal,
        KubeError::Api { code: 404, .. } => Code::FailedPrecondition,
        KubeError::Api { code: 409, .. } => Code::Aborted,
        KubeError::Api { code: 429, .. } => Code::Unavailable,
        KubeError::Api { code, .. } if *code >= 500 => Code::Unavailable,
        KubeError::Api { .. } => Code::Internal,
        KubeError::Transport(_) | KubeError::Timeout(_) => Code::Unavailable,
    }
}

impl From<IssueError> for Status {
    fn from(e: IssueError) -> Status {
        let code = match &e {
            IssueError::Csr(_) => Code::InvalidArgument,
            IssueError::Sign(SignError::PublicKey(_)) => Code::InvalidArgument,
            IssueError::Sign(SignError::Sign(_)) => Code::Internal,
            IssueError::MissingEvidence(_) => Code::InvalidArgument,
            IssueError::AuditEvent(source) => kube_code(source),
            IssueError::ControlPlaneRefused(GateError::Full { .. }) => Code::PermissionDenied,
            IssueError::ControlPlaneRefused(GateError::BadExpected(_)) => Code::FailedPrecondition,
            IssueError::ControlPlaneRefused(
                GateError::NotConfigured(source)
                | GateError::ListNodes(source)
                | GateError::ReadNodeVersion(source),
            ) => kube_code(source),
            IssueError::ControlPlaneFiles(_) => Code::Internal,
            IssueError::ClusterVersion(
                VersionError::ReadNodeVersion(source) | VersionError::ReadComponents { source, .. },
            ) => kube_code(source),
            IssueError::ClusterVersion(
                VersionError::MissingField(_)
                | VersionError::MissingKey { .. }
                | VersionError::BadComponents { .. },
            ) => Code::FailedPrecondition,
            IssueError::JoiningNode(JoiningError::ControlPlaneBusy { .. }) => Code::Aborted,
            IssueError::JoiningNode(
                JoiningError::Apply { source, .. }
                | JoiningError::Create(source)
                | JoiningError::ReadExisting(source)
                | JoiningError::DeleteExpired(source),
            ) => kube_code(source),
            IssueError::CreateToken { source, .. } => kube_code(source),
            IssueError::TaskAborted => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

/// What the service is built from.
#[derive(Debug)]
pub struct Parts {
    /// The cluster CA.
    pub ca: ClusterCa,
    /// The bootstrap token Secrets.
    pub tokens: TokenStore,
    /// The `NodeVersion` and components reader.
    pub versions: VersionReader,
    /// The `JoiningNode` records.
    pub joining: JoiningNodes,
    /// Whether the cluster expects a control-plane node.
    pub control_plane: ControlPlaneGate,
    /// The control-plane PKI directory.
    pub pki: PkiDir,
    /// The Events recording each release of the control-plane files.
    pub events: AuditEvents,
    /// The endpoint handed to nodes.
    pub api_server_endpoint: String,
}

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Parts>,
}

impl Service {
    /// A service issuing with `parts`.
    pub fn new(parts: Parts) -> Self {
        Self {
            inner: Arc::new(parts),
        }
    }

    /// Issues credentials for one node (everything but the gRPC framing); `peer_uid` is the
    /// uid of the process that asked (the socket's peer credentials), for the audit record.
    pub async fn issue(
        &self,
        req: &IssueNodeCredentialsRequest,
        peer_uid: Option<u32>,
    ) -> Result<IssueNodeCredentialsResponse, IssueError> {
        let parts = &self.inner;
        let node = csr::validate(&req.certificate_request).map_err(IssueError::Csr)?;
        if req.is_control_plane && !crate::audit::is_sha256_hex(&req.attested_evidence_sha256) {
            return Err(IssueError::MissingEvidence(
                req.attested_evidence_sha256.clone(),
            ));
        }
        let kubelet_cert = parts.ca.sign_kubelet(&node).map_err(IssueError::Sign)?;
        let mut release = None;
        let control_plane_files = if req.is_control_plane {
            let admitted = parts
                .control_plane
                .admit()
                .await
                .map_err(IssueError::ControlPlaneRefused)?;
            release = Some(Release {
                node_name: node.node_name.clone(),
                peer_uid,
                evidence_sha256: req.attested_evidence_sha256.clone(),
                peer_address: req.peer_address.clone(),
                admitted,
            });
            parts
                .pki
                .read()
                .await
                .map_err(IssueError::ControlPlaneFiles)?
        } else {
            Vec::new()
        };
        let version = parts
            .versions
            .read()
            .await
            .map_err(IssueError::ClusterVersion)?;

        let now = time::OffsetDateTime::now_utc();
        let record = Record::new(&node.node_name, req.is_control_plane, now);
        let token = BootstrapToken::generate();
        let secret = token.to_secret(&node.node_name, now + TOKEN_TTL);
        let (done_tx, done_rx) = oneshot::channel();
        let task_parts = self.inner.clone();
        let reference = version.components_reference.clone();
        let task_token = token.clone();
        let task_record = record.clone();
        let task_release = release.clone();
        tokio::spawn(async move {
            let result = write(
                &task_parts,
                &task_record,
                &reference,
                &task_token,
                &secret,
                task_release.as_ref(),
                now,
            )
            .await;
            let written = result.is_ok();
            if done_tx.send(result).is_err() && written {
                let why = "caller went away";
                forget_token(&task_parts, &task_token.secret_name(), why).await;
                forget_record(&task_parts, &task_record, why).await;
            }
        });
        let written = match done_rx.await {
            Ok(result) => result,
            Err(_) => Err(IssueError::TaskAborted),
        };
        if let Err(e) = written {
            // After a fault, the next join reads the cluster's version afresh rather than trust
            // an answer from before it.
            parts.versions.forget();
            return Err(e);
        }
        if let Some(release) = &release {
            release.log();
        }

        tracing::info!(
            node = %node.node_name,
            peer = %req.peer_address,
            control_plane = req.is_control_plane,
            token_id = %token.id,
            joining_node = %record.name,
            kubernetes_version = %version.kubernetes_version,
            "issued node credentials"
        );
        Ok(IssueNodeCredentialsResponse {
            token: token.token_string(),
            discovery_token_ca_cert_hash: parts.ca.discovery_hash().to_owned(),
            api_server_endpoint: parts.api_server_endpoint.clone(),
            kubelet_cert: kubelet_cert.into_bytes(),
            node_name: node.node_name,
            kubernetes_version: version.kubernetes_version,
            kubernetes_components: version.components,
            control_plane_files,
        })
    }
}

/// Steps 5 and 6, undoing step 5 (and whatever an unknown outcome may have left) on failure.
async fn write(
    parts: &Parts,
    record: &Record,
    components_reference: &str,
    token: &BootstrapToken,
    secret: &k8s_openapi::api::core::v1::Secret,
    release: Option<&Release>,
    now: time::OffsetDateTime,
) -> Result<(), IssueError> {
    if let Err(e) = parts
        .joining
        .record(record, components_reference, now)
        .await
    {
        if e.outcome_unknown() {
            forget_record(parts, record, "outcome of the JoiningNode write unknown").await;
        }
        return Err(IssueError::JoiningNode(e));
    }
    let name = token.secret_name();
    if let Err(source) = parts.tokens.create(secret).await {
        // AlreadyExists on a fresh random id almost always is our own write: kube-rs retries a
        // create answered 503/504, and the retry finds what the first attempt stored. (A true
        // collision needs one of the few live tokens to share the id, odds about n in 2e9; the
        // node whose token that was then retries its join.)
        if source.outcome_unknown() || source.is_already_exists() {
            forget_token(parts, &name, "outcome of the token create unknown").await;
        }
        forget_record(parts, record, "creating the bootstrap token failed").await;
        return Err(IssueError::CreateToken { name, source });
    }
    if let Some(release) = release {
        // No release of the CA keys without its record in the cluster: a failed (or unknown)
        // Event write undoes the join. A duplicate Event after an unknown outcome is harmless.
        if let Err(source) = parts.events.record(release).await {
            let why = "recording the control-plane release failed";
            forget_token(parts, &name, why).await;
            forget_record(parts, record, why).await;
            return Err(IssueError::AuditEvent(source));
        }
    }
    Ok(())
}

/// Attempts at each rollback. A transient API failure (5xx, 429, timeout, broken connection)
/// should not leave a token for its 15 minutes or a control-plane lock for its 10.
const ROLLBACK_ATTEMPTS: u32 = 3;

/// Runs a rollback step, again after 100 ms and 400 ms while it fails transiently.
async fn with_rollback_retries<T, F, Fut>(mut step: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, KubeError>>,
{
    let mut pause = std::time::Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        match step().await {
            Err(e)
                if attempt < ROLLBACK_ATTEMPTS
                    && (e.outcome_unknown() || e.code() == Some(429)) =>
            {
                tracing::warn!(error = %e, attempt, "rollback step failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 4;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn forget_token(parts: &Parts, name: &str, why: &str) {
    match with_rollback_retries(|| parts.tokens.delete(name)).await {
        Ok(()) => tracing::info!(secret = name, why, "rolled back bootstrap token"),
        Err(error) => {
            tracing::error!(secret = name, why, error = %error, "cannot roll back bootstrap token; it expires on its own")
        }
    }
}

async fn forget_record(parts: &Parts, record: &Record, why: &str) {
    match with_rollback_retries(|| parts.joining.forget(record)).await {
        Ok(true) => tracing::info!(joining_node = %record.name, why, "rolled back JoiningNode"),
        Ok(false) => {
            tracing::debug!(joining_node = %record.name, why, "no JoiningNode of this join to roll back")
        }
        Err(error) => tracing::error!(
            joining_node = %record.name,
            deadline = %record.deadline,
            why,
            error = %error,
            "cannot roll back JoiningNode; it expires at its deadline"
        ),
    }
}

#[tonic::async_trait]
impl TokenIssuer for Service {
    async fn issue_node_credentials(
        &self,
        request: Request<IssueNodeCredentialsRequest>,
    ) -> Result<Response<IssueNodeCredentialsResponse>, Status> {
        let started = std::time::Instant::now();
        let peer_uid = request
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        let req = request.into_inner();
        match self.issue(&req, peer_uid).await {
            Ok(resp) => {
                crate::metrics::issued(None, started.elapsed());
                Ok(Response::new(resp))
            }
            Err(e) => {
                crate::metrics::issued(Some(&e), started.elapsed());
                tracing::warn!(peer = %req.peer_address, step = e.step(), error = %e, "refused to issue node credentials");
                Err(e.into())
            }
        }
    }
}
