//! The audit record of one attestation decision.
//!
//! attest-proxy writes one [`Decision`] per node it accepts or rejects, as a single JSON line on
//! the tracing target [`TARGET`], so operators can route those lines to their own sink; each
//! record is a link of the process's hash chain ([`crate::audit_trail`]), which `attest-tool
//! audit verify` checks. The
//! operator CLI prints the same record ([`Decision::explain`]) when it verifies a saved document
//! offline. The record alone must let an operator of a rejected node tell why: it names the
//! failing check, the whole error chain, every mismatched measurement (enforced and warn-only)
//! with expected and actual values, the policy that decided, and a digest of the evidence.
//!
//! Evidence digest: SHA-256 of exactly the bytes that were judged, labelled by [`EvidenceKind`].
//! The proxy digests the client certificate's DER: it is available even when it does not parse,
//! and it covers the attestation document together with the key the document binds. The CLI,
//! which has only a saved document, digests the document bytes.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::{Error, MeasurementMismatch, Variant, Verified};

/// The tracing target audit lines are written to.
pub const TARGET: &str = "audit";

/// Accepted or rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    Rejected,
}

/// Whether a mismatched measurement rejects the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    Enforced,
    WarnOnly,
}

/// What the evidence digest was computed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    /// The aTLS client certificate, DER (which embeds the document).
    Certificate,
    /// The attestation document alone, as carried in the certificate extension.
    Document,
}

/// The evidence a decision was made on.
#[derive(Clone, Copy, Debug)]
pub enum Evidence<'a> {
    Certificate(&'a [u8]),
    Document(&'a [u8]),
}

/// SHA-256 of the judged bytes, lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceDigest {
    pub kind: EvidenceKind,
    pub sha256: String,
}

impl From<Evidence<'_>> for EvidenceDigest {
    fn from(evidence: Evidence<'_>) -> Self {
        let (kind, bytes) = match evidence {
            Evidence::Certificate(b) => (EvidenceKind::Certificate, b),
            Evidence::Document(b) => (EvidenceKind::Document, b),
        };
        Self {
            kind,
            sha256: hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)),
        }
    }
}

/// One measurement that differed from the policy. Values are lowercase hex; `actual` is `None`
/// when the evidence lacks the register.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasurementRecord {
    pub index: u32,
    pub enforcement: Enforcement,
    pub expected: String,
    pub actual: Option<String>,
}

impl From<&MeasurementMismatch> for MeasurementRecord {
    fn from(m: &MeasurementMismatch) -> Self {
        Self {
            index: m.index,
            enforcement: if m.warn_only {
                Enforcement::WarnOnly
            } else {
                Enforcement::Enforced
            },
            expected: hex::encode(&m.expected),
            actual: m.actual.as_deref().map(hex::encode),
        }
    }
}

/// Who was judged, under which policy, on what evidence.
#[derive(Clone, Debug)]
pub struct Subject<'a> {
    pub time: SystemTime,
    /// The node, as the caller knows it (the proxy: its TCP address; the CLI: the file name).
    pub peer: String,
    pub variant: Variant,
    /// The digest of the measurement policy in force ([`Policy::digest`](crate::Policy::digest)).
    pub policy: String,
    pub evidence: Evidence<'a>,
}

impl<'a> Subject<'a> {
    /// A subject judged now.
    pub fn now(
        peer: impl fmt::Display,
        variant: Variant,
        policy: impl Into<String>,
        evidence: Evidence<'a>,
    ) -> Self {
        Self {
            time: SystemTime::now(),
            peer: peer.to_string(),
            variant,
            policy: policy.into(),
            evidence,
        }
    }
}

/// One attestation decision, as logged and printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    pub peer: String,
    /// The variant's name, e.g. `qemu-vtpm`.
    pub variant: String,
    /// The digest of the measurement policy that decided.
    pub policy: String,
    pub result: Outcome,
    /// For a rejection: the name of the check that failed (see [`check_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// For a rejection: the error with every cause, outermost first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every measurement that differed from the policy, enforced and warn-only.
    pub measurements: Vec<MeasurementRecord>,
    /// What the hardware evidence established (product, TCB, signer, chip or CSP, policy bits)
    /// and what was only reported; empty for qemu-vtpm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub evidence: EvidenceDigest,
}

impl Decision {
    fn new(subject: Subject<'_>, result: Outcome, mismatches: &[MeasurementMismatch]) -> Self {
        Self {
            time: humantime::format_rfc3339_millis(subject.time).to_string(),
            peer: subject.peer,
            variant: subject.variant.name().to_owned(),
            policy: subject.policy,
            result,
            check: None,
            reason: None,
            measurements: mismatches.iter().map(MeasurementRecord::from).collect(),
            notes: Vec::new(),
            evidence: subject.evidence.into(),
        }
    }

    /// The node passed; its warn-only mismatches are recorded.
    pub fn accepted(subject: Subject<'_>, verified: &Verified) -> Self {
        let mut decision = Self::new(subject, Outcome::Accepted, &verified.warnings);
        decision.notes = verified.notes.clone();
        decision
    }

    /// The node was refused because of `error`. If an [`Error`] is anywhere in its chain, the
    /// check is named after it and its measurement mismatches are recorded; otherwise the check
    /// is `"evidence"` and a caller that knows better sets it with [`Decision::with_check`].
    pub fn rejected(subject: Subject<'_>, error: &(dyn std::error::Error + 'static)) -> Self {
        let attestation = find_attestation_error(error);
        let mismatches: Vec<MeasurementMismatch> = match attestation {
            Some(Error::Measurements {
                enforced,
                warn_only,
            }) => enforced.iter().chain(warn_only).cloned().collect(),
            _ => Vec::new(),
        };
        let mut decision = Self::new(subject, Outcome::Rejected, &mismatches);
        decision.check = Some(attestation.map_or("evidence", check_name).to_owned());
        decision.reason = Some(chain(error));
        decision
    }

    /// Names the failing check explicitly (for failures outside the validator, such as a
    /// malformed certificate or an overloaded verifier).
    pub fn with_check(mut self, check: impl Into<String>) -> Self {
        self.check = Some(check.into());
        self
    }

    /// The record as a JSON object, to be sealed into an audit chain
    /// ([`crate::audit_trail::Chain::seal`]).
    pub fn to_value(&self) -> serde_json::Value {
        // Plain strings, numbers and enums always serialize; should that ever change, the
        // readable form is kept rather than the record lost.
        serde_json::to_value(self).unwrap_or_else(
            |_| serde_json::json!({"result": self.result, "explained": self.explain().to_string()}),
        )
    }

    /// The record as one line of JSON.
    pub fn to_json_line(&self) -> String {
        // Serializing plain strings, numbers and enums cannot fail; fall back to the readable
        // form rather than losing the record should that ever change.
        serde_json::to_string(self)
            .unwrap_or_else(|_| self.explain().to_string().replace('\n', " | "))
    }

    /// The record for people: a headline and one line per detail, calling the peer a node.
    pub fn explain(&self) -> Explain<'_> {
        self.explain_as(Role::Node)
    }

    /// [`Decision::explain`] for a peer of `role` (a node checking the join service calls it
    /// the service).
    pub fn explain_as(&self, role: Role) -> Explain<'_> {
        Explain(self, role)
    }
}

/// What the peer a decision is about is, for its human-readable headline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A node asking to join (attest-proxy's decisions).
    Node,
    /// The join service, as a node checks it (join-client's decisions).
    Service,
}

/// Human-readable rendering of a [`Decision`]; see [`Decision::explain`].
#[derive(Debug)]
pub struct Explain<'a>(&'a Decision, Role);

impl fmt::Display for Explain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let role = match self.1 {
            Role::Node => "node",
            Role::Service => "service",
        };
        match d.result {
            Outcome::Accepted => write!(f, "ACCEPTED")?,
            Outcome::Rejected => write!(
                f,
                "REJECTED by check {}",
                d.check.as_deref().unwrap_or("evidence")
            )?,
        }
        writeln!(f, ": {} {role} {} at {}", d.variant, d.peer, d.time)?;
        writeln!(f, "  policy:   {}", d.policy)?;
        if let Some(reason) = &d.reason {
            writeln!(f, "  reason:   {reason}")?;
        }
        for m in &d.measurements {
            let enforcement = match m.enforcement {
                Enforcement::Enforced => "enforced",
                Enforcement::WarnOnly => "warn-only",
            };
            writeln!(f, "  measurement {} ({enforcement}):", m.index)?;
            writeln!(f, "    expected {}", m.expected)?;
            writeln!(
                f,
                "    actual   {}",
                m.actual.as_deref().unwrap_or("(missing from the evidence)")
            )?;
        }
        let kind = match d.evidence.kind {
            EvidenceKind::Certificate => "certificate",
            EvidenceKind::Document => "document",
        };
        write!(f, "  evidence: sha256 {} ({kind})", d.evidence.sha256)
    }
}

fn find_attestation_error<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<Error>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// An error with every cause it wraps, `outer: inner: innermost`: the innermost cause says
/// which PCR or which check, so logs and answers to nodes use this form too.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A stable, machine-readable name for the check `error` reports, for alerting and grouping.
/// Exhaustive on purpose: a new kind of rejection must get a name of its own.
pub fn check_name(error: &Error) -> &'static str {
    match error {
        Error::Malformed(_) => "document_malformed",
        Error::TooLarge { .. } => "document_too_large",
        Error::Json(_) => "document_json",
        Error::Missing(_) => "document_incomplete",
        Error::AkPublic(_) => "ak_format",
        Error::AkUnsuitable(_) => "ak_unsuitable",
        Error::UntrustedAk { .. } => "ak_untrusted",
        Error::Quote { .. } => "quote_format",
        Error::SignatureFormat { .. } => "signature_format",
        Error::NotTpmGenerated { .. } => "quote_not_tpm_generated",
        Error::NotAQuote { .. } => "quote_not_a_quote",
        Error::UnsupportedSignature { .. } => "signature_unsupported",
        Error::BadSignature { .. } => "quote_signature",
        Error::NonceMismatch { .. } => "nonce",
        Error::PcrSelection { .. } => "pcr_selection",
        Error::PcrDigest { .. } => "pcr_digest",
        Error::UnsupportedBank { .. } => "pcr_bank_unsupported",
        Error::DuplicateBank(_) => "pcr_bank_duplicate",
        Error::Sha1Only => "pcr_bank_sha1_only",
        Error::MissingBank(_) => "pcr_bank_missing",
        Error::EventLog(_) => "event_log_format",
        Error::EventLogMismatch { .. } => "event_log_replay",
        Error::Measurements { .. } => "measurements",
        Error::Snp(e) => snp_check_name(e),
        Error::SnpPolicy(e) => snp_policy_check_name(e),
        Error::Tdx(e) => tdx_check_name(e),
        Error::TdxPolicy(e) => tdx_policy_check_name(e),
        Error::Binding(_) => "hardware_binding",
        Error::GcePlatform(_) => "gce_platform",
        Error::CollateralUnavailable(_) => "collateral_unavailable",
        Error::AkCertificate(e) => ak_cert_check_name(e),
        Error::NitroDocument(e) => nitro_check_name(e),
    }
}

fn nitro_check_name(
    error: &crate::variants::aws_nitro_tpm::attestation_document::NitroDocError,
) -> &'static str {
    use crate::variants::aws_nitro_tpm::attestation_document::NitroDocError as E;
    match error {
        E::TooLarge { .. } | E::Cose(_) | E::Payload(_) | E::Digest(_) | E::Base64 => {
            "nitro_document_format"
        }
        E::Algorithm(_) => "nitro_document_algorithm",
        E::Certificate { .. } | E::Chain(_) => "nitro_document_chain",
        E::ForeignRoot { .. } => "nitro_document_root",
        E::Validity { .. } => "nitro_document_validity",
        E::Signature(_) => "nitro_document_signature",
        E::NonceMismatch => "nitro_document_nonce",
        E::AkNotBound { .. } => "nitro_document_ak_binding",
        E::PcrMismatch { .. } | E::PcrMissing { .. } => "nitro_document_pcrs",
        E::PolicyBank { .. } => "nitro_document_policy_bank",
        E::Required => "nitro_document_required",
    }
}

fn ak_cert_check_name(error: &crate::variants::azure_trustedlaunch::AkCertError) -> &'static str {
    use crate::variants::azure_trustedlaunch::AkCertError as E;
    match error {
        E::InstanceInfo(_) => "ak_cert_instance_info",
        E::Certificate { .. } => "ak_cert_format",
        E::Expired { .. } => "ak_cert_expired",
        E::UntrustedRoot(_) => "ak_cert_untrusted_root",
        E::Chain(_) => "ak_cert_chain",
        E::Usage(_) => "ak_cert_usage",
        E::KeyMismatch(_) => "ak_cert_key_mismatch",
    }
}

fn tdx_check_name(error: &crate::tdx::TdxError) -> &'static str {
    use crate::tdx::TdxError as E;
    match error {
        E::Quote(_) => "tdx_quote_format",
        E::QuoteSignature => "tdx_quote_signature",
        E::QeReportSignature | E::QeReportData => "tdx_qe_report",
        E::QeIdentity(_) => "tdx_qe_identity",
        E::Chain(_) | E::UntrustedRoot(_) => "tdx_chain",
        E::Revoked(_) => "tdx_revoked",
        E::Collateral(_) | E::TcbInfoSignature | E::QeIdentitySignature | E::FmspcMismatch => {
            "tdx_collateral"
        }
        E::NotCurrent { .. } => "tdx_collateral_not_current",
        E::UnknownPlatform(_) => "tdx_platform_unknown",
        E::NoTcbLevel(_) | E::TdxModule(_) | E::TcbRevoked => "tdx_tcb",
        E::Debug | E::Attributes(_) => "tdx_attributes",
        E::Other(_) => "tdx_other",
    }
}

fn tdx_policy_check_name(error: &crate::tdx::TdxPolicyError) -> &'static str {
    use crate::tdx::TdxPolicyError as E;
    match error {
        E::Debug | E::SeptVeDisable => "tdx_attributes",
        E::MrSeam(_) => "tdx_mrseam",
        E::Mrtd(_) => "tdx_mrtd",
        E::Status { .. } => "tdx_tcb_status",
        E::Svn { .. } | E::TeeTcbSvn { .. } => "tdx_svn",
        E::Mismatch { .. } => "tdx_td_report",
    }
}

fn snp_check_name(error: &crate::snp::SnpError) -> &'static str {
    use crate::snp::SnpError as E;
    match error {
        E::ReportLength(_) | E::ReportVersion(_) | E::ReportReserved(_) | E::ReportField(_) => {
            "snp_report_format"
        }
        E::ReportSignature => "snp_report_signature",
        E::InstanceInfo(_) => "snp_instance_info",
        E::Certificate(_) | E::Chain(_) | E::ChainSignature { .. } | E::SignerKind { .. } => {
            "snp_chain"
        }
        E::Expired { .. } => "snp_chain_validity",
        E::UntrustedRoot(_) => "snp_untrusted_root",
        E::Crl(_) | E::CrlNotCurrent { .. } => "snp_crl",
        E::Revoked { .. } => "snp_revoked",
        E::TcbMismatch { .. } => "snp_signer_tcb",
        E::ChipId => "snp_chip_id",
        E::ProductMismatch { .. } => "snp_product",
    }
}

fn snp_policy_check_name(error: &crate::snp::SnpPolicyError) -> &'static str {
    use crate::snp::SnpPolicyError as E;
    match error {
        E::Debug => "snp_policy_debug",
        E::MigrationAgent => "snp_policy_migration_agent",
        E::Smt => "snp_policy_smt",
        E::Vmpl(_) => "snp_vmpl",
        E::CurrentBelowCommitted { .. } => "snp_tcb_current_below_committed",
        E::TcbBelowMinimum { .. } => "snp_tcb_minimum",
        E::NoMinimumTcb(_) => "snp_tcb_no_minimum",
        E::Measurement(_) => "snp_launch_measurement",
        E::AuthorKeyDigest(_) => "snp_author_key_digest",
        E::HostData(_) => "snp_host_data",
        E::ChipId(_) => "snp_chip_id_allowed",
        E::IdKeyDigest(_) => "snp_id_key_digest",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[derive(Debug, thiserror::Error)]
    #[error("qemu-vtpm attestation document rejected")]
    struct Outer(#[source] Error);

    fn subject(evidence: &[u8]) -> Subject<'_> {
        Subject {
            time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            peer: "10.0.0.7:41234".to_owned(),
            variant: Variant::QemuVtpm,
            policy: "ab".repeat(32),
            evidence: Evidence::Certificate(evidence),
        }
    }

    fn mismatch(index: u32, warn_only: bool, actual: Option<u8>) -> MeasurementMismatch {
        MeasurementMismatch {
            index,
            expected: vec![0x11; 32],
            actual: actual.map(|b| vec![b; 32]),
            warn_only,
        }
    }

    #[test]
    fn rejection_names_check_and_every_mismatch() {
        let error = Outer(Error::Measurements {
            enforced: vec![mismatch(16, false, Some(0xee)), mismatch(17, false, None)],
            warn_only: vec![mismatch(9, true, Some(0xdd))],
        });
        let decision = Decision::rejected(subject(b"cert"), &error);
        let line = decision.to_json_line();
        assert!(!line.contains('\n'));
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(json["peer"], "10.0.0.7:41234");
        assert_eq!(json["variant"], "qemu-vtpm");
        assert_eq!(json["policy"], "ab".repeat(32));
        assert_eq!(json["result"], "rejected");
        assert_eq!(json["check"], "measurements");
        let reason = json["reason"].as_str().unwrap();
        assert!(reason.starts_with("qemu-vtpm attestation document rejected: measurements do not match the policy: measurement 16"), "{reason}");
        let m = json["measurements"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["index"], 16);
        assert_eq!(m[0]["enforcement"], "enforced");
        assert_eq!(m[0]["expected"], "11".repeat(32));
        assert_eq!(m[0]["actual"], "ee".repeat(32));
        assert_eq!(m[1]["index"], 17);
        assert!(m[1]["actual"].is_null());
        assert_eq!(m[2]["index"], 9);
        assert_eq!(m[2]["enforcement"], "warn_only");
        assert_eq!(m[2]["actual"], "dd".repeat(32));
        assert_eq!(json["evidence"]["kind"], "certificate");
        assert_eq!(
            json["evidence"]["sha256"],
            hex::encode(aws_lc_rs::digest::digest(
                &aws_lc_rs::digest::SHA256,
                b"cert"
            ))
        );
        // The line parses back into the same record (for tools reading audit logs).
        assert_eq!(serde_json::from_str::<Decision>(&line).unwrap(), decision);
    }

    #[test]
    fn acceptance_records_warn_only_mismatches() {
        let verified = Verified {
            variant: Variant::QemuVtpm,
            user_data: vec![],
            warnings: vec![mismatch(9, true, Some(0xdd))],
            notes: Vec::new(),
        };
        let decision = Decision::accepted(subject(b"cert"), &verified);
        assert_eq!(decision.result, Outcome::Accepted);
        assert_eq!(decision.check, None);
        assert_eq!(
            decision.measurements,
            vec![MeasurementRecord::from(&verified.warnings[0])]
        );
        let json: serde_json::Value = serde_json::from_str(&decision.to_json_line()).unwrap();
        assert!(json.get("check").is_none() && json.get("reason").is_none());
        assert_eq!(json["measurements"][0]["enforcement"], "warn_only");
    }

    #[test]
    fn other_failures_are_named_by_the_caller() {
        #[derive(Debug, thiserror::Error)]
        #[error("client certificate is not valid X.509")]
        struct BadCert;
        let decision = Decision::rejected(subject(b"x"), &BadCert);
        assert_eq!(decision.check.as_deref(), Some("evidence"));
        let decision = decision.with_check("certificate_malformed");
        assert_eq!(decision.check.as_deref(), Some("certificate_malformed"));
        assert_eq!(
            decision.reason.as_deref(),
            Some("client certificate is not valid X.509")
        );
        assert!(decision.measurements.is_empty());

        let nonce = Decision::rejected(
            subject(b"x"),
            &Outer(Error::NonceMismatch {
                index: 0,
                bank: crate::tpm::HashAlg::Sha256,
            }),
        );
        assert_eq!(nonce.check.as_deref(), Some("nonce"));
    }

    #[test]
    fn explanation_is_readable() {
        let error = Outer(Error::Measurements {
            enforced: vec![mismatch(16, false, None)],
            warn_only: vec![mismatch(9, true, Some(0xdd))],
        });
        let text = Decision::rejected(subject(b"cert"), &error)
            .explain()
            .to_string();
        let expected = format!(
            "REJECTED by check measurements: qemu-vtpm node 10.0.0.7:41234 at 2023-11-14T22:13:20.123Z\n  \
             policy:   {}\n",
            "ab".repeat(32)
        );
        assert!(text.starts_with(&expected), "{text}");
        assert!(text.contains(&format!(
            "  measurement 16 (enforced):\n    expected {}\n    actual   (missing from the evidence)\n",
            "11".repeat(32)
        )));
        assert!(text.contains(&format!(
            "  measurement 9 (warn-only):\n    expected {}\n    actual   {}\n",
            "11".repeat(32),
            "dd".repeat(32)
        )));
        assert!(text.ends_with("(certificate)"));
    }
}
