//! Client side: dial an aTLS server and attest to it.

use std::fmt;
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use attestation::Issuer;
use rustls::client::danger::{HandshakeSignatureValid, ServerIdentity, ServerVerifier};
use rustls::client::{ClientConfig, ClientCredentialResolver, CredentialRequest, Resumption};
use rustls::crypto::{
    CertificateIdentity, Credentials, CryptoProvider, Identity, SelectedCredential,
    SignatureScheme, VerifiedIdentity,
};
use rustls::enums::{ApplicationProtocol, CertificateType};
use rustls::error::{CertificateError, Error, PeerIncompatible};
use rustls::server::danger::SignatureVerificationInput;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{HandshakeError, ServerVerifyError};
use crate::extension::{AttestedCertificate, attested_certificate};
use crate::nonce;
use crate::server_evidence::ServerPolicy;
use crate::signature;
use crate::stream::TlsStream;
use crate::{ALPN_H2, ALPN_HTTP1, provider};

/// Produces the attested certificate once the server's nonce is known.
type MakeCertificate = dyn Fn(&[u8]) -> Result<AttestedCertificate, HandshakeError> + Send + Sync;

/// Where the credential callback leaves its error: rustls' callback can only say "no
/// certificate", and the caller deserves the real reason.
type FailureSlot = Arc<Mutex<Option<HandshakeError>>>;

/// Dials aTLS servers, presenting a certificate with a fresh attestation for each connection.
#[derive(Clone)]
pub struct Connector {
    provider: Arc<CryptoProvider>,
    make_certificate: Arc<MakeCertificate>,
    server_policy: Option<ServerPolicy>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector whose certificates carry documents from `issuer`.
    pub fn new(issuer: Arc<dyn Issuer>) -> Self {
        Self::with_certificate_maker(Arc::new(move |nonce: &[u8]| {
            attested_certificate(issuer.as_ref(), nonce)
        }))
    }

    /// Tests present deliberately broken certificates through this.
    pub(crate) fn with_certificate_maker(make_certificate: Arc<MakeCertificate>) -> Self {
        Self {
            provider: provider(),
            make_certificate,
            server_policy: None,
        }
    }

    /// Same connector, but the server must prove with evidence that `policy` accepts that it is
    /// the attested join service (ARCHITECTURE.md, "The service attests itself"). A server that
    /// fails is refused during the handshake, before this node sends its own certificate or any
    /// request byte, with [`HandshakeError::ServerRefused`].
    pub fn with_server_policy(mut self, policy: ServerPolicy) -> Self {
        self.server_policy = Some(policy);
        self
    }

    /// Whether this connector checks the server (see [`with_server_policy`](Self::with_server_policy)).
    pub fn verifies_server(&self) -> bool {
        self.server_policy.is_some()
    }

    /// Same connector, other crypto provider (tests restrict TLS versions this way).
    #[cfg(test)]
    pub(crate) fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Runs the aTLS handshake on `io`.
    ///
    /// Offers ALPN `h2` then `http/1.1` (as Constellation's client), TLS 1.2 and 1.3, never
    /// resumes a session, and sends no SNI.
    ///
    /// **Without a server policy the server is not authenticated.** Its certificate is accepted
    /// without any check beyond the TLS signature proving it holds the certificate's key; this
    /// matches Constellation's join flow, where only the client is attested. Do not send
    /// anything over such a stream that an impostor server must not see. With a policy
    /// ([`with_server_policy`](Self::with_server_policy)) the server's evidence is verified
    /// inside the handshake (on the same blocking terms as the issuer, below).
    ///
    /// **This blocks.** When the server's CertificateRequest arrives, the issuer runs inside
    /// the TLS state machine (a TPM quote can take a second or more). On a multi-thread tokio
    /// runtime that runs under `block_in_place`, so other tasks keep running on other workers;
    /// on a current-thread runtime it stalls the runtime for that long.
    ///
    /// Like any handshake, wrap it in a timeout.
    pub async fn connect<IO>(&self, io: IO) -> Result<TlsStream<IO>, HandshakeError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let failure = FailureSlot::default();
        let config = Arc::new(
            self.config(failure.clone())
                .map_err(HandshakeError::Config)?,
        );
        connect_with(config, io, &failure).await
    }

    /// The per-connection config: its credential callback reports to `failure`.
    pub(crate) fn config(&self, failure: FailureSlot) -> Result<ClientConfig, Error> {
        let resolver = Arc::new(AttestingResolver {
            provider: self.provider.clone(),
            make_certificate: self.make_certificate.clone(),
            failure: failure.clone(),
        });
        let mut config = ClientConfig::builder(self.provider.clone())
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServerCheck {
                provider: self.provider.clone(),
                policy: self.server_policy.clone(),
                failure,
            }))
            .with_client_credential_resolver(resolver)?;
        config.alpn_protocols = vec![
            ApplicationProtocol::from(ALPN_H2),
            ApplicationProtocol::from(ALPN_HTTP1),
        ];
        // A resumed session would carry no certificate and so no attestation; the server
        // refuses resumption anyway, this just avoids offering it.
        config.resumption = Resumption::disabled();
        config.enable_early_data = false;
        Ok(config)
    }
}

/// Runs a client handshake with `config`; errors from the credential callback take precedence
/// over the TLS failure they cause.
pub(crate) async fn connect_with<IO>(
    config: Arc<ClientConfig>,
    io: IO,
    failure: &FailureSlot,
) -> Result<TlsStream<IO>, HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    // An IP name makes rustls send no SNI (Go's server accepts that; its nonce-in-SNI is only
    // used for server attestation, which the join flow does not do). The server certificate is
    // not checked against any name, so the address itself is inert.
    let name = ServerName::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let mut client_hello = Vec::new();
    let conn = config
        .connect(name)
        .build(&mut client_hello)
        .map_err(HandshakeError::Config)?;
    let mut stream = TlsStream::new_client(io, conn, client_hello);
    let result = stream.handshake(true).await;
    // In TLS 1.3 the client finishes its side even after sending an empty Certificate, so the
    // callback's failure must be checked even when the handshake "succeeded".
    if let Some(error) = take_failure(failure) {
        return Err(error);
    }
    result?;
    Ok(stream)
}

fn take_failure(failure: &FailureSlot) -> Option<HandshakeError> {
    failure
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
}

/// Answers the server's CertificateRequest with a freshly attested certificate.
struct AttestingResolver {
    provider: Arc<CryptoProvider>,
    make_certificate: Arc<MakeCertificate>,
    failure: FailureSlot,
}

impl fmt::Debug for AttestingResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttestingResolver").finish_non_exhaustive()
    }
}

impl AttestingResolver {
    fn try_resolve(
        &self,
        request: &CredentialRequest<'_>,
    ) -> Result<SelectedCredential, HandshakeError> {
        let nonce = nonce::decode_from_hints(request.root_hint_subjects())?;
        let made = (self.make_certificate)(&nonce)?;
        let key = self
            .provider
            .key_provider
            .load_private_key(made.private_key)
            .map_err(HandshakeError::ClientKey)?;
        let identity = Identity::X509(CertificateIdentity::new(made.certificate, Vec::new()));
        // The key was generated for this certificate a moment ago; the checked constructor
        // would only repeat that (and needs rustls' webpki feature).
        Credentials::new_unchecked(Arc::new(identity), key)
            .signer(request.signature_schemes())
            .ok_or_else(|| {
                HandshakeError::ClientKey(PeerIncompatible::NoSignatureSchemesInCommon.into())
            })
    }
}

impl ClientCredentialResolver for AttestingResolver {
    fn resolve(&self, request: &CredentialRequest<'_>) -> Option<SelectedCredential> {
        match self.try_resolve(request) {
            Ok(credential) => Some(credential),
            Err(error) => {
                tracing::warn!(error = %error, "cannot answer the aTLS certificate request");
                // A server refusal recorded first is the more important news; keep it.
                self.failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .get_or_insert(error);
                None
            }
        }
    }

    fn supported_certificate_types(&self) -> &'static [CertificateType] {
        &[CertificateType::X509]
    }

    fn hash_config(&self, _h: &mut dyn Hasher) {
        // Only feeds session-cache keys; resumption is disabled.
    }
}

/// Without a policy, accepts any server certificate; with one, requires the server's evidence
/// to satisfy it. Either way it checks the handshake signature against the certificate, so the
/// TLS key schedule is bound to the key the server showed (which is what makes the evidence,
/// bound to that key, mean anything).
struct ServerCheck {
    provider: Arc<CryptoProvider>,
    policy: Option<ServerPolicy>,
    failure: FailureSlot,
}

impl fmt::Debug for ServerCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerCheck")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ServerCheck {
    fn refuse(&self, certificate: CertificateDer<'static>, error: ServerVerifyError) -> Error {
        tracing::warn!(check = error.check(), error = %attestation::audit::chain(&error), "refusing the server");
        // Overrides a credential failure: that the server is an impostor matters more.
        *self
            .failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(HandshakeError::ServerRefused {
                certificate: Box::new(certificate),
                source: Box::new(error),
            });
        CertificateError::ApplicationVerificationFailure.into()
    }
}

impl ServerVerifier for ServerCheck {
    fn verify_identity<'a>(
        &self,
        identity: &ServerIdentity<'a, '_>,
    ) -> Result<VerifiedIdentity<'a>, Error> {
        let Some(policy) = &self.policy else {
            return Ok(VerifiedIdentity::assertion(identity.identity.clone()));
        };
        let Identity::X509(certificate) = identity.identity else {
            return Err(PeerIncompatible::IncorrectCertificateTypeExtension.into());
        };
        let der = certificate.end_entity.as_ref();
        let now = UNIX_EPOCH + Duration::from_secs(identity.now.as_secs());
        match policy.verify(der, now) {
            Ok(_) => Ok(VerifiedIdentity::assertion(identity.identity.clone())),
            Err(error) => Err(self.refuse(CertificateDer::from(der.to_vec()), error)),
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

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        signature::supported_schemes(&self.provider)
    }

    fn request_ocsp_response(&self) -> bool {
        false
    }

    fn hash_config(&self, _h: &mut dyn Hasher) {
        // Only feeds session-cache keys; resumption is disabled.
    }
}
