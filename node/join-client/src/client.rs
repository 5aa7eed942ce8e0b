//! A join API client whose every connection is an aTLS handshake attested by the node's issuer.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use attestation::Issuer;
use attestation::audit::Decision;
use hyper_util::rt::TokioIo;
use proto::join::api_client::ApiClient;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::service_policy::ServicePolicy;

/// Why a call to the join service failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint could not be turned into a channel.
    #[error("invalid join service endpoint {0}")]
    Endpoint(String, #[source] tonic::transport::Error),
    /// The service answered with an error status.
    #[error("join service refused: {0}")]
    Status(#[from] tonic::Status),
    /// The server failed the node's service policy: it is not the attested join service.
    /// Nothing was sent to it. `decision` is the audit record of the refusal.
    #[error("the server at {peer} is not the attested join service (check {})", decision.check.as_deref().unwrap_or("evidence"))]
    ServerRefused {
        peer: SocketAddr,
        decision: Box<Decision>,
        #[source]
        source: Box<atls::ServerVerifyError>,
    },
}

/// Where a connection attempt leaves a server refusal, which tonic would otherwise flatten into
/// a transport error.
type RefusalSlot = Arc<Mutex<Option<ClientError>>>;

/// A client of the join API.
///
/// Every call gets a connection of its own, as a Constellation node dials per call: the service
/// answers one call per connection (and each connection is attested under the policy in force
/// when it connects), so a channel kept between calls would only meet a closed connection.
#[derive(Clone, Debug)]
pub struct Client {
    endpoint: Endpoint,
    addr: SocketAddr,
    connector: Arc<atls::Connector>,
    service_policy: Option<ServicePolicy>,
    /// The local address connections leave from; the system's choice when `None`.
    source_ip: Option<IpAddr>,
}

impl Client {
    /// A client for the join service at `addr`. Connections are made per call, each one
    /// attested with a fresh document from `issuer` for the server's nonce.
    pub fn new(
        addr: SocketAddr,
        issuer: Arc<dyn Issuer>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ClientError::Endpoint(addr.to_string(), e))?
            .timeout(timeout)
            .connect_timeout(timeout);
        Ok(Self {
            endpoint,
            addr,
            connector: Arc::new(atls::Connector::new(issuer)),
            service_policy: None,
            source_ip: None,
        })
    }

    /// Same client, but every connection refuses a server whose evidence does not satisfy
    /// `policy`, before anything is sent to it.
    pub fn with_service_policy(mut self, policy: ServicePolicy) -> Self {
        self.connector = Arc::new(
            self.connector
                .as_ref()
                .clone()
                .with_server_policy(policy.server_policy().clone()),
        );
        self.service_policy = Some(policy);
        self
    }

    /// Same client, but every connection leaves from `ip` (a host with several addresses).
    pub fn with_source_ip(mut self, ip: IpAddr) -> Self {
        self.source_ip = Some(ip);
        self
    }

    /// Whether the server is verified (see [`with_service_policy`](Self::with_service_policy)).
    pub fn verifies_service(&self) -> bool {
        self.service_policy.is_some()
    }

    /// A fresh, lazily connecting channel for one call, and where its connection leaves a
    /// server refusal.
    fn api(&self) -> (ApiClient<Channel>, RefusalSlot) {
        let (addr, connector, source_ip) = (self.addr, self.connector.clone(), self.source_ip);
        let policy = self.service_policy.clone();
        let refusal = RefusalSlot::default();
        let slot = refusal.clone();
        let channel = self
            .endpoint
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                let (connector, policy, slot) = (connector.clone(), policy.clone(), slot.clone());
                async move {
                    let tcp = connect(addr, source_ip).await?;
                    let _ = tcp.set_nodelay(true);
                    match connector.connect(tcp).await {
                        Ok(tls) => Ok::<_, std::io::Error>(TokioIo::new(tls)),
                        Err(atls::HandshakeError::ServerRefused {
                            certificate,
                            source,
                        }) => {
                            let decision = policy
                                .as_ref()
                                .map(|policy| policy.refusal(addr, certificate.as_ref(), &source));
                            let text = attestation::audit::chain(source.as_ref());
                            if let Some(decision) = decision {
                                audit_chain().seal(decision.to_value(), |_, canonical| {
                                    plumbing::telemetry::audit(false, canonical);
                                });
                                *slot.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(ClientError::ServerRefused {
                                        peer: addr,
                                        decision: Box::new(decision),
                                        source,
                                    });
                            }
                            Err(std::io::Error::other(text))
                        }
                        Err(other) => Err(std::io::Error::other(other)),
                    }
                }
            }));
        (ApiClient::new(channel), refusal)
    }

    /// A call's error: the server refusal its connection recorded, if any, else tonic's status.
    fn failed(status: tonic::Status, refusal: &RefusalSlot) -> ClientError {
        refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or(ClientError::Status(status))
    }

    /// Calls `IssueJoinTicket`.
    pub async fn join(
        &self,
        request: proto::join::IssueJoinTicketRequest,
    ) -> Result<proto::join::IssueJoinTicketResponse, ClientError> {
        self.join_with(tonic::Request::new(request)).await
    }

    /// Calls `IssueRejoinTicket`.
    pub async fn rejoin(
        &self,
        disk_uuid: &str,
    ) -> Result<proto::join::IssueRejoinTicketResponse, ClientError> {
        let request = proto::join::IssueRejoinTicketRequest {
            disk_uuid: disk_uuid.to_owned(),
        };
        let (mut api, refusal) = self.api();
        match api.issue_rejoin_ticket(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(Self::failed(status, &refusal)),
        }
    }

    /// A raw request through the attested channel, for tests and debugging: arbitrary metadata
    /// (e.g. headers the proxy must strip) can be attached.
    pub async fn join_with(
        &self,
        request: tonic::Request<proto::join::IssueJoinTicketRequest>,
    ) -> Result<proto::join::IssueJoinTicketResponse, ClientError> {
        let (mut api, refusal) = self.api();
        match api.issue_join_ticket(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(Self::failed(status, &refusal)),
        }
    }
}

/// This process's audit chain, started (its start record written) with its first record.
fn audit_chain() -> &'static attestation::audit_trail::Chain {
    static CHAIN: std::sync::OnceLock<attestation::audit_trail::Chain> = std::sync::OnceLock::new();
    CHAIN.get_or_init(|| {
        let (chain, start) = attestation::audit_trail::Chain::start("join-client");
        plumbing::telemetry::audit(true, &attestation::audit_trail::canonical(&start));
        chain
    })
}

/// A TCP connection to `addr`, from `source_ip` when given.
async fn connect(addr: SocketAddr, source_ip: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(ip) = source_ip else {
        return TcpStream::connect(addr).await;
    };
    let socket = match ip {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(addr).await
}
