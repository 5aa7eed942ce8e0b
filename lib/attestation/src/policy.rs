//! The measurement policy: which PCR values a node must present.
//!
//! The operator ships it as Constellation's attestation config (`/var/config/attestationConfig`,
//! projected from a ConfigMap), one JSON object for the cluster's variant whose `measurements`
//! map PCR indices to expected values. The proxy parses it here, logs [`Policy::digest`] so an
//! audit line says which policy admitted a node, and validators call [`Policy::compare`] on the
//! PCR values of a verified quote.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;

use crate::MeasurementMismatch;

/// The largest attestation config accepted; real ones are a few kilobytes.
pub const MAX_CONFIG_SIZE: usize = 1 << 20;

/// Measurement sizes a policy may hold: SHA-256 (TPM PCRs), SHA-384 (TPM banks, TDX/SEV-SNP
/// registers) and SHA-512. SHA-1 values are refused because SHA-1 banks are never trusted.
pub const ALLOWED_MEASUREMENT_SIZES: [usize; 3] = [32, 48, 64];

/// One expected measurement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measurement {
    pub expected: Vec<u8>,
    /// A mismatch is only reported, not enforced.
    pub warn_only: bool,
}

/// Why a policy could not be built or parsed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("attestation config of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("attestation config is not valid JSON of the expected shape")]
    Json(#[source] serde_json::Error),
    #[error("attestation config has no \"measurements\" object")]
    MissingMeasurements,
    #[error("measurement key {0:?} is not a decimal register index")]
    BadIndex(String),
    #[error("measurement {index}: expected value {value:?} is not valid hex")]
    BadHex {
        index: u32,
        value: String,
        #[source]
        source: hex::FromHexError,
    },
    #[error("measurement {index}: legacy value {value:?} is neither hex nor base64")]
    BadEncoding {
        index: u32,
        value: String,
        #[source]
        source: hex::FromHexError,
    },
    #[error(
        "measurement {index}: expected value has {len} bytes; allowed are 32 (SHA-256), 48 (SHA-384) or 64 (SHA-512)"
    )]
    BadLength { index: u32, len: usize },
    #[error(
        "measurement {index} has {len} bytes but measurement {first_index} has {first_len}: one policy must use one hash"
    )]
    MixedLengths {
        index: u32,
        len: usize,
        first_index: u32,
        first_len: usize,
    },
    /// A qemu-vtpm config that says neither which attestation keys to trust nor to trust any.
    #[error(
        "attestation config trusts no attestation key: list the SHA-256 digests of the nodes' AK public areas in \"trustedAkDigests\" (attest-tool ak-digest prints them), or set \"trustAnyAk\": true (development only: anyone can then forge a quote)"
    )]
    NoAkTrust,
    /// Both forms of key trust at once: which one was meant cannot be told.
    #[error(
        "attestation config sets both \"trustAnyAk\": true and \"trustedAkDigests\"; choose one"
    )]
    AkTrustConflict,
    /// An entry of `trustedAkDigests` is not a SHA-256 digest in hex.
    #[error("trustedAkDigests entry {value:?} is not 64 hex digits (a SHA-256 digest)")]
    BadAkDigest { value: String },
    /// The policy enforces no measurement: every node whose quote verifies would be admitted.
    #[error(
        "measurement policy enforces no measurement (it is empty or every entry is warnOnly), so it would admit any machine"
    )]
    NothingEnforced,
    /// aws-nitro-tpm's settings for AWS's NitroTPM attestation document are invalid.
    #[error("attestation config: {0}")]
    NitroAttestation(String),
    /// The SEV-SNP settings of an SNP variant's config are invalid.
    #[error(transparent)]
    Snp(#[from] crate::snp::SnpConfigError),
    #[error(transparent)]
    Tdx(#[from] crate::tdx::TdxConfigError),
    /// gcp-sev-snp's `allowedGcpProjects` is invalid, or set for another variant.
    #[error(transparent)]
    GcpProjects(#[from] crate::snp::GcpProjectsError),
    /// azure-trustedlaunch's `azureVtpmRoots` is invalid.
    #[error(transparent)]
    TrustedLaunch(#[from] crate::variants::azure_trustedlaunch::TrustedLaunchConfigError),
}

/// A measurement policy: register index → expected value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    measurements: BTreeMap<u32, Measurement>,
}

/// `{"expected": "<hex>", "warnOnly": bool}`, or the legacy bare string (always enforced).
#[derive(Deserialize)]
#[serde(untagged)]
enum RawMeasurement {
    Object {
        expected: String,
        #[serde(default, rename = "warnOnly")]
        warn_only: bool,
    },
    Legacy(String),
}

#[derive(Deserialize)]
struct RawConfig {
    // Everything else in the object (SEV-SNP/TDX fields, versions) is another layer's business.
    measurements: Option<BTreeMap<String, RawMeasurement>>,
}

impl Policy {
    /// A policy from already-decoded measurements. All values must have the same, allowed size,
    /// which names the PCR bank the policy is compared with.
    pub fn new(measurements: BTreeMap<u32, Measurement>) -> Result<Policy, PolicyError> {
        let mut first: Option<(u32, usize)> = None;
        for (&index, m) in &measurements {
            let len = m.expected.len();
            if !ALLOWED_MEASUREMENT_SIZES.contains(&len) {
                return Err(PolicyError::BadLength { index, len });
            }
            match first {
                None => first = Some((index, len)),
                Some((first_index, first_len)) if first_len != len => {
                    return Err(PolicyError::MixedLengths {
                        index,
                        len,
                        first_index,
                        first_len,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(Policy { measurements })
    }

    /// Parses Constellation's attestation config object for one variant:
    /// `{"measurements": {"4": {"expected": "<hex>", "warnOnly": false}, ...}, ...}`. A bare
    /// string value is the legacy form, enforced, and may be hex or base64 (Constellation's
    /// older encoding). `expected` in the object form must be hex: accepting base64 there too
    /// would let a typo in a hex value decode silently as a different value.
    pub fn from_attestation_config(json: &[u8]) -> Result<Policy, PolicyError> {
        if json.len() > MAX_CONFIG_SIZE {
            return Err(PolicyError::TooLarge {
                size: json.len(),
                limit: MAX_CONFIG_SIZE,
            });
        }
        let raw: RawConfig = serde_json::from_slice(json).map_err(PolicyError::Json)?;
        let raw = raw.measurements.ok_or(PolicyError::MissingMeasurements)?;
        let mut measurements = BTreeMap::new();
        for (key, value) in raw {
            let index = parse_index(&key)?;
            let (expected, warn_only) = match value {
                RawMeasurement::Object {
                    expected,
                    warn_only,
                } => {
                    let bytes = hex::decode(&expected).map_err(|source| PolicyError::BadHex {
                        index,
                        value: expected.clone(),
                        source,
                    })?;
                    (bytes, warn_only)
                }
                RawMeasurement::Legacy(s) => (decode_legacy(index, &s)?, false),
            };
            measurements.insert(
                index,
                Measurement {
                    expected,
                    warn_only,
                },
            );
        }
        Policy::new(measurements)
    }

    /// The measurements, by register index.
    pub fn measurements(&self) -> &BTreeMap<u32, Measurement> {
        &self.measurements
    }

    pub fn is_empty(&self) -> bool {
        self.measurements.is_empty()
    }

    /// The size of the expected values (`None` for an empty policy).
    pub fn digest_len(&self) -> Option<usize> {
        self.measurements.values().next().map(|m| m.expected.len())
    }

    /// A stable identifier for logs: lowercase hex SHA-256 over the canonical form, one line
    /// per measurement in ascending index order, `"<index>:<lowercase hex>:<enforce|warn>\n"`.
    /// It does not depend on JSON formatting, key order or the hex/base64 spelling.
    pub fn digest(&self) -> String {
        self.digest_with("")
    }

    /// The digest of a variant's whole config: SHA-256 (lowercase hex) of [`Policy::canonical`]
    /// followed by `more`, the variant's own canonical lines.
    pub(crate) fn digest_with(&self, more: &str) -> String {
        let canonical = self.canonical() + more;
        hex::encode(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            canonical.as_bytes(),
        ))
    }

    /// [`Policy::from_attestation_config`] for a hardware variant's validator: a policy that
    /// enforces no measurement is refused.
    pub(crate) fn enforcing_from_attestation_config(json: &[u8]) -> Result<Policy, PolicyError> {
        let policy = Policy::from_attestation_config(json)?;
        if !policy.enforces_any() {
            return Err(PolicyError::NothingEnforced);
        }
        Ok(policy)
    }

    /// The text [`Policy::digest`] hashes; a variant whose config holds more than measurements
    /// appends its own lines and hashes the whole.
    pub(crate) fn canonical(&self) -> String {
        let mut canonical = String::new();
        for (index, m) in &self.measurements {
            canonical.push_str(&format!(
                "{index}:{}:{}\n",
                hex::encode(&m.expected),
                if m.warn_only { "warn" } else { "enforce" }
            ));
        }
        canonical
    }

    /// Whether at least one measurement rejects a node that does not match it.
    pub fn enforces_any(&self) -> bool {
        self.measurements.values().any(|m| !m.warn_only)
    }

    /// Compares measured values with the policy and returns (enforced mismatches, warn-only
    /// mismatches). A register the evidence lacks counts as a mismatch.
    pub fn compare(
        &self,
        actual: &BTreeMap<u32, Vec<u8>>,
    ) -> (Vec<MeasurementMismatch>, Vec<MeasurementMismatch>) {
        let mut enforced = Vec::new();
        let mut warnings = Vec::new();
        for (&index, m) in &self.measurements {
            let got = actual.get(&index);
            if got.map(Vec::as_slice) == Some(m.expected.as_slice()) {
                continue;
            }
            let mismatch = MeasurementMismatch {
                index,
                expected: m.expected.clone(),
                actual: got.cloned(),
                warn_only: m.warn_only,
            };
            if m.warn_only {
                warnings.push(mismatch);
            } else {
                enforced.push(mismatch);
            }
        }
        (enforced, warnings)
    }
}

fn parse_index(key: &str) -> Result<u32, PolicyError> {
    // Only plain decimal: "+4" or " 4" in a policy file is more likely a mistake than intent.
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PolicyError::BadIndex(key.to_owned()));
    }
    key.parse()
        .map_err(|_| PolicyError::BadIndex(key.to_owned()))
}

fn decode_legacy(index: u32, text: &str) -> Result<Vec<u8>, PolicyError> {
    // Hex first: a 64-character hex string is also valid base64 (of 48 bytes), so the order
    // decides, and hex is the current format.
    match hex::decode(text) {
        Ok(bytes) => Ok(bytes),
        Err(hex_err) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| PolicyError::BadEncoding {
                index,
                value: text.to_owned(),
                source: hex_err,
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn parses_object_and_legacy_forms() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([0x22u8; 32]);
        let json = format!(
            r#"{{"measurements": {{"4": {{"expected": "{A}", "warnOnly": false}},
                "9": {{"expected": "{A}", "warnOnly": true}},
                "11": "{b64}", "12": "{A}"}},
               "amdRootKey": "ignored", "bootloaderVersion": 3}}"#
        );
        let p = Policy::from_attestation_config(json.as_bytes()).unwrap();
        let m = p.measurements();
        assert_eq!(m.len(), 4);
        assert_eq!(m[&4].expected, vec![0x11; 32]);
        assert!(!m[&4].warn_only);
        assert!(m[&9].warn_only);
        assert_eq!(m[&11].expected, vec![0x22; 32]);
        assert!(!m[&11].warn_only);
        assert!(!m[&12].warn_only);
        assert_eq!(p.digest_len(), Some(32));
    }

    #[test]
    fn bad_hex_is_a_clear_error() {
        let json = r#"{"measurements": {"4": {"expected": "zz11", "warnOnly": false}}}"#;
        let err = Policy::from_attestation_config(json.as_bytes()).unwrap_err();
        assert!(matches!(err, PolicyError::BadHex { index: 4, .. }));
        assert!(err.to_string().contains("measurement 4"), "{err}");
        assert!(err.to_string().contains("not valid hex"), "{err}");
        let json = r#"{"measurements": {"5": "not hex, not base64!"}}"#;
        let err = Policy::from_attestation_config(json.as_bytes()).unwrap_err();
        assert!(
            matches!(err, PolicyError::BadEncoding { index: 5, .. }),
            "{err}"
        );
    }

    #[test]
    fn other_malformed_configs_are_refused() {
        type Check = fn(&PolicyError) -> bool;
        let cases: [(&str, Check); 5] = [
            (r#"{"measurements": {"x": "00"}}"#, |e| {
                matches!(e, PolicyError::BadIndex(_))
            }),
            (r#"{"measurements": {"4": "0011"}}"#, |e| {
                matches!(e, PolicyError::BadLength { index: 4, len: 2 })
            }),
            (r#"{"other": 1}"#, |e| {
                matches!(e, PolicyError::MissingMeasurements)
            }),
            (r#"{"measurements": [1]}"#, |e| {
                matches!(e, PolicyError::Json(_))
            }),
            (
                r#"{"measurements": {"4": "1111111111111111111111111111111111111111111111111111111111111111",
                    "5": "111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111"}}"#,
                |e| matches!(e, PolicyError::MixedLengths { .. }),
            ),
        ];
        for (json, check) in cases {
            let err = Policy::from_attestation_config(json.as_bytes()).unwrap_err();
            assert!(check(&err), "{json}: {err}");
        }
    }

    #[test]
    fn digest_is_canonical() {
        let a = Policy::from_attestation_config(
            format!(r#"{{"measurements": {{"4": "{A}", "9": {{"expected": "{A}"}}}}}}"#).as_bytes(),
        )
        .unwrap();
        let b = Policy::from_attestation_config(
            format!(
                r#"{{ "measurements" : {{ "9": {{"warnOnly": false, "expected": "{}"}}, "4": {{"expected": "{A}"}} }} }}"#,
                A.to_uppercase()
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.digest().len(), 64);
        let mut warn = a.measurements().clone();
        if let Some(m) = warn.get_mut(&9) {
            m.warn_only = true;
        }
        assert_ne!(Policy::new(warn).unwrap().digest(), a.digest());
    }

    #[test]
    fn compare_splits_enforced_and_warnings() {
        let mut m = BTreeMap::new();
        m.insert(
            4,
            Measurement {
                expected: vec![1; 32],
                warn_only: false,
            },
        );
        m.insert(
            5,
            Measurement {
                expected: vec![2; 32],
                warn_only: true,
            },
        );
        m.insert(
            6,
            Measurement {
                expected: vec![3; 32],
                warn_only: false,
            },
        );
        let p = Policy::new(m).unwrap();
        let mut actual = BTreeMap::new();
        actual.insert(4, vec![1; 32]);
        actual.insert(5, vec![9; 32]);
        let (enforced, warnings) = p.compare(&actual);
        assert_eq!(enforced.len(), 1);
        assert_eq!(enforced[0].index, 6);
        assert_eq!(enforced[0].actual, None);
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].index, 5);
        assert_eq!(warnings[0].actual, Some(vec![9; 32]));
    }
}
