//! aws-nitro-tpm documents: the vTPM document of [`TpmIssuer`] with, as its InstanceInfo, the
//! instance identity document of EC2's instance metadata service (IMDSv2), as Constellation's
//! AWS NitroTPM issuer builds them: the SDK's `imds.InstanceIdentityDocument` marshalled by Go,
//! so its fields come in the struct's order, absent lists as `null` and absent strings as `""`.
//!
//! The document is fetched fresh for each attestation document, as Constellation does; the
//! quotes bind it with the nonce (qualifying data = SHA-256(InstanceInfo ‖ extraData)).

use std::time::Duration;

use attestation::{IssueError, Issuer, Variant};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

use crate::{TpmIssuer, TpmIssuerError};

/// The instance metadata service.
pub const IMDS_URL: &str = "http://169.254.169.254";
/// How long one metadata exchange may take.
pub const DEFAULT_IMDS_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest identity document read.
const MAX_ANSWER: usize = attestation::variants::aws_nitro_tpm::MAX_IDENTITY_DOCUMENT;

/// Why the identity document could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("{0:?} is not an http:// URL of the instance metadata service")]
    Url(String),
    #[error("starting the HTTP client's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("{what}: {reason}")]
    Exchange { what: String, reason: String },
    #[error("{what}: HTTP {status}")]
    Status { what: String, status: u16 },
    #[error("{what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("the instance identity document is not the JSON EC2 serves: {0}")]
    Document(String),
}

/// Why an aws-nitro-tpm document could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NitroIssuerError {
    #[error("the instance identity document")]
    Identity(#[source] ImdsError),
    #[error("quoting the TPM")]
    Quote(#[source] TpmIssuerError),
    #[error("AWS's NitroTPM attestation document: {0}")]
    NitroDocument(String),
}

/// The SDK's `imds.InstanceIdentityDocument`, in its field order.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GoIdentityDocument {
    #[serde(default)]
    devpay_product_codes: Option<Vec<String>>,
    #[serde(default)]
    marketplace_product_codes: Option<Vec<String>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    availability_zone: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    private_ip: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    version: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    region: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    instance_id: String,
    #[serde(default)]
    billing_products: Option<Vec<String>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    instance_type: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    account_id: String,
    /// Go's `time.Time`: RFC 3339, and the zero time when absent.
    #[serde(default = "zero_time", deserialize_with = "null_as_zero_time")]
    pending_time: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    image_id: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    kernel_id: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    ramdisk_id: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    architecture: String,
    /// AWS's NitroTPM attestation document, base64; not IMDS's, added by this issuer when it
    /// has a [`NitroDocumentSource`]. Go's decoder ignores it, so Constellation's validator
    /// accepts the document as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nitro_tpm_attestation_document: Option<String>,
}

fn zero_time() -> String {
    "0001-01-01T00:00:00Z".to_owned()
}

/// A string field IMDS may send as `null`, which Go decodes as "".
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(<Option<String> as serde::Deserialize>::deserialize(d)?.unwrap_or_default())
}

fn null_as_zero_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(<Option<String> as serde::Deserialize>::deserialize(d)?.unwrap_or_else(zero_time))
}

/// IMDS's identity document (`/latest/dynamic/instance-identity/document`) as Constellation's
/// issuer re-marshals it into InstanceInfo.
pub fn instance_info(imds_document: &[u8]) -> Result<Vec<u8>, ImdsError> {
    instance_info_with(imds_document, None)
}

/// [`instance_info`] with AWS's NitroTPM attestation document in the field the validator reads
/// (`nitroTpmAttestationDocument`), after IMDS's fields.
pub fn instance_info_with(
    imds_document: &[u8],
    nitro_document: Option<&[u8]>,
) -> Result<Vec<u8>, ImdsError> {
    use base64::Engine as _;
    let mut doc: GoIdentityDocument =
        serde_json::from_slice(imds_document).map_err(|e| ImdsError::Document(e.to_string()))?;
    doc.nitro_tpm_attestation_document =
        nitro_document.map(|d| base64::engine::general_purpose::STANDARD.encode(d));
    serde_json::to_vec(&doc).map_err(|e| ImdsError::Document(e.to_string()))
}

/// Where the node gets AWS's NitroTPM attestation document for a `user_data` and `nonce`.
pub trait NitroDocumentSource: Send + Sync + std::fmt::Debug {
    fn document(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, String>;
}

/// AWS's `nitro-tpm-attest` utility (package `aws-nitro-tpm-tools`): `--user-data FILE --nonce
/// FILE`, the CBOR document on stdout. It sends the NSM request to the NitroTPM with AWS's TPM
/// vendor command through an NV index; it opens the TPM device itself (`TPM_DEVICE`, default
/// `/dev/tpm0`), so join-client's own TCTI should be the resource manager (`/dev/tpmrm0`).
#[derive(Clone, Debug)]
pub struct NitroTpmAttestCommand {
    pub path: std::path::PathBuf,
}

impl NitroDocumentSource for NitroTpmAttestCommand {
    fn document(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let user_data_file = dir.path().join("user-data");
        let nonce_file = dir.path().join("nonce");
        std::fs::write(&user_data_file, user_data).map_err(|e| e.to_string())?;
        std::fs::write(&nonce_file, nonce).map_err(|e| e.to_string())?;
        let out = std::process::Command::new(&self.path)
            .arg("--user-data")
            .arg(&user_data_file)
            .arg("--nonce")
            .arg(&nonce_file)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", self.path.display()))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "{} failed ({}): {}",
                self.path.display(),
                out.status,
                stderr.chars().take(400).collect::<String>()
            ));
        }
        let limit = attestation::variants::aws_nitro_tpm::attestation_document::MAX_DOCUMENT;
        if out.stdout.is_empty() || out.stdout.len() > limit {
            return Err(format!(
                "{} wrote {} bytes, not a document of 1..={limit}",
                self.path.display(),
                out.stdout.len()
            ));
        }
        Ok(out.stdout)
    }
}

/// Where the identity document comes from.
pub trait IdentitySource: Send + Sync + std::fmt::Debug {
    /// The identity document as IMDS serves it.
    fn identity_document(&self) -> Result<Vec<u8>, ImdsError>;
}

/// IMDSv2 over HTTP: a session token, then the identity document with it.
#[derive(Clone, Debug)]
pub struct ImdsClient {
    base: String,
    timeout: Duration,
}

impl ImdsClient {
    /// The client of IMDS at `url` ([`IMDS_URL`] on EC2), giving up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, ImdsError> {
        let base = url.trim_end_matches('/');
        let uri: http::Uri = base.parse().map_err(|_| ImdsError::Url(url.to_owned()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(ImdsError::Url(url.to_owned()));
        }
        Ok(ImdsClient {
            base: base.to_owned(),
            timeout,
        })
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        header: (&str, &str),
    ) -> Result<Bytes, ImdsError> {
        let what = format!("{method} {}{path}", self.base);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Empty<Bytes>>();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(header.0, header.1)
            .body(Empty::new())
            .map_err(|_| ImdsError::Url(self.base.clone()))?;
        let exchange = async {
            let response = client
                .request(request)
                .await
                .map_err(|e| ImdsError::Exchange {
                    what: what.clone(),
                    reason: e.to_string(),
                })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| ImdsError::Exchange {
                    what: what.clone(),
                    reason: e.to_string(),
                })?
                .to_bytes();
            if !status.is_success() {
                return Err(ImdsError::Status {
                    what: what.clone(),
                    status: status.as_u16(),
                });
            }
            Ok(body)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ImdsError::Timeout {
                what: what.clone(),
                timeout: self.timeout,
            })?
    }
}

impl IdentitySource for ImdsClient {
    fn identity_document(&self) -> Result<Vec<u8>, ImdsError> {
        // The issuer is called from blocking code, inside a runtime or not: the exchange runs on
        // a thread of its own with a runtime of its own.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(ImdsError::Runtime)?;
                    runtime.block_on(async {
                        let token = self
                            .call(
                                http::Method::PUT,
                                "/latest/api/token",
                                ("x-aws-ec2-metadata-token-ttl-seconds", "60"),
                            )
                            .await?;
                        let token = String::from_utf8_lossy(&token).trim().to_owned();
                        let doc = self
                            .call(
                                http::Method::GET,
                                "/latest/dynamic/instance-identity/document",
                                ("x-aws-ec2-metadata-token", &token),
                            )
                            .await?;
                        Ok(doc.to_vec())
                    })
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(ImdsError::Exchange {
                        what: self.base.clone(),
                        reason: "the HTTP client thread panicked".to_owned(),
                    })
                })
        })
    }
}

/// Issues aws-nitro-tpm documents from the NitroTPM and the instance metadata service.
#[derive(Debug)]
pub struct AwsNitroTpmIssuer {
    tpm: TpmIssuer,
    identity: Box<dyn IdentitySource>,
    nitro: Option<Box<dyn NitroDocumentSource>>,
}

impl AwsNitroTpmIssuer {
    pub fn new(tpm: TpmIssuer, identity: Box<dyn IdentitySource>) -> Self {
        AwsNitroTpmIssuer {
            tpm,
            identity,
            nitro: None,
        }
    }

    /// Also send AWS's NitroTPM attestation document, made for each connection with nonce =
    /// extraData (SHA-256(UserData ‖ nonce)) and user_data = SHA-256 of the AK's TPMT_PUBLIC.
    pub fn with_nitro_document(mut self, source: Box<dyn NitroDocumentSource>) -> Self {
        self.nitro = Some(source);
        self
    }

    /// A document binding `user_data` to `nonce`.
    pub fn issue_document(
        &self,
        user_data: &[u8],
        nonce: &[u8],
    ) -> Result<Vec<u8>, NitroIssuerError> {
        let doc = self
            .identity
            .identity_document()
            .map_err(NitroIssuerError::Identity)?;
        let nitro = match &self.nitro {
            Some(source) => {
                let ak = self.tpm.ak_public().map_err(NitroIssuerError::Quote)?;
                let extra = attestation::vtpm::make_extra_data(user_data, nonce);
                Some(
                    source
                        .document(&attestation::ak_digest(&ak), &extra)
                        .map_err(NitroIssuerError::NitroDocument)?,
                )
            }
            None => None,
        };
        let info =
            instance_info_with(&doc, nitro.as_deref()).map_err(NitroIssuerError::Identity)?;
        self.tpm
            .issue_document_with_instance_info(user_data, nonce, Some(&info))
            .map_err(NitroIssuerError::Quote)
    }
}

impl Issuer for AwsNitroTpmIssuer {
    fn variant(&self) -> Variant {
        Variant::AwsNitroTpm
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.issue_document(user_data, nonce)
            .map_err(|e| crate::issue_error(Variant::AwsNitroTpm, e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn instance_info_is_the_document_as_go_marshals_it() {
        // As IMDS serves it: pretty-printed, its own field order, kernelId null.
        let imds = br#"{
  "accountId" : "123456789012",
  "architecture" : "x86_64",
  "availabilityZone" : "us-east-2a",
  "billingProducts" : null,
  "devpayProductCodes" : null,
  "marketplaceProductCodes" : null,
  "imageId" : "ami-0a1b2c3d4e5f60718",
  "instanceId" : "i-0fedcba9876543210",
  "instanceType" : "m6a.large",
  "kernelId" : null,
  "pendingTime" : "2026-11-28T10:00:00Z",
  "privateIp" : "10.0.0.5",
  "ramdiskId" : "",
  "region" : "us-east-2",
  "version" : "2017-09-30"
}"#;
        let info = instance_info(imds).unwrap();
        assert_eq!(
            String::from_utf8(info).unwrap(),
            r#"{"devpayProductCodes":null,"marketplaceProductCodes":null,"availabilityZone":"us-east-2a","privateIp":"10.0.0.5","version":"2017-09-30","region":"us-east-2","instanceId":"i-0fedcba9876543210","billingProducts":null,"instanceType":"m6a.large","accountId":"123456789012","pendingTime":"2026-11-28T10:00:00Z","imageId":"ami-0a1b2c3d4e5f60718","kernelId":"","ramdiskId":"","architecture":"x86_64"}"#
        );
        let sparse = instance_info(br#"{"region":"us-east-2","imageId":"ami-12345678"}"#).unwrap();
        let sparse = String::from_utf8(sparse).unwrap();
        assert!(
            sparse.contains(r#""pendingTime":"0001-01-01T00:00:00Z""#),
            "{sparse}"
        );
        assert!(sparse.contains(r#""privateIp":"""#), "{sparse}");
        let err = instance_info(b"<html>").unwrap_err();
        assert!(err.to_string().contains("not the JSON EC2 serves"), "{err}");
        assert!(ImdsClient::new("https://169.254.169.254", DEFAULT_IMDS_TIMEOUT).is_err());
    }
}
