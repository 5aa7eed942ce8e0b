//! One real aTLS handshake over loopback between a server and a node, and the node's own
//! attestation, which is not under test in these files.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use atls::{Acceptor, Connector, HandshakeError, PeerEvidence, TlsStream};
use attestation::{IssueError, Issuer, Variant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The node's own attestation: it is the server's business, not under test here.
#[derive(Debug, Default)]
pub struct NodeIssuer {
    pub calls: AtomicUsize,
}

impl Issuer for NodeIssuer {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }
    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok([user_data, nonce].concat())
    }
}

pub type Accepted = Result<(TlsStream<TcpStream>, PeerEvidence), HandshakeError>;

/// One connection from `connector` to a server using `acceptor`; when the handshake succeeds the
/// client sends a request and the server echoes what it read, so a test sees what reached it.
pub async fn join_once(
    acceptor: Arc<Acceptor>,
    connector: &Connector,
) -> (Result<Vec<u8>, HandshakeError>, Accepted) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
            .await
            .expect("server handshake timed out");
        match accepted {
            Ok((mut stream, evidence)) => {
                let mut request = [0u8; 7];
                stream.read_exact(&mut request).await.unwrap();
                stream.write_all(&request).await.unwrap();
                stream.shutdown().await.unwrap();
                Ok((stream, evidence))
            }
            Err(e) => Err(e),
        }
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let client = match connector.connect(tcp).await {
        Ok(mut stream) => {
            stream.write_all(b"request").await.unwrap();
            stream.flush().await.unwrap();
            let mut reply = Vec::new();
            stream.read_to_end(&mut reply).await.unwrap();
            Ok(reply)
        }
        Err(e) => Err(e),
    };
    (client, server.await.unwrap())
}
