//! The `join.API` service: checks a request, then keys and the SSH host certificate, then
//! Kubernetes credentials.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::join::api_server::Api;
use proto::join::{
    ControlPlaneCertOrKey, IssueJoinTicketRequest, IssueJoinTicketResponse,
    IssueRejoinTicketRequest, IssueRejoinTicketResponse,
};
use tonic::{Request, Response, Status};

use crate::credentials::CredentialsClient;
use crate::error::{TicketError, chain};
use crate::keys::KeyClient;
use crate::kubeadm::KubeadmConfig;
use crate::metrics::Metrics;
use crate::request::{self, Identity, MAX_DISK_UUID_LEN};
use crate::ssh::{self, HostKey};

/// How join-core makes SSH host certificates.
#[derive(Clone, Debug)]
pub struct HostCertificates {
    /// Where the API server's cert SANs, every certificate's extra principals, come from.
    pub kubeadm: KubeadmConfig,
    /// How long each certificate is valid.
    pub validity: Duration,
}

/// Issues join and rejoin tickets.
#[derive(Clone, Debug)]
pub struct TicketService {
    keys: KeyClient,
    credentials: CredentialsClient,
    measurement_salt: Arc<[u8]>,
    host_certificates: HostCertificates,
    metrics: Metrics,
}

impl TicketService {
    /// A ticket service over these backends, handing out `measurement_salt` in every ticket.
    pub fn new(
        keys: KeyClient,
        credentials: CredentialsClient,
        measurement_salt: impl Into<Arc<[u8]>>,
        host_certificates: HostCertificates,
    ) -> Self {
        Self {
            keys,
            credentials,
            measurement_salt: measurement_salt.into(),
            host_certificates,
            metrics: Metrics::default(),
        }
    }

    /// Counts every answered request in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// A join ticket for an attested node.
    ///
    /// Everything that can fail without side effects comes first: the request checks, the
    /// cert SANs, the keys and the SSH host certificate. Only then is token-issuer asked, so a
    /// failure before it leaves nothing behind in Kubernetes.
    async fn join(
        &self,
        identity: &Identity,
        request: IssueJoinTicketRequest,
    ) -> Result<(IssueJoinTicketResponse, String), TicketError> {
        request::check_disk_uuid(&request.disk_uuid)?;
        request::check_certificate_request(&request.certificate_request)?;
        let host_key = HostKey::parse(&request.host_public_key)?;
        ssh::check_requested_principals(&request.host_certificate_principals)?;

        // The local file first: a broken mount is found without asking the key service.
        let sans = self
            .host_certificates
            .kubeadm
            .api_server_cert_sans()
            .map_err(TicketError::KubeadmConfig)?;
        let mut keys = self.keys.join_keys(&request.disk_uuid).await?;
        let principals = ssh::principals(
            &request.host_certificate_principals,
            &sans,
            identity.peer_addr.ip(),
        );
        let ca = &keys.cluster.ssh_ca;
        let host_certificate = ca
            .host_certificate(
                &host_key,
                &principals,
                &request.disk_uuid,
                self.host_certificates.validity,
            )
            .map_err(TicketError::Ssh)?;
        let authorized_ca_public_key = ca.authorized_key_line();

        let credentials = self
            .credentials
            .issue(
                request.certificate_request,
                request.is_control_plane,
                identity.peer_addr,
                &identity.evidence_sha256,
            )
            .await?;
        let ticket = IssueJoinTicketResponse {
            state_disk_key: std::mem::take(&mut *keys.state_disk_key),
            measurement_salt: self.measurement_salt.to_vec(),
            measurement_secret: keys.cluster.measurement_secret.to_vec(),
            kubelet_cert: credentials.kubelet_cert,
            api_server_endpoint: credentials.api_server_endpoint,
            token: credentials.token,
            discovery_token_ca_cert_hash: credentials.discovery_token_ca_cert_hash,
            control_plane_files: credentials
                .control_plane_files
                .into_iter()
                .map(|file| ControlPlaneCertOrKey {
                    name: file.name,
                    data: file.data,
                })
                .collect(),
            kubernetes_version: credentials.kubernetes_version,
            kubernetes_components: credentials.kubernetes_components,
            authorized_ca_public_key,
            host_certificate,
        };
        Ok((ticket, credentials.node_name))
    }

    /// A rebooted node's keys: the same derivation gives the same key for the same disk UUID.
    async fn rejoin(
        &self,
        request: IssueRejoinTicketRequest,
    ) -> Result<IssueRejoinTicketResponse, TicketError> {
        request::check_disk_uuid(&request.disk_uuid)?;
        let mut keys = self.keys.node_keys(&request.disk_uuid).await?;
        Ok(IssueRejoinTicketResponse {
            state_disk_key: std::mem::take(&mut *keys.state_disk_key),
            measurement_secret: std::mem::take(&mut *keys.measurement_secret),
        })
    }
}

#[tonic::async_trait]
impl Api for TicketService {
    async fn issue_join_ticket(
        &self,
        request: Request<IssueJoinTicketRequest>,
    ) -> Result<Response<IssueJoinTicketResponse>, Status> {
        let started = Instant::now();
        let (metadata, _, request) = request.into_parts();
        let mut outcome = Outcome::new("IssueJoinTicket", &request.disk_uuid, started);
        let result = match Identity::from_metadata(&metadata) {
            Ok(identity) => {
                outcome.identity = Some(identity.clone());
                self.join(&identity, request).await
            }
            Err(refused) => Err(refused.into()),
        };
        match result {
            Ok((ticket, node_name)) => {
                outcome.node_name = node_name;
                outcome.issued(&self.metrics);
                Ok(Response::new(ticket))
            }
            Err(error) => Err(outcome.refused(&error, &self.metrics)),
        }
    }

    async fn issue_rejoin_ticket(
        &self,
        request: Request<IssueRejoinTicketRequest>,
    ) -> Result<Response<IssueRejoinTicketResponse>, Status> {
        let started = Instant::now();
        let (metadata, _, request) = request.into_parts();
        let mut outcome = Outcome::new("IssueRejoinTicket", &request.disk_uuid, started);
        let result = match Identity::from_metadata(&metadata) {
            Ok(identity) => {
                outcome.identity = Some(identity);
                self.rejoin(request).await
            }
            Err(refused) => Err(refused.into()),
        };
        match result {
            Ok(ticket) => {
                outcome.issued(&self.metrics);
                Ok(Response::new(ticket))
            }
            Err(error) => Err(outcome.refused(&error, &self.metrics)),
        }
    }
}

/// What the one log line per request says.
struct Outcome {
    method: &'static str,
    /// As sent, cut to a loggable length; logged escaped, since it is the node's input.
    disk_uuid: String,
    identity: Option<Identity>,
    node_name: String,
    started: Instant,
}

impl Outcome {
    fn new(method: &'static str, disk_uuid: &str, started: Instant) -> Self {
        Self {
            method,
            disk_uuid: disk_uuid.chars().take(MAX_DISK_UUID_LEN).collect(),
            identity: None,
            node_name: String::new(),
            started,
        }
    }

    fn peer_and_variant(&self) -> (String, &str) {
        match &self.identity {
            Some(identity) => (identity.peer_addr.to_string(), identity.variant.as_str()),
            None => ("-".to_owned(), "-"),
        }
    }

    fn issued(self, metrics: &Metrics) {
        metrics.ticket(self.method, None, self.started.elapsed());
        let (peer, variant) = self.peer_and_variant();
        tracing::info!(
            method = self.method,
            %peer,
            variant,
            disk_uuid = ?self.disk_uuid,
            node = %self.node_name,
            elapsed_ms = self.started.elapsed().as_millis(),
            "ticket issued"
        );
    }

    /// Logs the refusal and returns the status the node gets.
    fn refused(self, error: &TicketError, metrics: &Metrics) -> Status {
        metrics.ticket(self.method, Some(error), self.started.elapsed());
        let status = error.to_status();
        let (peer, variant) = self.peer_and_variant();
        tracing::warn!(
            method = self.method,
            %peer,
            variant,
            disk_uuid = ?self.disk_uuid,
            code = ?status.code(),
            error = %chain(error),
            elapsed_ms = self.started.elapsed().as_millis(),
            "ticket refused"
        );
        status
    }
}
