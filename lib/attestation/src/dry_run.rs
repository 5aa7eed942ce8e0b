//! A dry run: a new policy tried on kept evidence ([`crate::evidence`]) before it is enforced.
//!
//! Every kept record of the validator's variant is decided again by the new policy's validator
//! ([`Record::redecide`]), and each decision is an ordinary audit record ([`Decision`]): the
//! check that would fail, the reason, every differing measurement, named as the audit line
//! names them. The record's evidence digest is kept, so a refusal here points at the audit line
//! of the original decision. `attest-tool dry-run`, attest-proxy's `POST /dry-run` and its
//! held reload all use [`run`].
//!
//! Decisions are made now, with the validator's clock and collateral: a dry run answers "what
//! if these nodes joined now under this policy", so a raised minimum TCB, a revocation or
//! expired collateral all show. The certificate checks (self-signature, validity dates) are not
//! repeated: they judged the connection, not its evidence, and a policy does not change them.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::audit::{Decision, Evidence, Outcome, Subject};
use crate::evidence::{Record, Redecision};
use crate::{Validator, Verified};

/// One record a new policy would refuse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// What the node's connection was decided when it came: `accepted` or `rejected`.
    pub before: Outcome,
    /// The time and policy of that decision, and its failed check if it was refused.
    pub before_time: String,
    pub before_policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_check: Option<String>,
    /// The new policy's decision.
    pub decision: Decision,
}

/// What a dry run found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The variant decided for.
    pub variant: String,
    /// The digest of the policy tried.
    pub policy: String,
    /// Records decided again.
    pub seen: usize,
    /// Of them, accepted when they came.
    pub accepted_before: usize,
    /// Records the new policy would refuse, oldest first.
    pub refused: Vec<Refusal>,
    /// Records left out: another variant's, or unusable, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl Report {
    /// Records the new policy would refuse.
    pub fn would_refuse(&self) -> usize {
        self.refused.len()
    }

    /// Records accepted when they came that the new policy would refuse.
    pub fn newly_refused(&self) -> usize {
        self.refused
            .iter()
            .filter(|r| r.before == Outcome::Accepted)
            .count()
    }

    /// The share of the records accepted before that the new policy would refuse; 0 when none
    /// was accepted.
    pub fn newly_refused_share(&self) -> f64 {
        if self.accepted_before == 0 {
            return 0.0;
        }
        // Counts of kept records: far below 2^52, exact as f64.
        #[allow(clippy::cast_precision_loss)]
        let share = self.newly_refused() as f64 / self.accepted_before as f64;
        share
    }

    /// The report for people: each refusal as the audit line explains it, then the summary.
    pub fn explain(&self) -> ExplainReport<'_> {
        ExplainReport(self)
    }
}

/// Human-readable rendering of a [`Report`]; see [`Report::explain`].
#[derive(Debug)]
pub struct ExplainReport<'a>(&'a Report);

impl fmt::Display for ExplainReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        writeln!(
            f,
            "dry run of policy {} ({}) over {} kept decision(s)",
            r.policy, r.variant, r.seen
        )?;
        for refusal in &r.refused {
            writeln!(f, "WOULD BE {}", refusal.decision.explain())?;
            match refusal.before {
                Outcome::Accepted => writeln!(
                    f,
                    "  before:   ACCEPTED at {} under policy {}",
                    refusal.before_time, refusal.before_policy
                )?,
                Outcome::Rejected => writeln!(
                    f,
                    "  before:   REJECTED by check {} at {} under policy {}",
                    refusal.before_check.as_deref().unwrap_or("evidence"),
                    refusal.before_time,
                    refusal.before_policy
                )?,
            }
        }
        for skipped in &r.skipped {
            writeln!(f, "skipped: {skipped}")?;
        }
        write!(
            f,
            "summary: {} seen, {} would be refused ({} of them accepted before, of {} accepted before), {} would be accepted",
            r.seen,
            r.would_refuse(),
            r.newly_refused(),
            r.accepted_before,
            r.seen - r.would_refuse()
        )
    }
}

/// Decides every record of `validator`'s variant again under the policy `policy_digest`
/// describes; records of other variants and unusable ones are listed as skipped.
pub fn run<'r>(
    records: impl IntoIterator<Item = &'r Record>,
    validator: &dyn Validator,
    policy_digest: &str,
) -> Report {
    run_within(records, validator, policy_digest, |_, redecide| redecide())
}

/// One re-decision, as [`run_within`] hands it to its scope.
pub type Redecide<'a> = &'a dyn Fn() -> Result<Verified, Redecision>;

/// [`run`], each re-decision made inside `within` (attest-proxy makes it on behalf of the
/// record's peer, so collateral it makes the cache fetch counts against that peer's share).
pub fn run_within<'r>(
    records: impl IntoIterator<Item = &'r Record>,
    validator: &dyn Validator,
    policy_digest: &str,
    within: impl Fn(&Record, Redecide<'_>) -> Result<Verified, Redecision>,
) -> Report {
    let variant = validator.variant();
    let mut report = Report {
        variant: variant.name().to_owned(),
        policy: policy_digest.to_owned(),
        seen: 0,
        accepted_before: 0,
        refused: Vec::new(),
        skipped: Vec::new(),
    };
    for record in records {
        match record.variant() {
            Ok(v) if v == variant => {}
            Ok(other) => {
                report.skipped.push(format!(
                    "{} at {}: a {other} decision, not {variant}",
                    record.decision.peer, record.decision.time
                ));
                continue;
            }
            Err(error) => {
                report.skipped.push(format!(
                    "{} at {}: {error}",
                    record.decision.peer, record.decision.time
                ));
                continue;
            }
        }
        report.seen += 1;
        if record.accepted() {
            report.accepted_before += 1;
        }
        let subject = Subject {
            time: SystemTime::now(),
            peer: record.decision.peer.clone(),
            variant,
            policy: policy_digest.to_owned(),
            evidence: Evidence::Document(&[]),
        };
        let mut decision = match within(record, &|| record.redecide(validator)) {
            Ok(_) => continue,
            Err(error @ Redecision::Attestation(_)) => Decision::rejected(subject, &error),
            Err(error @ Redecision::UserData) => {
                Decision::rejected(subject, &error).with_check("user_data")
            }
            Err(error @ Redecision::Record(_)) => {
                Decision::rejected(subject, &error).with_check("record_unusable")
            }
        };
        // The digest of the original evidence, so the refusal can be found in the audit log.
        decision.evidence = record.decision.evidence.clone();
        report.refused.push(Refusal {
            before: record.decision.result,
            before_time: record.decision.time.clone(),
            before_policy: record.decision.policy.clone(),
            before_check: record.decision.check.clone(),
            decision,
        });
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Subject;
    use crate::{QemuVtpmConfig, QemuVtpmValidator, Variant};

    /// A node's document, its record as attest-proxy keeps it, decided by `validator`.
    fn kept(
        issuer: &soft_issuer::SoftIssuer,
        peer: &str,
        validator: &QemuVtpmValidator,
        digest: &str,
    ) -> Record {
        let (nonce, user_data) = ([7u8; 32], [9u8; 32]);
        let document = issuer.issue_document(&user_data, &nonce).unwrap();
        let subject = Subject::now(
            peer,
            Variant::QemuVtpm,
            digest,
            Evidence::Certificate(peer.as_bytes()),
        );
        let decision = match crate::Validator::validate(validator, &document, &nonce) {
            Ok(verified) => Decision::accepted(subject, &verified),
            Err(error) => Decision::rejected(subject, &error),
        };
        Record::new(decision, &nonce, &user_data, &document)
    }

    fn config(pcr4: u8, aks: &[&[u8]]) -> QemuVtpmConfig {
        let digests: Vec<String> = aks
            .iter()
            .map(|ak| hex::encode(crate::ak_digest(ak)))
            .collect();
        QemuVtpmConfig::from_attestation_config(
            serde_json::json!({
                "measurements": {"4": {"expected": hex::encode([pcr4; 32]), "warnOnly": false}},
                "trustedAkDigests": digests,
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn a_tightened_policy_names_exactly_the_nodes_it_would_refuse_and_why() {
        let a = soft_issuer::SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(4, [4; 32])])
            .unwrap();
        let b = soft_issuer::SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(4, [4; 32])])
            .unwrap();
        let c = soft_issuer::SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(4, [5; 32])])
            .unwrap();
        let old = config(4, &[a.ak_public(), b.ak_public(), c.ak_public()]);
        let old_validator = QemuVtpmValidator::from_config(old.clone());
        let mut records = vec![
            kept(&a, "10.0.0.1:1", &old_validator, &old.digest()),
            kept(&b, "10.0.0.2:1", &old_validator, &old.digest()),
            kept(&c, "10.0.0.3:1", &old_validator, &old.digest()),
        ];
        assert!(records[0].accepted() && records[1].accepted() && !records[2].accepted());
        // A record whose document was made for another certificate key.
        let mut rebound = records[0].clone();
        rebound.user_data = hex::encode([8u8; 32]);
        rebound.decision.peer = "10.0.0.4:1".to_owned();
        records.push(rebound);
        // Another variant's record is not decided by a qemu-vtpm policy.
        let mut other = records[1].clone();
        other.decision.variant = "aws-sev-snp".to_owned();
        records.push(other);

        // The new policy no longer trusts b's key.
        let new = config(4, &[a.ak_public(), c.ak_public()]);
        let report = run(
            &records,
            &QemuVtpmValidator::from_config(new.clone()),
            &new.digest(),
        );
        assert_eq!((report.seen, report.accepted_before), (4, 3));
        let refused: Vec<(&str, Option<&str>, Outcome)> = report
            .refused
            .iter()
            .map(|r| {
                (
                    r.decision.peer.as_str(),
                    r.decision.check.as_deref(),
                    r.before,
                )
            })
            .collect();
        assert_eq!(
            refused,
            [
                ("10.0.0.2:1", Some("ak_untrusted"), Outcome::Accepted),
                ("10.0.0.3:1", Some("measurements"), Outcome::Rejected),
                ("10.0.0.4:1", Some("user_data"), Outcome::Accepted),
            ]
        );
        assert_eq!(report.newly_refused(), 2);
        assert!((report.newly_refused_share() - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
        // Each refusal carries the original evidence digest and the new policy.
        assert_eq!(
            report.refused[0].decision.evidence,
            records[1].decision.evidence
        );
        assert_eq!(report.refused[0].decision.policy, new.digest());
        let text = report.explain().to_string();
        assert!(
            text.contains("WOULD BE REJECTED by check ak_untrusted: qemu-vtpm node 10.0.0.2:1"),
            "{text}"
        );
        assert!(text.contains("measurement 4 (enforced)"), "{text}");
        assert!(
            text.contains(&format!(
                "before:   ACCEPTED at {} under policy {}",
                records[1].decision.time,
                old.digest()
            )),
            "{text}"
        );
        assert!(text.ends_with("summary: 4 seen, 3 would be refused (2 of them accepted before, of 3 accepted before), 1 would be accepted"), "{text}");

        // The policy in force refuses nothing it accepted.
        let same = run(&records, &old_validator, &old.digest());
        assert_eq!(same.newly_refused(), 1, "only the rebound record");
    }
}
