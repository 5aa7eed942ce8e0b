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

use crate::policy::{Policy, PolicyError};
use crate::variants::qemu_vtpm::{AkTrust, QemuVtpmConfig, ak_digest};
use crate::vtpm::{compare_pcrs, verify_document};
use crate::{Error, Validator, Variant, Verified};

/// The `tpmSupport` value of an image that boots with a NitroTPM.
pub const TPM_SUPPORT_V2: &str = "v2.0";

/// The largest `InstanceInfo` read: a real identity document is well under 1 KiB.
pub const MAX_IDENTITY_DOCUMENT: usize = 4096;

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
}

impl IdentityDocument {
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

/// The aws-nitro-tpm attestation config: the same fields as qemu-vtpm's (`measurements`, and
/// `trustedAkDigests` or `trustAnyAk`), read by the same code, with the same refusals.
pub type AwsNitroTpmConfig = QemuVtpmConfig;

/// Validates aws-nitro-tpm documents: the quotes verify with a trusted AK, their PCRs satisfy
/// the policy, and EC2 says the instance's image supports TPM 2.0.
#[derive(Clone)]
pub struct AwsNitroTpmValidator {
    policy: Policy,
    ak_trust: AkTrust,
    ec2: Option<Arc<dyn Ec2Images>>,
}

impl fmt::Debug for AwsNitroTpmValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsNitroTpmValidator")
            .field("policy", &self.policy)
            .field("ak_trust", &self.ak_trust)
            .field("ec2", &self.ec2)
            .finish()
    }
}

impl AwsNitroTpmValidator {
    pub fn new(policy: Policy, ak_trust: AkTrust) -> Self {
        AwsNitroTpmValidator {
            policy,
            ak_trust,
            ec2: None,
        }
    }

    /// The validator a config describes, with its digest (measurements and key trust).
    pub fn from_attestation_config(
        json: &[u8],
    ) -> Result<(AwsNitroTpmValidator, String), PolicyError> {
        let config = AwsNitroTpmConfig::from_attestation_config(json)?;
        let digest = config.digest();
        Ok((
            AwsNitroTpmValidator::new(config.policy, config.ak_trust),
            digest,
        ))
    }

    /// Where the validator asks what EC2 says about an image; without one every document is
    /// refused.
    pub fn with_ec2_images(mut self, ec2: Arc<dyn Ec2Images>) -> Self {
        self.ec2 = Some(ec2);
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn ak_trust(&self) -> &AkTrust {
        &self.ak_trust
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
        self.ak_trust.check(ak_pub)?;
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        // Last: only a document that passed everything else costs an EC2 call.
        check_image(&image, self.ec2.as_deref())?;
        let key = if self.ak_trust.is_any() {
            format!(
                "AK sha256:{} trusted unchecked (trustAnyAk)",
                hex::encode(ak_digest(ak_pub))
            )
        } else {
            format!(
                "AK sha256:{} listed in trustedAkDigests",
                hex::encode(ak_digest(ak_pub))
            )
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
        assert!(validator.ak_trust().is_any());
        assert!(!digest.is_empty());
        assert_eq!(validator.variant(), Variant::AwsNitroTpm);
    }
}
