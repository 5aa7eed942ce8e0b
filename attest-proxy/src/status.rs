//! gRPC error answers the proxy gives on its own, as trailers-only responses.

use tonic::body::Body;

/// The response to send a node instead of forwarding its request.
pub fn respond(status: tonic::Status) -> http::Response<Body> {
    status.into_http()
}

/// An error with every cause it wraps: the node and the log line both need the innermost reason
/// (which PCR, which check), not just the outermost layer.
pub use attestation::audit::chain;

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);
    #[derive(Debug, thiserror::Error)]
    #[error("inner detail")]
    struct Inner;

    #[test]
    fn chain_includes_every_cause() {
        assert_eq!(super::chain(&Outer(Inner)), "outer: inner detail");
    }
}
