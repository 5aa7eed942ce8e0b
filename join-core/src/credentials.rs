//! The token-issuer client: Kubernetes credentials for a joining node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proto::tokenissuer::token_issuer_client::TokenIssuerClient;
use proto::tokenissuer::{IssueNodeCredentialsRequest, IssueNodeCredentialsResponse};
use tonic::transport::Channel;

use crate::call;
use crate::error::{TicketError, TokenIssuerError};
use crate::metrics::{Backend, Metrics};

/// Asks token-issuer over its Unix socket, on one channel for the life of the process.
#[derive(Clone, Debug)]
pub struct CredentialsClient {
    client: TokenIssuerClient<Channel>,
    deadline: Duration,
    metrics: Metrics,
}

impl CredentialsClient {
    /// A client for token-issuer at `socket`, served by `uid` (checked before anything is
    /// sent); connects on first use and reconnects by itself.
    pub fn new(socket: impl Into<PathBuf>, uid: u32, deadline: Duration) -> Self {
        Self {
            client: TokenIssuerClient::new(plumbing::unix::channel(socket, uid)),
            deadline,
            metrics: Metrics::default(),
        }
    }

    /// Times every call to token-issuer in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// A bootstrap token and a kubelet certificate for the node that sent `certificate_request`.
    pub async fn issue(
        &self,
        certificate_request: Vec<u8>,
        is_control_plane: bool,
        peer_addr: SocketAddr,
        evidence_sha256: &str,
    ) -> Result<IssueNodeCredentialsResponse, TicketError> {
        let fail = TicketError::TokenIssuer;
        let message = IssueNodeCredentialsRequest {
            certificate_request,
            is_control_plane,
            peer_address: peer_addr.to_string(),
            attested_evidence_sha256: evidence_sha256.to_owned(),
        };
        let mut client = self.client.clone();
        let started = Instant::now();
        let result = call::with_deadline(
            self.deadline,
            client.issue_node_credentials(call::request(message, self.deadline)),
        )
        .await;
        self.metrics.backend_call(
            Backend::TokenIssuer,
            call::outcome(&result),
            started.elapsed(),
        );
        let response = result.map_err(|e| fail(e.into()))?;

        let required = [
            ("token", response.token.is_empty()),
            ("kubelet_cert", response.kubelet_cert.is_empty()),
            (
                "api_server_endpoint",
                response.api_server_endpoint.is_empty(),
            ),
            (
                "discovery_token_ca_cert_hash",
                response.discovery_token_ca_cert_hash.is_empty(),
            ),
        ];
        if let Some((field, _)) = required.into_iter().find(|(_, empty)| *empty) {
            return Err(fail(TokenIssuerError::Incomplete { field }));
        }
        Ok(response)
    }
}
