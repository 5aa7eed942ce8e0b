//! azure-trustedlaunch: the vTPM document of an Azure Trusted Launch VM, attested with the key
//! Azure persisted at [`super::HCL_AK_HANDLE`] (0x81000003), whose InstanceInfo carries the
//! certificate Azure wrote for that key to NV index [`AK_CERT_NV_INDEX`] and the CA that issued
//! it (`{"AkCert", "CA"}`, bytes standard base64), as Constellation's issuer writes it.
//!
//! The CA is not in the vTPM: like Constellation's issuer, this one fetches it from the AK
//! certificate's authorityInfoAccess caIssuers URLs, in order, until one answers with a
//! certificate ([`CaFetcher`]; [`HttpCaFetcher`] over plain HTTP, where Azure publishes its CA
//! certificates). An AK certificate naming no URL, or none that answers, fails the issue with
//! what each said.

use std::time::Duration;

use attestation::variants::azure_trustedlaunch::{InstanceInfo, ak_cert};
use attestation::{IssueError, Issuer, Variant};
use bytes::Bytes;
use http_body_util::Full;

use super::AzureIssuerError;
use super::http::HttpError;
use crate::{TpmIssuer, TpmIssuerError};

/// The NV index where Azure leaves the AK certificate (DER).
pub const AK_CERT_NV_INDEX: u32 = 0x01C1_01D0;
/// The largest AK certificate read: Azure's are under 2 KiB.
pub const MAX_AK_CERT: usize = 8 * 1024;
/// The largest CA certificate accepted from a caIssuers URL.
pub const MAX_CA_CERT: usize = 64 * 1024;
/// How long one fetch of the CA may take, connecting included.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no CA certificate was had from one URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0:?} is not an http:// URL")]
    Url(String),
    #[error("cannot start the HTTP client")]
    Runtime(#[source] std::io::Error),
    #[error("{url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("reading the answer of {url}: {reason}")]
    Body { url: String, reason: String },
    #[error("{url} answered with something that is not a DER certificate: {reason}")]
    NotACertificate { url: String, reason: String },
}

/// Fetches the CA certificate published at a URL.
pub trait CaFetcher: Send + Sync + std::fmt::Debug {
    /// The DER certificate at `url`.
    fn fetch(&self, url: &str) -> Result<Vec<u8>, FetchError>;
}

/// Fetches CA certificates over plain HTTP (hyper), as Azure publishes them.
#[derive(Clone, Debug)]
pub struct HttpCaFetcher {
    timeout: Duration,
}

impl HttpCaFetcher {
    pub fn new(timeout: Duration) -> Self {
        HttpCaFetcher { timeout }
    }
}

impl CaFetcher for HttpCaFetcher {
    fn fetch(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let uri: http::Uri = url.parse().map_err(|_| FetchError::Url(url.to_owned()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(FetchError::Url(url.to_owned()));
        }
        let request = http::Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|_| FetchError::Url(url.to_owned()))?;
        let url = url.to_owned();
        let (status, body) =
            super::http::exchange(request, self.timeout, MAX_CA_CERT).map_err(|e| match e {
                HttpError::Runtime(e) => FetchError::Runtime(e),
                HttpError::Unreachable(e) => FetchError::Unreachable {
                    url: url.clone(),
                    reason: e.to_string(),
                },
                HttpError::Timeout => FetchError::Timeout {
                    url: url.clone(),
                    timeout: self.timeout,
                },
                HttpError::Body(reason) => FetchError::Body {
                    url: url.clone(),
                    reason,
                },
            })?;
        if !status.is_success() {
            return Err(FetchError::Status {
                url,
                status: status.as_u16(),
            });
        }
        ak_cert::check_certificate(&body, "CA certificate").map_err(|e| {
            FetchError::NotACertificate {
                url,
                reason: e.to_string(),
            }
        })?;
        Ok(body.to_vec())
    }
}

/// Why an azure-trustedlaunch InstanceInfo could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TrustedLaunchError {
    #[error(
        "reading Azure's AK certificate from the vTPM (NV index {AK_CERT_NV_INDEX:#010x}); is this an Azure Trusted Launch VM?"
    )]
    ReadCert(#[source] TpmIssuerError),
    #[error("the vTPM's AK certificate is unusable")]
    Cert(#[source] ak_cert::AkCertError),
    #[error("the AK certificate names no caIssuers URL, so its CA cannot be fetched")]
    NoCaUrl,
    #[error("no caIssuers URL of the AK certificate gave its CA: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    NoCa(Vec<FetchError>),
}

/// Issues azure-trustedlaunch documents from an Azure Trusted Launch VM's vTPM.
#[derive(Debug)]
pub struct TrustedLaunchIssuer {
    tpm: TpmIssuer,
    fetcher: Box<dyn CaFetcher>,
}

impl TrustedLaunchIssuer {
    /// An issuer over `tpm`, which must attest with Azure's key ([`super::open_tpm`]), fetching
    /// the CA with `fetcher`.
    pub fn new(tpm: TpmIssuer, fetcher: Box<dyn CaFetcher>) -> Self {
        TrustedLaunchIssuer { tpm, fetcher }
    }

    /// The InstanceInfo: the AK certificate in the vTPM and the CA its URLs give.
    pub fn instance_info(&self) -> Result<Vec<u8>, TrustedLaunchError> {
        let ak_cert = self
            .tpm
            .read_nv(AK_CERT_NV_INDEX, MAX_AK_CERT)
            .map_err(TrustedLaunchError::ReadCert)?;
        let urls = ak_cert::ca_issuer_urls(&ak_cert).map_err(TrustedLaunchError::Cert)?;
        if urls.is_empty() {
            return Err(TrustedLaunchError::NoCaUrl);
        }
        let mut failures = Vec::new();
        for url in &urls {
            match self.fetcher.fetch(url) {
                Ok(ca) => return Ok(InstanceInfo { ak_cert, ca }.to_json()),
                Err(e) => {
                    tracing::debug!(%url, error = %e, "no CA certificate from this caIssuers URL");
                    failures.push(e);
                }
            }
        }
        Err(TrustedLaunchError::NoCa(failures))
    }
}

impl Issuer for TrustedLaunchIssuer {
    fn variant(&self) -> Variant {
        Variant::AzureTrustedLaunch
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        super::issue_document(
            &self.tpm,
            self.variant(),
            self.instance_info()
                .map_err(AzureIssuerError::TrustedLaunch),
            user_data,
            nonce,
        )
    }
}
