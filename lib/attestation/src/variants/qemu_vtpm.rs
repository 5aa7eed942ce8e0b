//! qemu-vtpm: the vTPM document of a QEMU machine, as Constellation's local clusters make it.
//!
//! QEMU's vTPM has no endorsement certificate, so nothing in the document proves that its
//! attestation key (AK) lives in a TPM: anyone can create a key, compute a quote over PCR values
//! copied from the (public) measurement policy, and sign it. The quote then proves freshness and
//! consistency only. What makes the key trustworthy is configuration: the attestation config
//! lists the SHA-256 digests of the AKs of the operator's TPMs (`trustedAkDigests`, the digest of
//! the marshalled `TPMT_PUBLIC` a document carries as `ak_pub`; `attest-tool ak-digest` prints
//! it), and the validator refuses any other key. `"trustAnyAk": true` turns that off, for
//! development and load tests with software keys only.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::Error;
use crate::policy::{Policy, PolicyError};
use crate::vtpm::{compare_pcrs, verify_document};
use crate::{Validator, Variant, Verified};

/// The SHA-256 digest of an attestation key's public area (marshalled `TPMT_PUBLIC`, the
/// document's `ak_pub`), the form in which a config names the keys it trusts.
pub fn ak_digest(ak_pub: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, ak_pub).as_ref());
    out
}

/// Which attestation keys a qemu-vtpm validator accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AkTrust {
    /// Only keys whose [`ak_digest`] is listed.
    Pinned(BTreeSet<[u8; 32]>),
    /// Any key: a quote then proves nothing about the machine. Development only.
    AnyKey,
}

impl AkTrust {
    /// Trust exactly the keys with these public areas (marshalled `TPMT_PUBLIC`).
    pub fn keys<'a>(ak_pubs: impl IntoIterator<Item = &'a [u8]>) -> AkTrust {
        AkTrust::Pinned(ak_pubs.into_iter().map(ak_digest).collect())
    }

    /// Whether the key with public area `ak_pub` is trusted; the error names its digest.
    pub fn check(&self, ak_pub: &[u8]) -> Result<(), Error> {
        match self {
            AkTrust::AnyKey => Ok(()),
            AkTrust::Pinned(digests) => {
                let digest = ak_digest(ak_pub);
                if digests.contains(&digest) {
                    Ok(())
                } else {
                    Err(Error::UntrustedAk {
                        digest: hex::encode(digest),
                    })
                }
            }
        }
    }

    /// Whether this is the development-only mode that trusts every key.
    pub fn is_any(&self) -> bool {
        matches!(self, AkTrust::AnyKey)
    }

    /// The lines this setting adds to the canonical text the config digest hashes.
    pub(crate) fn canonical(&self) -> String {
        match self {
            AkTrust::AnyKey => "ak:any\n".to_owned(),
            AkTrust::Pinned(digests) => digests
                .iter()
                .map(|d| format!("ak:{}\n", hex::encode(d)))
                .collect(),
        }
    }
}

/// The qemu-vtpm attestation config as attest-proxy loads it: the measurement policy and which
/// attestation keys to trust, from one JSON object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuVtpmConfig {
    pub policy: Policy,
    pub ak_trust: AkTrust,
}

#[derive(Deserialize)]
struct RawAkTrust {
    #[serde(default, rename = "trustedAkDigests")]
    trusted_ak_digests: Option<Vec<String>>,
    #[serde(default, rename = "trustAnyAk")]
    trust_any_ak: bool,
}

impl QemuVtpmConfig {
    /// Parses `{"measurements": {...}, "trustedAkDigests": ["<64 hex>", ...]}` (or
    /// `"trustAnyAk": true` instead of the list). Refuses a config that trusts no key, sets both,
    /// or enforces no measurement: each would either admit nobody by surprise or anybody.
    pub fn from_attestation_config(json: &[u8]) -> Result<QemuVtpmConfig, PolicyError> {
        // The measurement parser checks the size before anything is deserialized.
        let policy = Policy::from_attestation_config(json)?;
        let raw: RawAkTrust = serde_json::from_slice(json).map_err(PolicyError::Json)?;
        let listed = raw.trusted_ak_digests.unwrap_or_default();
        let ak_trust = match (raw.trust_any_ak, listed.is_empty()) {
            (true, false) => return Err(PolicyError::AkTrustConflict),
            (true, true) => AkTrust::AnyKey,
            (false, true) => return Err(PolicyError::NoAkTrust),
            (false, false) => AkTrust::Pinned(
                listed
                    .iter()
                    .map(|value| parse_digest(value))
                    .collect::<Result<_, _>>()?,
            ),
        };
        if !policy.enforces_any() {
            return Err(PolicyError::NothingEnforced);
        }
        Ok(QemuVtpmConfig { policy, ak_trust })
    }

    /// A stable identifier for logs and audit lines, like [`Policy::digest`] but covering the
    /// key trust too: the measurement lines followed by `ak:<hex>` per trusted key digest in
    /// ascending order, or `ak:any`.
    pub fn digest(&self) -> String {
        self.policy.digest_with(&self.ak_trust.canonical())
    }
}

fn parse_digest(value: &str) -> Result<[u8; 32], PolicyError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(value, &mut out).map_err(|_| PolicyError::BadAkDigest {
        value: value.to_owned(),
    })?;
    Ok(out)
}

/// Validates qemu-vtpm documents: the quotes must verify with a trusted attestation key, and
/// their PCR values must satisfy the measurement policy.
#[derive(Clone, Debug)]
pub struct QemuVtpmValidator {
    policy: Policy,
    ak_trust: AkTrust,
}

impl QemuVtpmValidator {
    pub fn new(policy: Policy, ak_trust: AkTrust) -> Self {
        QemuVtpmValidator { policy, ak_trust }
    }

    pub fn from_config(config: QemuVtpmConfig) -> Self {
        QemuVtpmValidator::new(config.policy, config.ak_trust)
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn ak_trust(&self) -> &AkTrust {
        &self.ak_trust
    }
}

impl Validator for QemuVtpmValidator {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        // The quotes verify with the key the document carries; only now does it matter whose
        // key that is. verify_document refused a document without one.
        let ak_pub = doc
            .attestation
            .as_ref()
            .map(|a| a.ak_pub.as_slice())
            .unwrap_or_default();
        self.ak_trust.check(ak_pub)?;
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        Ok(Verified {
            variant: Variant::QemuVtpm,
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const K: &str = "abababababababababababababababababababababababababababababababab";

    fn config(extra: &str) -> Result<QemuVtpmConfig, PolicyError> {
        let json = format!(r#"{{"measurements": {{"4": {{"expected": "{A}"}}}}{extra}}}"#);
        QemuVtpmConfig::from_attestation_config(json.as_bytes())
    }

    #[test]
    fn pinned_and_any_key_forms_parse() {
        let pinned = config(&format!(
            r#", "trustedAkDigests": ["{}"]"#,
            K.to_uppercase()
        ))
        .unwrap();
        assert_eq!(
            pinned.ak_trust,
            AkTrust::Pinned(BTreeSet::from([[0xab; 32]]))
        );
        assert!(!pinned.ak_trust.is_any());
        let any = config(r#", "trustAnyAk": true"#).unwrap();
        assert!(any.ak_trust.is_any());
        // trustAnyAk false beside a list is the list.
        let both = config(&format!(
            r#", "trustAnyAk": false, "trustedAkDigests": ["{K}"]"#
        ))
        .unwrap();
        assert_eq!(both.ak_trust, pinned.ak_trust);
    }

    #[test]
    fn configs_without_clear_key_trust_are_refused() {
        type Check = fn(&PolicyError) -> bool;
        let cases: [(&str, Check); 6] = [
            ("", |e| matches!(e, PolicyError::NoAkTrust)),
            (r#", "trustAnyAk": false"#, |e| {
                matches!(e, PolicyError::NoAkTrust)
            }),
            (r#", "trustedAkDigests": []"#, |e| {
                matches!(e, PolicyError::NoAkTrust)
            }),
            (
                r#", "trustAnyAk": true, "trustedAkDigests": ["abababababababababababababababababababababababababababababababab"]"#,
                |e| matches!(e, PolicyError::AkTrustConflict),
            ),
            (
                r#", "trustedAkDigests": ["abab"]"#,
                |e| matches!(e, PolicyError::BadAkDigest { value } if value == "abab"),
            ),
            (r#", "trustedAkDigests": "abab""#, |e| {
                matches!(e, PolicyError::Json(_))
            }),
        ];
        for (extra, check) in cases {
            let err = config(extra).unwrap_err();
            assert!(check(&err), "{extra}: {err}");
        }
        let message = config("").unwrap_err().to_string();
        assert!(message.contains("trustedAkDigests"), "{message}");
        assert!(message.contains("trustAnyAk"), "{message}");
    }

    #[test]
    fn a_policy_enforcing_nothing_is_refused() {
        for json in [
            r#"{"measurements": {}, "trustAnyAk": true}"#.to_owned(),
            format!(
                r#"{{"measurements": {{"4": {{"expected": "{A}", "warnOnly": true}}}}, "trustAnyAk": true}}"#
            ),
        ] {
            let err = QemuVtpmConfig::from_attestation_config(json.as_bytes()).unwrap_err();
            assert!(matches!(err, PolicyError::NothingEnforced), "{json}: {err}");
        }
    }

    #[test]
    fn digest_covers_the_key_trust() {
        let any = config(r#", "trustAnyAk": true"#).unwrap();
        let pinned = config(&format!(r#", "trustedAkDigests": ["{K}"]"#)).unwrap();
        let other = config(&format!(r#", "trustedAkDigests": ["{A}"]"#)).unwrap();
        let two = config(&format!(r#", "trustedAkDigests": ["{K}", "{A}"]"#)).unwrap();
        let two_reordered = config(&format!(r#", "trustedAkDigests": ["{A}", "{K}"]"#)).unwrap();
        let digests = [
            any.digest(),
            pinned.digest(),
            other.digest(),
            two.digest(),
            any.policy.digest(),
        ];
        let distinct: BTreeSet<&String> = digests.iter().collect();
        assert_eq!(distinct.len(), digests.len(), "{digests:?}");
        assert_eq!(two.digest(), two_reordered.digest());
    }

    #[test]
    fn check_names_the_untrusted_digest() {
        let key = b"a TPMT_PUBLIC";
        let trust = AkTrust::keys([key.as_slice()]);
        trust.check(key).unwrap();
        AkTrust::AnyKey.check(b"anything").unwrap();
        let err = trust.check(b"another key").unwrap_err();
        let want = hex::encode(ak_digest(b"another key"));
        assert!(
            matches!(&err, Error::UntrustedAk { digest } if *digest == want),
            "{err}"
        );
        assert!(err.to_string().contains(&want), "{err}");
        assert_eq!(crate::audit::check_name(&err), "ak_untrusted");
    }
}
