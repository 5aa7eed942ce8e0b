//! The service attests itself: a server key bound to attestation evidence of the machine it runs
//! on, and the node's check of it (ARCHITECTURE.md, "The service attests itself").
//!
//! Constellation's aTLS would quote the server's hardware once per connection, over the nonce a
//! client puts in its SNI. A TPM makes tens of quotes a second and a join storm needs thousands of
//! handshakes, so here evidence is made once per server key instead, and a key lives for a bounded
//! validity window:
//!
//! - `userData = SHA-256(DER SubjectPublicKeyInfo)`, exactly what aTLS binds for a client key;
//! - `nonce = SHA-256(DOMAIN ‖ SHA-256(SPKI) ‖ not_before ‖ not_after)` ([`server_evidence_nonce`]),
//!   the window as 8-byte big-endian Unix seconds, so the certificate's dates are attested too.
//!
//! The document sits in the certificate's extension of its variant's OID, as aTLS embeds every
//! document, and the certificate is valid for exactly that window. [`certify`] is what a
//! certifier runs (it computes both inputs itself and bounds the window); [`ServerKey`] is the
//! server's side; [`verify_server_certificate`] the node's. SEV-SNP and TDX evidence needs the
//! vendor's collateral, which the certificate carries beside it ([`crate::server_collateral`];
//! [`ServerPolicy::amd`], [`ServerPolicy::intel`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use attestation::variants::sev_snp::SevSnpValidator;
use attestation::variants::tdx::TdxValidator;
use attestation::{Issuer, Validator, Variant, Verified};
use aws_lc_rs::digest;
use rcgen::{KeyPair, PublicKeyData as _};
use rustls::crypto::{CertificateIdentity, Credentials, Identity, SingleCredential};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use crate::der::split_spki;
use crate::error::{CertifyError, ServerVerifyError, SetupError};
use crate::extension::{self, attestation_oids, find_document, user_data_for_spki};
use crate::provider;
use crate::server::{SelfSignatureError, parse_der_certificate, self_signature};
use crate::server_collateral::{
    CertificateSnpCollateral, CertificateTdxCollateral, CollateralFormatError, ServerCollateral,
    find_collateral,
};

/// Separates the server-evidence nonce from every other use of the attestation device: no
/// other nonce starts from these bytes through SHA-256.
pub const SERVER_EVIDENCE_DOMAIN: &[u8] = b"joinservice aTLS server evidence v1";

/// The longest validity window a node accepts, and a certifier certifies: it bounds how old
/// accepted evidence can be and how long a stolen server key stays usable.
pub const MAX_SERVER_WINDOW: Duration = Duration::from_secs(5 * 60 * 60);

/// How far a server certificate's window reaches back from its certification: Go's own aTLS
/// certificates allow two hours of clock skew, so a Go node that accepted Constellation's server
/// certificates accepts these.
pub const SERVER_BACKDATE: Duration = Duration::from_secs(2 * 60 * 60);

/// How far a server certificate's window reaches ahead of its certification. With hourly
/// rotation, the certificate in use always reaches at least two hours ahead of now.
pub const SERVER_AHEAD: Duration = Duration::from_secs(3 * 60 * 60);

/// Clock slack a certifier allows between the requester's clock and its own.
pub const CERTIFIER_CLOCK_SLACK: Duration = Duration::from_secs(60);

/// A certificate's validity window, in whole Unix seconds (what X.509 times can hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub not_before: i64,
    pub not_after: i64,
}

impl Window {
    /// The window a server certifies a new key for at `now`: [`SERVER_BACKDATE`] before it to
    /// [`SERVER_AHEAD`] after it.
    pub fn for_rotation_at(now: SystemTime) -> Window {
        let now = unix_seconds(now);
        Window {
            not_before: now.saturating_sub(duration_seconds(SERVER_BACKDATE)),
            not_after: now.saturating_add(duration_seconds(SERVER_AHEAD)),
        }
    }

    /// From `span` before `now` to `span` after it.
    pub fn around(now: SystemTime, span: Duration) -> Window {
        let (now, span) = (unix_seconds(now), duration_seconds(span));
        Window {
            not_before: now.saturating_sub(span),
            not_after: now.saturating_add(span),
        }
    }

    /// Length in seconds (negative for an inverted window).
    pub fn length_seconds(&self) -> i64 {
        self.not_after.saturating_sub(self.not_before)
    }

    /// Whether `now` lies inside the window (both ends included, as X.509 has it).
    pub fn contains(&self, now: SystemTime) -> bool {
        let now = unix_seconds(now);
        self.not_before <= now && now <= self.not_after
    }

    fn offset_date_times(&self) -> Result<(OffsetDateTime, OffsetDateTime), SetupError> {
        let convert = |seconds: i64| {
            OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| SetupError::Window(*self))
        };
        Ok((convert(self.not_before)?, convert(self.not_after)?))
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |seconds: i64| {
            OffsetDateTime::from_unix_timestamp(seconds)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| format!("@{seconds}"))
        };
        write!(f, "{} to {}", show(self.not_before), show(self.not_after))
    }
}

/// Unix seconds of `time`, negative before 1970.
fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs())
            .map(|s| -s)
            .unwrap_or(i64::MIN),
    }
}

fn duration_seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// The nonce server evidence is issued over, for a key and its certificate's window.
pub fn server_evidence_nonce(spki_der: &[u8], window: Window) -> [u8; 32] {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(SERVER_EVIDENCE_DOMAIN);
    context.update(&user_data_for_spki(spki_der));
    context.update(&window.not_before.to_be_bytes());
    context.update(&window.not_after.to_be_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

/// What a certifier does for one request: checks that `spki_der` is a SubjectPublicKeyInfo and
/// that `window` is current by its own clock (`now`) and no longer than [`MAX_SERVER_WINDOW`],
/// then asks `issuer` for a document over the key's hash and the window's nonce. Neither input
/// of the issuer comes from the caller, so the device certifies keys and nothing else.
///
/// `issuer.issue` may block (a TPM quote).
pub fn certify(
    issuer: &dyn Issuer,
    spki_der: &[u8],
    window: Window,
    now: SystemTime,
) -> Result<Vec<u8>, CertifyError> {
    if split_spki(spki_der).is_none() {
        return Err(CertifyError::MalformedKey);
    }
    let limit = duration_seconds(MAX_SERVER_WINDOW);
    if window.length_seconds() <= 0 || window.length_seconds() > limit {
        return Err(CertifyError::WindowLength {
            window,
            limit: MAX_SERVER_WINDOW,
        });
    }
    let now_seconds = unix_seconds(now);
    let slack = duration_seconds(CERTIFIER_CLOCK_SLACK);
    let earliest = now_seconds
        .saturating_sub(duration_seconds(SERVER_BACKDATE))
        .saturating_sub(slack);
    if window.not_before < earliest || window.not_before > now_seconds.saturating_add(slack) {
        return Err(CertifyError::NotCurrent { window });
    }
    issuer
        .issue(
            &user_data_for_spki(spki_der),
            &server_evidence_nonce(spki_der, window),
        )
        .map_err(CertifyError::Issue)
}

/// A fresh server key for one window, before it is certified.
pub struct ServerKey {
    key: KeyPair,
    spki: Vec<u8>,
    window: Window,
}

impl fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerKey")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl ServerKey {
    /// Generates an ECDSA P-256 key (as Constellation's aTLS does) for `window`.
    pub fn generate(window: Window) -> Result<ServerKey, SetupError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(SetupError::Certificate)?;
        let spki = key.subject_public_key_info();
        Ok(ServerKey { key, spki, window })
    }

    /// The DER SubjectPublicKeyInfo to have certified.
    pub fn spki(&self) -> &[u8] {
        &self.spki
    }

    /// The window the certificate will be valid for.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Certifies the key in process with `issuer` (tests, and setups where the server itself may
    /// reach the device) and builds the credential.
    pub fn certify_with(
        self,
        issuer: &dyn Issuer,
        now: SystemTime,
    ) -> Result<ServerCredential, SetupError> {
        let document =
            certify(issuer, &self.spki, self.window, now).map_err(SetupError::Certify)?;
        self.with_evidence(issuer.variant(), document)
    }

    /// Builds the credential from a document a certifier returned for this key and window.
    pub fn with_evidence(
        self,
        variant: Variant,
        document: Vec<u8>,
    ) -> Result<ServerCredential, SetupError> {
        self.credential(Some((variant, document)), None)
    }

    /// [`ServerKey::with_evidence`], with the vendor collateral a node needs to check the
    /// document (SEV-SNP and TDX) in the certificate's collateral extension.
    pub fn with_evidence_and_collateral(
        self,
        variant: Variant,
        document: Vec<u8>,
        collateral: &ServerCollateral,
    ) -> Result<ServerCredential, SetupError> {
        let collateral = collateral.encode().map_err(SetupError::Collateral)?;
        self.credential(Some((variant, document)), Some(collateral))
    }

    /// Builds a credential without evidence: what a server without an attestation configuration
    /// (or whose certifier is unreachable) presents. Go nodes accept it; nodes with a service
    /// policy refuse it.
    pub fn unattested(self) -> Result<ServerCredential, SetupError> {
        self.credential(None, None)
    }

    fn credential(
        self,
        attestation: Option<(Variant, Vec<u8>)>,
        collateral: Option<Vec<u8>>,
    ) -> Result<ServerCredential, SetupError> {
        let variant = attestation.as_ref().map(|(variant, _)| *variant);
        let (not_before, not_after) = self.window.offset_date_times()?;
        let certificate =
            extension::self_signed_for(&self.key, attestation, collateral, not_before, not_after)
                .map_err(SetupError::Certificate)?;
        let signing_key = provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                self.key.serialize_der(),
            )))
            .map_err(SetupError::Key)?;
        let identity = Identity::X509(CertificateIdentity::new(certificate.clone(), Vec::new()));
        // `new_unchecked`: the checked constructor needs rustls' webpki feature only to compare
        // the key with the certificate we generated from that very key a moment ago.
        let credentials = Credentials::new_unchecked(Arc::new(identity), signing_key);
        Ok(ServerCredential {
            single: Arc::new(SingleCredential::from(credentials)),
            certificate,
            window: self.window,
            variant,
        })
    }
}

/// A server key with its certificate, ready for [`Acceptor::rotate`](crate::Acceptor::rotate).
#[derive(Clone)]
pub struct ServerCredential {
    pub(crate) single: Arc<SingleCredential>,
    certificate: CertificateDer<'static>,
    window: Window,
    variant: Option<Variant>,
}

impl fmt::Debug for ServerCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerCredential")
            .field("window", &self.window)
            .field("variant", &self.variant)
            .finish_non_exhaustive()
    }
}

impl ServerCredential {
    /// The certificate the server presents.
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.certificate
    }

    /// Its validity window.
    pub fn window(&self) -> Window {
        self.window
    }

    /// The variant of the evidence it carries, `None` without evidence.
    pub fn variant(&self) -> Option<Variant> {
        self.variant
    }
}

/// What a node requires of the server: evidence that its validator accepts.
#[derive(Clone)]
pub struct ServerPolicy {
    check: Check,
}

/// How the node gets the validator for one certificate.
#[derive(Clone)]
enum Check {
    /// The same validator for every certificate (qemu-vtpm: nothing from a vendor is needed).
    Fixed(Arc<dyn Validator>),
    /// An SEV-SNP validator whose AMD collateral comes from the certificate.
    Amd {
        validator: Arc<SevSnpValidator>,
        max_stale: Duration,
    },
    /// A TDX validator whose Intel collateral comes from the certificate.
    Intel {
        validator: Arc<TdxValidator>,
        max_stale: Duration,
    },
}

impl fmt::Debug for ServerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("ServerPolicy");
        out.field("variant", &self.variant());
        match &self.check {
            Check::Fixed(_) => {}
            Check::Amd { max_stale, .. } | Check::Intel { max_stale, .. } => {
                out.field("collateral_max_stale", max_stale);
            }
        }
        out.finish()
    }
}

impl ServerPolicy {
    /// Requires server evidence that `validator` accepts, with whatever collateral source it
    /// was built with.
    pub fn new(validator: Arc<dyn Validator>) -> Self {
        Self {
            check: Check::Fixed(validator),
        }
    }

    /// Requires SEV-SNP server evidence that `validator` accepts with the AMD collateral the
    /// server's certificate carries ([`crate::server_collateral`]), its CRL accepted at most
    /// `max_stale` past its `nextUpdate`.
    pub fn amd(validator: SevSnpValidator, max_stale: Duration) -> Self {
        Self {
            check: Check::Amd {
                validator: Arc::new(validator),
                max_stale,
            },
        }
    }

    /// Requires TDX server evidence that `validator` accepts with the Intel collateral the
    /// server's certificate carries, accepted at most `max_stale` past its `nextUpdate`.
    pub fn intel(validator: TdxValidator, max_stale: Duration) -> Self {
        Self {
            check: Check::Intel {
                validator: Arc::new(validator),
                max_stale,
            },
        }
    }

    /// The variant the server must attest with.
    pub fn variant(&self) -> Variant {
        match &self.check {
            Check::Fixed(validator) => validator.variant(),
            Check::Amd { validator, .. } => validator.variant(),
            Check::Intel { validator, .. } => validator.variant(),
        }
    }

    /// See [`verify_server_certificate`]; for SEV-SNP and TDX, the validator takes its vendor
    /// collateral from the certificate, which must carry it.
    pub fn verify(&self, der: &[u8], now: SystemTime) -> Result<Verified, ServerVerifyError> {
        let variant = self.variant();
        verify_certificate(der, variant, now, &|cert| match &self.check {
            Check::Fixed(validator) => Ok(Chosen::Borrowed(validator.as_ref())),
            Check::Amd {
                validator,
                max_stale,
            } => match certificate_collateral(cert, variant, "AMD")? {
                ServerCollateral::Amd(collateral) => {
                    let source = CertificateSnpCollateral::new(collateral, *max_stale);
                    Ok(Chosen::Built(Box::new(
                        SevSnpValidator::clone(validator).with_collateral(Arc::new(source)),
                    )))
                }
                ServerCollateral::Intel(_) => Err(wrong_vendor(variant, "Intel")),
            },
            Check::Intel {
                validator,
                max_stale,
            } => match certificate_collateral(cert, variant, "Intel")? {
                ServerCollateral::Intel(collateral) => {
                    let source = CertificateTdxCollateral::new(collateral, *max_stale);
                    Ok(Chosen::Built(Box::new(
                        TdxValidator::clone(validator).with_collateral(Arc::new(source)),
                    )))
                }
                ServerCollateral::Amd(_) => Err(wrong_vendor(variant, "AMD")),
            },
        })
    }
}

/// The collateral extension of `cert`, decoded; its absence is a refusal of its own.
fn certificate_collateral(
    cert: &X509Certificate<'_>,
    variant: Variant,
    vendor: &'static str,
) -> Result<ServerCollateral, ServerVerifyError> {
    let bytes =
        find_collateral(cert).ok_or(ServerVerifyError::MissingCollateral { variant, vendor })?;
    ServerCollateral::decode(bytes)
        .map_err(|source| ServerVerifyError::BadCollateral { variant, source })
}

fn wrong_vendor(variant: Variant, carried: &str) -> ServerVerifyError {
    ServerVerifyError::BadCollateral {
        variant,
        source: CollateralFormatError(format!(
            "it holds {carried} collateral, which cannot vouch for {variant} evidence"
        )),
    }
}

/// The node's check of a server certificate, in order: it parses (within
/// [`MAX_CLIENT_CERTIFICATE_SIZE`](crate::MAX_CLIENT_CERTIFICATE_SIZE), the same bound as a
/// client's); its self-signature verifies; it carries an extension of `validator`'s variant;
/// `now` lies in its window; the window is no longer than [`MAX_SERVER_WINDOW`]; (for
/// [`ServerPolicy::amd`] and [`ServerPolicy::intel`]: it carries that vendor's collateral, which
/// becomes the validator's source;) the validator accepts that document for the nonce of the
/// certificate's key and window; and the document's user data is SHA-256 of the certificate's
/// key. TLS itself proves the server holds that key.
pub fn verify_server_certificate(
    der: &[u8],
    validator: &dyn Validator,
    now: SystemTime,
) -> Result<Verified, ServerVerifyError> {
    verify_certificate(der, validator.variant(), now, &|_| {
        Ok(Chosen::Borrowed(validator))
    })
}

/// The validator for one certificate: the node's own, or one built over the collateral the
/// certificate carries.
enum Chosen<'v> {
    Borrowed(&'v dyn Validator),
    Built(Box<dyn Validator>),
}

impl Chosen<'_> {
    fn get(&self) -> &dyn Validator {
        match self {
            Chosen::Borrowed(validator) => *validator,
            Chosen::Built(validator) => validator.as_ref(),
        }
    }
}

type ValidatorFor<'a, 'v> =
    dyn Fn(&X509Certificate<'_>) -> Result<Chosen<'v>, ServerVerifyError> + 'a;

/// [`verify_server_certificate`] with the validator chosen once the certificate's window is
/// checked, so a certificate is judged on its evidence only when it is current.
fn verify_certificate(
    der: &[u8],
    variant: Variant,
    now: SystemTime,
    validator_for: &ValidatorFor<'_, '_>,
) -> Result<Verified, ServerVerifyError> {
    if der.len() > crate::MAX_CLIENT_CERTIFICATE_SIZE {
        return Err(ServerVerifyError::CertificateTooLarge {
            size: der.len(),
            limit: crate::MAX_CLIENT_CERTIFICATE_SIZE,
        });
    }
    let cert = parse_der_certificate(der).map_err(ServerVerifyError::MalformedCertificate)?;
    self_signature(&cert).map_err(|e| match e {
        SelfSignatureError::Weak { algorithm } => {
            ServerVerifyError::WeakSelfSignature { algorithm }
        }
        SelfSignatureError::Bad(e) => ServerVerifyError::BadSelfSignature(e),
    })?;

    // A certificate without evidence is the common refusal (an unattested service, an
    // impostor); say that before anything about its dates.
    let document =
        find_document(&cert, variant).ok_or_else(|| ServerVerifyError::MissingEvidence {
            expected: variant,
            present: attestation_oids(&cert),
        })?;
    let window = Window {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    };
    if !window.contains(now) {
        return Err(ServerVerifyError::NotValidNow { window });
    }
    if window.length_seconds() > duration_seconds(MAX_SERVER_WINDOW) {
        return Err(ServerVerifyError::WindowTooLong {
            window,
            limit: MAX_SERVER_WINDOW,
        });
    }

    let validator = validator_for(&cert)?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    let verified = validator
        .get()
        .validate(document, &server_evidence_nonce(spki, window))
        .map_err(|source| ServerVerifyError::Attestation { variant, source })?;
    if verified.variant != variant {
        return Err(ServerVerifyError::VariantMismatch {
            expected: variant,
            actual: verified.variant,
        });
    }
    // Constant time, to leak nothing about how close a forged binding came.
    if !bool::from(
        verified
            .user_data
            .as_slice()
            .ct_eq(&user_data_for_spki(spki)),
    ) {
        return Err(ServerVerifyError::UserDataMismatch);
    }
    Ok(verified)
}
