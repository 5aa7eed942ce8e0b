//! The `TokenIssuer` gRPC service and the one place its errors become `tonic::Status`.
//!
//! Order of work, chosen so a refused or failed request leaves nothing behind:
//! 1. validate the CSR (untrusted input) — nothing has been touched yet;
//! 2. sign the kubelet certificate — still local;
//! 3. create the bootstrap token Secret — the only Kubernetes write, and the last fallible
//!    step. If its outcome is unknown (5xx, timeout, broken connection: the write may have
//!    happened), the Secret is deleted by name before answering.
//!
//! Step 3 runs in its own task, so a caller that hangs up mid-call cannot cut it between the
//! write and the rollback; if the caller is gone when the token exists, the token is deleted,
//! because nobody will ever receive it.

use std::sync::Arc;

use proto::tokenissuer::token_issuer_server::TokenIssuer;
use proto::tokenissuer::{IssueNodeCredentialsRequest, IssueNodeCredentialsResponse};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::bootstrap::{BootstrapToken, KubeError, TOKEN_TTL, TokenStore};
use crate::ca::{ClusterCa, SignError};
use crate::csr::{self, CsrError};

/// Why issuing credentials failed; each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The CSR was refused.
    #[error("invalid certificate request: {0}")]
    Csr(#[source] CsrError),
    /// Signing the kubelet certificate failed.
    #[error("signing the kubelet certificate: {0}")]
    Sign(#[source] SignError),
    /// Creating the bootstrap token Secret failed.
    #[error("creating bootstrap token secret {name}: {source}")]
    CreateToken {
        /// The Secret's name.
        name: String,
        /// The Kubernetes failure.
        #[source]
        source: KubeError,
    },
    /// The creating task died (panic or runtime shutdown).
    #[error("creating bootstrap token secret {0}: task aborted")]
    TaskAborted(String),
}

impl From<IssueError> for Status {
    fn from(e: IssueError) -> Status {
        use tonic::Code;
        let code = match &e {
            // The caller sent something we will not sign: its fault, and retrying won't help.
            IssueError::Csr(_) => Code::InvalidArgument,
            // The node's key is of a kind we cannot certify.
            IssueError::Sign(SignError::PublicKey(_) | SignError::DnsName(_)) => {
                Code::InvalidArgument
            }
            IssueError::Sign(SignError::Sign(_)) => Code::Internal,
            IssueError::CreateToken { source, .. } => match source {
                // Our own credential or RBAC is wrong: a deployment fault, not the caller's,
                // so not PermissionDenied (that would blame the node).
                KubeError::Api {
                    code: 401 | 403, ..
                } => Code::Internal,
                // Token-id collision: a retry draws a new id.
                KubeError::Api { code: 409, .. } => Code::Aborted,
                // Missing namespace and the like: the cluster is not set up for joins yet.
                KubeError::Api { code: 404, .. } => Code::FailedPrecondition,
                KubeError::Api { code: 429, .. } => Code::Unavailable,
                KubeError::Api { code, .. } if *code >= 500 => Code::Unavailable,
                // 400/422: we built a Secret the server refuses — our bug.
                KubeError::Api { .. } => Code::Internal,
                KubeError::Transport(_) | KubeError::Timeout(_) => Code::Unavailable,
            },
            IssueError::TaskAborted(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

/// The service: the CA, the Secrets API and the endpoint to hand out.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ca: ClusterCa,
    tokens: TokenStore,
    api_server_endpoint: String,
}

impl Service {
    /// A service issuing with `ca`, storing tokens through `tokens`.
    pub fn new(ca: ClusterCa, tokens: TokenStore, api_server_endpoint: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                ca,
                tokens,
                api_server_endpoint,
            }),
        }
    }

    /// Issues credentials for one node (everything but the gRPC framing).
    pub async fn issue(
        &self,
        req: &IssueNodeCredentialsRequest,
    ) -> Result<IssueNodeCredentialsResponse, IssueError> {
        let node = csr::validate(&req.certificate_request).map_err(IssueError::Csr)?;
        let kubelet_cert = self
            .inner
            .ca
            .sign_kubelet(&node)
            .map_err(IssueError::Sign)?;

        let token = BootstrapToken::generate();
        let name = token.secret_name();
        let secret = token.to_secret(&node.node_name, time::OffsetDateTime::now_utc() + TOKEN_TTL);
        let (done_tx, done_rx) = oneshot::channel();
        let tokens = self.inner.tokens.clone();
        let task_name = name.clone();
        tokio::spawn(async move {
            let result = tokens.create(&secret).await;
            if result.as_ref().is_err_and(KubeError::outcome_unknown) {
                rollback(&tokens, &task_name, "outcome of create unknown").await;
            }
            let created = result.is_ok();
            if done_tx.send(result).is_err() && created {
                rollback(&tokens, &task_name, "caller went away").await;
            }
        });
        match done_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(IssueError::CreateToken { name, source }),
            Err(_) => return Err(IssueError::TaskAborted(name)),
        }

        tracing::info!(
            node = %node.node_name,
            peer = %req.peer_address,
            control_plane = req.is_control_plane,
            token_id = %token.id,
            "issued node credentials"
        );
        Ok(IssueNodeCredentialsResponse {
            token: token.token_string(),
            discovery_token_ca_cert_hash: self.inner.ca.discovery_hash().to_owned(),
            api_server_endpoint: self.inner.api_server_endpoint.clone(),
            kubelet_cert: kubelet_cert.into_bytes(),
            node_name: node.node_name,
            ..Default::default()
        })
    }
}

async fn rollback(tokens: &TokenStore, name: &str, why: &str) {
    match tokens.delete(name).await {
        Ok(()) => tracing::info!(secret = name, why, "rolled back bootstrap token"),
        // Left for the token cleaner, which deletes it at expiry (15 minutes).
        Err(error) => {
            tracing::error!(secret = name, why, error = %error, "cannot roll back bootstrap token; it expires on its own")
        }
    }
}

#[tonic::async_trait]
impl TokenIssuer for Service {
    async fn issue_node_credentials(
        &self,
        request: Request<IssueNodeCredentialsRequest>,
    ) -> Result<Response<IssueNodeCredentialsResponse>, Status> {
        let req = request.into_inner();
        match self.issue(&req).await {
            Ok(resp) => Ok(Response::new(resp)),
            Err(e) => {
                tracing::warn!(peer = %req.peer_address, error = %e, "refused to issue node credentials");
                Err(e.into())
            }
        }
    }
}
