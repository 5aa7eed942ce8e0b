//! A simulated Intel: a test Intel SGX Root CA, the TCB signing certificate and the two PCK CAs
//! it certified, and what they sign: TCB info, QE identity, CRLs and PCK certificates.
//!
//! The certificates have the shape of Intel's (the same names, ECDSA P-256 with SHA-256, CA and
//! key-usage extensions), and TCB info and QE identity are signed as Intel signs them: ECDSA
//! P-256 over the exact bytes of the `tcbInfo` / `enclaveIdentity` value, the signature r||s in
//! hex. Nothing here is trusted unless a test's attestation config sets `intelRootKey` to
//! [`SimulatedIntel::root_pem`]. The keys are made afresh for every `SimulatedIntel`.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair as _};
use time::format_description::well_known::Rfc3339;
use x509_cert::crl::{CertificateList, RevokedCert, TbsCertList};
use x509_cert::der::asn1::{BitString, Ia5String, OctetString, Uint};
use x509_cert::der::oid::{AssociatedOid, ObjectIdentifier};
use x509_cert::der::{Any, Encode};
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::crl::dp::DistributionPoint;
use x509_cert::ext::pkix::name::{DistributionPointName, GeneralName};
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, CrlDistributionPoints, CrlNumber, KeyUsage,
    KeyUsages, SubjectKeyIdentifier,
};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::time::{Time, Validity};
use x509_cert::{Certificate, TbsCertificate, Version};

const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const PRIME256V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const ECDSA_WITH_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");

/// The SVNs of the one TCB level [`SimulatedIntel::tcb_info_json`] writes, UpToDate: a
/// simulated machine whose quote carries these (or higher) is UpToDate.
pub const SGX_TCB_SVNS: [u8; 16] = [2, 2, 2, 2, 3, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0];
/// The PCE SVN of that level.
pub const PCE_SVN: u16 = 13;
/// The TEE TCB SVNs of that level (byte 1 is zero, so Intel's rule compares all sixteen bytes
/// rather than looking the module up in `tdxModuleIdentities`).
pub const TDX_TCB_SVNS: [u8; 16] = [5, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
/// The SVNs of the second, lower level [`SimulatedIntel::tcb_info_json`] writes, OutOfDate with
/// advisory [`OUT_OF_DATE_ADVISORY`]: a machine whose PCK or TD report falls short of the
/// UpToDate level but meets these is OutOfDate (below these too, no level matches at all).
pub const OUT_OF_DATE_SGX_TCB_SVNS: [u8; 16] = [1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
/// The PCE SVN of the OutOfDate level.
pub const OUT_OF_DATE_PCE_SVN: u16 = 11;
/// The TEE TCB SVNs of the OutOfDate level.
pub const OUT_OF_DATE_TDX_TCB_SVNS: [u8; 16] = [3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
/// The advisory the OutOfDate level names, as Intel names the fixes a platform lacks.
pub const OUT_OF_DATE_ADVISORY: &str = "INTEL-SA-00837";
/// The ISV SVN of the TD QE that [`SimulatedIntel::qe_identity_json`] calls UpToDate.
pub const QE_ISVSVN: u16 = 4;
/// The TD QE's MRSIGNER as Intel publishes it (the simulated QE identity names the real one).
pub const QE_MRSIGNER: &str = "DC9E2A7C6F948F17474E34A7FC43ED030F7C1563F1BABDDF6340C82E0E54A8C5";

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

/// How the simulated Intel's PCK CAs differ from what RFC 5280 asks of an issuer (and Intel's
/// real ones carry), for tests that the verifier refuses such a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssuerFlaw {
    /// The PCK CAs' KeyUsage lacks keyCertSign (it says digitalSignature and cRLSign: they
    /// still sign their CRLs).
    PckCaNoKeyCertSign,
    /// The PCK CAs' BasicConstraints say CA:FALSE.
    PckCaNotCa,
}

/// Why simulated Intel collateral could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error("simulated Intel key: {0}")]
    Key(String),
    #[error("simulated Intel certificate: {0}")]
    Der(#[from] x509_cert::der::Error),
    #[error("signing: {0}")]
    Sign(String),
    #[error("the date {0:?} cannot be written")]
    Date(SystemTime),
}

struct Ca {
    key: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    name: Name,
    cert_der: Vec<u8>,
}

/// A simulated Intel SGX Root CA and what it certified.
pub struct SimulatedIntel {
    root: Ca,
    tcb_signing: Ca,
    platform: Ca,
    processor: Ca,
    rng: SystemRandom,
}

impl std::fmt::Debug for SimulatedIntel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedIntel").finish_non_exhaustive()
    }
}

/// Intel's names, CN first in DER as in Intel's certificates (an RFC 4514 string lists the
/// attributes last first).
fn intel_name(cn: &str) -> Result<Name, SimulationError> {
    Name::from_str(&format!(
        "C=US,ST=CA,L=Santa Clara,O=Intel Corporation,CN={cn}"
    ))
    .map_err(SimulationError::Der)
}

fn ecdsa_sha256() -> AlgorithmIdentifierOwned {
    AlgorithmIdentifierOwned {
        oid: ECDSA_WITH_SHA256,
        parameters: None,
    }
}

/// The SubjectPublicKeyInfo of an uncompressed P-256 point.
fn p256_spki(point: &[u8]) -> Result<SubjectPublicKeyInfoOwned, SimulationError> {
    Ok(SubjectPublicKeyInfoOwned {
        algorithm: AlgorithmIdentifierOwned {
            oid: EC_PUBLIC_KEY,
            parameters: Some(Any::from(&PRIME256V1)),
        },
        subject_public_key: BitString::from_bytes(point)?,
    })
}

fn asn1_time(at: SystemTime) -> Result<Time, SimulationError> {
    Time::try_from(at).map_err(SimulationError::Der)
}

fn secs(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A key identifier as RFC 5280 §4.2.1.2 method 1 makes it: SHA-1 of the public key bits.
fn key_id(point: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, point)
        .as_ref()
        .to_vec()
}

/// A positive INTEGER serial from a number.
fn serial(n: u64) -> Result<SerialNumber, SimulationError> {
    let bytes = n.to_be_bytes();
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(7);
    let mut der = Vec::with_capacity(9);
    if bytes[first] & 0x80 != 0 {
        der.push(0);
    }
    der.extend_from_slice(&bytes[first..]);
    Ok(SerialNumber::new(&der)?)
}

fn extension<T: AssociatedOid + Encode>(
    value: &T,
    critical: bool,
) -> Result<Extension, SimulationError> {
    Ok(Extension {
        extn_id: T::OID,
        critical,
        extn_value: OctetString::new(value.to_der()?)?,
    })
}

/// KeyUsage and BasicConstraints of a CA (path length `path_len`), in Intel's order.
fn ca_extensions(path_len: u8) -> Result<Vec<Extension>, SimulationError> {
    flawed_ca_extensions(path_len, None)
}

/// [`ca_extensions`], but as `flaw` says.
fn flawed_ca_extensions(
    path_len: u8,
    flaw: Option<IssuerFlaw>,
) -> Result<Vec<Extension>, SimulationError> {
    let usage = match flaw {
        Some(IssuerFlaw::PckCaNoKeyCertSign) => KeyUsages::DigitalSignature | KeyUsages::CRLSign,
        _ => KeyUsages::KeyCertSign | KeyUsages::CRLSign,
    };
    let ca = flaw != Some(IssuerFlaw::PckCaNotCa);
    Ok(vec![
        extension(&KeyUsage(usage), true)?,
        extension(
            &BasicConstraints {
                ca,
                path_len_constraint: ca.then_some(path_len),
            },
            true,
        )?,
    ])
}

fn leaf_extensions() -> Result<Vec<Extension>, SimulationError> {
    Ok(vec![
        extension(
            &KeyUsage(KeyUsages::DigitalSignature | KeyUsages::NonRepudiation),
            true,
        )?,
        extension(
            &BasicConstraints {
                ca: false,
                path_len_constraint: None,
            },
            true,
        )?,
    ])
}

/// Where Intel publishes the CRL of the certificates `issuer_cn` signs, as its certificates'
/// CRL distribution points name it.
fn crl_url(issuer_cn: &str) -> &'static str {
    match issuer_cn {
        "Intel SGX PCK Platform CA" => {
            "https://api.trustedservices.intel.com/sgx/certification/v4/pckcrl?ca=platform&encoding=der"
        }
        "Intel SGX PCK Processor CA" => {
            "https://api.trustedservices.intel.com/sgx/certification/v4/pckcrl?ca=processor&encoding=der"
        }
        _ => "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der",
    }
}

/// Formats `at` as Intel writes dates: RFC 3339, UTC, whole seconds.
pub fn intel_date(at: SystemTime) -> Result<String, SimulationError> {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| SimulationError::Date(at))?
        .as_secs();
    let at_utc = time::OffsetDateTime::from_unix_timestamp(
        i64::try_from(secs).map_err(|_| SimulationError::Date(at))?,
    )
    .map_err(|_| SimulationError::Date(at))?;
    at_utc
        .format(&Rfc3339)
        .map_err(|_| SimulationError::Date(at))
}

/// PEM of one DER certificate.
pub fn certificate_pem(der: &[u8]) -> String {
    pem("CERTIFICATE", der)
}

/// The blocks of a PEM text: each one's label and DER, in order.
fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, SimulationError> {
    use base64::Engine as _;
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines().map(str::trim) {
        if let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            open = Some((label.to_owned(), String::new()));
        } else if let Some(label) = line
            .strip_prefix("-----END ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            let (begun, body) =
                open.take()
                    .filter(|(begun, _)| begun == label)
                    .ok_or_else(|| {
                        SimulationError::Key(format!("PEM: END {label} without its BEGIN"))
                    })?;
            let der = base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|e| SimulationError::Key(format!("PEM {begun}: {e}")))?;
            blocks.push((begun, der));
        } else if let Some((_, body)) = open.as_mut() {
            body.push_str(line);
        }
    }
    Ok(blocks)
}

/// PEM of `der` under `label`, in 64-character lines.
pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

impl SimulatedIntel {
    /// A fresh root, TCB signing certificate and PCK Platform and Processor CAs.
    pub fn new() -> Result<SimulatedIntel, SimulationError> {
        Self::build(None)
    }

    /// [`SimulatedIntel::new`], but its PCK CAs carry `flaw`.
    pub fn with_flaw(flaw: IssuerFlaw) -> Result<SimulatedIntel, SimulationError> {
        Self::build(Some(flaw))
    }

    fn build(flaw: Option<IssuerFlaw>) -> Result<SimulatedIntel, SimulationError> {
        let rng = SystemRandom::new();
        let ca = |cn: &str| -> Result<Ca, SimulationError> {
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
                    .map_err(|e| SimulationError::Key(e.to_string()))?;
            let key = EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                pkcs8.as_ref(),
            )
            .map_err(|e| SimulationError::Key(e.to_string()))?;
            Ok(Ca {
                key,
                pkcs8: pkcs8.as_ref().to_vec(),
                name: intel_name(cn)?,
                cert_der: Vec::new(),
            })
        };
        let mut intel = SimulatedIntel {
            root: ca("Intel SGX Root CA")?,
            tcb_signing: ca("Intel SGX TCB Signing")?,
            platform: ca("Intel SGX PCK Platform CA")?,
            processor: ca("Intel SGX PCK Processor CA")?,
            rng,
        };
        let root_subject = intel.root.name.clone();
        let root_point = intel.root.key.public_key().as_ref().to_vec();
        // The root may certify CAs.
        let root_ext = ca_extensions(1)?;
        intel.root.cert_der = intel.certify(&intel.root, root_subject, &root_point, 1, root_ext)?;
        intel.tcb_signing.cert_der = intel.certify(
            &intel.root,
            intel.tcb_signing.name.clone(),
            intel.tcb_signing.key.public_key().as_ref(),
            2,
            leaf_extensions()?,
        )?;
        intel.platform.cert_der = intel.certify(
            &intel.root,
            intel.platform.name.clone(),
            intel.platform.key.public_key().as_ref(),
            3,
            flawed_ca_extensions(0, flaw)?,
        )?;
        intel.processor.cert_der = intel.certify(
            &intel.root,
            intel.processor.name.clone(),
            intel.processor.key.public_key().as_ref(),
            4,
            flawed_ca_extensions(0, flaw)?,
        )?;
        Ok(intel)
    }

    /// A certificate for `subject` (an uncompressed P-256 point) signed by `issuer`, valid
    /// 2018-05-21 to 2049-12-31 as Intel's root is.
    fn certify(
        &self,
        issuer: &Ca,
        subject: Name,
        point: &[u8],
        serial_number: u64,
        extensions: Vec<Extension>,
    ) -> Result<Vec<u8>, SimulationError> {
        // As Intel's certificates begin: the issuer's key, its CRL, the subject's key.
        let issuer_cn = issuer.name.to_string();
        let issuer_cn = issuer_cn
            .split(',')
            .find_map(|rdn| rdn.trim().strip_prefix("CN="))
            .unwrap_or_default()
            .to_owned();
        let mut all = vec![
            extension(
                &AuthorityKeyIdentifier {
                    key_identifier: Some(OctetString::new(key_id(
                        issuer.key.public_key().as_ref(),
                    ))?),
                    authority_cert_issuer: None,
                    authority_cert_serial_number: None,
                },
                false,
            )?,
            extension(
                &CrlDistributionPoints(vec![DistributionPoint {
                    distribution_point: Some(DistributionPointName::FullName(vec![
                        GeneralName::UniformResourceIdentifier(Ia5String::new(crl_url(
                            &issuer_cn,
                        ))?),
                    ])),
                    reasons: None,
                    crl_issuer: None,
                }]),
                false,
            )?,
            extension(
                &SubjectKeyIdentifier(OctetString::new(key_id(point))?),
                false,
            )?,
        ];
        all.extend(extensions);
        let extensions = all;
        let tbs = TbsCertificate {
            version: Version::V3,
            serial_number: serial(serial_number)?,
            signature: ecdsa_sha256(),
            issuer: issuer.name.clone(),
            validity: Validity {
                not_before: asn1_time(secs(1_526_899_510))?,
                not_after: asn1_time(secs(2_524_607_999))?,
            },
            subject,
            subject_public_key_info: p256_spki(point)?,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: (!extensions.is_empty()).then_some(extensions),
        };
        let sig = self.sign_der(issuer, &tbs.to_der()?)?;
        Ok(Certificate {
            tbs_certificate: tbs,
            signature_algorithm: ecdsa_sha256(),
            signature: BitString::from_bytes(&sig)?,
        }
        .to_der()?)
    }

    fn sign_der(&self, issuer: &Ca, message: &[u8]) -> Result<Vec<u8>, SimulationError> {
        Ok(issuer
            .key
            .sign(&self.rng, message)
            .map_err(|e| SimulationError::Sign(e.to_string()))?
            .as_ref()
            .to_vec())
    }

    fn pck_ca(&self, ca: PckCa) -> &Ca {
        match ca {
            PckCa::Platform => &self.platform,
            PckCa::Processor => &self.processor,
        }
    }

    /// The simulated root, PEM: what a test's `intelRootKey` sets.
    pub fn root_pem(&self) -> String {
        certificate_pem(&self.root.cert_der)
    }

    /// Every CA's certificate and private key, PEM (a `CERTIFICATE` then a `PRIVATE KEY`
    /// block each: the root, the TCB signing certificate, the Platform and the Processor CA),
    /// for another process to stand for the same simulated Intel ([`SimulatedIntel::from_keys_pem`]):
    /// the keys are made afresh for every `SimulatedIntel`, and a config trusting one root
    /// trusts no other. Secret only as far as the simulation is trusted.
    pub fn keys_pem(&self) -> String {
        [
            &self.root,
            &self.tcb_signing,
            &self.platform,
            &self.processor,
        ]
        .iter()
        .map(|ca| certificate_pem(&ca.cert_der) + &pem("PRIVATE KEY", &ca.pkcs8))
        .collect()
    }

    /// The simulated Intel whose CAs are in `text`, as [`SimulatedIntel::keys_pem`] wrote them.
    /// Each key must be the one its certificate certifies, or it is refused.
    pub fn from_keys_pem(text: &str) -> Result<SimulatedIntel, SimulationError> {
        let blocks = pem_blocks(text)?;
        let rng = SystemRandom::new();
        let mut cas = Vec::with_capacity(4);
        for pair in blocks.chunks(2) {
            let [(cert_label, cert_der), (key_label, pkcs8)] = pair else {
                return Err(SimulationError::Key(
                    "a certificate without its private key".to_owned(),
                ));
            };
            if cert_label != "CERTIFICATE" || key_label != "PRIVATE KEY" {
                return Err(SimulationError::Key(format!(
                    "expected a CERTIFICATE then a PRIVATE KEY, found {cert_label} then {key_label}"
                )));
            }
            let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8)
                .map_err(|e| SimulationError::Key(e.to_string()))?;
            let cert = <Certificate as x509_cert::der::Decode>::from_der(cert_der)?;
            let tbs = cert.tbs_certificate;
            if tbs.subject_public_key_info.subject_public_key.raw_bytes()
                != key.public_key().as_ref()
            {
                return Err(SimulationError::Key(format!(
                    "the private key is not the one the certificate of {} certifies",
                    tbs.subject
                )));
            }
            cas.push(Ca {
                key,
                pkcs8: pkcs8.clone(),
                name: tbs.subject,
                cert_der: cert_der.clone(),
            });
        }
        let [root, tcb_signing, platform, processor] = <[Ca; 4]>::try_from(cas)
            .map_err(|cas| SimulationError::Key(format!("{} CAs instead of 4", cas.len())))?;
        Ok(SimulatedIntel {
            root,
            tcb_signing,
            platform,
            processor,
            rng,
        })
    }

    pub fn root_der(&self) -> &[u8] {
        &self.root.cert_der
    }

    pub fn tcb_signing_der(&self) -> &[u8] {
        &self.tcb_signing.cert_der
    }

    /// The chain PCS sends with TCB info and QE identity: the TCB signing certificate, then the
    /// root.
    pub fn tcb_issuer_chain_pem(&self) -> String {
        certificate_pem(&self.tcb_signing.cert_der) + &certificate_pem(&self.root.cert_der)
    }

    pub fn pck_ca_der(&self, ca: PckCa) -> &[u8] {
        &self.pck_ca(ca).cert_der
    }

    /// The chain PCS sends with a PCK CRL (and a node with its PCK certificate): the PCK CA,
    /// then the root.
    pub fn pck_issuer_chain_pem(&self, ca: PckCa) -> String {
        certificate_pem(&self.pck_ca(ca).cert_der) + &certificate_pem(&self.root.cert_der)
    }

    /// The PCK CA's private key (PKCS#8, ECDSA P-256), for a test that issues PCK certificates
    /// its own way.
    pub fn pck_ca_pkcs8(&self, ca: PckCa) -> &[u8] {
        &self.pck_ca(ca).pkcs8
    }

    /// A PCK certificate for `public_key` (an uncompressed P-256 point), signed by the PCK CA,
    /// with `serial` (so a test can revoke it) and `extensions` (the SGX extension of
    /// OID 1.2.840.113741.1.13.1 a verifier reads FMSPC and TCB from).
    pub fn pck_certificate(
        &self,
        ca: PckCa,
        public_key: &[u8],
        serial_number: u64,
        mut extensions: Vec<Extension>,
    ) -> Result<Vec<u8>, SimulationError> {
        let mut all = leaf_extensions()?;
        all.append(&mut extensions);
        self.certify(
            self.pck_ca(ca),
            intel_name("Intel SGX PCK Certificate")?,
            public_key,
            serial_number,
            all,
        )
    }

    /// `{"<field>":<inner>,"signature":"<hex r||s>"}`, signed by the TCB signing key over the
    /// exact bytes of `inner`.
    fn sign_json(&self, field: &str, inner: &str) -> Result<String, SimulationError> {
        let key = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.tcb_signing.pkcs8,
        )
        .map_err(|e| SimulationError::Key(e.to_string()))?;
        let sig = key
            .sign(&self.rng, inner.as_bytes())
            .map_err(|e| SimulationError::Sign(e.to_string()))?;
        Ok(format!(
            "{{\"{field}\":{inner},\"signature\":\"{}\"}}",
            hex::encode(sig.as_ref())
        ))
    }

    /// PCS's TCB info body for the `tcbInfo` JSON `inner` (written by the test, or by
    /// [`SimulatedIntel::tcb_info_json`]).
    pub fn sign_tcb_info(&self, inner: &str) -> Result<String, SimulationError> {
        self.sign_json("tcbInfo", inner)
    }

    /// PCS's TCB info body for [`SimulatedIntel::tcb_info_json`], signed.
    pub fn signed_tcb_info(
        &self,
        fmspc: &str,
        issued: SystemTime,
        next_update: SystemTime,
    ) -> Result<String, SimulationError> {
        self.sign_tcb_info(&self.tcb_info_json(fmspc, issued, next_update)?)
    }

    /// PCS's QE identity body for the `enclaveIdentity` JSON `inner`.
    pub fn sign_qe_identity(&self, inner: &str) -> Result<String, SimulationError> {
        self.sign_json("enclaveIdentity", inner)
    }

    /// A TDX TCB info (version 3) for `fmspc` valid from `issued` to `next_update`, with two
    /// platform TCB levels, as Intel lists a platform's history: UpToDate ([`SGX_TCB_SVNS`],
    /// [`PCE_SVN`], [`TDX_TCB_SVNS`]) and below it OutOfDate ([`OUT_OF_DATE_SGX_TCB_SVNS`],
    /// [`OUT_OF_DATE_PCE_SVN`], [`OUT_OF_DATE_TDX_TCB_SVNS`], advisory
    /// [`OUT_OF_DATE_ADVISORY`]), and one TDX module identity (`TDX_01`, ISV SVN 2), UpToDate.
    pub fn tcb_info_json(
        &self,
        fmspc: &str,
        issued: SystemTime,
        next_update: SystemTime,
    ) -> Result<String, SimulationError> {
        let svns = |svns: &[u8; 16]| {
            svns.iter()
                .map(|svn| serde_json::json!({ "svn": svn }))
                .collect::<Vec<_>>()
        };
        let zeros = "00".repeat(48);
        let tcb_date = intel_date(issued)?;
        let old_date = intel_date(
            issued
                .checked_sub(Duration::from_secs(365 * 86_400))
                .unwrap_or(SystemTime::UNIX_EPOCH),
        )?;
        Ok(serde_json::json!({
            "id": "TDX",
            "version": 3,
            "issueDate": intel_date(issued)?,
            "nextUpdate": intel_date(next_update)?,
            "fmspc": fmspc,
            "pceId": "0000",
            "tcbType": 0,
            "tcbEvaluationDataNumber": 17,
            "tdxModule": {
                "mrsigner": zeros,
                "attributes": "0000000000000000",
                "attributesMask": "FFFFFFFFFFFFFFFF",
            },
            "tdxModuleIdentities": [{
                "id": "TDX_01",
                "mrsigner": zeros,
                "attributes": "0000000000000000",
                "attributesMask": "FFFFFFFFFFFFFFFF",
                "tcbLevels": [{
                    "tcb": { "isvsvn": 2 },
                    "tcbDate": tcb_date,
                    "tcbStatus": "UpToDate",
                }],
            }],
            "tcbLevels": [{
                "tcb": {
                    "sgxtcbcomponents": svns(&SGX_TCB_SVNS),
                    "pcesvn": PCE_SVN,
                    "tdxtcbcomponents": svns(&TDX_TCB_SVNS),
                },
                "tcbDate": tcb_date,
                "tcbStatus": "UpToDate",
            }, {
                "tcb": {
                    "sgxtcbcomponents": svns(&OUT_OF_DATE_SGX_TCB_SVNS),
                    "pcesvn": OUT_OF_DATE_PCE_SVN,
                    "tdxtcbcomponents": svns(&OUT_OF_DATE_TDX_TCB_SVNS),
                },
                "tcbDate": old_date,
                "tcbStatus": "OutOfDate",
                "advisoryIDs": [OUT_OF_DATE_ADVISORY],
            }],
        })
        .to_string())
    }

    /// The TD QE identity (version 2) valid from `issued` to `next_update`: Intel's QE MRSIGNER,
    /// ISV product 2, one level (ISV SVN [`QE_ISVSVN`]) UpToDate.
    pub fn qe_identity_json(
        &self,
        issued: SystemTime,
        next_update: SystemTime,
    ) -> Result<String, SimulationError> {
        Ok(serde_json::json!({
            "id": "TD_QE",
            "version": 2,
            "issueDate": intel_date(issued)?,
            "nextUpdate": intel_date(next_update)?,
            "tcbEvaluationDataNumber": 17,
            "miscselect": "00000000",
            "miscselectMask": "FFFFFFFF",
            "attributes": "11000000000000000000000000000000",
            "attributesMask": "FBFFFFFFFFFFFFFF0000000000000000",
            "mrsigner": QE_MRSIGNER,
            "isvprodid": 2,
            "tcbLevels": [{
                "tcb": { "isvsvn": QE_ISVSVN },
                "tcbDate": intel_date(issued)?,
                "tcbStatus": "UpToDate",
            }],
        })
        .to_string())
    }

    fn crl(
        &self,
        issuer: &Ca,
        revoked: &[u64],
        this_update: SystemTime,
        next_update: SystemTime,
    ) -> Result<Vec<u8>, SimulationError> {
        let revoked = revoked
            .iter()
            .map(|n| {
                Ok(RevokedCert {
                    serial_number: serial(*n)?,
                    revocation_date: asn1_time(this_update)?,
                    crl_entry_extensions: None,
                })
            })
            .collect::<Result<Vec<_>, SimulationError>>()?;
        let tbs = TbsCertList {
            version: Version::V2,
            signature: ecdsa_sha256(),
            issuer: issuer.name.clone(),
            this_update: asn1_time(this_update)?,
            next_update: Some(asn1_time(next_update)?),
            revoked_certificates: (!revoked.is_empty()).then_some(revoked),
            // RFC 5280 requires both, as Intel's CRLs carry them, and webpki (which dcap-qvl
            // checks CRLs with) refuses a CRL without extensions.
            crl_extensions: Some(vec![
                extension(&CrlNumber(Uint::new(&[1])?), false)?,
                extension(
                    &AuthorityKeyIdentifier {
                        key_identifier: Some(OctetString::new(key_id(
                            issuer.key.public_key().as_ref(),
                        ))?),
                        authority_cert_issuer: None,
                        authority_cert_serial_number: None,
                    },
                    false,
                )?,
            ]),
        };
        let sig = self.sign_der(issuer, &tbs.to_der()?)?;
        Ok(CertificateList {
            tbs_cert_list: tbs,
            signature_algorithm: ecdsa_sha256(),
            signature: BitString::from_bytes(&sig)?,
        }
        .to_der()?)
    }

    /// A PCK CA's CRL (DER), revoking the PCK certificates with the given serials.
    pub fn pck_crl(
        &self,
        ca: PckCa,
        revoked: &[u64],
        this_update: SystemTime,
        next_update: SystemTime,
    ) -> Result<Vec<u8>, SimulationError> {
        self.crl(self.pck_ca(ca), revoked, this_update, next_update)
    }

    /// The root's CRL (DER), revoking the certificates with the given serials (the TCB signing
    /// certificate is serial 2, the Platform CA 3, the Processor CA 4).
    pub fn root_crl(
        &self,
        revoked: &[u64],
        this_update: SystemTime,
        next_update: SystemTime,
    ) -> Result<Vec<u8>, SimulationError> {
        self.crl(&self.root, revoked, this_update, next_update)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_cert::der::Decode as _;

    #[test]
    fn another_process_stands_for_the_same_simulated_intel_from_its_keys() {
        let intel = SimulatedIntel::new().unwrap();
        let again = SimulatedIntel::from_keys_pem(&intel.keys_pem()).unwrap();
        assert_eq!(again.root_pem(), intel.root_pem());
        assert_eq!(again.tcb_issuer_chain_pem(), intel.tcb_issuer_chain_pem());
        assert_eq!(
            again.pck_issuer_chain_pem(PckCa::Platform),
            intel.pck_issuer_chain_pem(PckCa::Platform)
        );
        // A PCK certificate the copy issues is signed by the original Platform CA's key.
        let point = intel.platform.key.public_key().as_ref().to_vec();
        let pck = again
            .pck_certificate(PckCa::Platform, &point, 0x77, Vec::new())
            .unwrap();
        let cert = Certificate::from_der(&pck).unwrap();
        let ca = Certificate::from_der(intel.pck_ca_der(PckCa::Platform)).unwrap();
        assert_eq!(cert.tbs_certificate.issuer, ca.tbs_certificate.subject);
        signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_ASN1,
            ca.tbs_certificate
                .subject_public_key_info
                .subject_public_key
                .raw_bytes(),
        )
        .verify(
            &cert.tbs_certificate.to_der().unwrap(),
            cert.signature.raw_bytes(),
        )
        .unwrap();
    }

    #[test]
    fn a_key_that_is_not_its_certificates_is_refused() {
        let intel = SimulatedIntel::new().unwrap();
        let other = SimulatedIntel::new().unwrap();
        // The root's certificate with another simulation's root key.
        let mixed = certificate_pem(intel.root_der()) + &pem("PRIVATE KEY", &other.root.pkcs8);
        let error = SimulatedIntel::from_keys_pem(&mixed).unwrap_err();
        assert!(error.to_string().contains("not the one"), "{error}");
        // Three CAs are not a simulated Intel.
        let pem = intel.keys_pem();
        let three: Vec<&str> = pem.split_inclusive("-----END PRIVATE KEY-----\n").collect();
        let error = SimulatedIntel::from_keys_pem(&three[..3].concat()).unwrap_err();
        assert!(error.to_string().contains("3 CAs instead of 4"), "{error}");
    }
}
