//! qemu-tdx and azure-tdx: Intel TDX quotes, verified with Intel's collateral.
//!
//! qemu-tdx is not a vTPM variant: the document is `{"RawQuote", "UserData"}` (Go
//! `encoding/json`, bytes standard base64); the quote verifies to Intel's root and the config
//! accepts it; its REPORT_DATA must be extraData (SHA-256 of UserData ‖ nonce) zero-padded to
//! 64 bytes; then MRTD and RTMR0..3 are compared with `measurements` at indices 0..4.
//!
//! azure-tdx is a vTPM variant, in the order of the trust chain as for azure-sev-snp: the vTPM
//! quotes verify with the document's AK; the TD quote in InstanceInfo
//! (`{"AttestationReport", "RuntimeData"}`) verifies to Intel's root and the config accepts it;
//! its REPORT_DATA[0:32] is SHA-256 of the HCL runtime data, whose `keys[0]` is that AK; and
//! only then are the quoted PCRs compared with `measurements`.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::policy::Policy;
use crate::snp::instance_info::check_azure_binding;
use crate::tdx::{
    TdQuote, TdxCollateral, TdxCollateralError, TdxConfig, TdxError, VerifiedQuote,
    verify_quote_within,
};
use crate::variants::sev_snp::{Clock, system_clock};
use crate::vtpm::{compare_pcrs, make_extra_data, verify_document};
use crate::{Error, Validator, Variant, Verified, tpm};

/// What an azure-tdx document without its TD quote is refused with.
const NO_TDX_EVIDENCE: &str = "the document has no InstanceInfo (TDX evidence)";

/// Which TDX variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TdxKind {
    /// `{"RawQuote", "UserData"}`; REPORT_DATA = extraData; MRTD and RTMRs are measured.
    Qemu,
    /// A vTPM document whose AK the TD quote vouches for through the HCL runtime data.
    Azure,
}

impl TdxKind {
    pub fn variant(self) -> Variant {
        match self {
            TdxKind::Qemu => Variant::QemuTdx,
            TdxKind::Azure => Variant::AzureTdx,
        }
    }
}

/// The largest qemu-tdx document or azure-tdx InstanceInfo accepted: a quote (at most
/// [`crate::tdx::quote::MAX_QUOTE`]) in base64, user data or runtime data of a few kilobytes.
pub const MAX_TDX_JSON: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct QemuDocument {
    #[serde(default, with = "crate::vtpm::document::b64")]
    raw_quote: Vec<u8>,
    #[serde(default, with = "crate::vtpm::document::b64")]
    user_data: Vec<u8>,
}

/// Constellation's azure-tdx `InstanceInfo`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AzureInstanceInfo {
    #[serde(default, with = "crate::vtpm::document::b64")]
    attestation_report: Vec<u8>,
    #[serde(default, with = "crate::vtpm::document::b64")]
    runtime_data: Vec<u8>,
}

fn too_large(size: usize) -> Result<(), Error> {
    if size > MAX_TDX_JSON {
        return Err(Error::TooLarge {
            size,
            limit: MAX_TDX_JSON,
        });
    }
    Ok(())
}

/// Parses a qemu-tdx document: the quote (parsed, not verified) and the user data.
pub fn parse_qemu_document(document: &[u8]) -> Result<(TdQuote, Vec<u8>), Error> {
    too_large(document.len())?;
    let doc: QemuDocument = serde_json::from_slice(document).map_err(|e| {
        Error::Malformed(format!(
            "not a qemu-tdx document {{RawQuote, UserData}}: {e}"
        ))
    })?;
    if doc.raw_quote.is_empty() {
        return Err(Error::Missing("the qemu-tdx document has no RawQuote"));
    }
    Ok((TdQuote::parse(&doc.raw_quote)?, doc.user_data))
}

/// Parses an azure-tdx InstanceInfo: the TD quote (parsed, not verified) and the runtime data.
pub fn parse_azure_instance_info(info: &[u8]) -> Result<(TdQuote, Vec<u8>), Error> {
    too_large(info.len())?;
    let info: AzureInstanceInfo = serde_json::from_slice(info).map_err(|e| {
        Error::Malformed(format!(
            "not an azure-tdx InstanceInfo {{AttestationReport, RuntimeData}}: {e}"
        ))
    })?;
    if info.attestation_report.is_empty() {
        return Err(Error::Missing("the InstanceInfo has no AttestationReport"));
    }
    if info.runtime_data.is_empty() {
        return Err(Error::Missing("the InstanceInfo has no RuntimeData"));
    }
    Ok((TdQuote::parse(&info.attestation_report)?, info.runtime_data))
}

/// The TD quote of a `kind` document, parsed, not verified.
fn quote_of_document(kind: TdxKind, document: &[u8]) -> Result<TdQuote, Error> {
    match kind {
        TdxKind::Qemu => Ok(parse_qemu_document(document)?.0),
        TdxKind::Azure => {
            let doc = crate::vtpm::document::AttestationDocument::parse(document)?;
            Ok(parse_azure_instance_info(doc.hardware_evidence(NO_TDX_EVIDENCE)?)?.0)
        }
    }
}

/// Takes from `collateral` what a verifier of `document` will ask it for: Intel's collateral
/// for the quote's FMSPC and PCK CA. Nothing is verified here: the service uses it to hand
/// nodes the collateral for its own document, and nodes verify it with the document.
pub fn collateral_for_document(
    kind: TdxKind,
    document: &[u8],
    collateral: &dyn TdxCollateral,
) -> Result<Arc<crate::tdx::Collateral>, Error> {
    let quote = quote_of_document(kind, document)?;
    collateral
        .collateral(quote.fmspc(), quote.pck_ca())
        .map_err(|e| Error::CollateralUnavailable(e.to_string()))
}

/// Validates the documents of a TDX variant.
#[derive(Clone)]
pub struct TdxValidator {
    kind: TdxKind,
    policy: Policy,
    tdx: TdxConfig,
    collateral: Arc<dyn TdxCollateral>,
    clock: Clock,
}

impl fmt::Debug for TdxValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TdxValidator")
            .field("kind", &self.kind)
            .field("policy", &self.policy)
            .field("tdx", &self.tdx)
            .field("collateral", &self.collateral)
            .finish_non_exhaustive()
    }
}

impl TdxValidator {
    pub fn new(
        kind: TdxKind,
        policy: Policy,
        tdx: TdxConfig,
        collateral: Arc<dyn TdxCollateral>,
    ) -> Self {
        TdxValidator {
            kind,
            policy,
            tdx,
            collateral,
            clock: system_clock(),
        }
    }

    /// The validator an attestation config describes: its measurements (at least one enforced)
    /// and its TDX settings as [`TdxConfig::for_variant`] reads them, with collateral from `collateral`. Returns it with the digest that
    /// covers everything it decides by.
    pub fn from_attestation_config(
        kind: TdxKind,
        json: &[u8],
        collateral: Arc<dyn TdxCollateral>,
    ) -> Result<(TdxValidator, String), crate::PolicyError> {
        let policy = Policy::enforcing_from_attestation_config(json)?;
        let tdx = TdxConfig::for_variant(kind.variant(), json, &policy)?;
        let digest = policy.digest_with(&tdx.canonical());
        Ok((TdxValidator::new(kind, policy, tdx, collateral), digest))
    }

    /// Verifies at the time `clock` gives instead of now (tests, offline verification).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The same validator over another collateral source.
    pub fn with_collateral(mut self, collateral: Arc<dyn TdxCollateral>) -> Self {
        self.collateral = collateral;
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Verifies `quote` with Intel's collateral for its platform and applies the TDX config.
    /// The PCK certificate is checked to the trusted root first, so the platform asked for is
    /// one Intel certified. Collateral that cannot be had now is `CollateralUnavailable` (the
    /// node retries); a platform Intel does not know is a refusal.
    pub fn verify_hardware(&self, quote: &TdQuote) -> Result<(VerifiedQuote, Vec<String>), Error> {
        // The FMSPC picks what is fetched from Intel: it must be Intel's (in a PCK certificate
        // signed up to the trusted root) before it is looked up, not any a node writes.
        quote.verify_pck_signatures(&self.tdx.trust)?;
        let collateral = self
            .collateral
            .collateral(quote.fmspc(), quote.pck_ca())
            .map_err(|e| match e {
                TdxCollateralError::Unavailable(e) => Error::CollateralUnavailable(e.to_string()),
                unknown @ TdxCollateralError::UnknownPlatform { .. } => {
                    Error::Tdx(TdxError::UnknownPlatform(unknown.to_string()))
                }
            })?;
        let verified = verify_quote_within(
            quote,
            &collateral,
            &self.tdx.trust,
            (self.clock)(),
            self.collateral.max_stale(),
        )?;
        let mut notes = self.tdx.check(&verified)?;
        if verified.stale {
            notes.push(format!(
                "Intel collateral past its nextUpdate {} (Intel unreachable; accepted for the cache's bounded staleness)",
                crate::tdx::rfc3339(verified.window.1)
            ));
        }
        Ok((verified, notes))
    }
}

/// The hardware facts the decision rests on, for the audit line.
pub fn facts(verified: &VerifiedQuote) -> String {
    let quote = &verified.quote;
    let td = quote.td();
    format!(
        "TDX quote v{}, FMSPC {} ({} CA), TEE_TCB_SVN {}, MRSEAM {}, TD attributes {}, XFAM {}, MRTD {}, QE SVN {}, PCE SVN {}{}",
        quote.version(),
        hex::encode(quote.fmspc()),
        quote.pck_ca(),
        hex::encode(td.tee_tcb_svn),
        hex::encode(td.mr_seam),
        hex::encode(td.td_attributes),
        hex::encode(td.xfam),
        hex::encode(td.mr_td),
        quote.qe_svn(),
        quote.pce_svn(),
        if quote.sept_ve_disable() {
            ""
        } else {
            ", SEPT_VE_DISABLE not set"
        },
    )
}

impl Validator for TdxValidator {
    fn variant(&self) -> Variant {
        self.kind.variant()
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        match self.kind {
            TdxKind::Qemu => {
                let (quote, user_data) = parse_qemu_document(document)?;
                let (verified, mut notes) = self.verify_hardware(&quote)?;
                let mut expected = [0u8; 64];
                expected[..32].copy_from_slice(&make_extra_data(&user_data, nonce));
                if !bool::from(quote.td().report_data.ct_eq(&expected)) {
                    return Err(Error::Binding(
                        "REPORT_DATA is not SHA-256(UserData ‖ nonce) zero-padded: the quote was not made for this connection".to_owned(),
                    ));
                }
                let (enforced, warnings) = self.policy.compare(&quote.td().measurements());
                if !enforced.is_empty() {
                    return Err(Error::Measurements {
                        enforced,
                        warn_only: warnings,
                    });
                }
                notes.insert(0, facts(&verified));
                Ok(Verified {
                    variant: self.variant(),
                    user_data,
                    warnings,
                    notes,
                })
            }
            TdxKind::Azure => {
                let (doc, quotes) = verify_document(document, nonce)?;
                let (quote, runtime) =
                    parse_azure_instance_info(doc.hardware_evidence(NO_TDX_EVIDENCE)?)?;
                let (verified, mut notes) = self.verify_hardware(&quote)?;
                let ak_pub = doc
                    .attestation
                    .as_ref()
                    .map(|a| a.ak_pub.as_slice())
                    .unwrap_or_default();
                let ak = tpm::Public::parse(ak_pub).map_err(Error::AkPublic)?;
                check_azure_binding(&quote.td().report_data, &runtime, &ak)?;
                let warnings = compare_pcrs(&self.policy, &quotes)?;
                notes.insert(0, facts(&verified));
                Ok(Verified {
                    variant: self.variant(),
                    user_data: doc.user_data.unwrap_or_default(),
                    warnings,
                    notes,
                })
            }
        }
    }
}
