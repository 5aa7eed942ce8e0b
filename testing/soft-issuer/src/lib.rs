//! A software attestation key for load tests and benchmarks.
//!
//! [`SoftIssuer`] produces qemu-vtpm attestation documents in exactly the format a TPM and the
//! node's `tpm-issuer` produce (`TPMT_PUBLIC` attestation key, `TPMS_ATTEST` quote with
//! `TPM_GENERATED` and `TPM_ST_ATTEST_QUOTE`, `TPMT_SIGNATURE`; ECC P-256 with ECDSA-SHA256 or
//! RSA-2048 with RSASSA-PKCS1-v1_5-SHA256), but signs them with a key held in process memory
//! (aws-lc-rs). One quote of the SHA-256 bank covers PCRs 0–23 with values the caller chooses,
//! so a simulated node can match (or deliberately miss) a measurement policy. Issuing costs one
//! signature, so thousands of simulated nodes fit on one machine without a TPM.
//!
//! [`gce`] simulates a GCE confidential VM's boot record for gcp-sev-es; [`snp`] and [`tdx`]
//! simulate the hardware of the SEV-SNP and TDX variants (AMD's and Intel's certificate chains,
//! signed reports and quotes, the variants' documents), and [`azure_vtpm`] Azure's vTPM CA that
//! certifies a Trusted Launch VM's attestation key, each trusted only where a test's attestation
//! config names the simulated root.
//!
//! **Not part of the service.** Such a document proves nothing: whoever holds the key can quote
//! any PCR values. The qemu-vtpm variant trusts the attestation key as presented, so the
//! validator accepts these documents; that is what makes them useful for load tests, and why
//! this crate must never be reachable from a deployment. It is a separate crate that
//! `attest-proxy`, `join-core` and `token-issuer` do not depend on (`tests/not_in_the_service.rs`
//! checks the dependency graph), so no configuration of the service can select it; only test
//! and benchmark code links it in. Real nodes use `tpm-issuer`.

pub mod azure;
pub mod azure_vtpm;
pub mod gce;
mod marshal;
pub mod nitro;
pub mod snp;
pub mod tdx;
pub mod tsm;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use attestation::eventlog::{EventLog, EventLogError};
use attestation::tpm::HashAlg;
use attestation::vtpm::document::{Attestation, AttestationDocument, Pcrs, Quote};
use attestation::vtpm::{make_extra_data, make_qualifying_data};
use attestation::{IssueError, Issuer, Variant};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};

/// PC Client TPMs have PCRs 0–23; like go-tpm-tools, every quote covers all of them.
pub const PCR_COUNT: u32 = 24;

/// The RSA-2048 key [`SoftIssuer::rsa_2048`] uses (PKCS#8 DER). An RSA key takes tens of
/// milliseconds to generate, so one is shipped; it is public and only ever signs simulated
/// quotes (see `keys/README.md`).
pub const TEST_RSA_2048_PKCS8: &[u8] = include_bytes!("../keys/rsa2048-test.pk8");

/// The firmware version the simulated TPM reports in its quotes.
const FIRMWARE_VERSION: u64 = 0x2019_1023_0016_3636;

/// The kind of attestation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// ECC P-256, ECDSA with SHA-256 (go-tpm-tools' AttestationKeyECC).
    EcdsaP256,
    /// RSA 2048, RSASSA-PKCS1-v1_5 with SHA-256 (go-tpm-tools' AttestationKeyRSA).
    Rsa2048,
}

/// Why the software issuer failed.
#[derive(Debug, thiserror::Error)]
pub enum SoftIssuerError {
    // The provider's `Unspecified` says nothing more.
    #[error("cannot generate an ECDSA P-256 key")]
    KeyGeneration,
    /// The provider's `KeyRejected`, as text.
    #[error("the key is not a usable PKCS#8 {0:?} key: {1}")]
    KeyRejected(KeyType, String),
    #[error("the RSA key has {0} bits; the software issuer signs with RSA-2048 only")]
    RsaKeySize(usize),
    #[error("the RSA key's public exponent does not fit the TPM's 32 bits")]
    RsaExponent,
    #[error("PCR {0} does not exist (PC Client TPMs have PCRs 0-23)")]
    PcrIndex(u32),
    #[error("the event log cannot be replayed for the SHA-256 bank")]
    EventLog(#[source] EventLogError),
    #[error("signing the quote failed")]
    Sign,
    #[error("cannot encode the attestation document")]
    Encode(#[source] serde_json::Error),
}

#[derive(Debug)]
enum SigningKey {
    Ecdsa(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// An in-process attestation key that issues qemu-vtpm documents. Cloning is cheap and shares
/// the key; [`SoftIssuer::with_pcrs`] then gives each clone its own measurements.
#[derive(Clone)]
pub struct SoftIssuer {
    key: Arc<SigningKey>,
    key_type: KeyType,
    ak_pub: Arc<[u8]>,
    ak_name: Arc<[u8]>,
    pcrs: BTreeMap<u32, Vec<u8>>,
    /// SHA-384 values of a second quote, if the node has that bank (a NitroTPM does).
    sha384_pcrs: Option<BTreeMap<u32, Vec<u8>>>,
    event_log: Arc<[u8]>,
    /// The TPM clock: it only moves forward, one tick per quote.
    clock: Arc<AtomicU64>,
    rng: SystemRandom,
}

impl fmt::Debug for SoftIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftIssuer")
            .field("key_type", &self.key_type)
            .field("pcrs", &self.pcrs.len())
            .field("event_log_bytes", &self.event_log.len())
            .finish_non_exhaustive()
    }
}

impl SoftIssuer {
    /// A new key of `key_type`: a freshly generated P-256 key, or the shipped RSA-2048 key
    /// ([`TEST_RSA_2048_PKCS8`]). All PCRs are zero.
    pub fn new(key_type: KeyType) -> Result<SoftIssuer, SoftIssuerError> {
        match key_type {
            KeyType::EcdsaP256 => SoftIssuer::ecdsa_p256(),
            KeyType::Rsa2048 => SoftIssuer::rsa_2048(),
        }
    }

    /// A freshly generated P-256 ECDSA key (cheap: one per simulated node is fine).
    pub fn ecdsa_p256() -> Result<SoftIssuer, SoftIssuerError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| SoftIssuerError::KeyGeneration)?;
        SoftIssuer::ecdsa_p256_from_pkcs8(pkcs8.as_ref())
    }

    /// A P-256 ECDSA key from PKCS#8 DER.
    pub fn ecdsa_p256_from_pkcs8(pkcs8: &[u8]) -> Result<SoftIssuer, SoftIssuerError> {
        let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8)
            .map_err(|e| SoftIssuerError::KeyRejected(KeyType::EcdsaP256, e.to_string()))?;
        // The provider's public key is the SEC1 uncompressed point 04 ‖ x ‖ y.
        let (x, y) = key
            .public_key()
            .as_ref()
            .strip_prefix(&[0x04])
            .and_then(|xy| xy.split_at_checked(32))
            .filter(|(x, y)| x.len() == y.len())
            .ok_or_else(|| {
                SoftIssuerError::KeyRejected(
                    KeyType::EcdsaP256,
                    "the public key is not an uncompressed P-256 point".to_owned(),
                )
            })?;
        let ak_pub = marshal::public_ecc_p256(x, y);
        Ok(SoftIssuer::with_key(
            SigningKey::Ecdsa(key),
            KeyType::EcdsaP256,
            ak_pub,
        ))
    }

    /// The shipped RSA-2048 key ([`TEST_RSA_2048_PKCS8`]).
    pub fn rsa_2048() -> Result<SoftIssuer, SoftIssuerError> {
        SoftIssuer::rsa_2048_from_pkcs8(TEST_RSA_2048_PKCS8)
    }

    /// An RSA-2048 key from PKCS#8 DER.
    pub fn rsa_2048_from_pkcs8(pkcs8: &[u8]) -> Result<SoftIssuer, SoftIssuerError> {
        let key = RsaKeyPair::from_pkcs8(pkcs8)
            .map_err(|e| SoftIssuerError::KeyRejected(KeyType::Rsa2048, e.to_string()))?;
        let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(key.public_key());
        let modulus = strip_leading_zeros(&public.n);
        if modulus.len() != 256 {
            return Err(SoftIssuerError::RsaKeySize(modulus.len() * 8));
        }
        // TPMT_PUBLIC has a u32 exponent; anything wider is not a key a TPM could hold.
        let exponent = strip_leading_zeros(&public.e);
        if exponent.len() > 4 {
            return Err(SoftIssuerError::RsaExponent);
        }
        let exponent = exponent
            .iter()
            .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
        let ak_pub = marshal::public_rsa(modulus, exponent);
        Ok(SoftIssuer::with_key(
            SigningKey::Rsa(key),
            KeyType::Rsa2048,
            ak_pub,
        ))
    }

    fn with_key(key: SigningKey, key_type: KeyType, ak_pub: Vec<u8>) -> SoftIssuer {
        let ak_name = marshal::name(&ak_pub);
        SoftIssuer {
            key: Arc::new(key),
            key_type,
            ak_pub: ak_pub.into(),
            ak_name: ak_name.into(),
            pcrs: (0..PCR_COUNT).map(|i| (i, vec![0u8; 32])).collect(),
            sha384_pcrs: None,
            event_log: Arc::from(Vec::new()),
            clock: Arc::new(AtomicU64::new(0)),
            rng: SystemRandom::new(),
        }
    }

    /// Sets the SHA-256 values of the given PCRs; the others keep their values.
    pub fn with_pcrs(
        mut self,
        pcrs: impl IntoIterator<Item = (u32, [u8; 32])>,
    ) -> Result<SoftIssuer, SoftIssuerError> {
        for (index, value) in pcrs {
            if index >= PCR_COUNT {
                return Err(SoftIssuerError::PcrIndex(index));
            }
            self.pcrs.insert(index, value.to_vec());
        }
        Ok(self)
    }

    /// Quotes a SHA-384 bank too, with these values (every other PCR of it zero).
    pub fn with_sha384_pcrs(
        mut self,
        pcrs: impl IntoIterator<Item = (u32, [u8; 48])>,
    ) -> Result<SoftIssuer, SoftIssuerError> {
        let mut bank: BTreeMap<u32, Vec<u8>> = (0..PCR_COUNT).map(|i| (i, vec![0u8; 48])).collect();
        for (index, value) in pcrs {
            if index >= PCR_COUNT {
                return Err(SoftIssuerError::PcrIndex(index));
            }
            bank.insert(index, value.to_vec());
        }
        self.sha384_pcrs = Some(bank);
        Ok(self)
    }

    /// Sends `log` in every document and sets the PCRs it extends to its SHA-256 replay, so the
    /// document is consistent the way a real node's is (and a policy computed from the log with
    /// `attest-tool replay-eventlog` matches).
    pub fn with_event_log(mut self, log: Vec<u8>) -> Result<SoftIssuer, SoftIssuerError> {
        let replayed = EventLog::parse(&log)
            .and_then(|l| l.replay(HashAlg::Sha256))
            .map_err(SoftIssuerError::EventLog)?;
        for (index, value) in replayed {
            if index >= PCR_COUNT {
                return Err(SoftIssuerError::PcrIndex(index));
            }
            self.pcrs.insert(index, value);
        }
        self.event_log = log.into();
        Ok(self)
    }

    pub fn key_type(&self) -> KeyType {
        self.key_type
    }

    /// The attestation key's `TPMT_PUBLIC`, as it appears in `ak_pub`.
    pub fn ak_public(&self) -> &[u8] {
        &self.ak_pub
    }

    /// The SHA-256 PCR values every quote reports.
    pub fn pcrs(&self) -> &BTreeMap<u32, Vec<u8>> {
        &self.pcrs
    }

    /// The JSON document binding `user_data` to the verifier's `nonce`, exactly as
    /// `tpm-issuer` writes it.
    pub fn issue_document(
        &self,
        user_data: &[u8],
        nonce: &[u8],
    ) -> Result<Vec<u8>, SoftIssuerError> {
        self.issue_document_with_instance_info(user_data, nonce, None)
    }

    /// A document carrying `instance_info` (the hardware evidence of the SNP and TDX variants),
    /// which the quote binds as Constellation's do: qualifying data = SHA-256(InstanceInfo ‖
    /// extraData).
    pub fn issue_document_with_instance_info(
        &self,
        user_data: &[u8],
        nonce: &[u8],
        instance_info: Option<&[u8]>,
    ) -> Result<Vec<u8>, SoftIssuerError> {
        let qualifying = make_qualifying_data(
            instance_info.unwrap_or_default(),
            &make_extra_data(user_data, nonce),
        );
        let mut quotes = Vec::new();
        for (bank, pcrs) in [
            (HashAlg::Sha256, Some(&self.pcrs)),
            (HashAlg::Sha384, self.sha384_pcrs.as_ref()),
        ] {
            let Some(pcrs) = pcrs else { continue };
            // TPM2_Quote digests the selected values with the signing scheme's hash (SHA-256).
            let mut digest = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
            for value in pcrs.values() {
                digest.update(value);
            }
            let indices: Vec<u32> = pcrs.keys().copied().collect();
            let attest = marshal::attest_quote(
                &self.ak_name,
                &qualifying,
                &marshal::QuoteBody {
                    clock: self.clock.fetch_add(1, Ordering::Relaxed),
                    firmware_version: FIRMWARE_VERSION,
                    bank: bank.id(),
                    indices: &indices,
                    pcr_digest: digest.finish().as_ref(),
                },
            );
            let raw_sig = self.sign(&attest)?;
            quotes.push(Quote {
                quote: attest,
                raw_sig,
                pcrs: Some(Pcrs {
                    hash: i32::from(bank.id()),
                    pcrs: pcrs.clone(),
                }),
            });
        }
        let doc = AttestationDocument {
            attestation: Some(Attestation {
                ak_pub: self.ak_pub.to_vec(),
                quotes,
                event_log: self.event_log.to_vec(),
            }),
            instance_info: instance_info.map(<[u8]>::to_vec),
            user_data: Some(user_data.to_vec()),
        };
        serde_json::to_vec(&doc).map_err(SoftIssuerError::Encode)
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SoftIssuerError> {
        match &*self.key {
            SigningKey::Ecdsa(key) => {
                let sig = key
                    .sign(&self.rng, message)
                    .map_err(|_| SoftIssuerError::Sign)?;
                let (r, s) = sig.as_ref().split_at(sig.as_ref().len() / 2);
                Ok(marshal::signature_ecdsa_sha256(r, s))
            }
            SigningKey::Rsa(key) => {
                let mut sig = vec![0u8; key.public_modulus_len()];
                key.sign(&signature::RSA_PKCS1_SHA256, &self.rng, message, &mut sig)
                    .map_err(|_| SoftIssuerError::Sign)?;
                Ok(marshal::signature_rsassa_sha256(&sig))
            }
        }
    }
}

/// A software AK issuing the vTPM document of a variant whose trust comes from the cloud
/// (azure-trustedlaunch, aws-nitro-tpm): the qemu-vtpm document format, carrying the cloud's
/// evidence as `InstanceInfo` (an AK certificate and its CA, an instance identity document),
/// which the quote binds. The node's certificate names `variant`.
#[derive(Clone, Debug)]
pub struct InstanceIssuer {
    ak: SoftIssuer,
    variant: Variant,
    instance_info: Vec<u8>,
}

impl InstanceIssuer {
    pub fn new(ak: SoftIssuer, variant: Variant, instance_info: Vec<u8>) -> InstanceIssuer {
        InstanceIssuer {
            ak,
            variant,
            instance_info,
        }
    }

    pub fn instance_info(&self) -> &[u8] {
        &self.instance_info
    }
}

impl Issuer for InstanceIssuer {
    fn variant(&self) -> Variant {
        self.variant
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.ak
            .issue_document_with_instance_info(user_data, nonce, Some(&self.instance_info))
            .map_err(|e| IssueError::from_error(self.variant, e))
    }
}

fn strip_leading_zeros(v: &[u8]) -> &[u8] {
    let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
    &v[first..]
}

impl Issuer for SoftIssuer {
    fn variant(&self) -> Variant {
        Variant::QemuVtpm
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.issue_document(user_data, nonce)
            .map_err(|e| IssueError::from_error(Variant::QemuVtpm, e))
    }
}
