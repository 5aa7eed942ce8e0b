//! Server side: accept aTLS connections and hand out the client's evidence for verification.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use attestation::{Validator, Variant, Verified};
use aws_lc_rs::rand::SystemRandom;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::compress::CompressionCache;
use rustls::crypto::SignatureScheme;
use rustls::crypto::VerifiedIdentity;
use rustls::crypto::{CryptoProvider, Identity};
use rustls::enums::ApplicationProtocol;
use rustls::error::{CertificateError, Error, PeerIncompatible};
use rustls::server::danger::{ClientIdentity, ClientVerifier, SignatureVerificationInput};
use rustls::server::{InvalidSniPolicy, NoServerSessionStorage, ServerConfig, Tls13Tickets};
use rustls::{Connection, DistinguishedName};
use rustls_pki_types::CertificateDer;
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncRead, AsyncWrite};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer as _;

use crate::error::{HandshakeError, SetupError, VerifyError};
use crate::extension::{attestation_oids, find_document, user_data_for_spki};
use crate::nonce::{self, NONCE_LEN};
use crate::server_evidence::{ServerCredential, ServerKey, Window};
use crate::signature;
use crate::stream::TlsStream;
use crate::{ALPN_H2, provider};

/// The largest client certificate [`PeerEvidence::verify`] parses. rustls already caps a
/// handshake message at 64 KiB; the explicit limit keeps the parser's input bounded even if
/// that changes. Constellation's largest documents (with event logs) fit well within it.
pub const MAX_CLIENT_CERTIFICATE_SIZE: usize = 64 * 1024;

/// The server certificate is never verified by aTLS clients beyond Go's parse-and-check-dates,
/// so it simply has to stay valid for the life of the process.
const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// Accepts aTLS connections: a fresh nonce per connection, client certificate required.
///
/// Build one per listener and share it; everything per connection is cheap (the server key,
/// certificate and crypto provider are shared).
pub struct Acceptor {
    provider: Arc<CryptoProvider>,
    /// Swapped whole by [`Acceptor::rotate`]; each connection clones the `Arc` it starts with.
    credential: RwLock<ServerCredential>,
    rng: SystemRandom,
    // Shared by every per-connection config so building one allocates as little as possible.
    no_sessions: Arc<NoServerSessionStorage>,
    no_compression_cache: Arc<CompressionCache>,
}

impl fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acceptor").finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Generates the server's self-signed ECDSA P-256 certificate, without evidence, and returns
    /// the acceptor. This is the server of a service that does not attest itself.
    pub fn new() -> Result<Self, SetupError> {
        // Go's client only parses the server certificate and checks its dates (no name, no
        // issuer), so it must be valid from before any plausible clock skew until well after
        // this process is gone.
        let now = SystemTime::now();
        // As before server attestation existed: the same span either side of now, so a node
        // whose clock is off by years still accepts it.
        let window = Window::around(now, SERVER_CERT_VALIDITY);
        Ok(Self::with_credential(
            ServerKey::generate(window)?.unattested()?,
        ))
    }

    /// An acceptor presenting `credential` (a certified key, see [`ServerKey`]) until
    /// [`rotate`](Self::rotate) replaces it.
    pub fn with_credential(credential: ServerCredential) -> Self {
        Self {
            provider: provider(),
            credential: RwLock::new(credential),
            rng: SystemRandom::new(),
            no_sessions: Arc::new(NoServerSessionStorage {}),
            no_compression_cache: Arc::new(CompressionCache::Disabled),
        }
    }

    /// Presents `credential` to every connection that starts from now on. A handshake already
    /// under way finishes with the credential it started with, and the previous certificate
    /// stays valid for its own window, so nodes connecting across a rotation are not refused.
    pub fn rotate(&self, credential: ServerCredential) {
        *self
            .credential
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = credential;
    }

    /// The credential new connections get.
    pub fn current(&self) -> ServerCredential {
        self.credential
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Runs the TLS handshake on `io` and returns the stream with the client's evidence.
    ///
    /// The evidence is *not yet verified*: the caller must run [`PeerEvidence::verify`] before
    /// trusting the peer, and should not serve anything but an error before it succeeds. The
    /// handshake does check that the client holds its certificate's key.
    ///
    /// There is no timeout here; wrap the call in one (`tokio::time::timeout`) so a silent
    /// client cannot hold a task forever.
    pub async fn accept<IO>(&self, io: IO) -> Result<(TlsStream<IO>, PeerEvidence), HandshakeError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let nonce = nonce::generate(&self.rng)?;
        let config = self.config_for(&nonce).map_err(HandshakeError::Config)?;
        let conn = Connection::new(config).map_err(HandshakeError::Config)?;
        let mut stream = TlsStream::new_server(io, conn);
        stream.handshake(false).await?;

        let certificate = stream
            .peer_end_entity()
            .ok_or(HandshakeError::NoClientCertificate)?;
        Ok((stream, PeerEvidence { nonce, certificate }))
    }

    /// A ServerConfig whose client verifier hints exactly this connection's nonce.
    fn config_for(&self, nonce: &[u8; NONCE_LEN]) -> Result<Arc<ServerConfig>, Error> {
        let verifier = Arc::new(NonceHintVerifier {
            hints: Arc::from([nonce::hint(nonce)]),
            provider: self.provider.clone(),
        });
        let mut config = ServerConfig::builder(self.provider.clone())
            .with_client_cert_verifier(verifier)
            .with_server_credential_resolver(self.current().single)?;
        config.alpn_protocols = vec![ApplicationProtocol::from(ALPN_H2)];
        // A Go node's SNI is base64 of its own nonce: not a host name. Ignore it (see crate docs).
        config.invalid_sni_policy = InvalidSniPolicy::IgnoreAll;
        // No resumption of any kind: a resumed session presents no certificate, so it would
        // skip attestation. No session cache, no ticketer, no TLS 1.3 tickets, no 0-RTT.
        config.session_storage = self.no_sessions.clone();
        config.ticketer = None;
        config.send_tls13_tickets = Tls13Tickets { default: 0, max: 0 };
        config.max_early_data_size = 0;
        config.cert_compression_cache = self.no_compression_cache.clone();
        Ok(Arc::new(config))
    }
}

/// What a client presented in the handshake, to be checked with [`PeerEvidence::verify`].
#[derive(Clone)]
pub struct PeerEvidence {
    nonce: [u8; NONCE_LEN],
    certificate: CertificateDer<'static>,
}

impl fmt::Debug for PeerEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerEvidence")
            .field("nonce", &nonce_hex(&self.nonce))
            .field("certificate_len", &self.certificate.as_ref().len())
            .finish()
    }
}

fn nonce_hex(nonce: &[u8]) -> String {
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

impl PeerEvidence {
    /// The nonce this connection sent to the client.
    pub fn nonce(&self) -> &[u8] {
        &self.nonce
    }

    /// The client's certificate, DER, as received (for audit logs).
    pub fn peer_certificate(&self) -> &CertificateDer<'static> {
        &self.certificate
    }

    /// The attestation document for `variant` the certificate carries and the user data it has
    /// to bind (SHA-256 of the certificate's SubjectPublicKeyInfo): what deciding on the
    /// document again later needs, with [`PeerEvidence::nonce`]. `None` when the certificate
    /// does not parse or carries no such document.
    pub fn document(&self, variant: Variant) -> Option<(Vec<u8>, [u8; 32])> {
        let der = self.certificate.as_ref();
        if der.len() > MAX_CLIENT_CERTIFICATE_SIZE {
            return None;
        }
        let cert = parse_certificate(der).ok()?;
        let document = find_document(&cert, variant)?.to_vec();
        Some((
            document,
            user_data_for_spki(cert.tbs_certificate.subject_pki.raw),
        ))
    }

    /// Checks the client's certificate and attestation. CPU-heavy: run it off the reactor.
    ///
    /// In order: the certificate parses (within [`MAX_CLIENT_CERTIFICATE_SIZE`]) and is valid
    /// now; its self-signature verifies; it carries an extension for `validator`'s variant; the
    /// validator accepts that document for this connection's nonce; and the document's user
    /// data equals SHA-256 of the certificate's SubjectPublicKeyInfo.
    pub fn verify(&self, validator: &dyn Validator) -> Result<Verified, VerifyError> {
        let der = self.certificate.as_ref();
        if der.len() > MAX_CLIENT_CERTIFICATE_SIZE {
            return Err(VerifyError::CertificateTooLarge {
                size: der.len(),
                limit: MAX_CLIENT_CERTIFICATE_SIZE,
            });
        }
        let cert = parse_certificate(der)?;

        // Go's `cert.Verify` checks the dates of the self-signed certificate; so do we.
        if !cert.validity().is_valid() {
            return Err(VerifyError::NotValidNow {
                not_before: cert.validity().not_before.to_string(),
                not_after: cert.validity().not_after.to_string(),
            });
        }
        check_self_signature(&cert)?;

        let variant = validator.variant();
        let document =
            find_document(&cert, variant).ok_or_else(|| VerifyError::MissingAttestation {
                expected: variant,
                present: attestation_oids(&cert),
            })?;
        let verified = validator
            .validate(document, &self.nonce)
            .map_err(|source| VerifyError::Attestation { variant, source })?;
        if verified.variant != variant {
            return Err(VerifyError::VariantMismatch {
                expected: variant,
                actual: verified.variant,
            });
        }

        let expected = user_data_for_spki(cert.tbs_certificate.subject_pki.raw);
        // Constant time, to leak nothing about how close a forged binding came.
        if !bool::from(verified.user_data.as_slice().ct_eq(&expected)) {
            return Err(VerifyError::UserDataMismatch);
        }
        Ok(verified)
    }
}

fn parse_certificate(der: &[u8]) -> Result<X509Certificate<'_>, VerifyError> {
    parse_der_certificate(der).map_err(VerifyError::MalformedCertificate)
}

/// Parses one DER certificate with nothing after it. Shared by both directions.
pub(crate) fn parse_der_certificate(
    der: &[u8],
) -> Result<X509Certificate<'_>, x509_parser::error::X509Error> {
    let (rest, cert) = X509Certificate::from_der(der).map_err(|e| match e {
        x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => e,
        x509_parser::nom::Err::Incomplete(_) => x509_parser::error::X509Error::InvalidCertificate,
    })?;
    if !rest.is_empty() {
        return Err(x509_parser::error::X509Error::InvalidCertificate);
    }
    Ok(cert)
}

/// The self-signature proves nothing about the machine (the attestation does that), but Go
/// checks it and a certificate that fails it is not something an honest node produces.
fn check_self_signature(cert: &X509Certificate<'_>) -> Result<(), VerifyError> {
    self_signature(cert).map_err(|e| match e {
        SelfSignatureError::Weak { algorithm } => VerifyError::WeakSelfSignature { algorithm },
        SelfSignatureError::Bad(e) => VerifyError::BadSelfSignature(e),
    })
}

/// Why a self-signature was not accepted; each direction words it for its own peer.
#[derive(Debug)]
pub(crate) enum SelfSignatureError {
    /// An algorithm Go refuses (SHA-1 RSA).
    Weak { algorithm: String },
    /// The signature does not verify with the certificate's own key.
    Bad(x509_parser::error::X509Error),
}

/// Checks a self-signature as Go's `cert.Verify` with the certificate as its own root would.
pub(crate) fn self_signature(cert: &X509Certificate<'_>) -> Result<(), SelfSignatureError> {
    // SHA-1 RSA signatures, which x509-parser still verifies for legacy use; Go rejects them.
    const WEAK: &[&str] = &["1.2.840.113549.1.1.5", "1.3.14.3.2.29"];
    let algorithm = cert.signature_algorithm.algorithm.to_id_string();
    if WEAK.contains(&algorithm.as_str()) {
        return Err(SelfSignatureError::Weak { algorithm });
    }
    cert.verify_signature(None).map_err(SelfSignatureError::Bad)
}

/// The per-connection client verifier: it advertises the nonce and checks the client's proof of
/// key possession. It deliberately accepts any certificate: attestation happens after the
/// handshake, in [`PeerEvidence::verify`].
#[derive(Debug)]
struct NonceHintVerifier {
    hints: Arc<[DistinguishedName]>,
    provider: Arc<CryptoProvider>,
}

impl ClientVerifier for NonceHintVerifier {
    fn verify_identity<'a>(
        &self,
        identity: &ClientIdentity<'a, '_>,
    ) -> Result<VerifiedIdentity<'a>, Error> {
        match identity.identity {
            Identity::X509(cert)
                if cert.end_entity.as_ref().len() > MAX_CLIENT_CERTIFICATE_SIZE =>
            {
                Err(CertificateError::BadEncoding.into())
            }
            Identity::X509(_) => Ok(VerifiedIdentity::assertion(identity.identity.clone())),
            _ => Err(PeerIncompatible::IncorrectCertificateTypeExtension.into()),
        }
    }

    fn verify_tls12_signature(
        &self,
        input: &SignatureVerificationInput<'_>,
    ) -> Result<HandshakeSignatureValid, Error> {
        signature::verify_tls12(input, &self.provider)
    }

    fn verify_tls13_signature(
        &self,
        input: &SignatureVerificationInput<'_>,
    ) -> Result<HandshakeSignatureValid, Error> {
        signature::verify_tls13(input, &self.provider)
    }

    fn root_hint_subjects(&self) -> Arc<[DistinguishedName]> {
        self.hints.clone()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn offer_client_auth(&self) -> bool {
        true
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        signature::supported_schemes(&self.provider)
    }
}
