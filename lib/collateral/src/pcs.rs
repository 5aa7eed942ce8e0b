//! Intel's Provisioning Certification Service (PCS, API v4) as a [`Source`], and the TDX
//! collateral a DCAP verifier asks for, answered from the [`Cache`].
//!
//! Keys and what they name (the real service is `https://api.trustedservices.intel.com`; an
//! operator may put a caching proxy such as Intel's PCCS in front of it, at the same paths):
//!
//! | key | URL | issuer chain from header |
//! |---|---|---|
//! | `tcb/{fmspc}` | `/tdx/certification/v4/tcb?fmspc={fmspc}` (JSON) | `TCB-Info-Issuer-Chain` |
//! | `qe/identity` | `/tdx/certification/v4/qe/identity` (JSON) | `SGX-Enclave-Identity-Issuer-Chain` |
//! | `pckcrl/{platform,processor}` | `/sgx/certification/v4/pckcrl?ca=..&encoding=der` | `SGX-PCK-CRL-Issuer-Chain` |
//! | `rootcrl` | Intel's root CA CRL, at its own URL ([`INTEL_ROOT_CA_CRL`]) (DER) | none: the root signs it |
//!
//! The QE identity and the CRLs are shared keys ([`crate::KeyClass::Shared`]); `tcb/{fmspc}` is
//! named by the FMSPC of a node's PCK certificate ([`crate::KeyClass::NodeNamed`]), looked up
//! only once that certificate verified to the trusted root, and bounded apart from the rest.
//!
//! Every item keeps the body exactly as served (the TCB info and QE identity signatures cover
//! the exact bytes of their `tcbInfo` / `enclaveIdentity` values) and the issuer chain, PEM,
//! URL-decoded from its header. A CRL served as PEM is kept as DER.
//!
//! Each item is refreshed a quarter of its window before its `nextUpdate` (TCB info and QE
//! identity: from `issueDate`; CRLs: from `thisUpdate`) and is stale after `nextUpdate`. An FMSPC
//! Intel does not know (HTTP 404) is remembered as such for a while
//! ([`PcsSource::with_not_found_recheck`]), so a storm of nodes of an unknown platform asks
//! Intel once, and the verifier gets [`PcsError::NotFound`]: a refusal, not a retry.
//!
//! [`PcsCollateral`] answers the TDX verifier ([`attestation::tdx::TdxCollateral`]): it assembles
//! one [`Collateral`] per FMSPC and PCK CA from the cached items and keeps it until one of them is
//! refreshed. Nothing cached and Intel not answering in time is
//! [`TdxCollateralError::Unavailable`] (the node retries); Intel's 404 for the FMSPC is
//! [`TdxCollateralError::UnknownPlatform`] (the node is refused).
//!
//! The source checks only that what it fetched parses: the JSON's shape and dates, the
//! signature's hex length, the CRL's DER and dates, the chain's PEM certificates. It verifies no
//! signature: the verifier checks the chains, the signatures and the validity windows, as it
//! does for what a node sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use attestation::tdx::collateral::{CollateralError, PcsResponses};
use attestation::tdx::{Collateral, PckCa as TdxPckCa, TdxCollateral, TdxCollateralError};
use time::format_description::well_known::Rfc3339;
use x509_parser::prelude::FromDer;

use crate::http::{HttpClient, SetupError};
use crate::{Cache, FetchError, FetchFuture, Fetched, KeyClass, Source, Unavailable};

/// Intel's PCS.
pub const INTEL_PCS: &str = "https://api.trustedservices.intel.com";

/// Where Intel serves the CRL of the Intel SGX Root CA.
pub const INTEL_ROOT_CA_CRL: &str =
    "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der";

/// The largest answer read: a processor CA's CRL is the largest item, tens of kilobytes.
const MAX_BODY: usize = 1024 * 1024;

/// How long Intel's "no such FMSPC" is believed before asking again, by default.
const NOT_FOUND_RECHECK: Duration = Duration::from_secs(10 * 60);

/// The two Intel CAs that issue PCK certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PckCa {
    Platform,
    Processor,
}

impl PckCa {
    /// The `ca=` value of the PCS query.
    pub fn as_str(self) -> &'static str {
        match self {
            PckCa::Platform => "platform",
            PckCa::Processor => "processor",
        }
    }
}

impl std::fmt::Display for PckCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A cached item: the body as served (a CRL as DER) and the PEM chain that signed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcsItem {
    pub body: Vec<u8>,
    /// PEM certificates, signer first; empty for the root CA CRL.
    pub issuer_chain: String,
}

/// What [`check`] found in a fetched item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub item: PcsItem,
    /// `issueDate` (TCB info, QE identity) or `thisUpdate` (CRL).
    pub issued: SystemTime,
    /// `nextUpdate`.
    pub next_update: SystemTime,
}

impl Checked {
    /// A quarter of the window before `nextUpdate`.
    pub fn refresh_after(&self) -> SystemTime {
        let window = self
            .next_update
            .duration_since(self.issued)
            .unwrap_or_default();
        self.next_update - window / 4
    }
}

/// Why TDX collateral could not be had.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PcsError {
    /// Nothing usable cached and Intel did not deliver in time: the node should retry.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// Intel answered 404: it has no such item (an FMSPC it does not know).
    #[error("Intel PCS has no collateral {key}: {reason}")]
    NotFound { key: String, reason: String },
    #[error("FMSPC {0:?} is not 6 bytes of hex")]
    Fmspc(String),
    /// A cached item does not decode (a corrupt persisted file).
    #[error("cached collateral {key} is malformed: {reason}")]
    Malformed { key: String, reason: String },
}

impl PcsError {
    /// Whether the node should be told to retry rather than refused.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, PcsError::Unavailable(_))
    }
}

/// The cache key of the TCB info of `fmspc` (12 hex digits, either case).
pub fn tcb_info_key(fmspc: &str) -> Result<String, PcsError> {
    if fmspc.len() != 12 || !fmspc.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PcsError::Fmspc(fmspc.to_owned()));
    }
    Ok(format!("tcb/{}", fmspc.to_ascii_lowercase()))
}

pub const QE_IDENTITY_KEY: &str = "qe/identity";
pub const ROOT_CA_CRL_KEY: &str = "rootcrl";

pub fn pck_crl_key(ca: PckCa) -> String {
    format!("pckcrl/{ca}")
}

/// The header that carries the issuer chain of `key`'s item.
fn chain_header(key: &str) -> Option<&'static str> {
    if key.starts_with("tcb/") {
        Some("TCB-Info-Issuer-Chain")
    } else if key == QE_IDENTITY_KEY {
        Some("SGX-Enclave-Identity-Issuer-Chain")
    } else if key.starts_with("pckcrl/") {
        Some("SGX-PCK-CRL-Issuer-Chain")
    } else {
        None
    }
}

/// Checks that `body` (and `issuer_chain`) fetched for `key` parse, and reads their dates.
/// Verifies no signature.
pub fn check(key: &str, body: &[u8], issuer_chain: &str) -> Result<Checked, String> {
    let (body, issued, next_update) = if let Some(fmspc) = key.strip_prefix("tcb/") {
        let (issued, next) = check_signed_json(body, "tcbInfo", "TDX", Some(fmspc))?;
        (body.to_vec(), issued, next)
    } else if key == QE_IDENTITY_KEY {
        let (issued, next) = check_signed_json(body, "enclaveIdentity", "TD_QE", None)?;
        (body.to_vec(), issued, next)
    } else if key.starts_with("pckcrl/") || key == ROOT_CA_CRL_KEY {
        let der = crl_der(body)?;
        let (issued, next) = crl_dates(&der)?;
        (der, issued, next)
    } else {
        return Err(format!("{key} names no PCS collateral"));
    };
    if next_update <= issued {
        return Err("nextUpdate is not after the issue date".to_owned());
    }
    if chain_header(key).is_some() {
        check_chain(issuer_chain)?;
    } else if !issuer_chain.is_empty() {
        return Err(format!("{key} comes with no issuer chain"));
    }
    Ok(Checked {
        item: PcsItem {
            body,
            issuer_chain: issuer_chain.to_owned(),
        },
        issued,
        next_update,
    })
}

/// `{"<field>": {"id": .., "issueDate": .., "nextUpdate": .., "tcbLevels": [..]}, "signature":
/// <64 bytes hex>}`: the issue date and next update.
fn check_signed_json(
    body: &[u8],
    field: &str,
    id: &str,
    fmspc: Option<&str>,
) -> Result<(SystemTime, SystemTime), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_owned())?;
    if let Some(other) = object.keys().find(|k| *k != field && *k != "signature") {
        return Err(format!("unexpected field {other:?}"));
    }
    let inner = object
        .get(field)
        .and_then(|v| v.as_object())
        .ok_or_else(|| format!("no {field:?} object"))?;
    let signature = object
        .get("signature")
        .and_then(|v| v.as_str())
        .ok_or_else(|| "no \"signature\" string".to_owned())?;
    match hex::decode(signature) {
        Ok(sig) if sig.len() == 64 => {}
        Ok(sig) => {
            return Err(format!(
                "the signature is {} bytes, not r||s (64)",
                sig.len()
            ));
        }
        Err(e) => return Err(format!("the signature is not hex: {e}")),
    }
    let string = |name: &str| {
        inner
            .get(name)
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("{field}.{name} is not a string"))
    };
    let found_id = string("id")?;
    if found_id != id {
        return Err(format!("{field}.id is {found_id:?}, not {id:?}"));
    }
    if let Some(fmspc) = fmspc {
        let found = string("fmspc")?;
        if !found.eq_ignore_ascii_case(fmspc) {
            return Err(format!("{field}.fmspc is {found:?}, asked for {fmspc:?}"));
        }
    }
    if !inner.get("tcbLevels").is_some_and(|v| v.is_array()) {
        return Err(format!("{field}.tcbLevels is not an array"));
    }
    let date = |name: &str| -> Result<SystemTime, String> {
        let text = string(name)?;
        let at = time::OffsetDateTime::parse(text, &Rfc3339)
            .map_err(|e| format!("{field}.{name} {text:?}: {e}"))?;
        at_secs(at.unix_timestamp()).ok_or_else(|| format!("{field}.{name} is before 1970"))
    };
    Ok((date("issueDate")?, date("nextUpdate")?))
}

fn at_secs(secs: i64) -> Option<SystemTime> {
    u64::try_from(secs)
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
}

/// A CRL's DER, from DER or PEM.
fn crl_der(body: &[u8]) -> Result<Vec<u8>, String> {
    if body.starts_with(b"-----BEGIN") {
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(body).map_err(|e| format!("the CRL's PEM: {e}"))?;
        if pem.label != "X509 CRL" {
            return Err(format!("a PEM {:?}, not an X509 CRL", pem.label));
        }
        return Ok(pem.contents);
    }
    Ok(body.to_vec())
}

fn crl_dates(der: &[u8]) -> Result<(SystemTime, SystemTime), String> {
    let (rest, crl) = x509_parser::revocation_list::CertificateRevocationList::from_der(der)
        .map_err(|e| format!("not a DER CRL: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the CRL", rest.len()));
    }
    let this = crl.last_update().timestamp();
    let next = crl
        .next_update()
        .ok_or_else(|| "the CRL has no nextUpdate".to_owned())?
        .timestamp();
    Ok((
        at_secs(this).ok_or_else(|| "the CRL's thisUpdate is before 1970".to_owned())?,
        at_secs(next).ok_or_else(|| "the CRL's nextUpdate is before 1970".to_owned())?,
    ))
}

/// At least one certificate, and nothing but certificates.
fn check_chain(pem: &str) -> Result<(), String> {
    let mut count = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("the issuer chain's PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            return Err(format!("the issuer chain holds a {:?}", block.label));
        }
        block
            .parse_x509()
            .map_err(|e| format!("issuer chain certificate {}: {e}", count + 1))?;
        count += 1;
    }
    if count == 0 {
        return Err("the issuer chain holds no certificate".to_owned());
    }
    Ok(())
}

/// Decodes a URL-encoded header value (`%XX`; `+` is a `+`, as in base64).
pub fn url_decode(value: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("a bad escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(value[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once decoded".to_owned())
}

// A cached item: "pcs1", a kind byte, the chain's length (u32 BE), the chain, the body.
const MAGIC: &[u8] = b"pcs1";
const FOUND: u8 = 0;
const NOT_FOUND: u8 = 1;

fn encode(kind: u8, chain: &str, body: &[u8]) -> Vec<u8> {
    let chain_len = u32::try_from(chain.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(9 + chain.len() + body.len());
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&chain_len.to_be_bytes());
    out.extend_from_slice(chain.as_bytes());
    out.extend_from_slice(body);
    out
}

/// The kind byte, the chain and the body of a cached item.
fn decode(bytes: &[u8]) -> Result<(u8, String, Vec<u8>), String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| "not a PCS item".to_owned())?;
    let (&kind, rest) = rest
        .split_first()
        .ok_or_else(|| "truncated item".to_owned())?;
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| "truncated item".to_owned())?;
    let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
    if rest.len() < len {
        return Err("truncated issuer chain".to_owned());
    }
    let (chain, body) = rest.split_at(len);
    let chain = String::from_utf8(chain.to_vec()).map_err(|_| "chain not UTF-8".to_owned())?;
    Ok((kind, chain, body.to_vec()))
}

/// Fetches from Intel's PCS (or a PCCS, or a proxy) over HTTPS.
#[derive(Clone)]
pub struct PcsSource {
    base: String,
    root_crl_url: String,
    client: HttpClient,
    not_found_recheck: Duration,
}

impl std::fmt::Debug for PcsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcsSource")
            .field("base", &self.base)
            .field("root_crl_url", &self.root_crl_url)
            .field("timeout", &self.client.timeout())
            .finish_non_exhaustive()
    }
}

impl PcsSource {
    /// A client for the PCS at `base` (e.g. [`INTEL_PCS`]) and the root CA CRL at
    /// `root_crl_url` (e.g. [`INTEL_ROOT_CA_CRL`]), trusting the system's roots plus the PEM
    /// certificates in `extra_ca`.
    pub fn new(
        base: &str,
        root_crl_url: &str,
        extra_ca: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<PcsSource, SetupError> {
        crate::http::base_url(root_crl_url)?;
        Ok(PcsSource {
            base: crate::http::base_url(base)?,
            root_crl_url: root_crl_url.to_owned(),
            client: HttpClient::new(extra_ca, timeout, MAX_BODY)?,
            not_found_recheck: NOT_FOUND_RECHECK,
        })
    }

    /// How long an answer of 404 stands before Intel is asked again (default ten minutes).
    pub fn with_not_found_recheck(mut self, recheck: Duration) -> Self {
        self.not_found_recheck = recheck;
        self
    }

    /// The URL a key names.
    pub fn url(&self, key: &str) -> Option<String> {
        let base = &self.base;
        match key.split_once('/') {
            Some(("tcb", fmspc)) => {
                let key = tcb_info_key(fmspc).ok()?;
                let fmspc = key.trim_start_matches("tcb/");
                Some(format!("{base}/tdx/certification/v4/tcb?fmspc={fmspc}"))
            }
            Some(("qe", "identity")) => Some(format!("{base}/tdx/certification/v4/qe/identity")),
            Some(("pckcrl", ca @ ("platform" | "processor"))) => Some(format!(
                "{base}/sgx/certification/v4/pckcrl?ca={ca}&encoding=der"
            )),
            None if key == ROOT_CA_CRL_KEY => Some(self.root_crl_url.clone()),
            _ => None,
        }
    }

    async fn fetch_key(&self, key: String) -> Result<Fetched, FetchError> {
        let url = self
            .url(&key)
            .ok_or_else(|| FetchError::new(format!("{key} names nothing on Intel's PCS")))?;
        let answer = match self.client.get(&url).await? {
            Ok(answer) => answer,
            Err(refused) => {
                let header = |name: &str| {
                    refused
                        .headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(|v| format!(", {name}: {v}"))
                        .unwrap_or_default()
                };
                let reason = format!(
                    "{url}: HTTP {}{}{}{}",
                    refused.status,
                    header("Error-Code"),
                    header("Error-Message"),
                    header("Request-ID"),
                );
                if refused.status != http::StatusCode::NOT_FOUND {
                    return Err(FetchError::new(reason));
                }
                // Intel's last word on this key, cached like an item so that a storm asks once.
                let until = SystemTime::now() + self.not_found_recheck;
                return Ok(Fetched {
                    bytes: encode(NOT_FOUND, "", reason.as_bytes()),
                    refresh_after: until,
                    stale_after: until,
                });
            }
        };
        let chain = match chain_header(&key) {
            Some(name) => {
                let value = answer.headers.get(name).ok_or_else(|| {
                    FetchError::new(format!("{url}: no {name} header in the answer"))
                })?;
                url_decode(value.as_bytes())
                    .map_err(|e| FetchError::new(format!("{url}: the {name} header: {e}")))?
            }
            None => String::new(),
        };
        let checked = check(&key, &answer.body, &chain)
            .map_err(|e| FetchError::new(format!("{url}: {e}")))?;
        Ok(Fetched {
            bytes: encode(FOUND, &checked.item.issuer_chain, &checked.item.body),
            refresh_after: checked.refresh_after(),
            stale_after: checked.next_update,
        })
    }
}

impl Source for PcsSource {
    fn fetch(&self, key: &str) -> FetchFuture {
        let source = self.clone();
        let key = key.to_owned();
        Box::pin(async move { source.fetch_key(key).await })
    }

    /// What every TDX join needs is shared; the TCB info is named by the FMSPC of the quote's PCK
    /// certificate (the verifier checks that certificate to Intel's root first, so only real
    /// platforms are named, but a node chooses which).
    fn class(&self, key: &str) -> KeyClass {
        match key {
            QE_IDENTITY_KEY | ROOT_CA_CRL_KEY => KeyClass::Shared,
            "pckcrl/platform" | "pckcrl/processor" => KeyClass::Shared,
            _ => KeyClass::NodeNamed,
        }
    }
}

/// The TDX verifier's collateral, from a cache in front of a PCS.
///
/// Every accessor is synchronous, as the verifier runs on blocking threads: it answers from
/// memory, or waits at most the cache's `wait` for the one fetch in flight.
#[derive(Clone, Debug)]
pub struct PcsCollateral {
    cache: Cache,
    max_stale: Duration,
    assembled: Assembled,
}

/// At most this many platforms' assembled collateral is kept. Only platforms Intel knows are
/// assembled (a few hundred FMSPCs exist), so the bound only guards against the unforeseen.
const MAX_ASSEMBLED: usize = 1024;

/// The verifier's [`Collateral`] per FMSPC and PCK CA, with the cached items it was built from.
/// Parsing the JSON and CRLs costs far more than a join's lookup, and a storm of one platform's
/// nodes needs the same result thousands of times: it is rebuilt only when the cache holds an
/// item with other bytes (a refresh that brought something new). A refetched item is a new
/// allocation, so the common case costs a pointer comparison per item.
#[derive(Clone, Default)]
struct Assembled(Arc<Mutex<HashMap<Platform, Built>>>);

/// An FMSPC and the CA that issued its PCK certificates.
type Platform = ([u8; 6], TdxPckCa);

struct Built {
    from: Vec<Arc<Vec<u8>>>,
    collateral: Result<Arc<Collateral>, TdxCollateralError>,
}

impl std::fmt::Debug for Assembled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let platforms = self.0.lock().map(|m| m.len()).unwrap_or_default();
        f.debug_struct("Assembled")
            .field("platforms", &platforms)
            .finish()
    }
}

impl From<TdxPckCa> for PckCa {
    fn from(ca: TdxPckCa) -> PckCa {
        match ca {
            TdxPckCa::Platform => PckCa::Platform,
            TdxPckCa::Processor => PckCa::Processor,
        }
    }
}

impl PcsCollateral {
    /// `max_stale` must be the cache's: an item is served that long past its `nextUpdate`, so
    /// the verifier must accept it that long.
    pub fn new(cache: Cache, max_stale: Duration) -> Self {
        PcsCollateral {
            cache,
            max_stale,
            assembled: Assembled::default(),
        }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// How long past `nextUpdate` the cache serves an item while the PCS fails.
    pub fn max_stale(&self) -> Duration {
        self.max_stale
    }

    /// Starts fetching the QE identity, both PCK CRLs, the root CA CRL and the TCB info of
    /// `fmspcs`, so the first joins find them cached.
    pub fn warm(&self, fmspcs: &[&str]) -> Result<(), PcsError> {
        let keys = fmspcs
            .iter()
            .map(|f| tcb_info_key(f))
            .collect::<Result<Vec<_>, _>>()?;
        for key in keys.iter().map(String::as_str).chain([
            QE_IDENTITY_KEY,
            "pckcrl/platform",
            "pckcrl/processor",
            ROOT_CA_CRL_KEY,
        ]) {
            self.cache.prefetch(key);
        }
        Ok(())
    }

    /// The TCB info of `fmspc`: `{"tcbInfo": .., "signature": ..}` as served, and its chain.
    pub fn tcb_info(&self, fmspc: &str) -> Result<PcsItem, PcsError> {
        self.get(&tcb_info_key(fmspc)?)
    }

    /// The TD QE identity: `{"enclaveIdentity": .., "signature": ..}` as served, and its chain.
    pub fn qe_identity(&self) -> Result<PcsItem, PcsError> {
        self.get(QE_IDENTITY_KEY)
    }

    /// The CRL (DER) of a PCK CA, and its chain.
    pub fn pck_crl(&self, ca: PckCa) -> Result<PcsItem, PcsError> {
        self.get(&pck_crl_key(ca))
    }

    /// The Intel SGX Root CA's CRL (DER).
    pub fn root_ca_crl(&self) -> Result<Vec<u8>, PcsError> {
        Ok(self.get(ROOT_CA_CRL_KEY)?.body)
    }

    fn get(&self, key: &str) -> Result<PcsItem, PcsError> {
        decode_item(key, &self.cache.get(key)?)
    }

    /// The verifier's collateral for `fmspc` and `ca`, from the cached items: the same `Arc`
    /// while none of them changed.
    fn assemble(
        &self,
        fmspc: [u8; 6],
        ca: TdxPckCa,
    ) -> Result<Arc<Collateral>, TdxCollateralError> {
        let fmspc_hex = hex::encode(fmspc);
        let unavailable = |e: PcsError| TdxCollateralError::from(CollateralError(e.to_string()));
        // The items every platform shares first: when those cannot be had, Intel's 404 for the
        // FMSPC would be no sure sign of an unknown platform (a wrong --pcs-url answers 404 to
        // everything).
        let keys = [
            QE_IDENTITY_KEY.to_owned(),
            pck_crl_key(ca.into()),
            ROOT_CA_CRL_KEY.to_owned(),
            tcb_info_key(&fmspc_hex).map_err(unavailable)?,
        ];
        let mut from = Vec::with_capacity(keys.len());
        for key in &keys {
            from.push(self.cache.get(key).map_err(|e| unavailable(e.into()))?);
        }
        let [qe, pck_crl, root_crl, tcb] = [0, 1, 2, 3].map(|i| (keys[i].as_str(), &from[i]));
        for (key, bytes) in [qe, pck_crl, root_crl] {
            if let Some(error) = not_found(key, bytes) {
                return Err(unavailable(error));
            }
        }
        // Intel's 404 is a small record: cheap to read, and not kept here (the FMSPC is the
        // node's to name, so such entries would be the node's to multiply).
        match not_found(tcb.0, tcb.1) {
            Some(PcsError::NotFound { reason, .. }) => {
                return Err(TdxCollateralError::UnknownPlatform {
                    fmspc: fmspc_hex,
                    reason,
                });
            }
            Some(other) => return Err(unavailable(other)),
            None => {}
        }
        let mut memo = self.assembled.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(built) = memo.get_mut(&(fmspc, ca)) {
            if built.from.iter().zip(&from).all(|(a, b)| Arc::ptr_eq(a, b)) {
                return built.collateral.clone();
            }
            // Refetched, but Intel served the same bytes: nothing to parse again.
            if built.from.iter().zip(&from).all(|(a, b)| a == b) {
                built.from = from;
                return built.collateral.clone();
            }
        }
        let collateral = (|| {
            let tcb = decode_item(tcb.0, tcb.1)?;
            let qe = decode_item(qe.0, qe.1)?;
            let pck_crl = decode_item(pck_crl.0, pck_crl.1)?;
            let root_crl = decode_item(root_crl.0, root_crl.1)?;
            Ok::<_, PcsError>(Collateral::from_pcs(PcsResponses {
                tcb_info: &tcb.body,
                tcb_info_issuer_chain: &tcb.issuer_chain,
                qe_identity: &qe.body,
                qe_identity_issuer_chain: &qe.issuer_chain,
                pck_crl: &pck_crl.body,
                pck_crl_issuer_chain: &pck_crl.issuer_chain,
                root_ca_crl: &root_crl.body,
            }))
        })()
        .map_err(unavailable)?
        .map(Arc::new)
        .map_err(|e| {
            // Intel served what parses item by item but not as a whole: nothing the node did.
            tracing::warn!(fmspc = %fmspc_hex, %ca, error = %e, "Intel's collateral does not assemble");
            TdxCollateralError::from(CollateralError(format!(
                "Intel's collateral for FMSPC {fmspc_hex} ({ca} CA) does not assemble: {e}"
            )))
        });
        if memo.len() >= MAX_ASSEMBLED && !memo.contains_key(&(fmspc, ca)) {
            memo.clear();
        }
        memo.insert(
            (fmspc, ca),
            Built {
                from,
                collateral: collateral.clone(),
            },
        );
        collateral
    }
}

impl TdxCollateral for PcsCollateral {
    fn collateral(
        &self,
        fmspc: [u8; 6],
        ca: TdxPckCa,
    ) -> Result<Arc<Collateral>, TdxCollateralError> {
        self.assemble(fmspc, ca)
    }

    fn max_stale(&self) -> i64 {
        i64::try_from(self.max_stale.as_secs()).unwrap_or(i64::MAX)
    }
}

/// Intel's 404 for `key`, if that is what `bytes` record (or why they are no item), read
/// without copying what was served.
fn not_found(key: &str, bytes: &[u8]) -> Option<PcsError> {
    let kind = bytes.strip_prefix(MAGIC).and_then(|rest| rest.first());
    (kind != Some(&FOUND)).then(|| {
        decode_item(key, bytes)
            .err()
            .unwrap_or_else(|| PcsError::Malformed {
                key: key.to_owned(),
                reason: "neither served nor a 404".to_owned(),
            })
    })
}

/// Reads a cached item: what was served, or Intel's 404 for it.
fn decode_item(key: &str, bytes: &[u8]) -> Result<PcsItem, PcsError> {
    let malformed = |reason: String| PcsError::Malformed {
        key: key.to_owned(),
        reason,
    };
    match decode(bytes).map_err(malformed)? {
        (FOUND, issuer_chain, body) => Ok(PcsItem { body, issuer_chain }),
        (NOT_FOUND, _, reason) => Err(PcsError::NotFound {
            key: key.to_owned(),
            reason: String::from_utf8_lossy(&reason).into_owned(),
        }),
        (kind, _, _) => Err(malformed(format!("unknown kind {kind}"))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn items_round_trip_and_truncations_are_named() {
        let bytes = encode(FOUND, "chain", b"body");
        assert_eq!(
            decode(&bytes).unwrap(),
            (FOUND, "chain".to_owned(), b"body".to_vec())
        );
        assert_eq!(decode(b"kds?").unwrap_err(), "not a PCS item");
        assert_eq!(decode(&bytes[..10]).unwrap_err(), "truncated issuer chain");
        assert_eq!(decode(b"pcs1").unwrap_err(), "truncated item");
    }

    #[test]
    fn url_decoding_keeps_plus_and_refuses_bad_escapes() {
        assert_eq!(
            url_decode(b"-----BEGIN%20CERTIFICATE-----%0AMI+a%2Fb%3D").unwrap(),
            "-----BEGIN CERTIFICATE-----\nMI+a/b="
        );
        assert_eq!(url_decode(b"ab%2").unwrap_err(), "a bad escape at byte 2");
        assert_eq!(url_decode(b"%zz").unwrap_err(), "a bad escape at byte 0");
        assert_eq!(url_decode(b"%ff").unwrap_err(), "not UTF-8 once decoded");
    }

    #[test]
    fn fmspcs_are_six_bytes_of_hex_and_keyed_in_lower_case() {
        assert_eq!(tcb_info_key("B0C06F000000").unwrap(), "tcb/b0c06f000000");
        for bad in ["b0c06f00000", "b0c06f0000000", "b0c06f00000g", "../../x/y"] {
            assert_eq!(
                tcb_info_key(bad).unwrap_err(),
                PcsError::Fmspc(bad.to_owned())
            );
        }
    }

    #[test]
    fn a_404_stands_ten_minutes_unless_configured() {
        let source =
            PcsSource::new(INTEL_PCS, INTEL_ROOT_CA_CRL, None, Duration::from_secs(1)).unwrap();
        assert_eq!(source.not_found_recheck, Duration::from_secs(600));
        let source = source.with_not_found_recheck(Duration::from_secs(5));
        assert_eq!(source.not_found_recheck, Duration::from_secs(5));
    }

    #[test]
    fn keys_name_the_v4_paths() {
        let source = PcsSource::new(
            "https://pcs.example/",
            "https://crl.example/root.der",
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        let cases = [
            (
                "tcb/00806F050000",
                "https://pcs.example/tdx/certification/v4/tcb?fmspc=00806f050000",
            ),
            (
                "qe/identity",
                "https://pcs.example/tdx/certification/v4/qe/identity",
            ),
            (
                "pckcrl/platform",
                "https://pcs.example/sgx/certification/v4/pckcrl?ca=platform&encoding=der",
            ),
            (
                "pckcrl/processor",
                "https://pcs.example/sgx/certification/v4/pckcrl?ca=processor&encoding=der",
            ),
            ("rootcrl", "https://crl.example/root.der"),
        ];
        for (key, url) in cases {
            assert_eq!(source.url(key).as_deref(), Some(url), "{key}");
        }
        for key in ["tcb/xyz", "pckcrl/other", "qe/other", "crl/Milan"] {
            assert_eq!(source.url(key), None, "{key}");
        }
        assert!(matches!(
            PcsSource::new("ftp://x", INTEL_ROOT_CA_CRL, None, Duration::from_secs(1)),
            Err(SetupError::Url(_))
        ));
    }

    fn signed(field: &str, inner: serde_json::Value, sig: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ field: inner, "signature": sig })).unwrap()
    }

    #[test]
    fn malformed_json_collateral_is_refused_with_the_reason() {
        let sig = "ab".repeat(64);
        let good = serde_json::json!({
            "id": "TDX", "fmspc": "00806f050000", "tcbLevels": [],
            "issueDate": "2025-02-13T03:50:41Z", "nextUpdate": "2025-03-15T03:50:41Z",
        });
        let with = |name: &str, value: serde_json::Value| {
            let mut v = good.clone();
            v[name] = value;
            v
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"<html>".to_vec(), "not JSON"),
            (
                signed("tcbInfo", good.clone(), "abcd"),
                "the signature is 2 bytes",
            ),
            (signed("tcbInfo", good.clone(), &"zz".repeat(64)), "not hex"),
            (
                signed("enclaveIdentity", good.clone(), &sig),
                "unexpected field",
            ),
            (
                signed("tcbInfo", with("fmspc", "00906ed50000".into()), &sig),
                "asked for \"00806f050000\"",
            ),
            (
                signed("tcbInfo", with("id", "SGX".into()), &sig),
                "tcbInfo.id is \"SGX\"",
            ),
            (
                signed("tcbInfo", with("nextUpdate", "tomorrow".into()), &sig),
                "tcbInfo.nextUpdate \"tomorrow\"",
            ),
            (
                signed("tcbInfo", with("tcbLevels", 1.into()), &sig),
                "tcbLevels is not an array",
            ),
            (
                signed(
                    "tcbInfo",
                    with("nextUpdate", "2025-01-01T00:00:00Z".into()),
                    &sig,
                ),
                "nextUpdate is not after",
            ),
        ];
        let chain = "";
        for (body, expected) in cases {
            let error = check("tcb/00806f050000", &body, chain).unwrap_err();
            assert!(error.contains(expected), "{error} / {expected}");
        }
        // The shape is right but the chain is empty.
        let error = check("tcb/00806f050000", &signed("tcbInfo", good, &sig), "").unwrap_err();
        assert_eq!(error, "the issuer chain holds no certificate");
    }

    #[test]
    fn a_crl_that_is_not_der_is_refused() {
        let error = check("rootcrl", b"\x30\x03\x02\x01\x01", "").unwrap_err();
        assert!(error.starts_with("not a DER CRL"), "{error}");
        let error = check(
            "rootcrl",
            b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
            "",
        )
        .unwrap_err();
        assert!(error.contains("not an X509 CRL"), "{error}");
        assert_eq!(
            check("nothing/here", b"", "").unwrap_err(),
            "nothing/here names no PCS collateral"
        );
    }
}
