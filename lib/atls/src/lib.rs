//! Attested TLS (aTLS), wire-compatible with Constellation's Go implementation
//! (`internal/atls`).
//!
//! # Where this sits
//!
//! A node that wants to join the cluster opens TLS to the join service (`:9090`). The
//! attest-proxy terminates that TLS with an [`Acceptor`]; the node side (our node client) dials
//! with a [`Connector`]. Everything after the handshake is plain HTTP/2 (gRPC).
//!
//! # The protocol
//!
//! aTLS binds an attestation statement to the TLS session of one connection:
//!
//! 1. Per connection the server draws a fresh 32-byte nonce and sends it inside the TLS
//!    `CertificateRequest`, as the only "acceptable CA" distinguished name: a DN whose
//!    CommonName is the standard base64 of the nonce ([`nonce`]). A client certificate is
//!    required.
//! 2. The client makes a fresh key pair and asks its attestation issuer (TPM, SEV-SNP, ...) for
//!    a document over `userData = SHA-256(DER SubjectPublicKeyInfo of that key)` and the nonce.
//!    It presents a self-signed certificate for the key that carries the document in one X.509
//!    extension whose OID names the attestation variant ([`extension`]).
//! 3. TLS itself proves that the client holds the certificate's key (`CertificateVerify`). The
//!    server then checks the self-signature, finds the extension of its variant, validates the
//!    document against the nonce, and requires the document's user data to equal the hash of
//!    the certificate key ([`PeerEvidence::verify`]). Key possession + key hash in the evidence
//!    + fresh nonce together mean: the attested machine is the TLS peer of *this* connection.
//!
//! In Constellation's join flow only the client is attested: the server's certificate is
//! self-signed and a Go node does not verify it, so the host, which controls the network, could
//! terminate a join itself and replace the disk key in the answer. [`server_evidence`] closes
//! that: the server presents a key certified with attestation evidence of the machine it runs on
//! (made once per key and rotated, not per connection), and a [`Connector`] given a
//! [`ServerPolicy`] refuses a server whose evidence does not satisfy it, inside the handshake.
//! Without a policy the client accepts any server, as Go nodes do.
//!
//! The handshake itself does no attestation work: [`Acceptor::accept`] returns the evidence and
//! the caller runs the CPU-heavy [`PeerEvidence::verify`] where it likes (a bounded blocking
//! pool) and answers failures on the gRPC layer, which tells the node far more than a TLS alert.
//!
//! Session resumption is disabled on both sides: a resumed session carries no certificate and
//! would skip attestation.
//!
//! # Why a pre-release rustls
//!
//! Constellation's Go client puts the standard base64 of its own random nonce into TLS SNI
//! (`+`, `/` and `=` included). That is not a valid host name, and rustls 0.23 rejects such a
//! ClientHello outright (`ServerNameMustContainOneHostName`), so a stock 0.23 server cannot talk
//! to a Go node at all. rustls 0.24 adds `ServerConfig::invalid_sni_policy =
//! InvalidSniPolicy::IgnoreAll`, but is only published as a pre-release (`=0.24.0-dev.2`), with
//! its aws-lc-rs provider in the separate `rustls-aws-lc-rs` crate.
//!
//! The trade-off: we pin an exact pre-release whose API still moves between dev releases, and
//! there is no tokio-rustls for it, so [`TlsStream`] is our own small async adapter over the
//! rustls connection. The pin is exact (`=`) so an update is a deliberate, reviewed change; the
//! adapter is confined to `stream.rs`. Once rustls 0.24 is released, this crate should move to
//! it (and possibly to tokio-rustls) without changing its public API. The rest of the workspace
//! (kube-rs) stays on rustls 0.23; both use aws-lc-rs.
//!
//! # Blocking
//!
//! [`attestation::Issuer::issue`] may block (a TPM quote takes a while) and is called from
//! inside the TLS state machine, during [`Connector::connect`]. See that method's docs.

#![forbid(unsafe_code)]

mod client;
mod der;
pub mod error;
pub mod extension;
pub mod nonce;
mod server;
pub mod server_collateral;
pub mod server_evidence;
mod signature;
mod stream;

#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

pub use client::Connector;
pub use error::{CertifyError, HandshakeError, ServerVerifyError, SetupError, VerifyError};
pub use server::{Acceptor, MAX_CLIENT_CERTIFICATE_SIZE, PeerEvidence};
pub use server_evidence::{ServerCredential, ServerKey, ServerPolicy, Window};
pub use stream::TlsStream;

/// The only ALPN protocol the server accepts: gRPC runs over HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// Offered by the client after `h2`, as Constellation's Go client does.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The workspace's one crypto provider (aws-lc-rs), built once and shared by every config.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls_aws_lc_rs::DEFAULT_PROVIDER))
        .clone()
}
