//! The vendor collateral a node needs to verify the service's SEV-SNP or TDX evidence, carried
//! in the server certificate (ARCHITECTURE.md, "The service attests itself").
//!
//! A node cannot reach AMD's KDS or Intel's PCS, and the host between it and the service could
//! block them anyway. The service already fetches that collateral for the nodes it verifies, so
//! it puts what its own document needs into its certificate, in a second non-critical extension
//! ([`SERVER_COLLATERAL_OID`]) next to the evidence:
//!
//! - AMD (`{"amd": {"crl", "intermediate"?, "signer"?}}`, DER in standard base64): the product's
//!   CRL for the report's signer kind (KDS `/vcek/v1/{product}/crl` for a VCEK,
//!   `/vlek/v1/{product}/crl` for a VLEK), and the ASK or ASVK and the VCEK when the document does not carry them;
//! - Intel (`{"intel": {...}}`): dcap-qvl's collateral JSON for the quote's FMSPC and PCK CA (TCB
//!   info and QE identity exactly as Intel signed them, with their issuer chains, the PCK CRL and
//!   the root CA CRL).
//!
//! Nothing in it is trusted for being there: it is handed to the ordinary validators as their
//! collateral source ([`CertificateSnpCollateral`], [`CertificateTdxCollateral`]), which check
//! every signature up to the root in the node's policy (`amdRootKey`, `intelRootKey`, or the
//! built-in roots) and every date, with the staleness past `nextUpdate` the node allows. The
//! extension is inside the self-signed certificate, so only the holder of the server key can
//! choose it; it could at most choose older genuine collateral, which the staleness bound
//! refuses once it is too old.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use attestation::Variant;
use attestation::snp::{Cert, CollateralError, Crl, Product, SigningKey, SnpCollateral, Tcb};
use attestation::tdx::{Collateral, PckCa, TdxCollateral, TdxCollateralError};
use attestation::variants::sev_snp::DocumentCollateral;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use x509_parser::certificate::X509Certificate;

/// The OID of the collateral extension: `1.3.9900.99.1`. The arc is Constellation's, whose
/// variant OIDs ([`attestation::Variant::oid`]) sit at `1.3.9900.{1..5}`; `99` is this project's
/// own sub-arc, which Constellation does not use, and Go nodes ignore the extension (it is not
/// critical).
pub const SERVER_COLLATERAL_OID: &[u64] = &[1, 3, 9900, 99, 1];

/// The largest collateral extension a server attaches or a node reads. The whole certificate
/// must fit a TLS handshake message (64 KiB) with the document; AMD's items are a few
/// kilobytes, Intel's about 15.
pub const MAX_SERVER_COLLATERAL: usize = 40 * 1024;

/// The collateral extension is malformed or too large.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the server's collateral extension: {0}")]
pub struct CollateralFormatError(pub String);

fn bad(reason: impl Into<String>) -> CollateralFormatError {
    CollateralFormatError(reason.into())
}

/// The collateral for one document.
#[derive(Clone, Debug)]
pub enum ServerCollateral {
    /// AMD's, for an SEV-SNP document.
    Amd(DocumentCollateral),
    /// Intel's, for a TDX document.
    Intel(Arc<Collateral>),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
enum Wire<'a> {
    #[serde(rename = "amd")]
    Amd(AmdWire),
    #[serde(rename = "intel", borrow)]
    Intel(&'a RawValue),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AmdWire {
    crl: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    intermediate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signer: Option<String>,
}

fn b64(der: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(der)
}

fn unb64(field: &str, text: &str) -> Result<Vec<u8>, CollateralFormatError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| bad(format!("{field} is not standard base64: {e}")))
}

impl ServerCollateral {
    /// The extension's bytes; refused beyond [`MAX_SERVER_COLLATERAL`].
    pub fn encode(&self) -> Result<Vec<u8>, CollateralFormatError> {
        let intel;
        let wire = match self {
            ServerCollateral::Amd(amd) => Wire::Amd(AmdWire {
                crl: b64(amd.crl.der()),
                intermediate: amd.intermediate.as_ref().map(|c| b64(c.der())),
                signer: amd.signer.as_ref().map(|c| b64(c.der())),
            }),
            ServerCollateral::Intel(collateral) => {
                let json = String::from_utf8(collateral.to_dcap_json())
                    .map_err(|_| bad("Intel's collateral is not UTF-8"))?;
                intel = RawValue::from_string(json)
                    .map_err(|e| bad(format!("Intel's collateral as JSON: {e}")))?;
                Wire::Intel(&intel)
            }
        };
        let bytes = serde_json::to_vec(&wire).map_err(|e| bad(e.to_string()))?;
        if bytes.len() > MAX_SERVER_COLLATERAL {
            return Err(bad(format!(
                "{} bytes, more than the limit of {MAX_SERVER_COLLATERAL}",
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    /// Reads the extension's bytes. Only the shape is checked; the content is the validator's.
    pub fn decode(bytes: &[u8]) -> Result<ServerCollateral, CollateralFormatError> {
        if bytes.len() > MAX_SERVER_COLLATERAL {
            return Err(bad(format!(
                "{} bytes, more than the limit of {MAX_SERVER_COLLATERAL}",
                bytes.len()
            )));
        }
        let wire: Wire<'_> = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not {{\"amd\": ...}} or {{\"intel\": ...}}: {e}")))?;
        match wire {
            Wire::Amd(amd) => {
                let crl =
                    Crl::from_der(unb64("crl", &amd.crl)?).map_err(|e| bad(format!("crl: {e}")))?;
                let cert = |field: &str, text: Option<String>| {
                    text.map(|text| {
                        Cert::from_der(unb64(field, &text)?)
                            .map_err(|e| bad(format!("{field}: {e}")))
                    })
                    .transpose()
                };
                Ok(ServerCollateral::Amd(DocumentCollateral {
                    crl,
                    intermediate: cert("intermediate", amd.intermediate)?,
                    signer: cert("signer", amd.signer)?,
                }))
            }
            Wire::Intel(json) => Collateral::from_dcap_json(json.get().as_bytes())
                .map(|c| ServerCollateral::Intel(Arc::new(c)))
                .map_err(|e| bad(format!("intel: {e}"))),
        }
    }

    /// Which vendor's collateral this is, for errors.
    pub fn vendor(&self) -> &'static str {
        match self {
            ServerCollateral::Amd(_) => "AMD",
            ServerCollateral::Intel(_) => "Intel",
        }
    }
}

/// The collateral extension of `cert`, if it carries one.
pub fn find_collateral<'a>(cert: &X509Certificate<'a>) -> Option<&'a [u8]> {
    let wanted = oid_string();
    cert.extensions()
        .iter()
        .find(|ext| ext.oid.to_id_string() == wanted)
        .map(|ext| ext.value)
}

/// [`SERVER_COLLATERAL_OID`], dotted.
pub fn oid_string() -> String {
    SERVER_COLLATERAL_OID
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

fn seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// A server certificate's AMD collateral as the SEV-SNP validator's source: it answers only
/// with what the certificate carries, and accepts its CRL `max_stale` past `nextUpdate`.
#[derive(Clone, Debug)]
pub struct CertificateSnpCollateral {
    collateral: DocumentCollateral,
    max_stale: Duration,
}

impl CertificateSnpCollateral {
    pub fn new(collateral: DocumentCollateral, max_stale: Duration) -> Self {
        Self {
            collateral,
            max_stale,
        }
    }
}

impl SnpCollateral for CertificateSnpCollateral {
    fn crl(&self, _product: Product, _key: SigningKey) -> Result<Crl, CollateralError> {
        // The CRL's issuer and signature are checked against the ARK of the report's product;
        // the service gathered the CRL of its own report's signing-key kind.
        Ok(self.collateral.crl.clone())
    }

    fn vcek(&self, product: Product, _hw_id: &[u8], tcb: &Tcb) -> Result<Cert, CollateralError> {
        // The validator checks that its hwID and TCB are the report's.
        self.collateral.signer.clone().ok_or_else(|| {
            CollateralError(format!(
                "neither the server's document nor its certificate carries the VCEK of its {product} chip at {tcb}"
            ))
        })
    }

    fn intermediate(&self, product: Product, key: SigningKey) -> Result<Cert, CollateralError> {
        self.collateral.intermediate.clone().ok_or_else(|| {
            CollateralError(format!(
                "neither the server's document nor its certificate carries the {product} intermediate for its {key}"
            ))
        })
    }

    fn crl_max_stale(&self) -> i64 {
        seconds(self.max_stale)
    }
}

/// A server certificate's Intel collateral as the TDX validator's source: it answers only for
/// the FMSPC and CA it is for, and accepts it `max_stale` past `nextUpdate`.
#[derive(Clone)]
pub struct CertificateTdxCollateral {
    collateral: Arc<Collateral>,
    max_stale: Duration,
}

impl fmt::Debug for CertificateTdxCollateral {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateTdxCollateral")
            .field("fmspc", &hex_fmspc(self.collateral.fmspc()))
            .field("ca", &self.collateral.ca())
            .field("max_stale", &self.max_stale)
            .finish()
    }
}

fn hex_fmspc(fmspc: [u8; 6]) -> String {
    fmspc.iter().map(|b| format!("{b:02x}")).collect()
}

impl CertificateTdxCollateral {
    pub fn new(collateral: Arc<Collateral>, max_stale: Duration) -> Self {
        Self {
            collateral,
            max_stale,
        }
    }
}

impl TdxCollateral for CertificateTdxCollateral {
    fn collateral(&self, fmspc: [u8; 6], ca: PckCa) -> Result<Arc<Collateral>, TdxCollateralError> {
        if self.collateral.fmspc() != fmspc || self.collateral.ca() != ca {
            return Err(CollateralError(format!(
                "the server's certificate carries Intel collateral for FMSPC {} ({} CA), its quote is for FMSPC {} ({ca} CA)",
                hex_fmspc(self.collateral.fmspc()),
                self.collateral.ca(),
                hex_fmspc(fmspc),
            ))
            .into());
        }
        Ok(self.collateral.clone())
    }

    fn max_stale(&self) -> i64 {
        seconds(self.max_stale)
    }
}

/// Why the service could not gather the collateral for its own document.
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    /// The variant's evidence needs a vendor's collateral, and no source for it was given.
    #[error("{variant} evidence needs {vendor} collateral, and there is no {vendor} source")]
    NoSource {
        variant: Variant,
        vendor: &'static str,
    },
    /// The document could not be read, or the source has nothing for it (yet).
    #[error("cannot gather the {vendor} collateral for the {variant} document")]
    Document {
        variant: Variant,
        vendor: &'static str,
        #[source]
        source: attestation::Error,
    },
}

/// The collateral a node needs beside a `variant` `document`, taken from the service's own
/// sources: AMD's for the SEV-SNP variants, Intel's for the TDX variants, none for the others
/// (qemu-vtpm needs nothing from a vendor). Sources may block for their bounded wait.
pub fn gather(
    variant: Variant,
    document: &[u8],
    amd: Option<&dyn SnpCollateral>,
    intel: Option<&dyn TdxCollateral>,
) -> Result<Option<ServerCollateral>, GatherError> {
    use attestation::variants::{sev_snp, tdx};
    let kind = match variant {
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp => {
            let vendor = "AMD";
            let source = amd.ok_or(GatherError::NoSource { variant, vendor })?;
            return sev_snp::collateral_for_document(document, source)
                .map(|c| Some(ServerCollateral::Amd(c)))
                .map_err(|source| GatherError::Document {
                    variant,
                    vendor,
                    source,
                });
        }
        Variant::QemuTdx => tdx::TdxKind::Qemu,
        Variant::AzureTdx => tdx::TdxKind::Azure,
        _ => return Ok(None),
    };
    let vendor = "Intel";
    let source = intel.ok_or(GatherError::NoSource { variant, vendor })?;
    tdx::collateral_for_document(kind, document, source)
        .map(|c| Some(ServerCollateral::Intel(c)))
        .map_err(|source| GatherError::Document {
            variant,
            vendor,
            source,
        })
}
