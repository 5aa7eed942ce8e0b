//! One simulated node: its own keys, a real kubelet CSR and SSH host key, and one join per call,
//! each over a new connection with a full handshake.
//!
//! A node dials like a Constellation node does: TCP, then aTLS (a fresh certificate key and a
//! fresh attestation document for the server's nonce, see `atls::Connector`), then HTTP/2 and one
//! unary `IssueJoinTicket`. Setup A's nodes dial plain mutual TLS instead ([`crate::mtls`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use attestation::{Issuer, Variant};
use hyper_util::rt::{TokioExecutor, TokioIo};
use node_client::keys::{self, SshHostKey};
use proto::join::IssueJoinTicketRequest;
use proto::join::api_client::ApiClient;
use rand::Rng as _;
use soft_issuer::{KeyType, SoftIssuer, SoftIssuerError};
use testsupport::gce::EsMachines;
use testsupport::harness::{BOOT_MEASUREMENTS, extended_once};
use testsupport::nitro::SoftInstances;
use testsupport::snp::SnpMachines;
use testsupport::tdx::TdxMachines;
use testsupport::trustedlaunch::SoftVms;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tonic::Code;

use crate::mtls::{ClientCa, MtlsError};
use crate::report::Failure;

/// Why a simulated node could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot make the node's kubelet CSR or SSH host key")]
    Keys(#[from] keys::KeyError),
    #[error("cannot make the node's attestation key")]
    Attestation(#[from] SoftIssuerError),
    #[error("cannot make the node's client certificate")]
    Mtls(#[from] MtlsError),
    #[error("cannot make the node's simulated SEV-SNP machine or report: {0:#}")]
    Snp(anyhow::Error),
    #[error("cannot make the node's TD on a simulated TDX machine: {0:#}")]
    Tdx(anyhow::Error),
    #[error("cannot make the node's simulated cloud VM: {0:#}")]
    Cloud(anyhow::Error),
}

/// How simulated nodes attest: soft-issuer documents (qemu-vtpm, the exact TPM format, signed
/// in-process) quoting the given PCR values.
#[derive(Clone, Debug)]
pub struct SoftAttestation {
    key_type: KeyType,
    pcrs: Vec<(u32, [u8; 32])>,
    // An RSA key takes tens of milliseconds to generate, more than a join costs, so every node
    // shares soft-issuer's one RSA key; P-256 attestation keys are generated per node.
    rsa: Option<SoftIssuer>,
}

impl SoftAttestation {
    /// Nodes with attestation keys of `key_type` whose quotes carry `pcrs` (the others zero).
    pub fn new(key_type: KeyType, pcrs: Vec<(u32, [u8; 32])>) -> Result<Self, NodeError> {
        let rsa = match key_type {
            KeyType::Rsa2048 => Some(SoftIssuer::rsa_2048()?.with_pcrs(pcrs.clone())?),
            KeyType::EcdsaP256 => None,
        };
        Ok(Self {
            key_type,
            pcrs,
            rsa,
        })
    }

    /// Nodes whose PCRs are the test harness's boot measurements, so they satisfy the policy the
    /// harness writes (`testsupport::harness::attestation_config`), which `local-cluster` and
    /// the benchmark's attest-proxy enforce. Their keys are software keys, so that policy must
    /// trust any attestation key (`local-cluster --trust-any-ak`; the benchmark's does).
    pub fn matching_harness_policy(key_type: KeyType) -> Result<Self, NodeError> {
        let pcrs = BOOT_MEASUREMENTS
            .iter()
            .map(|&(index, byte)| (index, extended_once(&[byte; 32])))
            .collect();
        Self::new(key_type, pcrs)
    }

    fn issuer(&self) -> Result<SoftIssuer, NodeError> {
        Ok(match &self.rsa {
            Some(rsa) => rsa.clone(),
            None => SoftIssuer::new(self.key_type)?.with_pcrs(self.pcrs.clone())?,
        })
    }
}

/// How the simulated nodes of one attestation variant attest.
#[derive(Clone, Debug)]
pub enum NodeAttestation {
    /// qemu-vtpm: software-key vTPM documents.
    Soft(SoftAttestation),
    /// An SEV-SNP variant: vTPM documents whose key a report from simulated AMD hardware vouches
    /// for (see `testsupport::snp::SnpMachines` for how each variant's machines are made).
    Snp(Arc<SnpMachines>),
    /// A TDX variant: TDs on simulated Intel hosts, quoting per connection (qemu-tdx) or once
    /// for their vTPM key (azure-tdx; see `testsupport::tdx::TdxMachines`).
    Tdx(Arc<TdxMachines>),
    /// gcp-sev-es: software AKs on simulated GCE confidential VMs, each a new instance whose key
    /// the GCE stand-in vouches for (see `testsupport::gce::EsMachines`).
    GcpSevEs(Arc<EsMachines>),
    /// azure-trustedlaunch: an AK certificate per VM from a simulated Azure vTPM CA (see
    /// `testsupport::trustedlaunch::SoftVms`).
    AzureTrustedLaunch(Arc<SoftVms>),
    /// aws-nitro-tpm: software AKs with identity documents of one image (see
    /// `testsupport::nitro::SoftInstances`).
    AwsNitroTpm(Arc<SoftInstances>),
}

impl NodeAttestation {
    /// The attestation variant the nodes' documents are for.
    pub fn variant(&self) -> Variant {
        match self {
            NodeAttestation::Soft(_) => Variant::QemuVtpm,
            NodeAttestation::Snp(machines) => machines.variant(),
            NodeAttestation::Tdx(machines) => machines.variant(),
            NodeAttestation::GcpSevEs(_) => Variant::GcpSevEs,
            NodeAttestation::AzureTrustedLaunch(_) => Variant::AzureTrustedLaunch,
            NodeAttestation::AwsNitroTpm(_) => Variant::AwsNitroTpm,
        }
    }

    /// One node's document issuer: a new attestation key (or the shared RSA key) and, for SNP,
    /// a report from the next simulated machine; for TDX, a new TD on the next simulated host;
    /// for the cloud-trusted variants, a new VM (a new instance, AK certificate or identity).
    fn issuer(&self) -> Result<Arc<dyn Issuer>, NodeError> {
        Ok(match self {
            NodeAttestation::Soft(soft) => Arc::new(soft.issuer()?),
            NodeAttestation::Snp(machines) => Arc::new(machines.node().map_err(NodeError::Snp)?),
            NodeAttestation::Tdx(machines) => Arc::new(machines.node().map_err(NodeError::Tdx)?),
            NodeAttestation::GcpSevEs(vms) => Arc::new(vms.node().map_err(NodeError::Cloud)?),
            NodeAttestation::AzureTrustedLaunch(vms) => {
                Arc::new(vms.node().map_err(NodeError::Cloud)?)
            }
            NodeAttestation::AwsNitroTpm(vms) => Arc::new(vms.node().map_err(NodeError::Cloud)?),
        })
    }
}

impl From<SoftAttestation> for NodeAttestation {
    fn from(soft: SoftAttestation) -> Self {
        NodeAttestation::Soft(soft)
    }
}

/// What the simulated nodes dial, and how they prove who they are.
#[derive(Clone, Debug)]
pub enum Target {
    /// aTLS with attestation: attest-proxy (setups B, C and C-mutual).
    Atls {
        addr: SocketAddr,
        attestation: NodeAttestation,
        /// With a policy, every node checks the server's evidence with it inside each
        /// handshake, before it sends its own certificate, as `join-client --service-policy`
        /// does (ARCHITECTURE.md, "The service attests itself"); a refused server is the
        /// node's final failure, `Unauthenticated` with the failed check in its class.
        server_policy: Option<atls::ServerPolicy>,
    },
    /// Plain mutual TLS with CA-signed client certificates (setup A).
    Mtls { addr: SocketAddr, ca: Arc<ClientCa> },
}

impl Target {
    /// The address nodes dial.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Target::Atls { addr, .. } | Target::Mtls { addr, .. } => *addr,
        }
    }

    /// A new node called `name` at `ip`, with all its keys made. With `source`, its connections
    /// come from that address.
    pub fn node(&self, name: &str, ip: IpAddr, source: Option<IpAddr>) -> Result<Node, NodeError> {
        let kubelet = keys::kubelet_request(name, &[ip])?;
        let ssh = SshHostKey::generate()?;
        let request = IssueJoinTicketRequest {
            disk_uuid: random_uuid(),
            certificate_request: kubelet.csr_der,
            is_control_plane: false,
            host_public_key: ssh.public_wire,
            host_certificate_principals: vec![],
        };
        let credential = match self {
            Target::Atls {
                attestation,
                server_policy,
                ..
            } => {
                let connector = atls::Connector::new(attestation.issuer()?);
                Credential::Atls(match server_policy {
                    Some(policy) => connector.with_server_policy(policy.clone()),
                    None => connector,
                })
            }
            Target::Mtls { ca, .. } => {
                Credential::Mtls(tokio_rustls::TlsConnector::from(ca.client_config(name)?))
            }
        };
        Ok(Node {
            name: name.to_owned(),
            addr: self.addr(),
            source,
            request,
            credential,
        })
    }
}

/// The `index`-th node's address in 10.0.0.0/8 (the CSR carries it as an IP SAN).
pub fn node_ip(index: u64) -> IpAddr {
    let [_, _, _, _, _, b, c, d] = index.to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(10, b, c, d))
}

/// The `index`-th node's source address on the loopback network: 127.0.0.0/8 is local as a
/// whole on Linux, so simulated nodes can come from distinct addresses as real nodes do (a
/// per-source limit then sees one node per address), and each address has its own range of
/// ephemeral ports. 127.0.0.1 itself is skipped.
pub fn loopback_source(index: u64) -> IpAddr {
    let [_, _, _, _, _, b, c, d] = index.to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, 1 + b % 254, c, d))
}

/// A random version-4 UUID, as a node's state disk has.
fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

enum Credential {
    /// One connector per node: its attestation key; each handshake makes a fresh certificate
    /// key and document.
    Atls(atls::Connector),
    Mtls(tokio_rustls::TlsConnector),
}

/// A simulated node, ready to join.
pub struct Node {
    name: String,
    addr: SocketAddr,
    source: Option<IpAddr>,
    request: IssueJoinTicketRequest,
    credential: Credential,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// The node's name (its kubelet CSR says `system:node:<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One join over a new connection, answered within `timeout` or failed as
    /// `DeadlineExceeded`.
    pub async fn join(&self, timeout: Duration) -> Result<(), Failure> {
        match tokio::time::timeout(timeout, self.attempt()).await {
            Ok(result) => result,
            Err(_) => Err(Failure::new(
                Code::DeadlineExceeded,
                "no answer within the client's deadline",
            )),
        }
    }

    /// TCP to the target, from the node's own source address if it has one.
    async fn connect(&self) -> std::io::Result<TcpStream> {
        let Some(source) = self.source else {
            return TcpStream::connect(self.addr).await;
        };
        let socket = match source {
            IpAddr::V4(_) => TcpSocket::new_v4()?,
            IpAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(self.addr).await
    }

    async fn attempt(&self) -> Result<(), Failure> {
        let tcp = self
            .connect()
            .await
            .map_err(|e| Failure::new(Code::Unavailable, &format!("tcp connect: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let handshake_failed = |e: &dyn std::error::Error| {
            Failure::new(Code::Unavailable, &format!("tls handshake: {}", chain(e)))
        };
        match &self.credential {
            Credential::Atls(connector) => {
                let tls = connector.connect(tcp).await.map_err(|e| match &e {
                    atls::HandshakeError::ServerRefused { source, .. } => server_refused(source),
                    _ => handshake_failed(&e),
                })?;
                call(tls, self.request.clone()).await
            }
            Credential::Mtls(connector) => {
                let tls = connector
                    .connect(crate::mtls::server_name(self.addr), tcp)
                    .await
                    .map_err(|e| handshake_failed(&e))?;
                call(tls, self.request.clone()).await
            }
        }
    }
}

/// The node refused the server: its certificate's evidence did not satisfy the node's service
/// policy. `Unauthenticated` (the server failed the node's authentication of it), which no node
/// retries; the class leads with the failed check, as audit records name it, so that a report
/// tells an impostor (`server_evidence_missing`, `ak_untrusted`) from a changed control plane
/// (`measurements`) even where a long message is cut.
fn server_refused(error: &atls::ServerVerifyError) -> Failure {
    Failure::new(
        Code::Unauthenticated,
        &format!("server refused [{}]: {}", error.check(), chain(error)),
    )
}

/// HTTP/2 on the fresh TLS stream and one `IssueJoinTicket`.
async fn call<IO>(io: IO, request: IssueJoinTicketRequest) -> Result<(), Failure>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .map_err(|e| {
                Failure::new(
                    Code::Unavailable,
                    &format!("http/2 handshake: {}", chain(&e)),
                )
            })?;
    // The connection task ends by itself once the last sender below is dropped.
    tokio::spawn(connection);
    let service = tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        let mut send = send.clone();
        async move {
            // A broken connection is `Unavailable` to a gRPC client (tonic would say `Unknown`).
            send.send_request(request).await.map_err(|e| {
                tonic::Status::unavailable(format!("connection failed: {}", chain(&e)))
            })
        }
    });
    let mut client = ApiClient::with_origin(service, http::Uri::from_static("http://join-service"));
    match client.issue_join_ticket(request).await {
        Ok(_) => Ok(()),
        Err(status) => Err(Failure::new(status.code(), status.message())),
    }
}

/// An error and its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4() {
        let u = random_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(u, random_uuid());
    }

    #[test]
    fn loopback_sources_are_distinct_and_not_the_usual_one() {
        assert_eq!(loopback_source(0), IpAddr::V4(Ipv4Addr::new(127, 1, 0, 0)));
        assert_eq!(
            loopback_source(0x01_02_03),
            IpAddr::V4(Ipv4Addr::new(127, 2, 2, 3))
        );
        let all: std::collections::HashSet<IpAddr> = (0..70_000).map(loopback_source).collect();
        assert_eq!(all.len(), 70_000);
        assert!(!all.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn node_ips_are_distinct() {
        assert_eq!(node_ip(0), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)));
        assert_eq!(node_ip(65_793), IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1)));
    }
}
