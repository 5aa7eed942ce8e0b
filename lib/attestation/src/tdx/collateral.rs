//! Intel's collateral for TDX quotes, and where a verifier gets it.
//!
//! One [`Collateral`] serves every quote of one platform model (FMSPC) whose PCK was issued by
//! one PCK CA: the TDX TCB info and the TD QE identity (each the exact JSON Intel signed, with
//! the signature and the TCB signing issuer chain), the PCK CRL of that CA and the root CA CRL.
//! It is built from Intel PCS v4 responses as served (`/tdx/certification/v4/tcb?fmspc=`
//! `{"tcbInfo": ..., "signature": hex}` with header `TCB-Info-Issuer-Chain`;
//! `/tdx/certification/v4/qe/identity` `{"enclaveIdentity": ..., "signature": hex}` with
//! `SGX-Enclave-Identity-Issuer-Chain`; `/sgx/certification/v4/pckcrl?ca=` DER with
//! `SGX-PCK-CRL-Issuer-Chain`; the root CA CRL DER), from a directory holding those
//! ([`Collateral::from_dir`]), or from dcap-qvl's own JSON form.
//!
//! Nothing here is trusted: [`super::verify_quote`] checks every signature and date.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use x509_parser::prelude::FromDer;

pub use crate::snp::CollateralError;

use super::TdxError;

/// The largest collateral item accepted. Intel's TCB info for one FMSPC is a few kilobytes and a
/// PCK CRL tens of kilobytes; a megabyte leaves room for growth and bounds a bad file.
pub const MAX_ITEM: usize = 1 << 20;

/// The Intel CA that issued a PCK certificate, and so which PCK CRL applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PckCa {
    Platform,
    Processor,
}

impl PckCa {
    /// The name PCS uses (`/pckcrl?ca=`).
    pub fn name(self) -> &'static str {
        match self {
            PckCa::Platform => "platform",
            PckCa::Processor => "processor",
        }
    }

    /// The CA whose certificate has this common name.
    pub fn from_issuer_cn(cn: &str) -> Option<PckCa> {
        match cn {
            "Intel SGX PCK Platform CA" => Some(PckCa::Platform),
            "Intel SGX PCK Processor CA" => Some(PckCa::Processor),
            _ => None,
        }
    }
}

impl fmt::Display for PckCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Intel PCS v4 responses for one FMSPC and CA, as served.
#[derive(Clone, Copy, Debug)]
pub struct PcsResponses<'a> {
    /// The body of `/tdx/certification/v4/tcb?fmspc=`.
    pub tcb_info: &'a [u8],
    /// Its `TCB-Info-Issuer-Chain` header, URL-decoded: PEM, TCB signing certificate first.
    pub tcb_info_issuer_chain: &'a str,
    /// The body of `/tdx/certification/v4/qe/identity`.
    pub qe_identity: &'a [u8],
    /// Its `SGX-Enclave-Identity-Issuer-Chain` header, URL-decoded.
    pub qe_identity_issuer_chain: &'a str,
    /// The body of `/sgx/certification/v4/pckcrl?ca=` (DER).
    pub pck_crl: &'a [u8],
    /// Its `SGX-PCK-CRL-Issuer-Chain` header, URL-decoded (kept for the record; the PCK CRL is
    /// verified with the PCK chain the quote carries).
    pub pck_crl_issuer_chain: &'a str,
    /// The root CA CRL (DER).
    pub root_ca_crl: &'a [u8],
}

/// Intel's collateral for one FMSPC and PCK CA.
#[derive(Clone, Debug)]
pub struct Collateral {
    dcap: dcap_qvl::QuoteCollateralV3,
    fmspc: [u8; 6],
    ca: PckCa,
    issued: i64,
    next_update: i64,
}

fn bad(reason: impl Into<String>) -> TdxError {
    TdxError::Collateral(reason.into())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedTcbInfo<'a> {
    #[serde(borrow)]
    tcb_info: &'a RawValue,
    signature: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedQeIdentity<'a> {
    #[serde(borrow)]
    enclave_identity: &'a RawValue,
    signature: String,
}

/// The fields read from the signed JSON before it is verified (to index and refresh it).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dated {
    issue_date: String,
    next_update: String,
    #[serde(default)]
    fmspc: Option<String>,
}

/// dcap-qvl's collateral JSON (`tcb_info` and `qe_identity` the exact signed strings,
/// signatures and CRLs hex).
#[derive(Deserialize, serde::Serialize)]
struct DcapJson {
    pck_crl_issuer_chain: String,
    root_ca_crl: String,
    pck_crl: String,
    tcb_info_issuer_chain: String,
    tcb_info: String,
    tcb_info_signature: String,
    qe_identity_issuer_chain: String,
    qe_identity: String,
    qe_identity_signature: String,
}

fn unhex(field: &str, value: &str) -> Result<Vec<u8>, TdxError> {
    hex::decode(value.trim()).map_err(|e| bad(format!("{field} is not hex: {e}")))
}

fn signature(field: &str, value: &str) -> Result<Vec<u8>, TdxError> {
    let sig = unhex(field, value)?;
    if sig.len() != 64 {
        return Err(bad(format!(
            "{field} has {} bytes, an ECDSA P-256 r||s has 64",
            sig.len()
        )));
    }
    Ok(sig)
}

fn limit(field: &str, len: usize) -> Result<(), TdxError> {
    if len > MAX_ITEM {
        return Err(bad(format!(
            "{field} has {len} bytes, more than the limit of {MAX_ITEM}"
        )));
    }
    Ok(())
}

fn time(field: &str, value: &str) -> Result<i64, TdxError> {
    humantime::parse_rfc3339(value)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .ok_or_else(|| bad(format!("{field} {value:?} is not an RFC 3339 time")))
}

/// A CRL's issuer CA, thisUpdate and nextUpdate.
fn crl_facts(field: &str, der: &[u8]) -> Result<(String, i64, i64), TdxError> {
    let (_, crl) = x509_parser::revocation_list::CertificateRevocationList::from_der(der)
        .map_err(|e| bad(format!("{field} is not a DER CRL: {e}")))?;
    let issuer = crate::issuer::common_name(crl.issuer()).to_owned();
    let next = crl
        .next_update()
        .map(|t| t.timestamp())
        .ok_or_else(|| bad(format!("{field} has no nextUpdate")))?;
    Ok((issuer, crl.last_update().timestamp(), next))
}

impl Collateral {
    /// Builds collateral from PCS v4 responses.
    pub fn from_pcs(pcs: PcsResponses<'_>) -> Result<Collateral, TdxError> {
        limit("the TCB info", pcs.tcb_info.len())?;
        limit("the QE identity", pcs.qe_identity.len())?;
        let tcb: SignedTcbInfo<'_> = serde_json::from_slice(pcs.tcb_info).map_err(|e| {
            bad(format!(
                "the TCB info is not PCS's {{tcbInfo, signature}}: {e}"
            ))
        })?;
        let qe: SignedQeIdentity<'_> = serde_json::from_slice(pcs.qe_identity).map_err(|e| {
            bad(format!(
                "the QE identity is not PCS's {{enclaveIdentity, signature}}: {e}"
            ))
        })?;
        Self::assemble(dcap_qvl::QuoteCollateralV3 {
            pck_crl_issuer_chain: pcs.pck_crl_issuer_chain.to_owned(),
            root_ca_crl: pcs.root_ca_crl.to_vec(),
            pck_crl: pcs.pck_crl.to_vec(),
            tcb_info_issuer_chain: pcs.tcb_info_issuer_chain.to_owned(),
            tcb_info: tcb.tcb_info.get().to_owned(),
            tcb_info_signature: signature("the TCB info signature", &tcb.signature)?,
            qe_identity_issuer_chain: pcs.qe_identity_issuer_chain.to_owned(),
            qe_identity: qe.enclave_identity.get().to_owned(),
            qe_identity_signature: signature("the QE identity signature", &qe.signature)?,
            pck_certificate_chain: None,
        })
    }

    /// Reads dcap-qvl's collateral JSON.
    pub fn from_dcap_json(json: &[u8]) -> Result<Collateral, TdxError> {
        limit("the collateral JSON", json.len())?;
        let raw: DcapJson = serde_json::from_slice(json)
            .map_err(|e| bad(format!("not dcap-qvl's collateral JSON: {e}")))?;
        Self::assemble(dcap_qvl::QuoteCollateralV3 {
            pck_crl_issuer_chain: raw.pck_crl_issuer_chain,
            root_ca_crl: unhex("root_ca_crl", &raw.root_ca_crl)?,
            pck_crl: unhex("pck_crl", &raw.pck_crl)?,
            tcb_info_issuer_chain: raw.tcb_info_issuer_chain,
            tcb_info: raw.tcb_info,
            tcb_info_signature: signature("tcb_info_signature", &raw.tcb_info_signature)?,
            qe_identity_issuer_chain: raw.qe_identity_issuer_chain,
            qe_identity: raw.qe_identity,
            qe_identity_signature: signature("qe_identity_signature", &raw.qe_identity_signature)?,
            pck_certificate_chain: None,
        })
    }

    /// Reads a directory: either `collateral.json` (dcap-qvl's form), or the PCS responses as
    /// files: `tcb_info.json`, `tcb_info_issuer_chain.pem`, `qe_identity.json`,
    /// `qe_identity_issuer_chain.pem`, `pck_crl.der`, `root_ca_crl.der`, and optionally
    /// `pck_crl_issuer_chain.pem`.
    pub fn from_dir(dir: &Path) -> Result<Collateral, TdxError> {
        let read = |name: &str| -> Result<Vec<u8>, TdxError> {
            let path = dir.join(name);
            let len = std::fs::metadata(&path)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?
                .len();
            limit(name, usize::try_from(len).unwrap_or(usize::MAX))?;
            std::fs::read(&path).map_err(|e| bad(format!("{}: {e}", path.display())))
        };
        let text = |name: &str| -> Result<String, TdxError> {
            String::from_utf8(read(name)?).map_err(|_| bad(format!("{name} is not UTF-8")))
        };
        if dir.join("collateral.json").exists() {
            return Self::from_dcap_json(&read("collateral.json")?);
        }
        let pck_crl_issuer_chain = if dir.join("pck_crl_issuer_chain.pem").exists() {
            text("pck_crl_issuer_chain.pem")?
        } else {
            String::new()
        };
        Self::from_pcs(PcsResponses {
            tcb_info: &read("tcb_info.json")?,
            tcb_info_issuer_chain: &text("tcb_info_issuer_chain.pem")?,
            qe_identity: &read("qe_identity.json")?,
            qe_identity_issuer_chain: &text("qe_identity_issuer_chain.pem")?,
            pck_crl: &read("pck_crl.der")?,
            pck_crl_issuer_chain: &pck_crl_issuer_chain,
            root_ca_crl: &read("root_ca_crl.der")?,
        })
    }

    fn assemble(dcap: dcap_qvl::QuoteCollateralV3) -> Result<Collateral, TdxError> {
        let tcb: Dated = serde_json::from_str(&dcap.tcb_info)
            .map_err(|e| bad(format!("the TCB info lacks nextUpdate: {e}")))?;
        let qe: Dated = serde_json::from_str(&dcap.qe_identity)
            .map_err(|e| bad(format!("the QE identity lacks nextUpdate: {e}")))?;
        let fmspc = tcb
            .fmspc
            .as_deref()
            .and_then(|f| hex::decode(f).ok())
            .and_then(|f| <[u8; 6]>::try_from(f).ok())
            .ok_or_else(|| bad("the TCB info has no 6-byte hex fmspc"))?;
        let (pck_issuer, pck_this, pck_next) = crl_facts("the PCK CRL", &dcap.pck_crl)?;
        let ca = PckCa::from_issuer_cn(&pck_issuer).ok_or_else(|| {
            bad(format!(
                "the PCK CRL is issued by {pck_issuer:?}, not an Intel PCK CA"
            ))
        })?;
        let (_, root_this, root_next) = crl_facts("the root CA CRL", &dcap.root_ca_crl)?;
        let issued = [
            time("the TCB info's issueDate", &tcb.issue_date)?,
            time("the QE identity's issueDate", &qe.issue_date)?,
            pck_this,
            root_this,
        ]
        .into_iter()
        .max()
        .unwrap_or(i64::MAX);
        let next_update = [
            time("the TCB info's nextUpdate", &tcb.next_update)?,
            time("the QE identity's nextUpdate", &qe.next_update)?,
            pck_next,
            root_next,
        ]
        .into_iter()
        .min()
        .unwrap_or(i64::MIN);
        Ok(Collateral {
            dcap,
            fmspc,
            ca,
            issued,
            next_update,
        })
    }

    /// The platform model this collateral is for.
    pub fn fmspc(&self) -> [u8; 6] {
        self.fmspc
    }

    /// The CA whose PCK CRL this collateral holds.
    pub fn ca(&self) -> PckCa {
        self.ca
    }

    /// The latest issueDate or thisUpdate of its items (seconds since the epoch): before it,
    /// the collateral cannot vouch for anything.
    pub fn issued(&self) -> i64 {
        self.issued
    }

    /// The earliest nextUpdate of its items (seconds since the epoch): when it must be
    /// refreshed.
    pub fn next_update(&self) -> i64 {
        self.next_update
    }

    /// dcap-qvl's collateral JSON for this collateral, which [`Collateral::from_dcap_json`]
    /// reads back: every item exactly as Intel signed it.
    pub fn to_dcap_json(&self) -> Vec<u8> {
        let dcap = &self.dcap;
        let json = DcapJson {
            pck_crl_issuer_chain: dcap.pck_crl_issuer_chain.clone(),
            root_ca_crl: hex::encode(&dcap.root_ca_crl),
            pck_crl: hex::encode(&dcap.pck_crl),
            tcb_info_issuer_chain: dcap.tcb_info_issuer_chain.clone(),
            tcb_info: dcap.tcb_info.clone(),
            tcb_info_signature: hex::encode(&dcap.tcb_info_signature),
            qe_identity_issuer_chain: dcap.qe_identity_issuer_chain.clone(),
            qe_identity: dcap.qe_identity.clone(),
            qe_identity_signature: hex::encode(&dcap.qe_identity_signature),
        };
        // Strings and hex only: serializing cannot fail.
        serde_json::to_vec(&json).unwrap_or_default()
    }

    /// The TCB info as Intel signed it.
    pub fn tcb_info_json(&self) -> &str {
        &self.dcap.tcb_info
    }

    pub(crate) fn dcap(&self) -> &dcap_qvl::QuoteCollateralV3 {
        &self.dcap
    }
}

/// Why a source gives no collateral for a platform. The two cases call for opposite answers: a
/// source that cannot deliver now is the service's trouble (the node retries), while Intel
/// itself saying it knows no such platform is final (the node is refused).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum TdxCollateralError {
    /// Nothing usable at hand and the source did not deliver in time: the node should retry.
    #[error(transparent)]
    Unavailable(#[from] CollateralError),
    /// Intel has no TCB info for the FMSPC the quote's PCK certificate names (PCS answered 404):
    /// the platform is unknown to Intel, and asking again will not change that.
    #[error("Intel knows no platform with FMSPC {fmspc}: {reason}")]
    UnknownPlatform { fmspc: String, reason: String },
}

/// A source of Intel collateral. Implementations must not block for long: the verifier calls
/// them on its verification threads, so a slow source is answered from cache or refused.
pub trait TdxCollateral: Send + Sync + fmt::Debug {
    /// The collateral for quotes whose PCK certificate has `fmspc` and was issued by `ca`.
    fn collateral(&self, fmspc: [u8; 6], ca: PckCa) -> Result<Arc<Collateral>, TdxCollateralError>;

    /// How long past its nextUpdate collateral from this source is still accepted (seconds):
    /// the bounded staleness a cache serves while Intel is unreachable. Zero: never.
    fn max_stale(&self) -> i64 {
        0
    }
}

/// Collateral held in memory: given up front, never fetched.
#[derive(Clone, Debug, Default)]
pub struct StaticCollateral {
    items: HashMap<([u8; 6], PckCa), Arc<Collateral>>,
}

impl StaticCollateral {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `collateral` under its own FMSPC and CA.
    pub fn with(mut self, collateral: Collateral) -> Self {
        self.items
            .insert((collateral.fmspc(), collateral.ca()), Arc::new(collateral));
        self
    }
}

impl TdxCollateral for StaticCollateral {
    fn collateral(&self, fmspc: [u8; 6], ca: PckCa) -> Result<Arc<Collateral>, TdxCollateralError> {
        self.items.get(&(fmspc, ca)).cloned().ok_or_else(|| {
            CollateralError(format!(
                "no Intel collateral for FMSPC {} ({ca} CA)",
                hex::encode(fmspc)
            ))
            .into()
        })
    }
}
