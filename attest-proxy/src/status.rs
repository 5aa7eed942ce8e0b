//! gRPC error answers the proxy gives on its own, as trailers-only responses.

use tonic::body::Body;

/// The response to send a node instead of forwarding its request.
pub fn respond(status: tonic::Status) -> http::Response<Body> {
    status.into_http()
}
