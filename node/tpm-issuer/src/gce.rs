//! gcp-sev-es documents on a GCE confidential VM, as Constellation's GCP issuer makes them.
//!
//! The AK is the key Google's AK template makes: the template sits in the vTPM's NV index
//! [`AK_TEMPLATE_NV_INDEX_RSA`] and the key is a primary key of the endorsement hierarchy
//! (go-tpm-tools' `GceAttestationKeyRSA`), the key the GCE API names as the instance's signing
//! key. The InstanceInfo is go-tpm-tools' `GCEInstanceInfo` with the project ID, zone and
//! instance name the metadata server gives (`{"zone", "project_id", "instance_name"}`, as Go's
//! `encoding/json` writes it); the quotes bind it (qualifying data = SHA-256(InstanceInfo ‖
//! extraData)), and the event log carries what Google's firmware measured.

use std::time::Duration;

use attestation::gce::GceInstance;
use attestation::{IssueError, Issuer, Variant};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};

use crate::{TpmIssuer, TpmIssuerConfig, TpmIssuerError};

/// The NV index of Google's RSA-2048 AK template on a GCE vTPM.
pub const AK_TEMPLATE_NV_INDEX_RSA: u32 = 0x01c1_0001;
/// The GCE metadata server.
pub const METADATA_URL: &str = "http://metadata.google.internal";
/// Where Linux exposes the firmware event log, which carries Google's PCR 0 record; go-tpm-tools
/// reads it from here by default, and gcp-sev-es verifiers need it.
pub const KERNEL_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";
/// How long each metadata request may take.
pub const DEFAULT_METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata answer read: a name is at most a few dozen characters.
const MAX_METADATA_ANSWER: usize = 4096;

/// Why the instance could not be named.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("{0:?} is not an http:// URL of a metadata server")]
    Url(String),
    #[error("cannot start the HTTP client's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the metadata server at {url} cannot be reached")]
    Unreachable {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("the metadata server did not answer {url} within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("the metadata server answered {url} with HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("the metadata server's answer to {url} is unusable: {reason}")]
    BadAnswer { url: String, reason: String },
}

/// The GCE metadata server, asked for this VM's project, zone and name.
#[derive(Clone, Debug)]
pub struct MetadataClient {
    base: String,
    timeout: Duration,
}

impl MetadataClient {
    /// A client of the metadata server at `url` ([`METADATA_URL`] on GCE).
    pub fn new(url: &str, timeout: Duration) -> Result<Self, MetadataError> {
        let base = url.trim_end_matches('/');
        let uri: http::Uri = base
            .parse()
            .map_err(|_| MetadataError::Url(url.to_owned()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(MetadataError::Url(url.to_owned()));
        }
        Ok(MetadataClient {
            base: base.to_owned(),
            timeout,
        })
    }

    async fn get(&self, path: &str) -> Result<String, MetadataError> {
        let url = format!("{}/computeMetadata/v1/{path}", self.base);
        let bad = |reason: String| MetadataError::BadAnswer {
            url: url.clone(),
            reason,
        };
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Empty<Bytes>>();
        let request = http::Request::get(&url)
            .header("metadata-flavor", "Google")
            .body(Empty::new())
            .map_err(|_| MetadataError::Url(url.clone()))?;
        let exchange = async {
            let response =
                client
                    .request(request)
                    .await
                    .map_err(|source| MetadataError::Unreachable {
                        url: url.clone(),
                        source,
                    })?;
            let status = response.status();
            if !status.is_success() {
                return Err(MetadataError::Status {
                    url: url.clone(),
                    status: status.as_u16(),
                });
            }
            // Only the real server (or one playing it) says so; a proxy or captive portal that
            // answered 200 does not.
            if response
                .headers()
                .get("metadata-flavor")
                .map(|v| v.as_bytes())
                != Some(b"Google")
            {
                return Err(bad("no Metadata-Flavor: Google header".to_owned()));
            }
            Limited::new(response.into_body(), MAX_METADATA_ANSWER)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| bad(e.to_string()))
        };
        let body = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| MetadataError::Timeout {
                url: url.clone(),
                timeout: self.timeout,
            })??;
        let text = String::from_utf8(body.to_vec()).map_err(|_| bad("not UTF-8".to_owned()))?;
        let text = text.trim().to_owned();
        if text.is_empty() {
            return Err(bad("empty".to_owned()));
        }
        Ok(text)
    }

    /// This VM's project ID, zone (the last part of `projects/<number>/zones/<zone>`) and
    /// instance name, as Go's metadata client gives them.
    pub fn instance(&self) -> Result<GceInstance, MetadataError> {
        // Called from blocking code, inside a runtime or not: the requests run on a thread of
        // their own with a runtime of their own.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(MetadataError::Runtime)?;
                    runtime.block_on(async {
                        let project_id = self.get("project/project-id").await?;
                        let zone = self.get("instance/zone").await?;
                        let zone = zone.rsplit('/').next().unwrap_or_default().to_owned();
                        let instance_name = self.get("instance/name").await?;
                        Ok(GceInstance {
                            zone,
                            project_id,
                            instance_name,
                            ..GceInstance::default()
                        })
                    })
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(MetadataError::BadAnswer {
                        url: self.base.clone(),
                        reason: "the HTTP client thread panicked".to_owned(),
                    })
                })
        })
    }
}

/// Why a gcp-sev-es issuer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GceIssuerError {
    #[error("opening the TPM with Google's attestation key")]
    Tpm(#[from] TpmIssuerError),
    #[error("naming this instance")]
    Metadata(#[from] MetadataError),
}

/// The TPM configuration of a GCE VM: Google's AK template from the vTPM's NV.
pub fn tpm_config(tcti: &str) -> TpmIssuerConfig {
    TpmIssuerConfig {
        ak_template_nv: Some(AK_TEMPLATE_NV_INDEX_RSA),
        ..TpmIssuerConfig::new(tcti)
    }
}

/// Issues gcp-sev-es documents.
#[derive(Debug)]
pub struct GcpSevEsIssuer {
    tpm: TpmIssuer,
    instance_info: Vec<u8>,
}

impl GcpSevEsIssuer {
    /// An issuer over `tpm` (opened with [`tpm_config`]) for the instance `metadata` names.
    pub fn new(tpm: TpmIssuer, metadata: &MetadataClient) -> Result<Self, GceIssuerError> {
        let instance = metadata.instance()?;
        Ok(GcpSevEsIssuer {
            tpm,
            instance_info: instance.to_json(),
        })
    }

    /// The InstanceInfo every document carries.
    pub fn instance_info(&self) -> &[u8] {
        &self.instance_info
    }

    /// The attestation key's public area (`TPMT_PUBLIC`).
    pub fn ak_public(&self) -> Result<Vec<u8>, TpmIssuerError> {
        self.tpm.ak_public()
    }
}

impl Issuer for GcpSevEsIssuer {
    fn variant(&self) -> Variant {
        Variant::GcpSevEs
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.tpm
            .issue_document_with_instance_info(user_data, nonce, Some(&self.instance_info))
            .map_err(|e| crate::issue_error(Variant::GcpSevEs, e))
    }
}
