//! Errors, one enum per layer: setting up an endpoint, the TLS handshake, verifying the peer's
//! evidence after the handshake.

use std::time::Duration;

use attestation::Variant;
use rustls_pki_types::CertificateDer;

use crate::server_evidence::Window;

/// An [`Acceptor`](crate::Acceptor) could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The server's self-signed certificate could not be generated.
    #[error("cannot generate the aTLS server certificate")]
    Certificate(#[source] rcgen::Error),
    /// rustls refused the generated key.
    #[error("cannot load the aTLS server key")]
    Key(#[source] rustls::Error),
    /// The window cannot be written as X.509 times.
    #[error("the validity window {0} cannot be encoded in a certificate")]
    Window(Window),
    /// The server key could not be certified.
    #[error("cannot certify the aTLS server key")]
    Certify(#[source] CertifyError),
    /// The vendor collateral cannot go into the certificate (too large).
    #[error("cannot attach the vendor collateral to the aTLS server certificate")]
    Collateral(#[source] crate::server_collateral::CollateralFormatError),
}

/// A certifier refused or failed to certify a server key.
#[derive(Debug, thiserror::Error)]
pub enum CertifyError {
    /// What was sent as the key is not a DER SubjectPublicKeyInfo.
    #[error("the key to certify is not a DER SubjectPublicKeyInfo")]
    MalformedKey,
    /// The window is empty, inverted or longer than the limit.
    #[error("validity window {window} is empty or longer than {}", humantime_secs(*limit))]
    WindowLength { window: Window, limit: Duration },
    /// The window does not start now, by the certifier's clock (within the back-dating and
    /// clock slack a server uses): certifying it would make evidence that looks fresher or
    /// lasts longer than it is.
    #[error("validity window {window} does not start now by the certifier's clock")]
    NotCurrent { window: Window },
    /// The attestation device failed.
    #[error("cannot produce the server evidence")]
    Issue(#[source] attestation::IssueError),
}

fn humantime_secs(duration: Duration) -> String {
    let seconds = duration.as_secs();
    format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60)
}

/// A TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading from or writing to the transport failed.
    #[error("I/O error during the aTLS handshake")]
    Io(#[source] std::io::Error),
    /// The peer closed the transport before the handshake finished.
    #[error("the peer closed the connection during the aTLS handshake")]
    UnexpectedEof,
    /// The TLS protocol failed (bad message, alert from the peer, bad signature, ...).
    #[error("TLS handshake failed")]
    Tls(#[source] rustls::Error),
    /// The per-connection TLS configuration could not be built.
    #[error("cannot build the per-connection TLS configuration")]
    Config(#[source] rustls::Error),
    /// The system random number generator failed while drawing a nonce.
    #[error("the system random number generator failed")]
    Random,
    /// Client: the server's CertificateRequest did not carry an aTLS nonce the way
    /// Constellation encodes it (one acceptable-CA name whose CommonName is base64).
    #[error("the server sent no usable aTLS nonce: {0}")]
    NoNonce(String),
    /// Client: the attestation issuer failed.
    #[error("cannot produce the attestation document")]
    Issue(#[source] attestation::IssueError),
    /// Client: the attested certificate could not be generated.
    #[error("cannot generate the attested client certificate")]
    Certificate(#[source] rcgen::Error),
    /// Client: rustls refused the generated key or no signature scheme fits it.
    #[error("cannot use the generated client key")]
    ClientKey(#[source] rustls::Error),
    /// Client: the server's certificate did not satisfy the node's service policy. The
    /// handshake stopped before the node sent its own certificate or any request byte.
    #[error("the server is not the attested join service: its certificate was refused")]
    ServerRefused {
        /// The certificate the server presented, DER (for the audit record).
        certificate: Box<CertificateDer<'static>>,
        #[source]
        source: Box<ServerVerifyError>,
    },
    /// Server: the handshake finished without a client certificate (rustls requires one, so
    /// this means a bug rather than a misbehaving peer).
    #[error("the client presented no certificate")]
    NoClientCertificate,
}

/// The peer's certificate or attestation was rejected after the handshake. Each variant names
/// the one check that failed, in words an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The certificate is larger than any legitimate aTLS certificate.
    #[error("client certificate of {size} bytes exceeds the limit of {limit} bytes")]
    CertificateTooLarge { size: usize, limit: usize },
    /// The certificate is not well-formed X.509 DER.
    #[error("client certificate is not valid X.509")]
    MalformedCertificate(#[source] x509_parser::error::X509Error),
    /// The certificate's validity period does not include the current time.
    #[error(
        "client certificate is not valid now (valid from {not_before} to {not_after}); check the node's clock"
    )]
    NotValidNow {
        not_before: String,
        not_after: String,
    },
    /// The certificate is signed with an algorithm we do not accept (e.g. SHA-1).
    #[error("client certificate is signed with the unaccepted algorithm {algorithm}")]
    WeakSelfSignature { algorithm: String },
    /// The certificate's self-signature does not verify with its own key.
    #[error("client certificate's self-signature does not verify")]
    BadSelfSignature(#[source] x509_parser::error::X509Error),
    /// The certificate carries no attestation of the expected variant.
    #[error(
        "client certificate carries no {expected} attestation (extension {}); {}",
        expected.oid_string(),
        describe_present(present)
    )]
    MissingAttestation {
        expected: Variant,
        /// The attestation extensions the certificate does carry, as dotted OIDs.
        present: Vec<String>,
    },
    /// The validator rejected the attestation document.
    #[error("{variant} attestation document rejected")]
    Attestation {
        variant: Variant,
        #[source]
        source: attestation::Error,
    },
    /// The validator reported a variant other than its own (a validator bug).
    #[error("validator for {expected} returned a result for {actual}")]
    VariantMismatch { expected: Variant, actual: Variant },
    /// The document is genuine but binds another key than the certificate's: it was made for
    /// a different certificate (a copied document).
    #[error(
        "attestation user data does not match the hash of the certificate's public key (document made for another key)"
    )]
    UserDataMismatch,
}

fn describe_present(present: &[String]) -> String {
    if present.is_empty() {
        return "it carries no attestation extension at all".to_owned();
    }
    let named: Vec<String> = present
        .iter()
        .map(|oid| match Variant::from_oid_string(oid) {
            Some(v) => format!("{v} ({oid})"),
            None => oid.clone(),
        })
        .collect();
    format!("it carries: {}", named.join(", "))
}

/// The server's certificate did not satisfy a node's service policy. Each variant names the one
/// check that failed; [`ServerVerifyError::check`] names it for audit records.
#[derive(Debug, thiserror::Error)]
pub enum ServerVerifyError {
    /// The certificate is larger than any legitimate aTLS certificate.
    #[error("server certificate of {size} bytes exceeds the limit of {limit} bytes")]
    CertificateTooLarge { size: usize, limit: usize },
    /// The certificate is not well-formed X.509 DER.
    #[error("server certificate is not valid X.509")]
    MalformedCertificate(#[source] x509_parser::error::X509Error),
    /// The certificate is signed with an algorithm we do not accept (e.g. SHA-1).
    #[error("server certificate is signed with the unaccepted algorithm {algorithm}")]
    WeakSelfSignature { algorithm: String },
    /// The certificate's self-signature does not verify with its own key.
    #[error("server certificate's self-signature does not verify")]
    BadSelfSignature(#[source] x509_parser::error::X509Error),
    /// Now is outside the certificate's window: its evidence expired (or the node's clock is
    /// wrong).
    #[error(
        "server certificate is not valid now (valid {window}); its evidence expired or the node's clock is wrong"
    )]
    NotValidNow { window: Window },
    /// The window is longer than a node accepts, so the evidence could be older than allowed.
    #[error("server certificate's validity window {window} is longer than {}", humantime_secs(*limit))]
    WindowTooLong { window: Window, limit: Duration },
    /// The certificate carries no evidence of the expected variant.
    #[error(
        "server certificate carries no {expected} evidence (extension {}); {}",
        expected.oid_string(),
        describe_present(present)
    )]
    MissingEvidence {
        expected: Variant,
        /// The attestation extensions the certificate does carry, as dotted OIDs.
        present: Vec<String>,
    },
    /// The certificate carries no vendor collateral, which a node needs to check SEV-SNP or
    /// TDX evidence (it does not reach AMD or Intel itself).
    #[error(
        "server certificate carries no {vendor} collateral (extension {}) for its {variant} evidence, and the node fetches none itself",
        crate::server_collateral::oid_string()
    )]
    MissingCollateral {
        variant: Variant,
        vendor: &'static str,
    },
    /// The collateral extension is malformed, too large, or another vendor's.
    #[error("server certificate's collateral for its {variant} evidence is unusable")]
    BadCollateral {
        variant: Variant,
        #[source]
        source: crate::server_collateral::CollateralFormatError,
    },
    /// The validator rejected the evidence (measurements, signatures, nonce, ...).
    #[error("server's {variant} evidence rejected")]
    Attestation {
        variant: Variant,
        #[source]
        source: attestation::Error,
    },
    /// The validator reported a variant other than its own (a validator bug).
    #[error("validator for {expected} returned a result for {actual}")]
    VariantMismatch { expected: Variant, actual: Variant },
    /// The evidence is genuine but certifies another key than the certificate's.
    #[error(
        "server evidence certifies another key than the certificate's (evidence copied from another certificate)"
    )]
    UserDataMismatch,
}

impl ServerVerifyError {
    /// A stable name for the failed check, as audit records name checks.
    pub fn check(&self) -> &'static str {
        match self {
            ServerVerifyError::CertificateTooLarge { .. } => "server_certificate_too_large",
            ServerVerifyError::MalformedCertificate(_) => "server_certificate_malformed",
            ServerVerifyError::WeakSelfSignature { .. }
            | ServerVerifyError::BadSelfSignature(_) => "server_self_signature",
            ServerVerifyError::NotValidNow { .. } => "server_evidence_expired",
            ServerVerifyError::WindowTooLong { .. } => "server_window_too_long",
            ServerVerifyError::MissingEvidence { .. } => "server_evidence_missing",
            ServerVerifyError::MissingCollateral { .. } => "server_collateral_missing",
            ServerVerifyError::BadCollateral { .. } => "server_collateral_malformed",
            ServerVerifyError::Attestation { source, .. } => attestation::audit::check_name(source),
            ServerVerifyError::VariantMismatch { .. } => "server_variant_mismatch",
            ServerVerifyError::UserDataMismatch => "server_key_mismatch",
        }
    }
}
