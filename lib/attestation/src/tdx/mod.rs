//! Intel TDX: the DCAP quote, Intel's collateral, and the checks that decide whether a quote was
//! made by a genuine TDX platform whose TCB the configuration accepts.
//!
//! Who checks what:
//! - [`quote`] reads the quote before anything is trusted, to find the collateral it needs: the
//!   header (version 4 or 5, ECDSA P-256 attestation key, TEE type TDX, Intel's QE vendor ID),
//!   the TD report (TDX 1.0 and 1.5 bodies), and the PCK certificate's FMSPC and issuing CA;
//!   [`TdQuote::verify_pck_signatures`] then checks the PCK certificate's signature by the PCK
//!   CA the quote carries and that CA's by the trusted root (aws-lc-rs, through x509-parser,
//!   each pair once per process), before the collateral for the FMSPC is looked up: only
//!   platforms Intel certified are asked of Intel's PCS, never one a node wrote into its quote;
//! - the `dcap-qvl` crate (pinned, on aws-lc-rs through `dcap.rs`, which remembers the
//!   signatures that verified) verifies, following Intel's QVL: the quote's
//!   signature by the attestation key; the QE report's signature by the PCK; QE REPORT_DATA =
//!   SHA-256(attestation key ‖ QE auth data); the PCK chain to the trusted root, with the root
//!   and PCK CRLs (signed by their issuers, within nextUpdate, every certificate's status known);
//!   TCB info and QE identity (signed by the TCB signing certificate, itself checked to the root;
//!   issueDate ≤ time ≤ nextUpdate); the QE report against the QE identity; the FMSPC of the TCB
//!   info against the PCK's; the TCB level by Intel's rule (tee_tcb_svn[0..1] are skipped when
//!   tee_tcb_svn[1] > 0 and judged by the `tdxModuleIdentities` entry `TDX_%02X`, whose MRSIGNER
//!   and attributes must match the TD report's SEAM signer and attributes), converged with the
//!   QE's status; a Revoked status is refused outright; TD attributes (DEBUG and profiling,
//!   migratable, reserved bits, SEPT_VE_DISABLE, service TDs) are refused, except that a TD
//!   without SEPT_VE_DISABLE gets its status from [`tcb`] and is left to the config to refuse;
//! - [`verify_quote`] checks what the crate leaves to its caller: the collateral's whole window
//!   (the crate does not hold the time against a CRL's thisUpdate), and it names the failed check
//!   as a [`TdxError`] rather than the crate's text;
//! - [`config`] reads the TDX settings of Constellation's attestation config and applies them to
//!   a [`VerifiedQuote`]: the accepted TCB statuses (UpToDate only unless configured, every
//!   advisory ID reported), `qeSVN`, `pceSVN`, `teeTCBSVN` minimums, `qeVendorID`, the MRSEAM
//!   and MRTD allow-lists, `xfam`, SEPT_VE_DISABLE (required except on azure-tdx), and DEBUG
//!   refused once more, independent of the crate.
//!
//! [`collateral`] holds Intel's collateral for one FMSPC and PCK CA, in the shape Intel PCS v4
//! serves it, and the [`TdxCollateral`] source a verifier asks for it.

pub mod collateral;
pub mod config;
mod dcap;
pub mod quote;
mod tcb;

pub use collateral::{Collateral, PckCa, StaticCollateral, TdxCollateral, TdxCollateralError};
pub use config::{TdxConfig, TdxConfigError, TdxPolicyError};
pub use quote::{TdQuote, TdReport};

pub use dcap_qvl::TcbStatus;
use dcap_qvl::verify::QuoteVerifier;
use x509_parser::prelude::FromDer as _;

/// Intel's QE vendor ID, the only one whose quoting enclave Intel's collateral describes.
pub const INTEL_QE_VENDOR_ID: [u8; 16] = [
    0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07,
];

/// Why a quote or its collateral was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TdxError {
    #[error("TDX quote: {0}")]
    Quote(String),
    #[error("the TDX quote's signature does not verify with its attestation key")]
    QuoteSignature,
    #[error("the QE report's signature does not verify with the PCK certificate")]
    QeReportSignature,
    #[error(
        "the QE report does not vouch for the attestation key (REPORT_DATA is not SHA-256 of the key and QE auth data)"
    )]
    QeReportData,
    #[error("the quoting enclave does not match Intel's QE identity: {0}")]
    QeIdentity(String),
    #[error("Intel certificate chain: {0}")]
    Chain(String),
    #[error("a certificate of the chain is revoked by Intel's CRL: {0}")]
    Revoked(String),
    #[error("the Intel root (SHA-256 {0}) is not one the configuration trusts")]
    UntrustedRoot(String),
    #[error("Intel collateral: {0}")]
    Collateral(String),
    /// Intel has no TCB info for the platform (FMSPC) of the quote's PCK certificate.
    #[error("{0}")]
    UnknownPlatform(String),
    #[error("Intel collateral is not current at the verification time {at}: {reason}")]
    NotCurrent { at: i64, reason: String },
    #[error("the TCB info's signature does not verify with the TCB signing certificate")]
    TcbInfoSignature,
    #[error("the QE identity's signature does not verify with the TCB signing certificate")]
    QeIdentitySignature,
    #[error("the TCB info is for another platform (FMSPC) than the PCK certificate")]
    FmspcMismatch,
    #[error("no TCB level of the TCB info is met by this platform: {0}")]
    NoTcbLevel(String),
    #[error("the TDX module does not match the TCB info's module identity: {0}")]
    TdxModule(String),
    #[error("the platform's TCB is Revoked")]
    TcbRevoked,
    #[error("the TD is a debug TD (TD attributes allow debugging)")]
    Debug,
    #[error("the TD's attributes are refused: {0}")]
    Attributes(String),
    #[error("TDX quote verification failed: {0}")]
    Other(String),
}

impl TdxError {
    /// Names a dcap-qvl failure. The crate reports `anyhow` text; the version is pinned and the
    /// tests drive each named case, so a changed message shows up as a failing test.
    fn from_dcap(error: &anyhow::Error) -> TdxError {
        let text = format!("{error:#}");
        let has = |s: &str| text.contains(s);
        if has("ISV enclave report signature is invalid") {
            TdxError::QuoteSignature
        } else if has("Signature is invalid for qe_report") {
            TdxError::QeReportSignature
        } else if has("QE report hash mismatch") {
            TdxError::QeReportData
        } else if has("Signature is invalid for tcb_info") {
            TdxError::TcbInfoSignature
        } else if has("Signature is invalid for qe_identity") {
            TdxError::QeIdentitySignature
        } else if has("issue date is in the future")
            || has("TCBInfo expired")
            || has("QE Identity expired")
        {
            TdxError::NotCurrent {
                at: 0,
                reason: text,
            }
        } else if has("CertRevoked") {
            TdxError::Revoked(text)
        } else if has("CertExpired") || has("CertNotValidYet") || has("CrlExpired") {
            TdxError::NotCurrent {
                at: 0,
                reason: text,
            }
        } else if has("Failed to parse root CA CRL")
            || has("Failed to verify certificate chain")
            || has("certificate")
        {
            TdxError::Chain(text)
        } else if has("Fmspc mismatch") {
            TdxError::FmspcMismatch
        } else if has("No matching TCB level") {
            TdxError::NoTcbLevel(text)
        } else if has("TDX module") {
            TdxError::TdxModule(text)
        } else if has("TCB status is invalid: Revoked") {
            TdxError::TcbRevoked
        } else if has("Debug mode is enabled") {
            TdxError::Debug
        } else if has("TD profiling")
            || has("TD attributes")
            || has("migration")
            || has("SERVTD")
            || has("SEPT_VE_DISABLE")
            || has("MR service TD")
        {
            TdxError::Attributes(text)
        } else if has("QE") {
            TdxError::QeIdentity(text)
        } else {
            TdxError::Other(text)
        }
    }
}

/// The Intel SGX root a verifier trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trust {
    root_der: Vec<u8>,
}

const BUILTIN_ROOT: &[u8] = include_bytes!("roots/intel-sgx-root-ca.der");

impl Trust {
    /// Intel's SGX Provisioning Certification Root CA (the production root that signs every
    /// PCK, TCB signing and CRL issuer chain).
    pub fn builtin() -> Trust {
        Trust {
            root_der: BUILTIN_ROOT.to_vec(),
        }
    }

    /// The root in `pem` (Constellation's `intelRootKey`): exactly one certificate.
    pub fn from_pem(pem: &[u8]) -> Result<Trust, TdxError> {
        let certs = crate::snp::certs_from_pem(pem)
            .map_err(|e| TdxError::Chain(format!("intelRootKey: {e}")))?;
        match certs.as_slice() {
            [root] => Ok(Trust {
                root_der: root.der().to_vec(),
            }),
            more => Err(TdxError::Chain(format!(
                "intelRootKey holds {} certificates, expected one",
                more.len()
            ))),
        }
    }

    pub fn root_der(&self) -> &[u8] {
        &self.root_der
    }

    /// SHA-256 of the root certificate, lowercase hex.
    pub fn fingerprint(&self) -> String {
        hex::encode(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            &self.root_der,
        ))
    }
}

/// A quote whose signatures, chain and collateral verified.
#[derive(Clone, Debug)]
pub struct VerifiedQuote {
    pub quote: TdQuote,
    /// The converged TCB status (platform, TDX module and QE).
    pub status: TcbStatus,
    /// Every advisory ID of the matched levels.
    pub advisory_ids: Vec<String>,
    /// The platform TCB level's status and date (converged with the TDX module's).
    pub platform_status: TcbStatus,
    pub tcb_date: String,
    /// The QE identity level's status.
    pub qe_status: TcbStatus,
    /// The collateral's window (seconds since the epoch): the latest issueDate or thisUpdate
    /// and the earliest nextUpdate of its items.
    pub window: (i64, i64),
    /// Set when the collateral was past its nextUpdate (the window's end) at verification
    /// time, yet within the staleness the caller allowed ([`verify_quote_within`]).
    pub stale: bool,
}

/// Accepts every verified quote: the decision is [`config::TdxConfig::check`]'s, on typed facts.
struct DecideLater;

impl dcap_qvl::Policy for DecideLater {
    fn validate(&self, _claims: &dcap_qvl::QuoteClaims) -> anyhow::Result<()> {
        Ok(())
    }
}

/// dcap-qvl's last check, refusing a TD without SEPT_VE_DISABLE (see [`tcb`]).
const SEPT_VE_REFUSAL: &str = "SEPT_VE_DISABLE is not enabled";

/// The signatures this process verified for TDX quotes, remembered so that the platform's and
/// Intel's (all but each quote's own) are verified once (see `dcap.rs`).
pub fn remembered_signatures() -> &'static crate::signature_memo::SignatureMemo {
    &dcap::SIGNATURES
}

/// Verifies `quote` with `collateral` up to the root `trust` names, at `at` (seconds since the
/// epoch). Every status but Revoked passes here; which statuses are accepted is the config's.
pub fn verify_quote(
    quote: &TdQuote,
    collateral: &Collateral,
    trust: &Trust,
    at: i64,
) -> Result<VerifiedQuote, TdxError> {
    verify_quote_within(quote, collateral, trust, at, 0)
}

/// [`verify_quote`], accepting collateral up to `max_stale` seconds past its nextUpdate: the
/// bounded staleness a collateral cache serves while Intel is unreachable, so that an outage of
/// the PCS does not refuse every node at the moment Intel's next issue was due.
///
/// dcap-qvl takes one time for everything, and refuses collateral past its nextUpdate. Stale
/// collateral is therefore evaluated at its last current second, and what that would leave
/// unchecked at the real time is checked here: every certificate (the quote's PCK chain and the
/// collateral's issuer chains) must be valid at `at`. What staleness gives up is only what a
/// newer issue would have said: a PCK revoked, or a TCB level demoted, since.
pub fn verify_quote_within(
    quote: &TdQuote,
    collateral: &Collateral,
    trust: &Trust,
    at: i64,
    max_stale: i64,
) -> Result<VerifiedQuote, TdxError> {
    if quote.fmspc() != collateral.fmspc() || quote.pck_ca() != collateral.ca() {
        return Err(TdxError::Collateral(format!(
            "the collateral is for FMSPC {} ({} CA), the quote's PCK for {} ({} CA)",
            hex::encode(collateral.fmspc()),
            collateral.ca(),
            hex::encode(quote.fmspc()),
            quote.pck_ca()
        )));
    }
    let window = (collateral.issued(), collateral.next_update());
    let not_current = || TdxError::NotCurrent {
        at,
        reason: if max_stale > 0 {
            format!(
                "the collateral is valid from {} to {}, and accepted {max_stale} s past that",
                rfc3339(window.0),
                rfc3339(window.1)
            )
        } else {
            format!(
                "the collateral is valid from {} to {}",
                rfc3339(window.0),
                rfc3339(window.1)
            )
        },
    };
    // The crate checks each item's expiry, and the TCB info's and QE identity's issue dates,
    // but not a CRL's thisUpdate: a CRL issued after the verification time cannot vouch for it.
    // At nextUpdate itself an item is no longer current (as webpki holds for CRLs).
    if at < window.0 || at >= window.1.saturating_add(max_stale.max(0)) {
        return Err(not_current());
    }
    let stale = at >= window.1;
    let evaluated_at = if stale {
        certificates_valid_at(quote, collateral, at)?;
        window.1 - 1
    } else {
        at
    };
    let now = u64::try_from(evaluated_at).map_err(|_| not_current())?;
    let verified = QuoteVerifier::<dcap::Backend>::new_with_config(trust.root_der().to_vec())
        .verify_with_policy(quote.bytes(), collateral.dcap(), now, &DecideLater);
    let (status, advisory_ids, platform_status, tcb_date, qe_status) = match verified {
        Ok(claims) => (
            claims.tcb.status,
            claims.tcb.advisory_ids,
            claims.platform.tcb_level.tcb_status,
            claims.platform.tcb_level.tcb_date,
            claims.qe.tcb_level.tcb_status,
        ),
        Err(e) if format!("{e:#}") == SEPT_VE_REFUSAL && quote.td().tee_tcb_svn2.is_none() => {
            let t = tcb::evaluate(quote, collateral)?;
            (
                t.status,
                t.advisory_ids,
                t.platform_status,
                t.tcb_date,
                t.qe_status,
            )
        }
        Err(e) => {
            return Err(match TdxError::from_dcap(&e) {
                TdxError::NotCurrent { reason, .. } => TdxError::NotCurrent {
                    at: evaluated_at,
                    reason,
                },
                TdxError::Chain(text)
                    if text.contains("UnknownIssuer") || text.contains("InvalidCrlSignature") =>
                {
                    TdxError::UntrustedRoot(trust.fingerprint())
                }
                other => other,
            });
        }
    };
    Ok(VerifiedQuote {
        quote: quote.clone(),
        status,
        advisory_ids,
        platform_status,
        tcb_date,
        qe_status,
        window,
        stale,
    })
}

/// Every certificate the verification rests on is valid at `at`: the quote's PCK chain and the
/// issuer chains of the collateral's items. (dcap-qvl checks them too, but at the time it is
/// given, which for stale collateral is earlier.)
fn certificates_valid_at(
    quote: &TdQuote,
    collateral: &Collateral,
    at: i64,
) -> Result<(), TdxError> {
    let when = x509_parser::time::ASN1Time::from_timestamp(at)
        .map_err(|e| TdxError::Collateral(format!("time {at}: {e}")))?;
    let parsed = dcap_qvl::quote::Quote::parse(quote.bytes())
        .map_err(|e| TdxError::Quote(format!("{e:#}")))?;
    let pck_chain = dcap_qvl::intel::extract_cert_chain(&parsed)
        .map_err(|e| TdxError::Quote(format!("no PCK certificate chain: {e:#}")))?;
    let mut ders: Vec<(&str, Vec<u8>)> = pck_chain
        .into_iter()
        .map(|der| ("the quote's PCK chain", der))
        .collect();
    let dcap = collateral.dcap();
    for (what, pem) in [
        ("the TCB info's issuer chain", &dcap.tcb_info_issuer_chain),
        (
            "the QE identity's issuer chain",
            &dcap.qe_identity_issuer_chain,
        ),
        ("the PCK CRL's issuer chain", &dcap.pck_crl_issuer_chain),
    ] {
        for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
            let block = block.map_err(|e| TdxError::Collateral(format!("{what}: {e}")))?;
            ders.push((what, block.contents));
        }
    }
    for (what, der) in &ders {
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|e| TdxError::Chain(format!("{what}: {e}")))?;
        if !cert.validity().is_valid_at(when) {
            return Err(TdxError::NotCurrent {
                at,
                reason: format!(
                    "a certificate in {what} ({}) is valid from {} to {}",
                    cert.subject(),
                    cert.validity().not_before,
                    cert.validity().not_after
                ),
            });
        }
    }
    Ok(())
}

/// A time for messages, RFC 3339 (UTC).
pub(crate) fn rfc3339(secs: i64) -> String {
    u64::try_from(secs)
        .ok()
        .map(|s| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(s),
            )
            .to_string()
        })
        .unwrap_or_else(|| secs.to_string())
}
