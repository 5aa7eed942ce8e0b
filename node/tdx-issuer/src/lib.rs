//! Node-side Intel TDX: qemu-tdx attestation documents around TD quotes from the guest kernel.
//!
//! A qemu-tdx node proves what it runs with a TD quote alone (no vTPM): the TDX module's report
//! of the TD (MRTD, RTMR0..3, attributes) with REPORT_DATA chosen by the TD, signed through the
//! host's quoting enclave (the kernel asks the host's quote generation service with a GetQuote
//! hypercall). [`ConfigfsTdx`] asks Linux's configfs-tsm for one (provider `tdx_guest`, inblob
//! = the 64 bytes of REPORT_DATA, outblob = the quote), through the `configfs-tsm` crate the SNP
//! issuer uses too. [`QemuTdxIssuer`] wraps each quote as Constellation's qemu-tdx issuer does:
//! REPORT_DATA = SHA-256(user data ‖ nonce) zero-padded to 64 bytes, document
//! `{"RawQuote", "UserData"}` as Go's `encoding/json` writes it (bytes as standard base64).
//!
//! Nothing here is trusted by anyone: the verifier checks the quote against Intel's root. The
//! checks here (a TDX quote, over the REPORT_DATA asked for) only turn a broken or
//! misconfigured interface into a clear error on the node instead of a refusal at the verifier.

use std::path::{Path, PathBuf};

use attestation::tdx::quote::TEE_TYPE_TDX;
use attestation::{IssueError, Issuer, Variant};
use base64::Engine as _;
use configfs_tsm::{RealFs, Request, Tsm, TsmError, TsmFs};
use serde::Serialize;

pub use configfs_tsm::DEFAULT_ROOT;

/// The `provider` of Intel TDX guests.
pub const TDX_GUEST_PROVIDER: &str = "tdx_guest";
/// The length of REPORT_DATA, the TD's input to its report.
pub const REPORT_DATA_LEN: usize = 64;
/// The quote header: version, attestation key type, TEE type, QE and PCE SVNs, QE vendor ID,
/// user data.
const HEADER_LEN: usize = 48;
/// A version 5 quote's body descriptor (type and size) between header and body.
const V5_BODY_DESCRIPTOR_LEN: usize = 6;
/// REPORT_DATA in the TD report body, after TEE_TCB_SVN, MRSEAM, MRSIGNERSEAM, the SEAM and TD
/// attributes, XFAM, MRTD, MRCONFIGID, MROWNER, MROWNERCONFIG and RTMR0..3.
const REPORT_DATA_IN_BODY: usize = 520;

/// Why no usable quote could be had.
#[derive(Debug, thiserror::Error)]
pub enum TdxQuoteError {
    #[error("asking {interface} for a TD quote")]
    Tsm {
        interface: String,
        #[source]
        source: TsmError,
    },
    #[error("the outblob has {len} bytes, too short for a TD quote (at least {needed})")]
    Short { len: usize, needed: usize },
    #[error("the outblob is a quote of version {0}, not a TD quote (versions 4 and 5)")]
    Version(u16),
    #[error("the outblob is a quote for TEE type {0:#x}, not TDX ({TEE_TYPE_TDX:#x})")]
    NotTdx(u32),
    #[error("the quote's REPORT_DATA is not what was asked for (another request's quote?)")]
    ReportDataMismatch,
    #[error("encoding the qemu-tdx document")]
    Encode(#[from] serde_json::Error),
}

fn le_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// Checks that `quote` is a TD quote (version 4 or 5, TEE type TDX) whose REPORT_DATA is
/// `report_data`. The rest (signatures, the QE, the PCK chain) is the verifier's.
pub fn check_quote(quote: &[u8], report_data: &[u8; REPORT_DATA_LEN]) -> Result<(), TdxQuoteError> {
    let short = |needed: usize| TdxQuoteError::Short {
        len: quote.len(),
        needed,
    };
    if quote.len() < HEADER_LEN {
        return Err(short(HEADER_LEN));
    }
    let version = le_u16(quote, 0);
    let body = match version {
        4 => HEADER_LEN,
        5 => HEADER_LEN + V5_BODY_DESCRIPTOR_LEN,
        other => return Err(TdxQuoteError::Version(other)),
    };
    let tee_type = u32::from_le_bytes([quote[4], quote[5], quote[6], quote[7]]);
    if tee_type != TEE_TYPE_TDX {
        return Err(TdxQuoteError::NotTdx(tee_type));
    }
    let at = body + REPORT_DATA_IN_BODY;
    let got = quote
        .get(at..at + REPORT_DATA_LEN)
        .ok_or_else(|| short(at + REPORT_DATA_LEN))?;
    if got != report_data {
        return Err(TdxQuoteError::ReportDataMismatch);
    }
    Ok(())
}

/// TD quotes from configfs-tsm.
#[derive(Debug)]
pub struct ConfigfsTdx<F: TsmFs = RealFs> {
    tsm: Tsm<F>,
}

impl ConfigfsTdx<RealFs> {
    /// The kernel's interface under `root` (normally [`DEFAULT_ROOT`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ConfigfsTdx::with_fs(RealFs, root)
    }
}

impl<F: TsmFs> ConfigfsTdx<F> {
    /// The interface under `root`, through `fs`.
    pub fn with_fs(fs: F, root: impl Into<PathBuf>) -> Self {
        ConfigfsTdx {
            tsm: Tsm::with_fs(fs, root, TDX_GUEST_PROVIDER),
        }
    }

    pub fn root(&self) -> &Path {
        self.tsm.root()
    }

    /// A fresh quote of this TD over `report_data`, checked to be one and to answer this
    /// request.
    pub fn quote(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<Vec<u8>, TdxQuoteError> {
        let blobs = self
            .tsm
            .request(&Request {
                inblob: report_data,
                privlevel: None,
                auxblob: false,
            })
            .map_err(|source| TdxQuoteError::Tsm {
                interface: self.tsm.describe(),
                source,
            })?;
        check_quote(&blobs.outblob, report_data)?;
        Ok(blobs.outblob)
    }
}

/// Constellation's qemu-tdx document, fields in Go's order.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct QemuTdxDocument {
    raw_quote: String,
    user_data: String,
}

/// The qemu-tdx REPORT_DATA for `user_data` and `nonce`: the 32 bytes of extraData, then zeros.
pub fn report_data(user_data: &[u8], nonce: &[u8]) -> [u8; REPORT_DATA_LEN] {
    let mut data = [0u8; REPORT_DATA_LEN];
    data[..32].copy_from_slice(&attestation::vtpm::make_extra_data(user_data, nonce));
    data
}

/// Issues qemu-tdx documents, one fresh quote each.
#[derive(Debug)]
pub struct QemuTdxIssuer<F: TsmFs = RealFs> {
    source: ConfigfsTdx<F>,
}

impl QemuTdxIssuer<RealFs> {
    /// Quotes from the kernel's configfs-tsm under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        QemuTdxIssuer::with_source(ConfigfsTdx::new(root))
    }

    /// Quotes from the kernel's configfs-tsm under `root`, which must be there: a process
    /// that will need quotes says at start that it cannot get any, not at its first request.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, TdxQuoteError> {
        let root = root.into();
        if !root.is_dir() {
            return Err(TdxQuoteError::Tsm {
                interface: format!("configfs-tsm at {}", root.display()),
                source: TsmError::NoConfigfs(root),
            });
        }
        Ok(QemuTdxIssuer::new(root))
    }
}

impl<F: TsmFs> QemuTdxIssuer<F> {
    pub fn with_source(source: ConfigfsTdx<F>) -> Self {
        QemuTdxIssuer { source }
    }

    /// A document binding `user_data` to `nonce`.
    pub fn issue_document(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, TdxQuoteError> {
        let quote = self.source.quote(&report_data(user_data, nonce))?;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let document = QemuTdxDocument {
            raw_quote: b64(&quote),
            user_data: b64(user_data),
        };
        Ok(serde_json::to_vec(&document)?)
    }
}

impl<F: TsmFs> Issuer for QemuTdxIssuer<F> {
    fn variant(&self) -> Variant {
        Variant::QemuTdx
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.issue_document(user_data, nonce)
            .map_err(|e| IssueError {
                variant: Variant::QemuTdx,
                // The whole chain: "asking configfs-tsm for a TD quote" alone would not say what to
                // fix.
                reason: attestation::audit::chain(&e),
                source: Some(Box::new(e)),
            })
    }
}
