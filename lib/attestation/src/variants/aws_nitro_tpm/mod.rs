//! aws-nitro-tpm: the vTPM document of an EC2 instance's NitroTPM, as Constellation's nodes make
//! it.
//!
//! The document is the vTPM document ([`crate::vtpm`]) with the instance identity document of
//! EC2's instance metadata service (IMDS) as `InstanceInfo` (JSON, as the Go SDK's
//! `imds.InstanceIdentityDocument` marshals it; [`IdentityDocument`]). The TPM quotes bind it:
//! their qualifying data is SHA-256(InstanceInfo ‖ extraData).
//!
//! Nothing in the document proves that its attestation key (AK) lives in a NitroTPM: AWS issues
//! no certificate for it, and the instance identity document is not signed in this form.
//! Constellation trusts the key as presented and asks EC2 only whether the image the identity
//! document names supports TPM 2.0 (`DescribeImages`, `tpmSupport` = `v2.0`). This validator
//! does the same two things, but trusts a key only under an explicit setting, exactly as
//! qemu-vtpm does ([`AkTrust`]): `trustedAkDigests` (the nodes' AKs, so only the host that holds
//! those TPMs, or AWS, could forge a join) or `trustAnyAk` (development only: anyone can make a
//! key and a quote over the published PCR values).
//!
//! The verifier holds no AWS credential, so it asks through an [`Ec2Images`]: in the service,
//! attest-proxy's cache in front of the `ec2-identity` process. What that source cannot answer
//! now is [`Ec2ImageError::Unavailable`] (the node retries); an image EC2 does not know is
//! [`Ec2ImageError::NotFound`] (the node is refused). The question is asked last, so a document
//! that fails any other check costs no EC2 call.

pub mod attestation_document;
pub mod ec2_answer;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

use attestation_document::{NitroDocError, NitroDocument, NitroRoots};

use crate::policy::{Policy, PolicyError};
use crate::tpm::HashAlg;
use crate::variants::qemu_vtpm::{AkTrust, QemuVtpmConfig, ak_digest};
use crate::vtpm::{VerifiedQuote, compare_pcrs, make_extra_data, verify_document};
use crate::{Error, Validator, Variant, Verified};

/// The `tpmSupport` value of an image that boots with a NitroTPM.
pub const TPM_SUPPORT_V2: &str = "v2.0";

/// The largest `InstanceInfo` read: a real identity document is well under 1 KiB; with AWS's
/// NitroTPM attestation document (at most 17 KiB) in base64 it stays under 32 KiB.
pub const MAX_IDENTITY_DOCUMENT: usize = 32 * 1024;

/// The InstanceInfo field that carries AWS's NitroTPM attestation document (standard base64).
/// Constellation's validator decodes InstanceInfo with Go's `encoding/json` into the SDK's
/// `imds.InstanceIdentityDocument`, which ignores unknown fields, so its nodes' documents and
/// ours stay valid for each other.
pub const NITRO_DOCUMENT_FIELD: &str = "nitroTpmAttestationDocument";

/// What aws-nitro-tpm documents without their identity document are refused with.
const NO_IDENTITY: &str = "the document has no InstanceInfo (EC2 instance identity document)";

/// The fields of the instance identity document this service reads; the others (`privateIp`,
/// `pendingTime`, product codes, ...) are accepted and ignored, as Go's decoder does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDocument {
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub image_id: String,
    #[serde(default)]
    pub instance_id: String,
    #[serde(default)]
    pub account_id: String,
    #[serde(default)]
    pub availability_zone: String,
    #[serde(default)]
    pub instance_type: String,
    /// AWS's NitroTPM attestation document ([`NITRO_DOCUMENT_FIELD`]), base64.
    #[serde(default)]
    pub nitro_tpm_attestation_document: Option<String>,
}

impl IdentityDocument {
    /// AWS's NitroTPM attestation document, if the node sent one.
    pub fn nitro_document(&self) -> Result<Option<Vec<u8>>, NitroDocError> {
        use base64::Engine as _;
        self.nitro_tpm_attestation_document
            .as_deref()
            .map(|b64| {
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|_| NitroDocError::Base64)
            })
            .transpose()
    }

    /// Parses `InstanceInfo` bytes (at most [`MAX_IDENTITY_DOCUMENT`]).
    pub fn parse(bytes: &[u8]) -> Result<IdentityDocument, Error> {
        if bytes.len() > MAX_IDENTITY_DOCUMENT {
            return Err(Error::Malformed(format!(
                "InstanceInfo of {} bytes exceeds the {MAX_IDENTITY_DOCUMENT}-byte limit of an EC2 instance identity document",
                bytes.len()
            )));
        }
        serde_json::from_slice(bytes).map_err(|e| {
            Error::Malformed(format!(
                "InstanceInfo is not an EC2 instance identity document (JSON): {e}"
            ))
        })
    }
}

/// The image a document names, checked to be a well-formed region name and AMI ID, so both can
/// go into an endpoint host and a query as they are.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    pub region: String,
    pub image_id: String,
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "image {} in {}", self.image_id, self.region)
    }
}

/// Why a region or image ID is not one.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("InstanceInfo {field} {value:?} is not an EC2 {what}")]
pub struct ImageRefError {
    pub field: &'static str,
    pub value: String,
    pub what: &'static str,
}

impl ImageRef {
    /// `region` and `image_id` if they are an AWS region name (`us-east-1`, `us-gov-west-1`:
    /// 1–32 of `[a-z0-9-]`, starting with a letter, not ending with `-`) and an AMI ID (`ami-`
    /// and 8 or 17 lowercase hex digits).
    pub fn new(region: &str, image_id: &str) -> Result<ImageRef, ImageRefError> {
        let region_ok = (1..=32).contains(&region.len())
            && region.starts_with(|c: char| c.is_ascii_lowercase())
            && !region.ends_with('-')
            && region
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !region_ok {
            return Err(ImageRefError {
                field: "region",
                value: region.chars().take(80).collect(),
                what: "region name",
            });
        }
        let image_ok = image_id.strip_prefix("ami-").is_some_and(|hex| {
            matches!(hex.len(), 8 | 17)
                && hex
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        });
        if !image_ok {
            return Err(ImageRefError {
                field: "imageId",
                value: image_id.chars().take(80).collect(),
                what: "AMI ID (ami- and 8 or 17 hex digits)",
            });
        }
        Ok(ImageRef {
            region: region.to_owned(),
            image_id: image_id.to_owned(),
        })
    }

    /// The image an identity document names.
    pub fn from_identity(doc: &IdentityDocument) -> Result<ImageRef, ImageRefError> {
        ImageRef::new(&doc.region, &doc.image_id)
    }
}

/// Why EC2's word on an image could not be had.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Ec2ImageError {
    /// EC2 does not know the image (`InvalidAMIID.NotFound`, `InvalidAMIID.Unavailable`, or an
    /// empty `imagesSet`): the document names an image that does not exist in that region.
    #[error("EC2 knows no {0}")]
    NotFound(String),
    /// EC2 could not be asked or did not answer (403 UnauthorizedOperation, throttling, 5xx, a
    /// timeout, the ec2-identity process down); nothing is wrong with the node's evidence.
    #[error("EC2 cannot be asked now: {0}")]
    Unavailable(String),
}

/// Where the verifier learns what EC2 says about an image. Called on the verification threads:
/// implementations answer from a cache or wait a bounded time.
pub trait Ec2Images: Send + Sync + fmt::Debug {
    /// The image's `tpmSupport` as `DescribeImages` reports it (`Some("v2.0")`), `None` when the
    /// image has no such attribute (it boots without a NitroTPM).
    fn tpm_support(&self, image: &ImageRef) -> Result<Option<String>, Ec2ImageError>;
}

/// EC2's answers given up front (tests, offline verification with `attest-tool`).
#[derive(Clone, Debug, Default)]
pub struct StaticEc2Images {
    images: HashMap<ImageRef, Option<String>>,
    unavailable: Option<String>,
}

impl StaticEc2Images {
    pub fn new() -> Self {
        Self::default()
    }

    /// EC2 reports `tpm_support` for `image` (`None`: no `tpmSupport` attribute).
    pub fn with_image(mut self, image: ImageRef, tpm_support: Option<&str>) -> Self {
        self.images.insert(image, tpm_support.map(str::to_owned));
        self
    }

    /// Every lookup fails as if EC2 could not be reached.
    pub fn unavailable(mut self, reason: &str) -> Self {
        self.unavailable = Some(reason.to_owned());
        self
    }
}

impl Ec2Images for StaticEc2Images {
    fn tpm_support(&self, image: &ImageRef) -> Result<Option<String>, Ec2ImageError> {
        if let Some(reason) = &self.unavailable {
            return Err(Ec2ImageError::Unavailable(reason.clone()));
        }
        self.images
            .get(image)
            .cloned()
            .ok_or_else(|| Ec2ImageError::NotFound(image.to_string()))
    }
}

/// The aws-nitro-tpm attestation config: qemu-vtpm's fields (`measurements`, and
/// `trustedAkDigests` or `trustAnyAk`, read by the same code) and the settings of AWS's NitroTPM
/// attestation document: `requireNitroTpmAttestation` (every node must send one; the opt-in
/// fields must then be absent, and the measurements must be SHA-384 values, the bank AWS signs)
/// and `nitroTpmRoots` (PEM; the Nitro roots trusted instead of AWS's built-in G1 root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsNitroTpmConfig {
    pub policy: Policy,
    /// The key opt-in for nodes without an AWS document; `None` when the document is required.
    pub ak_trust: Option<AkTrust>,
    pub nitro_roots: NitroRoots,
    pub require_nitro_attestation: bool,
}

#[derive(Deserialize)]
struct RawNitro {
    #[serde(default, rename = "requireNitroTpmAttestation")]
    require: bool,
    #[serde(default, rename = "nitroTpmRoots")]
    roots: Option<String>,
    #[serde(default, rename = "trustedAkDigests")]
    trusted_ak_digests: Option<Vec<String>>,
    #[serde(default, rename = "trustAnyAk")]
    trust_any_ak: bool,
}

impl AwsNitroTpmConfig {
    pub fn from_attestation_config(json: &[u8]) -> Result<AwsNitroTpmConfig, PolicyError> {
        let policy = Policy::from_attestation_config(json)?;
        let raw: RawNitro = serde_json::from_slice(json).map_err(PolicyError::Json)?;
        let nitro_roots = match &raw.roots {
            Some(pem) => NitroRoots::from_pem(pem)
                .map_err(|e| PolicyError::NitroAttestation(format!("nitroTpmRoots: {e}")))?,
            None => NitroRoots::aws(),
        };
        let ak_trust = if raw.require {
            if raw.trust_any_ak || raw.trusted_ak_digests.is_some() {
                return Err(PolicyError::NitroAttestation(
                    "requireNitroTpmAttestation trusts keys only through AWS's document: remove trustedAkDigests and trustAnyAk".to_owned(),
                ));
            }
            if let Some(len) = policy.digest_len().filter(|&l| l != 48) {
                return Err(PolicyError::NitroAttestation(format!(
                    "requireNitroTpmAttestation compares the measurements with the SHA-384 PCRs AWS signs, but they are {len}-byte values"
                )));
            }
            if !policy.enforces_any() {
                return Err(PolicyError::NothingEnforced);
            }
            None
        } else {
            Some(QemuVtpmConfig::from_attestation_config(json)?.ak_trust)
        };
        Ok(AwsNitroTpmConfig {
            policy,
            ak_trust,
            nitro_roots,
            require_nitro_attestation: raw.require,
        })
    }

    /// qemu-vtpm's digest, plus the document settings when they differ from the defaults.
    pub fn digest(&self) -> String {
        let mut more = match &self.ak_trust {
            Some(trust) => trust.canonical(),
            None => String::new(),
        };
        if self.require_nitro_attestation {
            more.push_str("nitro:required\n");
        }
        if self.nitro_roots != NitroRoots::aws() {
            for root in self.nitro_roots.fingerprints() {
                more.push_str(&format!("nitro-root:{root}\n"));
            }
        }
        self.policy.digest_with(&more)
    }
}

/// Validates aws-nitro-tpm documents: the quotes verify with an AK that AWS's NitroTPM
/// attestation document binds (or, without one, that the config's opt-in trusts), their PCRs
/// satisfy the policy, and EC2 says the instance's image supports TPM 2.0.
#[derive(Clone)]
pub struct AwsNitroTpmValidator {
    policy: Policy,
    ak_trust: Option<AkTrust>,
    nitro_roots: NitroRoots,
    require_nitro: bool,
    ec2: Option<Arc<dyn Ec2Images>>,
    /// The verification time; `None` is the system clock.
    at: Option<i64>,
}

impl fmt::Debug for AwsNitroTpmValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsNitroTpmValidator")
            .field("policy", &self.policy)
            .field("ak_trust", &self.ak_trust)
            .field("nitro_roots", &self.nitro_roots.fingerprints())
            .field("require_nitro", &self.require_nitro)
            .field("ec2", &self.ec2)
            .finish()
    }
}

impl AwsNitroTpmValidator {
    /// A validator that trusts keys through `ak_trust` or AWS's document under the built-in root.
    pub fn new(policy: Policy, ak_trust: AkTrust) -> Self {
        AwsNitroTpmValidator {
            policy,
            ak_trust: Some(ak_trust),
            nitro_roots: NitroRoots::aws(),
            require_nitro: false,
            ec2: None,
            at: None,
        }
    }

    pub fn from_config(config: AwsNitroTpmConfig) -> Self {
        AwsNitroTpmValidator {
            policy: config.policy,
            ak_trust: config.ak_trust,
            nitro_roots: config.nitro_roots,
            require_nitro: config.require_nitro_attestation,
            ec2: None,
            at: None,
        }
    }

    /// The validator a config describes, with its digest.
    pub fn from_attestation_config(
        json: &[u8],
    ) -> Result<(AwsNitroTpmValidator, String), PolicyError> {
        let config = AwsNitroTpmConfig::from_attestation_config(json)?;
        let digest = config.digest();
        Ok((AwsNitroTpmValidator::from_config(config), digest))
    }

    /// Where the validator asks what EC2 says about an image; without one every document is
    /// refused.
    pub fn with_ec2_images(mut self, ec2: Arc<dyn Ec2Images>) -> Self {
        self.ec2 = Some(ec2);
        self
    }

    /// Trust these Nitro roots instead of the configured ones (tests, attest-tool).
    pub fn with_nitro_roots(mut self, roots: NitroRoots) -> Self {
        self.nitro_roots = roots;
        self
    }

    /// Verify AWS documents as of `unix_seconds` instead of now (offline verification).
    pub fn at(mut self, unix_seconds: i64) -> Self {
        self.at = Some(unix_seconds);
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The key opt-in for nodes without an AWS document; `None` when the document is required.
    pub fn ak_trust(&self) -> Option<&AkTrust> {
        self.ak_trust.as_ref()
    }

    /// Checks AWS's document against this connection: verified under the trusted roots, nonce =
    /// extraData, user_data = SHA-256 of the AK's public area, and every PCR the policy checks
    /// equal in the document and the verified SHA-384 quote, so the policy's values are AWS's.
    fn check_nitro(
        &self,
        bytes: &[u8],
        ak_pub: &[u8],
        extra_data: &[u8],
        quotes: &[VerifiedQuote],
    ) -> Result<NitroDocument, Error> {
        let now = self.at.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
                .unwrap_or(0)
        });
        let doc = attestation_document::verify(bytes, &self.nitro_roots, now)?;
        if doc.nonce.as_deref() != Some(extra_data) {
            return Err(NitroDocError::NonceMismatch.into());
        }
        let ak = ak_digest(ak_pub);
        if doc.user_data.as_deref() != Some(&ak[..]) {
            return Err(NitroDocError::AkNotBound {
                ak: hex::encode(ak),
            }
            .into());
        }
        if let Some(len) = self.policy.digest_len().filter(|&l| l != 48) {
            return Err(NitroDocError::PolicyBank { len }.into());
        }
        let quote = quotes
            .iter()
            .find(|q| q.bank == HashAlg::Sha384)
            .ok_or(Error::MissingBank(HashAlg::Sha384))?;
        for &index in self.policy.measurements().keys() {
            let signed = doc.pcrs.get(&index).ok_or(NitroDocError::PcrMissing {
                index,
                from: "the AWS document",
            })?;
            let quoted = quote.pcrs.get(&index).ok_or(NitroDocError::PcrMissing {
                index,
                from: "the SHA-384 quote",
            })?;
            if signed != quoted {
                return Err(NitroDocError::PcrMismatch { index }.into());
            }
        }
        Ok(doc)
    }
}

/// EC2 says `image` boots with a NitroTPM.
fn check_image(image: &ImageRef, ec2: Option<&dyn Ec2Images>) -> Result<(), Error> {
    let ec2 =
        ec2.ok_or_else(|| Error::Binding("this validator has no way to ask EC2".to_owned()))?;
    match ec2.tpm_support(image) {
        Ok(Some(support)) if support == TPM_SUPPORT_V2 => Ok(()),
        Ok(Some(other)) => Err(Error::Binding(format!(
            "{image} does not support NitroTPM: EC2 reports tpmSupport {:?}, not {TPM_SUPPORT_V2:?}",
            other.chars().take(40).collect::<String>()
        ))),
        Ok(None) => Err(Error::Binding(format!(
            "{image} does not support NitroTPM: EC2 reports no tpmSupport for it"
        ))),
        Err(Ec2ImageError::NotFound(what)) => Err(Error::Binding(format!(
            "EC2 knows no {what}, so nothing says the instance has a NitroTPM"
        ))),
        Err(unavailable @ Ec2ImageError::Unavailable(_)) => {
            Err(Error::CollateralUnavailable(unavailable.to_string()))
        }
    }
}

impl Validator for AwsNitroTpmValidator {
    fn variant(&self) -> Variant {
        Variant::AwsNitroTpm
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        let identity = IdentityDocument::parse(doc.hardware_evidence(NO_IDENTITY)?)?;
        let image =
            ImageRef::from_identity(&identity).map_err(|e| Error::Malformed(e.to_string()))?;
        let ak_pub = doc
            .attestation
            .as_ref()
            .map(|a| a.ak_pub.as_slice())
            .unwrap_or_default();
        let nitro = match identity.nitro_document()? {
            Some(bytes) => {
                let extra = make_extra_data(doc.user_data.as_deref().unwrap_or_default(), nonce);
                Some(self.check_nitro(&bytes, ak_pub, &extra, &quotes)?)
            }
            None if self.require_nitro => return Err(NitroDocError::Required.into()),
            None => None,
        };
        if nitro.is_none() {
            match &self.ak_trust {
                Some(trust) => trust.check(ak_pub)?,
                None => return Err(NitroDocError::Required.into()),
            }
        }
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        // Last: only a document that passed everything else costs an EC2 call.
        check_image(&image, self.ec2.as_deref())?;
        let digest = hex::encode(ak_digest(ak_pub));
        let key = match (&nitro, &self.ak_trust) {
            (Some(n), _) => format!(
                "AK sha256:{digest} bound by AWS's NitroTPM attestation document (module {}, timestamp {} ms)",
                n.module_id.chars().take(64).collect::<String>(),
                n.timestamp_ms
            ),
            (None, Some(t)) if t.is_any() => {
                format!("AK sha256:{digest} trusted unchecked (trustAnyAk)")
            }
            (None, _) => format!("AK sha256:{digest} listed in trustedAkDigests"),
        };
        let clip = |s: &str| s.chars().take(64).collect::<String>();
        Ok(Verified {
            variant: Variant::AwsNitroTpm,
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes: vec![
                format!(
                    "EC2 instance {} of account {} ({}), {image} supports TPM {TPM_SUPPORT_V2}",
                    clip(&identity.instance_id),
                    clip(&identity.account_id),
                    clip(&identity.availability_zone),
                ),
                key,
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identity_documents_parse_as_go_writes_them() {
        // The Go SDK's struct, marshalled: every field present, nil slices null, a zero time.
        let json = br#"{"devpayProductCodes":null,"marketplaceProductCodes":null,"availabilityZone":"eu-central-1a","privateIp":"10.0.1.7","version":"2017-09-30","region":"eu-central-1","instanceId":"i-0123456789abcdef0","billingProducts":null,"instanceType":"m6a.xlarge","accountId":"123456789012","pendingTime":"2026-11-28T10:00:00Z","imageId":"ami-0a1b2c3d4e5f60718","kernelId":"","ramdiskId":"","architecture":"x86_64"}"#;
        let doc = IdentityDocument::parse(json).unwrap();
        assert_eq!(doc.region, "eu-central-1");
        assert_eq!(doc.image_id, "ami-0a1b2c3d4e5f60718");
        assert_eq!(doc.instance_id, "i-0123456789abcdef0");
        let image = ImageRef::from_identity(&doc).unwrap();
        assert_eq!(
            image.to_string(),
            "image ami-0a1b2c3d4e5f60718 in eu-central-1"
        );
        for (bytes, needle) in [
            (&b"\"text\""[..], "not an EC2 instance identity document"),
            (b"{\"region\": 7}", "not an EC2 instance identity document"),
        ] {
            let err = IdentityDocument::parse(bytes).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        let big = vec![b' '; MAX_IDENTITY_DOCUMENT + 1];
        let err = IdentityDocument::parse(&big).unwrap_err().to_string();
        assert!(err.contains("exceeds"), "{err}");
    }

    #[test]
    fn regions_and_image_ids_follow_ec2_rules() {
        ImageRef::new("us-east-1", "ami-12345678").unwrap();
        ImageRef::new("us-gov-west-1", "ami-0123456789abcdef0").unwrap();
        for (region, image, field) in [
            ("", "ami-12345678", "region"),
            ("us-east-1.evil.example", "ami-12345678", "region"),
            ("US-EAST-1", "ami-12345678", "region"),
            ("us-east-1-", "ami-12345678", "region"),
            ("us-east-1", "", "imageId"),
            ("us-east-1", "ami-1234567", "imageId"),
            ("us-east-1", "ami-ABCDEF12", "imageId"),
            ("us-east-1", "ami-12345678&Action=RunInstances", "imageId"),
            ("us-east-1", "snap-12345678", "imageId"),
        ] {
            let err = ImageRef::new(region, image).unwrap_err();
            assert_eq!(err.field, field, "{region} {image}: {err}");
        }
    }

    #[test]
    fn ec2_answers_map_to_refusals_and_retries() {
        let v2 = ImageRef::new("us-east-1", "ami-11111111").unwrap();
        let legacy = ImageRef::new("us-east-1", "ami-22222222").unwrap();
        let odd = ImageRef::new("us-east-1", "ami-33333333").unwrap();
        let unknown = ImageRef::new("us-east-1", "ami-44444444").unwrap();
        let ec2 = StaticEc2Images::new()
            .with_image(v2.clone(), Some("v2.0"))
            .with_image(legacy.clone(), None)
            .with_image(odd.clone(), Some("v1.2"));
        check_image(&v2, Some(&ec2)).unwrap();
        for (image, needle) in [
            (&legacy, "reports no tpmSupport"),
            (&odd, "tpmSupport \"v1.2\""),
            (&unknown, "EC2 knows no image ami-44444444"),
        ] {
            let err = check_image(image, Some(&ec2)).unwrap_err();
            assert!(matches!(err, Error::Binding(_)), "{err}");
            assert!(!err.is_unavailable());
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
        let down = StaticEc2Images::new().unavailable("HTTP 503 RequestLimitExceeded");
        let err = check_image(&v2, Some(&down)).unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("RequestLimitExceeded"), "{err}");
        let err = check_image(&v2, None).unwrap_err();
        assert!(err.to_string().contains("no way to ask EC2"), "{err}");
    }

    #[test]
    fn configs_need_explicit_key_trust_as_for_qemu_vtpm() {
        let a = "11".repeat(32);
        let none = format!(r#"{{"measurements": {{"4": {{"expected": "{a}"}}}}}}"#);
        let err = AwsNitroTpmValidator::from_attestation_config(none.as_bytes()).unwrap_err();
        assert!(matches!(err, PolicyError::NoAkTrust), "{err}");
        let any =
            format!(r#"{{"measurements": {{"4": {{"expected": "{a}"}}}}, "trustAnyAk": true}}"#);
        let (validator, digest) =
            AwsNitroTpmValidator::from_attestation_config(any.as_bytes()).unwrap();
        assert!(validator.ak_trust().unwrap().is_any());
        assert!(!digest.is_empty());
        assert_eq!(validator.variant(), Variant::AwsNitroTpm);
    }
}
