//! Simulated Intel TDX machines: a PCK certificate from a [`SimulatedIntel`] with Intel's SGX
//! extension, a quoting enclave whose report the PCK signs, and DCAP TD quotes (versions 4 and 5)
//! signed by the QE's attestation key, wrapped in the documents the qemu-tdx and azure-tdx
//! validators read.
//!
//! No TDX module or quoting enclave runs here. The quote has the exact layout of Intel's
//! (`sgx_quote_4.h` / `sgx_quote_5.h`): the 48-byte header, the TD report body, then the
//! signature data (the ECDSA signature over header and body, the attestation key, and
//! certification data of type 6 carrying the QE report, its PCK signature, the QE
//! authentication data and the PCK chain as certification data of type 5). The PCK's SGX
//! extension carries what a real one does (PPID, the TCB components with PCESVN and CPUSVN,
//! PCE-ID, FMSPC, SGX type, and for a Platform CA's PCK the platform instance and
//! configuration), so the verifier reads the TCB and FMSPC from it exactly as from a real PCK.
//! Everything is trusted only where a test's attestation config sets `intelRootKey` to
//! [`SimulatedIntel::root_pem`].

use std::sync::Arc;

use attestation::{IssueError, Issuer, Variant};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair as _};
use base64::Engine as _;
use pcs_standin::intel::{PCE_SVN, QE_ISVSVN, QE_MRSIGNER, SGX_TCB_SVNS, TDX_TCB_SVNS};
use pcs_standin::{PckCa, SimulatedIntel};
use x509_cert::der::asn1::{Any, OctetString};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Encode, EncodeValue, Tag, Tagged};
use x509_cert::ext::Extension;

/// Intel's SGX extension of a PCK certificate, and the entries inside it.
pub const SGX_EXTENSION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1");
const SGX_ARC: &str = "1.2.840.113741.1.13.1";

/// The QE vendor ID of Intel's quoting enclave, the only one Intel's collateral describes.
pub const INTEL_QE_VENDOR_ID: [u8; 16] = [
    0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07,
];

/// The FMSPC of every simulated machine unless a test names another: a Sapphire Rapids
/// family/model with the package configuration zero.
pub const FMSPC: [u8; 6] = [0x00, 0x80, 0x6f, 0x05, 0x00, 0x00];

/// TD attributes bit 0: the host may debug the TD.
pub const TD_ATTRIBUTES_DEBUG: u64 = 1;
/// TD attributes bit 28: EPT violations on pending pages do not become #VE in the TD.
pub const TD_ATTRIBUTES_SEPT_VE_DISABLE: u64 = 1 << 28;

/// Why a simulated TDX machine or its quote could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TdxSimulationError {
    #[error("simulated Intel: {0}")]
    Intel(#[from] pcs_standin::SimulationError),
    #[error("simulated TDX key: {0}")]
    Key(String),
    #[error("the SGX extension: {0}")]
    Der(#[from] x509_cert::der::Error),
    #[error("signing: {0}")]
    Sign(String),
    #[error("the attestation key: {0}")]
    AttestationKey(#[from] crate::snp::SimulationError),
    #[error("a certification data item of {0} bytes does not fit its length field")]
    TooLong(usize),
    #[error("the document: {0}")]
    Issue(#[from] crate::SoftIssuerError),
    #[error("the simulated collateral: {0}")]
    Collateral(#[from] attestation::tdx::TdxError),
    #[error("the attestation config: {0}")]
    Config(#[from] attestation::PolicyError),
}

/// What a machine's PCK certificate says about the platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PckSpec {
    /// The Intel CA that certifies it (and whose CRL can revoke it).
    pub ca: PckCa,
    /// Its serial number, so a test can revoke it ([`SimulatedIntel::pck_crl`]).
    pub serial: u64,
    pub fmspc: [u8; 6],
    /// The 16 SGX TCB component SVNs the PCK was issued for (also its CPUSVN).
    pub sgx_tcb_svns: [u8; 16],
    pub pce_svn: u16,
    pub ppid: [u8; 16],
    pub pce_id: [u8; 2],
}

impl Default for PckSpec {
    /// A Platform CA PCK at the UpToDate level of [`SimulatedIntel::tcb_info_json`].
    fn default() -> Self {
        PckSpec {
            ca: PckCa::Platform,
            serial: 0x1000,
            fmspc: FMSPC,
            sgx_tcb_svns: SGX_TCB_SVNS,
            pce_svn: PCE_SVN,
            ppid: [0x9d; 16],
            pce_id: [0, 0],
        }
    }
}

/// A DER value of `tag` holding `contents`.
fn tlv(tag: Tag, contents: &[u8]) -> Result<Any, TdxSimulationError> {
    Ok(Any::new(tag, contents)?)
}

/// A SEQUENCE of `items`.
fn sequence(items: &[Any]) -> Result<Any, TdxSimulationError> {
    let mut contents = Vec::new();
    for item in items {
        item.encode_to_vec(&mut contents)?;
    }
    tlv(Tag::Sequence, &contents)
}

/// One entry of the SGX extension: SEQUENCE { OID `1.2.840.113741.1.13.1.<suffix>`, value }.
fn entry(suffix: &str, value: Any) -> Result<Any, TdxSimulationError> {
    let oid = ObjectIdentifier::new(&format!("{SGX_ARC}.{suffix}"))
        .map_err(|e| TdxSimulationError::Der(e.into()))?;
    sequence(&[Any::from(&oid), value])
}

fn octets(bytes: &[u8]) -> Result<Any, TdxSimulationError> {
    Ok(Any::encode_from(&OctetString::new(bytes)?)?)
}

fn integer<T: Tagged + EncodeValue>(value: T) -> Result<Any, TdxSimulationError> {
    Ok(Any::encode_from(&value)?)
}

/// The SGX extension (OID 1.2.840.113741.1.13.1) of a PCK certificate as Intel writes it: a
/// SEQUENCE of {OID, value} entries, the TCB entry itself a SEQUENCE of the 16 component SVNs,
/// PCESVN and CPUSVN. A Platform CA's PCK adds the platform instance ID and the configuration
/// (dynamic platform, cached keys, SMT), as Intel's multi-package platforms' do.
pub fn sgx_extension(pck: &PckSpec) -> Result<Extension, TdxSimulationError> {
    let mut tcb = Vec::with_capacity(18);
    for (i, svn) in (1u8..).zip(pck.sgx_tcb_svns) {
        tcb.push(entry(&format!("2.{i}"), integer(svn)?)?);
    }
    tcb.push(entry("2.17", integer(pck.pce_svn)?)?);
    tcb.push(entry("2.18", octets(&pck.sgx_tcb_svns)?)?);
    let (sgx_type, platform) = match pck.ca {
        // Standard: a single-package platform whose PCK the Processor CA issued.
        PckCa::Processor => (0u8, Vec::new()),
        // Scalable: a platform registered as a whole.
        PckCa::Platform => {
            let flag = |suffix: &str, on: bool| entry(suffix, Any::encode_from(&on)?);
            (
                1,
                vec![
                    entry("6", octets(&[0x1d; 16])?)?,
                    entry(
                        "7",
                        sequence(&[flag("7.1", false)?, flag("7.2", true)?, flag("7.3", true)?])?,
                    )?,
                ],
            )
        }
    };
    let mut entries = vec![
        entry("1", octets(&pck.ppid)?)?,
        entry("2", sequence(&tcb)?)?,
        entry("3", octets(&pck.pce_id)?)?,
        entry("4", octets(&pck.fmspc)?)?,
        entry("5", tlv(Tag::Enumerated, &[sgx_type])?)?,
    ];
    entries.extend(platform);
    Ok(Extension {
        extn_id: SGX_EXTENSION,
        critical: false,
        extn_value: OctetString::new(sequence(&entries)?.to_der()?)?,
    })
}

/// The quote format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuoteVersion {
    /// Version 4 with a TDX 1.0 TD report (584 bytes), as Azure's and most hosts' QEs make.
    V4,
    /// Version 5 with a TDX 1.5 TD report (body type 3, 648 bytes): TEE_TCB_SVN2 equal to
    /// TEE_TCB_SVN (no TD-preserving update) and no service TD.
    V5,
}

/// The TD report body of a simulated quote: what the TDX module and the TD put there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TdFields {
    pub version: QuoteVersion,
    pub tee_tcb_svn: [u8; 16],
    pub mr_seam: [u8; 48],
    /// Must be the TCB info's `tdxModule.mrsigner` (zero for [`SimulatedIntel`]'s).
    pub mr_signer_seam: [u8; 48],
    pub seam_attributes: [u8; 8],
    /// [`TD_ATTRIBUTES_DEBUG`], [`TD_ATTRIBUTES_SEPT_VE_DISABLE`], ...
    pub td_attributes: u64,
    pub xfam: u64,
    pub mr_td: [u8; 48],
    pub mr_config_id: [u8; 48],
    pub mr_owner: [u8; 48],
    pub mr_owner_config: [u8; 48],
    pub rtmrs: [[u8; 48]; 4],
}

/// The MRTD of a simulated TD unless a test sets another.
pub const MRTD: [u8; 48] = [0x7d; 48];
/// RTMR0..3 of a simulated TD unless a test sets others.
pub const RTMRS: [[u8; 48]; 4] = [[0xa0; 48], [0xa1; 48], [0xa2; 48], [0xa3; 48]];
/// The MRSEAM of the simulated TDX module.
pub const MRSEAM: [u8; 48] = [0x5e; 48];
/// The XFAM of a simulated TD (x87, SSE, AVX, AVX-512, PKRU and AMX state, as a Linux TD
/// enables).
pub const XFAM: u64 = 0x0006_02e7;

impl Default for TdFields {
    /// A production TD (SEPT_VE_DISABLE, not debuggable) on a module at the UpToDate level, with
    /// [`MRTD`] and [`RTMRS`], quoted in version 4.
    fn default() -> Self {
        TdFields {
            version: QuoteVersion::V4,
            tee_tcb_svn: TDX_TCB_SVNS,
            mr_seam: MRSEAM,
            mr_signer_seam: [0; 48],
            seam_attributes: [0; 8],
            td_attributes: TD_ATTRIBUTES_SEPT_VE_DISABLE,
            xfam: XFAM,
            mr_td: MRTD,
            mr_config_id: [0; 48],
            mr_owner: [0; 48],
            mr_owner_config: [0; 48],
            rtmrs: RTMRS,
        }
    }
}

impl TdFields {
    /// The 584-byte TDX 1.0 report body, then for [`QuoteVersion::V5`] TEE_TCB_SVN2 and
    /// MRSERVICETD.
    fn body(&self, report_data: &[u8; 64]) -> Vec<u8> {
        let mut body = Vec::with_capacity(648);
        for part in [
            &self.tee_tcb_svn[..],
            &self.mr_seam,
            &self.mr_signer_seam,
            &self.seam_attributes,
            &self.td_attributes.to_le_bytes(),
            &self.xfam.to_le_bytes(),
            &self.mr_td,
            &self.mr_config_id,
            &self.mr_owner,
            &self.mr_owner_config,
        ] {
            body.extend_from_slice(part);
        }
        for rtmr in &self.rtmrs {
            body.extend_from_slice(rtmr);
        }
        body.extend_from_slice(report_data);
        if self.version == QuoteVersion::V5 {
            body.extend_from_slice(&self.tee_tcb_svn);
            body.extend_from_slice(&[0; 48]);
        }
        body
    }
}

/// The length of a TD report (`TDREPORT_STRUCT`).
pub const TD_REPORT_LEN: usize = 1024;

/// A TD report as the TDX module writes it for `td` with `report_data` (TDX module ABI
/// `TDREPORT_STRUCT`): REPORTMACSTRUCT (report type TDX, REPORTDATA at 128, a MAC nothing
/// here checks), TEE_TCB_INFO at 256 (TEE_TCB_SVN, MRSEAM, MRSIGNERSEAM, SEAM attributes),
/// TDINFO at 512 (attributes, XFAM, MRTD, MRCONFIGID, MROWNER, MROWNERCONFIG, RTMR0..3). What
/// an Azure TD's paravisor puts into its HCL report, and Azure's quote service turns into a
/// quote.
pub fn td_report(td: &TdFields, report_data: &[u8; 64]) -> Vec<u8> {
    let mut r = vec![0u8; TD_REPORT_LEN];
    r[0] = 0x81; // TEE type TDX; subtype and version 0
    r[128..192].copy_from_slice(report_data);
    r[224..256].fill(0x4d);
    r[256..264].fill(0xff); // every TEE_TCB_INFO field valid
    r[264..280].copy_from_slice(&td.tee_tcb_svn);
    r[280..328].copy_from_slice(&td.mr_seam);
    r[328..376].copy_from_slice(&td.mr_signer_seam);
    r[376..384].copy_from_slice(&td.seam_attributes);
    r[512..520].copy_from_slice(&td.td_attributes.to_le_bytes());
    r[520..528].copy_from_slice(&td.xfam.to_le_bytes());
    r[528..576].copy_from_slice(&td.mr_td);
    r[576..624].copy_from_slice(&td.mr_config_id);
    r[624..672].copy_from_slice(&td.mr_owner);
    r[672..720].copy_from_slice(&td.mr_owner_config);
    for (i, rtmr) in td.rtmrs.iter().enumerate() {
        r[720 + 48 * i..768 + 48 * i].copy_from_slice(rtmr);
    }
    r
}

/// The TD fields and REPORTDATA of a TD report ([`td_report`]), quoted in `version`: what a
/// quoting service takes from the report it is given.
pub fn parse_td_report(
    report: &[u8],
    version: QuoteVersion,
) -> Result<(TdFields, [u8; 64]), TdxSimulationError> {
    if report.len() != TD_REPORT_LEN {
        return Err(TdxSimulationError::Key(format!(
            "a TD report is {TD_REPORT_LEN} bytes, not {}",
            report.len()
        )));
    }
    if report[0] != 0x81 {
        return Err(TdxSimulationError::Key(format!(
            "report type {:#04x} is not TDX (0x81)",
            report[0]
        )));
    }
    let take = |at: usize| -> [u8; 48] {
        let mut out = [0u8; 48];
        out.copy_from_slice(&report[at..at + 48]);
        out
    };
    let u64_at = |at: usize| {
        let mut out = [0u8; 8];
        out.copy_from_slice(&report[at..at + 8]);
        u64::from_le_bytes(out)
    };
    let mut tee_tcb_svn = [0u8; 16];
    tee_tcb_svn.copy_from_slice(&report[264..280]);
    let mut seam_attributes = [0u8; 8];
    seam_attributes.copy_from_slice(&report[376..384]);
    let mut report_data = [0u8; 64];
    report_data.copy_from_slice(&report[128..192]);
    let td = TdFields {
        version,
        tee_tcb_svn,
        mr_seam: take(280),
        mr_signer_seam: take(328),
        seam_attributes,
        td_attributes: u64_at(512),
        xfam: u64_at(520),
        mr_td: take(528),
        mr_config_id: take(576),
        mr_owner: take(624),
        mr_owner_config: take(672),
        rtmrs: [take(720), take(768), take(816), take(864)],
    };
    Ok((td, report_data))
}

/// A simulated TDX host: its PCK (certified by a [`SimulatedIntel`]) and its quoting enclave,
/// whose attestation key the PCK vouches for through the QE report.
pub struct TdxMachine {
    attestation_key: EcdsaKeyPair,
    /// The attestation key as the quote carries it: x ‖ y.
    attestation_point: [u8; 64],
    qe_report: [u8; 384],
    qe_report_signature: [u8; 64],
    qe_auth_data: [u8; 32],
    /// PEM: the PCK certificate, its CA, the root.
    pck_chain_pem: String,
    pck: PckSpec,
    rng: SystemRandom,
}

impl std::fmt::Debug for TdxMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TdxMachine")
            .field("pck", &self.pck)
            .finish_non_exhaustive()
    }
}

fn p256_key(rng: &SystemRandom) -> Result<EcdsaKeyPair, TdxSimulationError> {
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, rng)
        .map_err(|e| TdxSimulationError::Key(e.to_string()))?;
    EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref())
        .map_err(|e| TdxSimulationError::Key(e.to_string()))
}

/// An ECDSA P-256 signature as Intel's quotes hold it: r ‖ s, 32 bytes each.
fn sign(
    key: &EcdsaKeyPair,
    rng: &SystemRandom,
    message: &[u8],
) -> Result<[u8; 64], TdxSimulationError> {
    let sig = key
        .sign(rng, message)
        .map_err(|e| TdxSimulationError::Sign(e.to_string()))?;
    <[u8; 64]>::try_from(sig.as_ref())
        .map_err(|_| TdxSimulationError::Sign("not a 64-byte r ‖ s".to_owned()))
}

/// Certification data: type (u16) and length (u32), little-endian, then the data.
fn certification_data(kind: u16, data: &[u8]) -> Result<Vec<u8>, TdxSimulationError> {
    let len = u32::try_from(data.len()).map_err(|_| TdxSimulationError::TooLong(data.len()))?;
    let mut out = Vec::with_capacity(6 + data.len());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

impl TdxMachine {
    /// A machine whose PCK `intel` certifies as `pck` says, with a fresh PCK key and attestation
    /// key, and a QE at Intel's QE identity ([`QE_MRSIGNER`], product 2, [`QE_ISVSVN`]).
    pub fn new(intel: &SimulatedIntel, pck: PckSpec) -> Result<TdxMachine, TdxSimulationError> {
        let rng = SystemRandom::new();
        let pck_key = p256_key(&rng)?;
        let pck_der = intel.pck_certificate(
            pck.ca,
            pck_key.public_key().as_ref(),
            pck.serial,
            vec![sgx_extension(&pck)?],
        )?;
        let pck_chain_pem =
            pcs_standin::intel::certificate_pem(&pck_der) + &intel.pck_issuer_chain_pem(pck.ca);
        let attestation_key = p256_key(&rng)?;
        let attestation_point = attestation_key
            .public_key()
            .as_ref()
            .strip_prefix(&[0x04])
            .and_then(|xy| <[u8; 64]>::try_from(xy).ok())
            .ok_or_else(|| TdxSimulationError::Key("not an uncompressed P-256 point".to_owned()))?;
        let qe_auth_data: [u8; 32] = std::array::from_fn(|i| i as u8);
        let qe_report = Self::qe_report(&pck, &attestation_point, &qe_auth_data)?;
        let qe_report_signature = sign(&pck_key, &rng, &qe_report)?;
        Ok(TdxMachine {
            attestation_key,
            attestation_point,
            qe_report,
            qe_report_signature,
            qe_auth_data,
            pck_chain_pem,
            pck,
            rng,
        })
    }

    /// The QE's 384-byte SGX report: its identity (Intel's MRSIGNER, product 2, ISVSVN
    /// [`QE_ISVSVN`], attributes INIT | MODE64BIT, no MISCSELECT), and in REPORT_DATA
    /// SHA-256(attestation key ‖ QE authentication data) followed by 32 zero bytes: the QE
    /// vouching for the key that signs the quotes.
    fn qe_report(
        pck: &PckSpec,
        attestation_point: &[u8; 64],
        qe_auth_data: &[u8; 32],
    ) -> Result<[u8; 384], TdxSimulationError> {
        let mut r = [0u8; 384];
        r[0..16].copy_from_slice(&pck.sgx_tcb_svns);
        // MISCSELECT (16..20) zero; ATTRIBUTES at 48: flags INIT | MODE64BIT, XFRM x87 | SSE |
        // AVX | AVX-512.
        r[48] = 0x11;
        r[56] = 0xe7;
        r[64..96].copy_from_slice(&[0x4e; 32]);
        let mr_signer = hex::decode(QE_MRSIGNER)
            .map_err(|e| TdxSimulationError::Key(format!("QE_MRSIGNER: {e}")))?;
        r[128..160].copy_from_slice(&mr_signer);
        r[256..258].copy_from_slice(&2u16.to_le_bytes());
        r[258..260].copy_from_slice(&QE_ISVSVN.to_le_bytes());
        let mut hashed = Vec::with_capacity(96);
        hashed.extend_from_slice(attestation_point);
        hashed.extend_from_slice(qe_auth_data);
        r[320..352].copy_from_slice(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &hashed).as_ref(),
        );
        Ok(r)
    }

    pub fn pck(&self) -> &PckSpec {
        &self.pck
    }

    /// The FMSPC of the PCK, lower-case hex, as PCS is asked for it.
    pub fn fmspc_hex(&self) -> String {
        hex::encode(self.pck.fmspc)
    }

    /// The PCK chain the quotes carry, PEM: the PCK certificate, its CA, the root.
    pub fn pck_chain_pem(&self) -> &str {
        &self.pck_chain_pem
    }

    /// A quote of a TD with `td`'s report body and `report_data`, signed by this machine's
    /// attestation key.
    pub fn quote(
        &self,
        td: &TdFields,
        report_data: &[u8; 64],
    ) -> Result<Vec<u8>, TdxSimulationError> {
        let body = td.body(report_data);
        let mut quote = Vec::with_capacity(6 * 1024);
        let version: u16 = match td.version {
            QuoteVersion::V4 => 4,
            QuoteVersion::V5 => 5,
        };
        quote.extend_from_slice(&version.to_le_bytes());
        // Attestation key type 2: ECDSA-256 with P-256.
        quote.extend_from_slice(&2u16.to_le_bytes());
        // TEE type TDX.
        quote.extend_from_slice(&0x81u32.to_le_bytes());
        quote.extend_from_slice(&QE_ISVSVN.to_le_bytes());
        quote.extend_from_slice(&self.pck.pce_svn.to_le_bytes());
        quote.extend_from_slice(&INTEL_QE_VENDOR_ID);
        // User data: the QE ID (16 bytes) and 4 zero bytes.
        quote.extend_from_slice(&[0xe1; 16]);
        quote.extend_from_slice(&[0; 4]);
        if td.version == QuoteVersion::V5 {
            // Body descriptor: type 3 (TDX 1.5 TD report) and its size.
            quote.extend_from_slice(&3u16.to_le_bytes());
            let size =
                u32::try_from(body.len()).map_err(|_| TdxSimulationError::TooLong(body.len()))?;
            quote.extend_from_slice(&size.to_le_bytes());
        }
        quote.extend_from_slice(&body);
        let signature = sign(&self.attestation_key, &self.rng, &quote)?;

        let mut qe_data = Vec::with_capacity(4 * 1024);
        qe_data.extend_from_slice(&self.qe_report);
        qe_data.extend_from_slice(&self.qe_report_signature);
        qe_data.extend_from_slice(&32u16.to_le_bytes());
        qe_data.extend_from_slice(&self.qe_auth_data);
        qe_data.extend(certification_data(5, self.pck_chain_pem.as_bytes())?);

        let mut signature_data = Vec::with_capacity(qe_data.len() + 134);
        signature_data.extend_from_slice(&signature);
        signature_data.extend_from_slice(&self.attestation_point);
        signature_data.extend(certification_data(6, &qe_data)?);
        let len = u32::try_from(signature_data.len())
            .map_err(|_| TdxSimulationError::TooLong(signature_data.len()))?;
        quote.extend_from_slice(&len.to_le_bytes());
        quote.extend(signature_data);
        Ok(quote)
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What the simulated `intel` publishes for `machine`'s platform, as a verifier gets it from
/// PCS: the TCB info of its FMSPC, the QE identity, its PCK CA's CRL (revoking nothing) and the
/// root CA's CRL, issued an hour ago and current for a day.
pub fn current_collateral(
    intel: &SimulatedIntel,
    machine: &TdxMachine,
) -> Result<attestation::tdx::Collateral, TdxSimulationError> {
    let now = std::time::SystemTime::now();
    let issued = now - std::time::Duration::from_secs(3600);
    let next = now + std::time::Duration::from_secs(86_400);
    let tcb = intel.signed_tcb_info(&machine.fmspc_hex(), issued, next)?;
    let qe = intel.sign_qe_identity(&intel.qe_identity_json(issued, next)?)?;
    let chain = intel.tcb_issuer_chain_pem();
    let ca = machine.pck.ca;
    Ok(attestation::tdx::Collateral::from_pcs(
        attestation::tdx::collateral::PcsResponses {
            tcb_info: tcb.as_bytes(),
            tcb_info_issuer_chain: &chain,
            qe_identity: qe.as_bytes(),
            qe_identity_issuer_chain: &chain,
            pck_crl: &intel.pck_crl(ca, &[], issued, next)?,
            pck_crl_issuer_chain: &intel.pck_issuer_chain_pem(ca),
            root_ca_crl: &intel.root_crl(&[], issued, next)?,
        },
    )?)
}

/// A qemu-tdx attestation config trusting only `intel`'s root, enforcing the simulated TDs'
/// [`MRTD`] and [`RTMRS`] as measurements 0..4 and accepting the simulated [`MRSEAM`].
pub fn qemu_attestation_config(intel: &SimulatedIntel) -> serde_json::Value {
    let measurements: serde_json::Map<String, serde_json::Value> = std::iter::once(MRTD)
        .chain(RTMRS)
        .enumerate()
        .map(|(index, value)| {
            (
                index.to_string(),
                serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            )
        })
        .collect();
    serde_json::json!({
        "measurements": measurements,
        "intelRootKey": intel.root_pem(),
        "mrSeams": [hex::encode(MRSEAM)],
    })
}

/// The real qemu-tdx validator as a verifier of `intel`'s platforms runs it, for TDs on
/// `machine`: [`qemu_attestation_config`], with [`current_collateral`].
pub fn qemu_validator(
    intel: &SimulatedIntel,
    machine: &TdxMachine,
) -> Result<attestation::variants::tdx::TdxValidator, TdxSimulationError> {
    let collateral =
        attestation::tdx::StaticCollateral::new().with(current_collateral(intel, machine)?);
    let (validator, _digest) = attestation::variants::tdx::TdxValidator::from_attestation_config(
        attestation::variants::tdx::TdxKind::Qemu,
        qemu_attestation_config(intel).to_string().as_bytes(),
        Arc::new(collateral),
    )?;
    Ok(validator)
}

/// A qemu-tdx document as Constellation's issuer writes it with Go's `encoding/json`.
pub fn qemu_document(quote: &[u8], user_data: &[u8]) -> Vec<u8> {
    serde_json::json!({ "RawQuote": b64(quote), "UserData": b64(user_data) })
        .to_string()
        .into_bytes()
}

/// An azure-tdx InstanceInfo: the TD quote and the HCL runtime data it binds.
pub fn azure_instance_info(quote: &[u8], runtime_data: &[u8]) -> Vec<u8> {
    serde_json::json!({ "AttestationReport": b64(quote), "RuntimeData": b64(runtime_data) })
        .to_string()
        .into_bytes()
}

/// What a node puts into its TD report's REPORT_DATA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportData {
    /// What binds it: qemu-tdx extraData (SHA-256 of user data ‖ nonce) zero-padded to 64
    /// bytes; azure-tdx SHA-256 of the HCL runtime data, zero-padded.
    Bound,
    /// These 64 bytes, whatever the connection or key (a quote made for something else).
    Fixed([u8; 64]),
}

/// A node of a TDX variant on a simulated machine.
///
/// - **qemu-tdx**: each document's quote is made per connection (its REPORT_DATA holds the
///   connection's extraData), wrapped as `{"RawQuote", "UserData"}`.
/// - **azure-tdx**: a vTPM document from a software AK; its InstanceInfo holds one TD quote whose
///   REPORT_DATA[0:32] is SHA-256 of Azure's HCL runtime data naming that AK, as an Azure TD's
///   paravisor makes it at boot.
pub struct TdxDocumentIssuer {
    variant: Variant,
    machine: Arc<TdxMachine>,
    td: TdFields,
    report_data: ReportData,
    /// azure-tdx: the vTPM's attestation key and the InstanceInfo every document carries.
    azure: Option<(crate::SoftIssuer, Vec<u8>)>,
}

impl std::fmt::Debug for TdxDocumentIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TdxDocumentIssuer")
            .field("variant", &self.variant)
            .field("td", &self.td)
            .field("report_data", &self.report_data)
            .finish_non_exhaustive()
    }
}

impl TdxDocumentIssuer {
    /// A qemu-tdx node on `machine`.
    pub fn qemu(machine: Arc<TdxMachine>, td: TdFields, report_data: ReportData) -> Self {
        TdxDocumentIssuer {
            variant: Variant::QemuTdx,
            machine,
            td,
            report_data,
            azure: None,
        }
    }

    /// An azure-tdx node on `machine` whose vTPM key is `ak` (RSA, as Azure's are).
    pub fn azure(
        ak: crate::SoftIssuer,
        machine: Arc<TdxMachine>,
        td: TdFields,
        report_data: ReportData,
    ) -> Result<Self, TdxSimulationError> {
        let runtime = crate::snp::azure_runtime_data_for(&ak)?;
        let data = match report_data {
            ReportData::Bound => {
                let mut data = [0u8; 64];
                data[..32].copy_from_slice(
                    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &runtime).as_ref(),
                );
                data
            }
            ReportData::Fixed(data) => data,
        };
        let quote = machine.quote(&td, &data)?;
        Ok(TdxDocumentIssuer {
            variant: Variant::AzureTdx,
            machine,
            td,
            report_data,
            azure: Some((ak, azure_instance_info(&quote, &runtime))),
        })
    }

    /// An azure-tdx node that presents `instance_info` (another node's, for theft tests) with
    /// its own `ak`.
    pub fn azure_from_parts(
        ak: crate::SoftIssuer,
        machine: Arc<TdxMachine>,
        instance_info: Vec<u8>,
    ) -> Self {
        TdxDocumentIssuer {
            variant: Variant::AzureTdx,
            machine,
            td: TdFields::default(),
            report_data: ReportData::Bound,
            azure: Some((ak, instance_info)),
        }
    }

    pub fn machine(&self) -> &TdxMachine {
        &self.machine
    }

    /// azure-tdx: the InstanceInfo every document carries; `None` for qemu-tdx.
    pub fn instance_info(&self) -> Option<&[u8]> {
        self.azure.as_ref().map(|(_, info)| info.as_slice())
    }

    /// The document for a connection with `user_data` and `nonce`.
    pub fn document(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, TdxSimulationError> {
        if let Some((ak, instance_info)) = &self.azure {
            return Ok(ak.issue_document_with_instance_info(
                user_data,
                nonce,
                Some(instance_info),
            )?);
        }
        let data = match self.report_data {
            ReportData::Bound => {
                let mut data = [0u8; 64];
                data[..32].copy_from_slice(&attestation::vtpm::make_extra_data(user_data, nonce));
                data
            }
            ReportData::Fixed(data) => data,
        };
        Ok(qemu_document(
            &self.machine.quote(&self.td, &data)?,
            user_data,
        ))
    }
}

impl Issuer for TdxDocumentIssuer {
    fn variant(&self) -> Variant {
        self.variant
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.document(user_data, nonce)
            .map_err(|e| IssueError::from_error(self.variant, e))
    }
}
