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
    let doc: GoIdentityDocument =
        serde_json::from_slice(imds_document).map_err(|e| ImdsError::Document(e.to_string()))?;
    serde_json::to_vec(&doc).map_err(|e| ImdsError::Document(e.to_string()))
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
}

impl AwsNitroTpmIssuer {
    pub fn new(tpm: TpmIssuer, identity: Box<dyn IdentitySource>) -> Self {
        AwsNitroTpmIssuer { tpm, identity }
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
        let info = instance_info(&doc).map_err(NitroIssuerError::Identity)?;
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
