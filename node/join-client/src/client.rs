//! A join API client whose every connection is an aTLS handshake attested by the node's issuer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use attestation::Issuer;
use hyper_util::rt::TokioIo;
use proto::join::api_client::ApiClient;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// Why a call to the join service failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint could not be turned into a channel.
    #[error("invalid join service endpoint {0}")]
    Endpoint(String, #[source] tonic::transport::Error),
    /// The service answered with an error status.
    #[error("join service refused: {0}")]
    Status(#[from] tonic::Status),
}

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
        })
    }

    /// A fresh, lazily connecting channel for one call.
    fn api(&self) -> ApiClient<Channel> {
        let (addr, connector) = (self.addr, self.connector.clone());
        let channel = self
            .endpoint
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                let connector = connector.clone();
                async move {
                    let tcp = TcpStream::connect(addr).await?;
                    let _ = tcp.set_nodelay(true);
                    let tls = connector
                        .connect(tcp)
                        .await
                        .map_err(std::io::Error::other)?;
                    Ok::<_, std::io::Error>(TokioIo::new(tls))
                }
            }));
        ApiClient::new(channel)
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
        Ok(self.api().issue_rejoin_ticket(request).await?.into_inner())
    }

    /// A raw request through the attested channel, for tests and debugging: arbitrary metadata
    /// (e.g. headers the proxy must strip) can be attached.
    pub async fn join_with(
        &self,
        request: tonic::Request<proto::join::IssueJoinTicketRequest>,
    ) -> Result<proto::join::IssueJoinTicketResponse, ClientError> {
        Ok(self.api().issue_join_ticket(request).await?.into_inner())
    }
}
