//! Node-side vTPM attestation: quotes from a real TPM (device or swtpm) through the TSS.
//!
//! A node joining the cluster proves what it booted by presenting TPM quotes inside its aTLS
//! client certificate. [`TpmIssuer`] opens the TPM once, creates an attestation key (AK) once,
//! and for every [`Issuer::issue`] quotes PCRs 0–23 of every allocated non-SHA-1 bank, bound to
//! the verifier's nonce and the caller's user data, and writes the document exactly as
//! Constellation's Go issuer does (the wire types come from [`attestation::vtpm::document`], which
//! the validator uses too). The SNP variants' documents are the same with an InstanceInfo in
//! them ([`TpmIssuer::issue_document_with_instance_info`]); [`aws_sev_snp`] makes aws-sev-snp
//! documents with a report from `snp-issuer`, [`azure`] azure-sev-snp and azure-tdx documents
//! from the HCL report Azure's paravisor leaves in the vTPM, azure-trustedlaunch documents with
//! the AK certificate Azure leaves there, and [`gce`] gcp-sev-es documents with the GCE
//! attestation key and the instance the metadata server names.

pub mod aws_nitro_tpm;
pub mod aws_sev_snp;
pub mod azure;
pub mod gce;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;

use attestation::tpm::HashAlg;
use attestation::vtpm::document::{Attestation, AttestationDocument, Pcrs, Quote};
use attestation::vtpm::{make_extra_data, make_qualifying_data};
use attestation::{IssueError, Issuer, Variant};
use tss_esapi::Context;
use tss_esapi::abstraction::pcr::read_all;
use tss_esapi::attributes::ObjectAttributesBuilder;
use tss_esapi::constants::CapabilityType;
use tss_esapi::handles::{
    KeyHandle, NvIndexHandle, NvIndexTpmHandle, PersistentTpmHandle, TpmHandle,
};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth};
use tss_esapi::structures::{
    CapabilityData, Data, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme,
    PcrSelectionList, PcrSlot, Public, PublicBuilder, PublicEccParametersBuilder, PublicKeyRsa,
    PublicRsaParametersBuilder, RsaExponent, RsaScheme, SignatureScheme, SymmetricDefinitionObject,
};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::Marshall;

/// How often a quote is retried when a PCR changed between reading and quoting.
const QUOTE_ATTEMPTS: usize = 3;
/// PC Client TPMs have PCRs 0–23; go-tpm-tools quotes all of them.
const PCR_COUNT: u32 = 24;

/// The RSA signature scheme of an RSA attestation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RsaSigScheme {
    /// RSASSA-PKCS1-v1_5.
    Pkcs1v15,
    /// RSASSA-PSS.
    Pss,
}

/// The elliptic curve of an ECC attestation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AkCurve {
    P256,
    P384,
}

/// Which attestation key to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AkSpec {
    /// RSA 2048; the default (`RSA_DEFAULT`) matches go-tpm-tools' AttestationKeyRSA.
    Rsa { scheme: RsaSigScheme, hash: HashAlg },
    /// ECDSA; `ECC_DEFAULT` matches go-tpm-tools' AttestationKeyECC.
    Ecc { curve: AkCurve, hash: HashAlg },
}

impl AkSpec {
    /// RSA 2048, RSASSA-PKCS1-v1_5 with SHA-256.
    pub const RSA_DEFAULT: AkSpec = AkSpec::Rsa {
        scheme: RsaSigScheme::Pkcs1v15,
        hash: HashAlg::Sha256,
    };
    /// ECC P-256, ECDSA with SHA-256.
    pub const ECC_DEFAULT: AkSpec = AkSpec::Ecc {
        curve: AkCurve::P256,
        hash: HashAlg::Sha256,
    };

    fn hash(self) -> HashAlg {
        match self {
            AkSpec::Rsa { hash, .. } | AkSpec::Ecc { hash, .. } => hash,
        }
    }
}

impl Default for AkSpec {
    fn default() -> Self {
        AkSpec::RSA_DEFAULT
    }
}

/// What the issuer needs to know.
#[derive(Clone, Debug)]
pub struct TpmIssuerConfig {
    /// TCTI configuration, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
    pub tcti: String,
    pub ak: AkSpec,
    /// The firmware event log to include, e.g.
    /// `/sys/kernel/security/tpm0/binary_bios_measurements`; `None` sends none.
    pub event_log: Option<PathBuf>,
    /// Attest with the key persisted at this handle instead of creating one (`ak` is then
    /// ignored): on Azure the paravisor persists its AK at [`azure::HCL_AK_HANDLE`], and only
    /// that key is named in the HCL report.
    pub persistent_ak: Option<u32>,
    /// Attest with the primary key the template in this NV index makes under the endorsement
    /// hierarchy instead (`ak` is then ignored): on GCE, Google's AK template
    /// ([`gce::AK_TEMPLATE_NV_INDEX_RSA`]), whose key the GCE API vouches for.
    pub ak_template_nv: Option<u32>,
}

impl TpmIssuerConfig {
    /// The default AK and no event log.
    pub fn new(tcti: impl Into<String>) -> Self {
        TpmIssuerConfig {
            tcti: tcti.into(),
            ak: AkSpec::default(),
            event_log: None,
            persistent_ak: None,
            ak_template_nv: None,
        }
    }
}

/// Why the issuer failed.
#[derive(Debug, thiserror::Error)]
pub enum TpmIssuerError {
    #[error("invalid TCTI configuration {0:?}")]
    Tcti(String, #[source] tss_esapi::Error),
    #[error("cannot open the TPM")]
    Open(#[source] tss_esapi::Error),
    #[error("TPM command {0} failed")]
    Tpm(&'static str, #[source] tss_esapi::Error),
    #[error("the TPM has no allocated PCR bank other than SHA-1")]
    NoBanks,
    #[error("SHA-1 cannot be the attestation key's hash")]
    Sha1Ak,
    #[error("PCRs kept changing while quoting the {0} bank")]
    PcrsChanging(HashAlg),
    #[error("the TPM returned an unusable quote")]
    BadQuote(#[source] attestation::tpm::ParseError),
    #[error("cannot read the event log {0}")]
    EventLog(PathBuf, #[source] std::io::Error),
    #[error("cannot encode the attestation document")]
    Encode(#[source] serde_json::Error),
    #[error("the TPM context lock is poisoned (an earlier issue panicked)")]
    Poisoned,
    #[error("no key is persisted at handle {0:#010x}")]
    NoPersistentAk(u32, #[source] tss_esapi::Error),
    #[error("the key persisted at {0:#010x} cannot be the attestation key: {1}")]
    UnusableAk(u32, String),
    #[error("NV index {0:#010x} does not hold an attestation key template: {1}")]
    UnusableTemplate(u32, String),
    #[error("NV index {0:#010x} is not defined")]
    NoNvIndex(u32, #[source] tss_esapi::Error),
    #[error("NV index {index:#010x} returned nothing after {read} of its {size} bytes")]
    NvShortRead {
        index: u32,
        read: usize,
        size: usize,
    },
    #[error("NV index {index:#010x} holds {size} bytes, more than the {limit} accepted")]
    NvTooLarge {
        index: u32,
        size: usize,
        limit: usize,
    },
}

struct TpmState {
    context: Context,
    ak: KeyHandle,
    ak_pub: Vec<u8>,
    banks: Vec<(HashAlg, HashingAlgorithm)>,
}

/// Issues qemu-vtpm attestation documents from a real TPM.
pub struct TpmIssuer {
    // The ESAPI context is not Sync and one TPM runs one command at a time anyway.
    state: Mutex<TpmState>,
    ak_spec: AkSpec,
    event_log: Option<PathBuf>,
}

impl std::fmt::Debug for TpmIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmIssuer")
            .field("ak", &self.ak_spec)
            .field("event_log", &self.event_log)
            .finish_non_exhaustive()
    }
}

impl TpmIssuer {
    /// Opens the TPM, finds its PCR banks and creates the attestation key.
    pub fn open(config: &TpmIssuerConfig) -> Result<TpmIssuer, TpmIssuerError> {
        if config.ak.hash() == HashAlg::Sha1 {
            return Err(TpmIssuerError::Sha1Ak);
        }
        let tcti = TctiNameConf::from_str(&config.tcti)
            .map_err(|e| TpmIssuerError::Tcti(config.tcti.clone(), e))?;
        let mut context = Context::new(tcti).map_err(TpmIssuerError::Open)?;
        let banks = allocated_banks(&mut context)?;
        let (ak, ak_pub, ak_spec) = match (config.persistent_ak, config.ak_template_nv) {
            (Some(handle), _) => load_persistent_ak(&mut context, handle)?,
            (None, Some(index)) => ak_from_nv_template(&mut context, index)?,
            (None, None) => {
                let template = ak_template(config.ak)
                    .map_err(|e| TpmIssuerError::Tpm("build AK template", e))?;
                // A primary key under the owner hierarchy, as go-tpm-tools creates its AKs:
                // derived from the hierarchy seed, so every creation yields the same key on
                // one TPM.
                let created = context
                    .execute_with_nullauth_session(|ctx| {
                        ctx.create_primary(Hierarchy::Owner, template, None, None, None, None)
                    })
                    .map_err(|e| TpmIssuerError::Tpm("CreatePrimary", e))?;
                let ak_pub = created
                    .out_public
                    .marshall()
                    .map_err(|e| TpmIssuerError::Tpm("marshal AK public area", e))?;
                (created.key_handle, ak_pub, config.ak)
            }
        };
        tracing::info!(ak = ?ak_spec, persistent = ?config.persistent_ak, template_nv = ?config.ak_template_nv, banks = ?banks.iter().map(|b| b.0).collect::<Vec<_>>(), "TPM attestation key ready");
        Ok(TpmIssuer {
            state: Mutex::new(TpmState {
                context,
                ak,
                ak_pub,
                banks,
            }),
            ak_spec,
            event_log: config.event_log.clone(),
        })
    }

    /// The whole content of NV index `index`, read with owner authorization (empty, as on
    /// Azure's vTPM) in chunks the TPM accepts; an index larger than `limit` is refused
    /// before it is read.
    pub fn read_nv(&self, index: u32, limit: usize) -> Result<Vec<u8>, TpmIssuerError> {
        let mut state = self.state.lock().map_err(|_| TpmIssuerError::Poisoned)?;
        read_nv(&mut state.context, index, limit)
    }

    /// The attestation key's public area (`TPMT_PUBLIC`), as sent in documents.
    pub fn ak_public(&self) -> Result<Vec<u8>, TpmIssuerError> {
        let state = self.state.lock().map_err(|_| TpmIssuerError::Poisoned)?;
        Ok(state.ak_pub.clone())
    }

    /// Produces the JSON document binding `user_data` to `nonce`.
    pub fn issue_document(
        &self,
        user_data: &[u8],
        nonce: &[u8],
    ) -> Result<Vec<u8>, TpmIssuerError> {
        // qemu-vtpm has no instance info; Constellation still hashes the (empty) value in.
        self.issue_document_with_instance_info(user_data, nonce, None)
    }

    /// A document carrying `instance_info` (the hardware evidence of the SNP variants), which
    /// the quotes bind as Constellation's do: qualifying data = SHA-256(InstanceInfo ‖
    /// extraData).
    pub fn issue_document_with_instance_info(
        &self,
        user_data: &[u8],
        nonce: &[u8],
        instance_info: Option<&[u8]>,
    ) -> Result<Vec<u8>, TpmIssuerError> {
        let qualifying = make_qualifying_data(
            instance_info.unwrap_or_default(),
            &make_extra_data(user_data, nonce),
        );
        let event_log = match &self.event_log {
            Some(path) => {
                std::fs::read(path).map_err(|e| TpmIssuerError::EventLog(path.clone(), e))?
            }
            None => Vec::new(),
        };
        let mut state = self.state.lock().map_err(|_| TpmIssuerError::Poisoned)?;
        let state = &mut *state;
        let mut quotes = Vec::with_capacity(state.banks.len());
        for &(bank, tss_bank) in &state.banks {
            quotes.push(quote_bank(
                &mut state.context,
                state.ak,
                self.ak_spec.hash(),
                bank,
                tss_bank,
                &qualifying,
            )?);
        }
        let doc = AttestationDocument {
            attestation: Some(Attestation {
                ak_pub: state.ak_pub.clone(),
                quotes,
                event_log,
            }),
            instance_info: instance_info.map(<[u8]>::to_vec),
            user_data: Some(user_data.to_vec()),
        };
        serde_json::to_vec(&doc).map_err(TpmIssuerError::Encode)
    }
}

impl Issuer for TpmIssuer {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.issue_document(user_data, nonce)
            .map_err(|e| IssueError::from_error(Variant::QemuVtpm, e))
    }
}

/// An [`IssueError`] whose reason is `e`'s whole chain: a layer's own text ("the SEV-SNP
/// evidence") alone would not say what to fix.
pub(crate) fn issue_error(
    variant: Variant,
    e: impl std::error::Error + Send + Sync + 'static,
) -> IssueError {
    let mut reason = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        reason = format!("{reason}: {c}");
        cause = c.source();
    }
    IssueError {
        variant,
        reason,
        source: Some(Box::new(e)),
    }
}

fn to_tss_hash(h: HashAlg) -> HashingAlgorithm {
    match h {
        HashAlg::Sha1 => HashingAlgorithm::Sha1,
        HashAlg::Sha256 => HashingAlgorithm::Sha256,
        HashAlg::Sha384 => HashingAlgorithm::Sha384,
        HashAlg::Sha512 => HashingAlgorithm::Sha512,
    }
}

/// The allocated banks with at least one PCR, except SHA-1 (never trusted by validators) and
/// hashes the validator does not know (SM3).
fn allocated_banks(
    context: &mut Context,
) -> Result<Vec<(HashAlg, HashingAlgorithm)>, TpmIssuerError> {
    let (data, _) = context
        .get_capability(CapabilityType::AssignedPcr, 0, 1)
        .map_err(|e| TpmIssuerError::Tpm("GetCapability(PCRS)", e))?;
    let CapabilityData::AssignedPcr(list) = data else {
        return Err(TpmIssuerError::NoBanks);
    };
    let mut banks = Vec::new();
    for selection in list.get_selections() {
        if selection.is_empty() {
            continue;
        }
        let tss = selection.hashing_algorithm();
        let Some(bank) = HashAlg::from_id(u16::from(tss)) else {
            continue;
        };
        if bank != HashAlg::Sha1 {
            banks.push((bank, tss));
        }
    }
    if banks.is_empty() {
        return Err(TpmIssuerError::NoBanks);
    }
    Ok(banks)
}

/// The template of the AK [`TpmIssuer`] creates for `spec` (go-tpm-tools' AK templates).
pub fn ak_template(spec: AkSpec) -> tss_esapi::Result<Public> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()?;
    match spec {
        AkSpec::Rsa { scheme, hash } => {
            let scheme = match scheme {
                RsaSigScheme::Pkcs1v15 => RsaScheme::RsaSsa(HashScheme::new(to_tss_hash(hash))),
                RsaSigScheme::Pss => RsaScheme::RsaPss(HashScheme::new(to_tss_hash(hash))),
            };
            PublicBuilder::new()
                .with_public_algorithm(PublicAlgorithm::Rsa)
                .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
                .with_object_attributes(attributes)
                .with_rsa_parameters(
                    PublicRsaParametersBuilder::new()
                        .with_scheme(scheme)
                        .with_key_bits(RsaKeyBits::Rsa2048)
                        .with_exponent(RsaExponent::default())
                        .with_is_signing_key(true)
                        .with_is_decryption_key(false)
                        .with_restricted(true)
                        .build()?,
                )
                .with_rsa_unique_identifier(PublicKeyRsa::default())
                .build()
        }
        AkSpec::Ecc { curve, hash } => PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attributes)
            .with_ecc_parameters(
                PublicEccParametersBuilder::new()
                    .with_symmetric(SymmetricDefinitionObject::Null)
                    .with_ecc_scheme(EccScheme::EcDsa(HashScheme::new(to_tss_hash(hash))))
                    .with_curve(match curve {
                        AkCurve::P256 => EccCurve::NistP256,
                        AkCurve::P384 => EccCurve::NistP384,
                    })
                    .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                    .with_is_signing_key(true)
                    .with_is_decryption_key(false)
                    .with_restricted(true)
                    .build()?,
            )
            .with_ecc_unique_identifier(EccPoint::default())
            .build(),
    }
}

/// Quotes PCRs 0–23 of one bank and reads their values. The values are read before the quote
/// and checked against the quote's digest afterwards, so a PCR extended in between is noticed
/// and the pair retried instead of shipping values that fail validation.
fn quote_bank(
    context: &mut Context,
    ak: KeyHandle,
    sig_hash: HashAlg,
    bank: HashAlg,
    tss_bank: HashingAlgorithm,
    qualifying: &[u8; 32],
) -> Result<Quote, TpmIssuerError> {
    let slots: Vec<PcrSlot> = (0..PCR_COUNT)
        .filter_map(|i| PcrSlot::try_from(1u32 << i).ok())
        .collect();
    let selection = PcrSelectionList::builder()
        .with_selection(tss_bank, &slots)
        .build()
        .map_err(|e| TpmIssuerError::Tpm("build PCR selection", e))?;
    let qualifying_data = Data::try_from(qualifying.to_vec())
        .map_err(|e| TpmIssuerError::Tpm("qualifying data", e))?;
    for _ in 0..QUOTE_ATTEMPTS {
        let values =
            read_all(context, selection.clone()).map_err(|e| TpmIssuerError::Tpm("PCR_Read", e))?;
        let (attest, signature) = context
            .execute_with_nullauth_session(|ctx| {
                ctx.quote(
                    ak,
                    qualifying_data.clone(),
                    SignatureScheme::Null,
                    selection.clone(),
                )
            })
            .map_err(|e| TpmIssuerError::Tpm("Quote", e))?;
        let attest = attest
            .marshall()
            .map_err(|e| TpmIssuerError::Tpm("marshal TPMS_ATTEST", e))?;
        let raw_sig = signature
            .marshall()
            .map_err(|e| TpmIssuerError::Tpm("marshal TPMT_SIGNATURE", e))?;

        let mut pcrs = std::collections::BTreeMap::new();
        if let Some(values) = values.pcr_bank(tss_bank) {
            for (slot, digest) in values {
                let index = u32::from(*slot).trailing_zeros();
                pcrs.insert(index, digest.value().to_vec());
            }
        }
        let parsed = attestation::tpm::Attest::parse(&attest).map_err(TpmIssuerError::BadQuote)?;
        // TPM2_Quote digests the selected PCRs with the signing scheme's hash.
        let mut ctx = aws_lc_rs::digest::Context::new(sig_hash.digest_algorithm());
        for value in pcrs.values() {
            ctx.update(value);
        }
        if ctx.finish().as_ref() == parsed.quote.pcr_digest.as_slice() {
            return Ok(Quote {
                quote: attest,
                raw_sig,
                pcrs: Some(Pcrs {
                    hash: i32::from(bank.id()),
                    pcrs,
                }),
            });
        }
        tracing::debug!(%bank, "PCRs changed while quoting; retrying");
    }
    Err(TpmIssuerError::PcrsChanging(bank))
}

/// Loads the key persisted at `handle` as the attestation key, with the signing scheme its
/// public area names (go-tpm-tools' `LoadCachedKey`).
fn load_persistent_ak(
    context: &mut Context,
    handle: u32,
) -> Result<(KeyHandle, Vec<u8>, AkSpec), TpmIssuerError> {
    let tpm_handle =
        PersistentTpmHandle::new(handle).map_err(|e| TpmIssuerError::NoPersistentAk(handle, e))?;
    let object = context
        .execute_without_session(|ctx| ctx.tr_from_tpm_public(TpmHandle::Persistent(tpm_handle)))
        .map_err(|e| TpmIssuerError::NoPersistentAk(handle, e))?;
    let key = KeyHandle::from(object);
    let (public, _, _) = context
        .execute_without_session(|ctx| ctx.read_public(key))
        .map_err(|e| TpmIssuerError::Tpm("ReadPublic", e))?;
    let ak_pub = public
        .marshall()
        .map_err(|e| TpmIssuerError::Tpm("marshal AK public area", e))?;
    let spec = ak_spec_of(&ak_pub).map_err(|reason| TpmIssuerError::UnusableAk(handle, reason))?;
    Ok((key, ak_pub, spec))
}

/// The attestation key the template in NV index `index` makes: a primary key under the
/// endorsement hierarchy, as go-tpm-tools' `KeyFromNvIndex` makes GCE's AK.
fn ak_from_nv_template(
    context: &mut Context,
    index: u32,
) -> Result<(KeyHandle, Vec<u8>, AkSpec), TpmIssuerError> {
    use tss_esapi::traits::UnMarshall;
    // A TPMT_PUBLIC template: an RSA-2048 one with no unique value is about 300 bytes.
    let raw = read_nv(context, index, 4096)?;
    let unusable = |reason: String| TpmIssuerError::UnusableTemplate(index, reason);
    ak_spec_of(&raw).map_err(unusable)?;
    let template = Public::unmarshall(&raw).map_err(|e| unusable(e.to_string()))?;
    let created = context
        .execute_with_nullauth_session(|ctx| {
            ctx.create_primary(Hierarchy::Endorsement, template, None, None, None, None)
        })
        .map_err(|e| TpmIssuerError::Tpm("CreatePrimary(endorsement)", e))?;
    let ak_pub = created
        .out_public
        .marshall()
        .map_err(|e| TpmIssuerError::Tpm("marshal AK public area", e))?;
    let spec = ak_spec_of(&ak_pub).map_err(unusable)?;
    Ok((created.key_handle, ak_pub, spec))
}

/// How a key with public area `ak_pub` signs quotes, if it can be an attestation key at all.
fn ak_spec_of(ak_pub: &[u8]) -> Result<AkSpec, String> {
    use attestation::tpm::{PublicKey, alg, curve, object_attributes};
    let unusable = |reason: &str| reason.to_owned();
    let parsed = attestation::tpm::Public::parse(ak_pub).map_err(|e| e.to_string())?;
    if !parsed.has_attributes(object_attributes::RESTRICTED | object_attributes::SIGN_ENCRYPT) {
        return Err(unusable("it is not a restricted signing key"));
    }
    let hash_of = |scheme: &Option<attestation::tpm::Scheme>| {
        scheme
            .as_ref()
            .and_then(|s| s.hash)
            .and_then(HashAlg::from_id)
            .filter(|h| *h != HashAlg::Sha1)
    };
    Ok(match &parsed.key {
        PublicKey::Rsa { scheme, .. } => {
            let rsa_scheme = match scheme.as_ref().map(|s| s.scheme) {
                Some(alg::RSASSA) => RsaSigScheme::Pkcs1v15,
                Some(alg::RSAPSS) => RsaSigScheme::Pss,
                _ => return Err(unusable("its RSA scheme is neither RSASSA nor RSAPSS")),
            };
            let hash =
                hash_of(scheme).ok_or_else(|| unusable("its scheme's hash is SHA-1 or unknown"))?;
            AkSpec::Rsa {
                scheme: rsa_scheme,
                hash,
            }
        }
        PublicKey::Ecc { scheme, curve, .. } => {
            if scheme.as_ref().map(|s| s.scheme) != Some(alg::ECDSA) {
                return Err(unusable("its ECC scheme is not ECDSA"));
            }
            let curve = match *curve {
                curve::NIST_P256 => AkCurve::P256,
                curve::NIST_P384 => AkCurve::P384,
                _ => return Err(unusable("its curve is neither P-256 nor P-384")),
            };
            let hash =
                hash_of(scheme).ok_or_else(|| unusable("its scheme's hash is SHA-1 or unknown"))?;
            AkSpec::Ecc { curve, hash }
        }
    })
}

fn read_nv(context: &mut Context, index: u32, limit: usize) -> Result<Vec<u8>, TpmIssuerError> {
    let tpm_index =
        NvIndexTpmHandle::new(index).map_err(|e| TpmIssuerError::NoNvIndex(index, e))?;
    let mut object = context
        .execute_without_session(|ctx| ctx.tr_from_tpm_public(TpmHandle::NvIndex(tpm_index)))
        .map_err(|e| TpmIssuerError::NoNvIndex(index, e))?;
    let result = read_nv_object(context, index, object, limit);
    // The ESYS object for the index is only needed for this read.
    let _ = context.tr_close(&mut object);
    result
}

fn read_nv_object(
    context: &mut Context,
    index: u32,
    object: tss_esapi::handles::ObjectHandle,
    limit: usize,
) -> Result<Vec<u8>, TpmIssuerError> {
    let nv = NvIndexHandle::from(object);
    let (public, _) = context
        .execute_without_session(|ctx| ctx.nv_read_public(nv))
        .map_err(|e| TpmIssuerError::Tpm("NV_ReadPublic", e))?;
    let size = public.data_size();
    if size > limit {
        return Err(TpmIssuerError::NvTooLarge { index, size, limit });
    }
    let chunk = tss_esapi::abstraction::nv::max_nv_buffer_size(context)
        .map_err(|e| TpmIssuerError::Tpm("GetCapability(NV_BUFFER_MAX)", e))?
        .clamp(1, usize::from(u16::MAX));
    let mut data = Vec::with_capacity(size);
    while data.len() < size {
        let want = chunk.min(size - data.len());
        // Both fit a u16: size is at most `limit` and every offset is below size.
        let (Ok(want16), Ok(offset)) = (u16::try_from(want), u16::try_from(data.len())) else {
            return Err(TpmIssuerError::NvTooLarge { index, size, limit });
        };
        let read = context
            .execute_with_nullauth_session(|ctx| ctx.nv_read(NvAuth::Owner, nv, want16, offset))
            .map_err(|e| TpmIssuerError::Tpm("NV_Read", e))?;
        if read.is_empty() {
            return Err(TpmIssuerError::NvShortRead {
                index,
                read: data.len(),
                size,
            });
        }
        data.extend_from_slice(read.value());
    }
    Ok(data)
}
