//! The TDX quote (Intel DCAP quote format, versions 4 and 5), read before anything in it is
//! trusted: enough to refuse what is not a TDX quote from Intel's QE, to find the collateral it
//! needs (the PCK certificate's FMSPC and CA), and to carry the TD report's fields. dcap-qvl
//! decodes the layout; [`TdQuote::parse`] adds the limits and the header checks.

use x509_parser::prelude::FromDer;

use super::collateral::PckCa;
use super::{INTEL_QE_VENDOR_ID, TdxError};
use crate::parse_memo::ParseMemo;

/// The largest quote accepted. A quote is a TD report, signatures, a QE report and a PCK chain of
/// three certificates: about 5 KB; some tools zero-pad it to 8 KB.
pub const MAX_QUOTE: usize = 16 * 1024;

/// TEE type of a TDX quote (header `tee_type`).
pub const TEE_TYPE_TDX: u32 = 0x81;

/// Attestation key type ECDSA-256 with P-256 (header `att_key_type`).
pub const ATT_KEY_ECDSA_P256: u16 = 2;

/// TD attributes bit 0: the TD may be debugged (its memory and registers read by the host).
pub const TD_ATTRIBUTES_DEBUG: u64 = 1;

/// The fields of the TD report (TDREPORT body) a verifier decides by.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TdReport {
    #[serde(with = "hex::serde")]
    pub tee_tcb_svn: [u8; 16],
    #[serde(with = "hex::serde")]
    pub mr_seam: [u8; 48],
    #[serde(with = "hex::serde")]
    pub mr_signer_seam: [u8; 48],
    #[serde(with = "hex::serde")]
    pub seam_attributes: [u8; 8],
    #[serde(with = "hex::serde")]
    pub td_attributes: [u8; 8],
    #[serde(with = "hex::serde")]
    pub xfam: [u8; 8],
    #[serde(with = "hex::serde")]
    pub mr_td: [u8; 48],
    #[serde(with = "hex::serde")]
    pub mr_config_id: [u8; 48],
    #[serde(with = "hex::serde")]
    pub mr_owner: [u8; 48],
    #[serde(with = "hex::serde")]
    pub mr_owner_config: [u8; 48],
    pub rtmrs: [Rtmr; 4],
    #[serde(with = "hex::serde")]
    pub report_data: [u8; 64],
    /// TDX 1.5 (quote v5, body type 3 or 4): the current TCB after a TD-preserving update.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_hex")]
    pub tee_tcb_svn2: Option<[u8; 16]>,
}

/// One runtime measurement register (SHA-384).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Rtmr(#[serde(with = "hex::serde")] pub [u8; 48]);

fn opt_hex<S: serde::Serializer>(v: &Option<[u8; 16]>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&hex::encode(v)),
        None => s.serialize_none(),
    }
}

impl TdReport {
    /// TD attributes as the little-endian 64-bit value the TDX ABI defines.
    pub fn td_attributes(&self) -> u64 {
        u64::from_le_bytes(self.td_attributes)
    }

    pub fn is_debug(&self) -> bool {
        self.td_attributes() & TD_ATTRIBUTES_DEBUG != 0
    }

    /// MRTD and RTMR0..3, as Constellation numbers them for the measurement policy (0..4).
    pub fn measurements(&self) -> std::collections::BTreeMap<u32, Vec<u8>> {
        std::iter::once(self.mr_td.to_vec())
            .chain(self.rtmrs.iter().map(|r| r.0.to_vec()))
            .zip(0u32..)
            .map(|(v, i)| (i, v))
            .collect()
    }
}

/// A parsed, not yet verified, TDX quote.
#[derive(Clone, Debug)]
pub struct TdQuote {
    bytes: Vec<u8>,
    version: u16,
    qe_svn: u16,
    pce_svn: u16,
    qe_vendor_id: [u8; 16],
    td: TdReport,
    fmspc: [u8; 6],
    ca: PckCa,
    pck_cpu_svn: [u8; 16],
    pck_pce_svn: u16,
    qe_isvsvn: u16,
    /// The PCK certificate and its issuers as the quote carries them (DER, leaf first).
    pck_chain: Vec<Vec<u8>>,
}

/// What a quote's PCK certificate chain says, as [`TdQuote::parse`] reads it.
#[derive(Clone, Debug)]
struct Pck {
    fmspc: [u8; 6],
    ca: PckCa,
    cpu_svn: [u8; 16],
    pce_svn: u16,
    /// DER, leaf first.
    chain: Vec<Vec<u8>>,
}

/// Chains parsed lately, by their PEM: the PCK chain is the same in every quote of a platform.
/// Intel's three certificates are about 4 KiB of PEM; at most 2 × 256 of up to 16 KiB are kept.
static PARSED: std::sync::LazyLock<ParseMemo<Pck>> =
    std::sync::LazyLock::new(|| ParseMemo::new(256, 16 * 1024));

impl Pck {
    fn of(quote: &dcap_qvl::quote::Quote) -> Result<Pck, TdxError> {
        let chain = dcap_qvl::intel::extract_cert_chain(quote)
            .map_err(|e| bad(format!("no PCK certificate chain: {e:#}")))?;
        let leaf = chain
            .first()
            .ok_or_else(|| bad("the PCK certificate chain is empty"))?;
        let pck = dcap_qvl::intel::parse_pck_extension_with::<super::dcap::Backend>(leaf)
            .map_err(|e| bad(format!("the PCK certificate's Intel extension: {e:#}")))?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf)
            .map_err(|e| bad(format!("the PCK certificate: {e}")))?;
        let issuer = crate::issuer::common_name(cert.issuer());
        let ca = PckCa::from_issuer_cn(issuer).ok_or_else(|| {
            bad(format!(
                "the PCK certificate's issuer {issuer:?} is neither Intel PCK CA"
            ))
        })?;
        Ok(Pck {
            fmspc: pck.fmspc,
            ca,
            cpu_svn: pck.cpu_svn,
            pce_svn: pck.pce_svn,
            chain,
        })
    }
}

fn bad(reason: impl Into<String>) -> TdxError {
    TdxError::Quote(reason.into())
}

impl TdQuote {
    pub fn parse(bytes: &[u8]) -> Result<TdQuote, TdxError> {
        if bytes.len() > MAX_QUOTE {
            return Err(bad(format!(
                "{} bytes, more than the limit of {MAX_QUOTE}",
                bytes.len()
            )));
        }
        let quote = dcap_qvl::quote::Quote::parse(bytes)
            .map_err(|e| bad(format!("not a DCAP quote: {e:#}")))?;
        let header = &quote.header;
        if header.version != 4 && header.version != 5 {
            return Err(bad(format!(
                "version {}, this verifier knows TDX quotes of versions 4 and 5",
                header.version
            )));
        }
        if header.tee_type != TEE_TYPE_TDX {
            return Err(bad(format!(
                "TEE type {:#x} is not TDX ({TEE_TYPE_TDX:#x})",
                header.tee_type
            )));
        }
        if header.attestation_key_type != ATT_KEY_ECDSA_P256 {
            return Err(bad(format!(
                "attestation key type {} is not ECDSA P-256 ({ATT_KEY_ECDSA_P256})",
                header.attestation_key_type
            )));
        }
        if header.qe_vendor_id != INTEL_QE_VENDOR_ID {
            return Err(bad(format!(
                "QE vendor ID {} is not Intel's",
                hex::encode(header.qe_vendor_id)
            )));
        }
        let (base, tee_tcb_svn2) = match &quote.report {
            dcap_qvl::quote::Report::TD10(r) => (*r, None),
            dcap_qvl::quote::Report::TD15(r) => (r.base, Some(r.tee_tcb_svn2)),
            dcap_qvl::quote::Report::TD15Ex(r) => (r.base.base, Some(r.base.tee_tcb_svn2)),
            dcap_qvl::quote::Report::SgxEnclave(_) => {
                return Err(bad("the body is an SGX enclave report, not a TD report"));
            }
        };
        let pck = match quote.raw_cert_chain() {
            // `Pck::of` reads the chain from exactly these bytes.
            Ok(pem) => PARSED.get_or_parse(pem, |_| Pck::of(&quote))?,
            Err(_) => Pck::of(&quote)?,
        };
        let td = TdReport {
            tee_tcb_svn: base.tee_tcb_svn,
            mr_seam: base.mr_seam,
            mr_signer_seam: base.mr_signer_seam,
            seam_attributes: base.seam_attributes,
            td_attributes: base.td_attributes,
            xfam: base.xfam,
            mr_td: base.mr_td,
            mr_config_id: base.mr_config_id,
            mr_owner: base.mr_owner,
            mr_owner_config: base.mr_owner_config,
            rtmrs: [
                Rtmr(base.rt_mr0),
                Rtmr(base.rt_mr1),
                Rtmr(base.rt_mr2),
                Rtmr(base.rt_mr3),
            ],
            report_data: base.report_data,
            tee_tcb_svn2,
        };
        // ISVSVN of the QE's SGX report (offset 258, little-endian), which picks its QE
        // identity level.
        let qe_report = quote.qe_report();
        let qe_isvsvn = u16::from_le_bytes([qe_report[258], qe_report[259]]);
        Ok(TdQuote {
            bytes: bytes.to_vec(),
            version: header.version,
            qe_svn: header.qe_svn,
            pce_svn: header.pce_svn,
            qe_vendor_id: header.qe_vendor_id,
            td,
            fmspc: pck.fmspc,
            ca: pck.ca,
            pck_cpu_svn: pck.cpu_svn,
            pck_pce_svn: pck.pce_svn,
            qe_isvsvn,
            pck_chain: pck.chain,
        })
    }

    /// Checks that the PCK certificate was signed by the PCK CA the quote carries, and that CA
    /// by the root `trust` names: signatures and names only, with aws-lc-rs. The FMSPC and CA this
    /// quote names are then Intel's word, not a node's, and may be looked up at Intel (a made-up
    /// FMSPC would cost a PCS request and a cache entry per name). Dates and revocation are
    /// checked with the collateral by [`super::verify_quote`].
    pub fn verify_pck_signatures(&self, trust: &super::Trust) -> Result<(), TdxError> {
        fn chain_error(what: String) -> TdxError {
            TdxError::Chain(format!("the PCK chain: {what}"))
        }
        fn parse<'a>(
            der: &'a [u8],
            what: &str,
        ) -> Result<x509_parser::certificate::X509Certificate<'a>, TdxError> {
            x509_parser::certificate::X509Certificate::from_der(der)
                .map(|(_, cert)| cert)
                .map_err(|e| chain_error(format!("{what}: {e}")))
        }
        let [leaf_der, ca_der, ..] = self.pck_chain.as_slice() else {
            return Err(chain_error(
                "the quote carries no PCK CA certificate".to_owned(),
            ));
        };
        let leaf = parse(leaf_der, "the PCK certificate")?;
        let ca = parse(ca_der, "the PCK CA certificate")?;
        let root = parse(trust.root_der(), "the trusted root")?;
        // dcap-qvl's path building (webpki) requires CA:TRUE of an issuer but not keyCertSign;
        // RFC 5280 asks both of the two issuers this chain has.
        let may_sign = |which: &str, cert: &x509_parser::certificate::X509Certificate<'_>| {
            crate::issuer::may_sign(cert, crate::issuer::Usage::Certificates)
                .map_err(|reason| chain_error(format!("the {which} {} {reason}", cert.subject())))
        };
        if leaf.issuer() != ca.subject() {
            return Err(chain_error(format!(
                "the PCK certificate's issuer {} is not the CA it carries ({})",
                leaf.issuer(),
                ca.subject()
            )));
        }
        may_sign("PCK CA", &ca)?;
        // Both signatures are the platform's and Intel's, the same for every quote of a host:
        // verified once (see `dcap.rs`); the names and usages above and below on every quote.
        let remembered = &super::dcap::SIGNATURES;
        remembered
            .check(&[leaf_der], ca_der, || {
                leaf.verify_signature(Some(ca.public_key()))
            })
            .map_err(|e| {
                chain_error(format!(
                    "the PCK certificate's signature does not verify with its CA's key: {e}"
                ))
            })?;
        // A CA the trusted root did not sign, whatever root the quote's chain ends at: a chain
        // failure, named with the root that is trusted.
        if ca.issuer() != root.subject() {
            return Err(chain_error(format!(
                "the PCK CA's issuer {} is not the trusted root ({}, SHA-256 {})",
                ca.issuer(),
                root.subject(),
                trust.fingerprint()
            )));
        }
        remembered
            .check(&[ca_der], trust.root_der(), || {
                ca.verify_signature(Some(root.public_key()))
            })
            .map_err(|e| {
                chain_error(format!(
                    "the PCK CA's signature does not verify with the trusted root's key \
                     (SHA-256 {}): {e}",
                    trust.fingerprint()
                ))
            })?;
        may_sign("trusted root", &root)?;
        Ok(())
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn version(&self) -> u16 {
        self.version
    }

    /// The QE's SVN as the header states it.
    pub fn qe_svn(&self) -> u16 {
        self.qe_svn
    }

    /// The PCE's SVN as the header states it.
    pub fn pce_svn(&self) -> u16 {
        self.pce_svn
    }

    pub fn qe_vendor_id(&self) -> [u8; 16] {
        self.qe_vendor_id
    }

    pub fn td(&self) -> &TdReport {
        &self.td
    }

    /// The FMSPC of the PCK certificate the quote carries: which TCB info applies.
    pub fn fmspc(&self) -> [u8; 6] {
        self.fmspc
    }

    /// The CPUSVN and PCESVN the PCK certificate was issued for.
    pub fn pck_svns(&self) -> ([u8; 16], u16) {
        (self.pck_cpu_svn, self.pck_pce_svn)
    }

    /// The QE's ISVSVN, from its report.
    pub fn qe_isvsvn(&self) -> u16 {
        self.qe_isvsvn
    }

    /// Whether the TD set SEPT_VE_DISABLE (TD attributes bit 28).
    pub fn sept_ve_disable(&self) -> bool {
        self.td.td_attributes() & (1 << 28) != 0
    }

    /// The CA that issued the PCK certificate: which PCK CRL applies.
    pub fn pck_ca(&self) -> PckCa {
        self.ca
    }
}
