//! Tower middleware: the identity join-core sees is the one attest-proxy verified.
//!
//! Every identity header a client sent is removed, whatever its case, and the proxy's own are
//! added. join-core trusts these headers only because attest-proxy is the one process allowed on
//! its socket.

use std::net::SocketAddr;
use std::task::{Context, Poll};

use http::HeaderValue;
use plumbing::identity;

/// What attest-proxy established about one connection.
#[derive(Clone, Debug)]
pub struct PeerIdentity {
    /// The attestation variant that was verified.
    pub variant: attestation::Variant,
    /// The node's TCP address.
    pub peer_addr: SocketAddr,
    /// The digest of the measurement policy the node passed.
    pub policy_digest: String,
    /// SHA-256 (hex) of the evidence that was verified, as the audit line records it.
    pub evidence_sha256: String,
}

/// Adds [`IdentityHeaders`] for one connection's verified identity.
#[derive(Clone, Debug)]
pub struct IdentityLayer {
    headers: Vec<(&'static str, HeaderValue)>,
}

impl IdentityLayer {
    /// Headers asserting `peer`. Header values are built once per connection, not per request.
    pub fn new(peer: &PeerIdentity) -> Self {
        let mut headers = Vec::with_capacity(4);
        for (name, value) in [
            (identity::VARIANT, peer.variant.name().to_owned()),
            (identity::PEER_ADDR, peer.peer_addr.to_string()),
            (identity::POLICY_DIGEST, peer.policy_digest.clone()),
            (identity::EVIDENCE_SHA256, peer.evidence_sha256.clone()),
        ] {
            // Variant names, socket addresses and hex digests are always valid header values;
            // should that ever change, the header is left out and join-core refuses the call.
            match HeaderValue::from_str(&value) {
                Ok(value) => headers.push((name, value)),
                Err(_) => {
                    tracing::error!(header = name, "identity value is not a valid header value")
                }
            }
        }
        Self { headers }
    }
}

impl<S> tower::Layer<S> for IdentityLayer {
    type Service = IdentityHeaders<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdentityHeaders {
            headers: self.headers.clone(),
            inner,
        }
    }
}

/// Replaces client-sent identity headers with the proxy's own.
#[derive(Clone, Debug)]
pub struct IdentityHeaders<S> {
    headers: Vec<(&'static str, HeaderValue)>,
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for IdentityHeaders<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        strip_client_identity(request.headers_mut());
        for (name, value) in &self.headers {
            request.headers_mut().insert(*name, value.clone());
        }
        self.inner.call(request)
    }
}

/// Removes every header that claims an identity (HeaderMap names are already lower-case).
fn strip_client_identity(headers: &mut http::HeaderMap) {
    let claimed: Vec<http::HeaderName> = headers
        .keys()
        .filter(|name| identity::is_identity_header(name.as_str()))
        .cloned()
        .collect();
    for name in claimed {
        if headers.remove(&name).is_some() {
            tracing::warn!(header = %name, "removed an identity header sent by the client");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn client_identity_is_replaced() {
        let peer = PeerIdentity {
            variant: attestation::Variant::QemuVtpm,
            peer_addr: "10.0.0.7:41234".parse().unwrap(),
            policy_digest: "ab12".to_owned(),
            evidence_sha256: "cd".repeat(32),
        };
        let echo = tower::service_fn(|req: http::Request<()>| async move {
            Ok::<_, std::convert::Infallible>(req)
        });
        let mut svc = IdentityLayer::new(&peer).layer(echo);
        let request = http::Request::builder()
            .header("X-Attested-Variant", "aws-sev-snp")
            .header("x-attested-peer-addr", "1.2.3.4:5")
            .header("x-attested-admin", "yes")
            .header("x-attested-evidence-sha256", "00".repeat(32))
            .header("x-forwarded-for", "1.2.3.4")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let seen = svc.ready().await.unwrap().call(request).await.unwrap();
        let headers = seen.headers();
        assert_eq!(
            headers
                .get_all(identity::VARIANT)
                .iter()
                .collect::<Vec<_>>(),
            ["qemu-vtpm"]
        );
        assert_eq!(
            headers
                .get_all(identity::PEER_ADDR)
                .iter()
                .collect::<Vec<_>>(),
            ["10.0.0.7:41234"]
        );
        assert_eq!(headers[identity::POLICY_DIGEST], "ab12");
        assert_eq!(
            headers
                .get_all(identity::EVIDENCE_SHA256)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect::<Vec<_>>(),
            ["cd".repeat(32)],
            "the client's own evidence digest is replaced"
        );
        assert!(headers.get("x-attested-admin").is_none());
        assert!(headers.get("x-forwarded-for").is_none());
        assert_eq!(headers["content-type"], "application/grpc");
    }
}
