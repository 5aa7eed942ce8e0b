//! Simulated AMD SEV-SNP hardware: an ARK, ASK and ASVK of AMD's shape, VCEKs and VLEKs they
//! certify, and attestation reports those sign.
//!
//! No SNP machine runs here. The certificates carry what AMD's do (the same names, RSA-PSS with
//! the very algorithm identifier AMD's Milan ARK carries, AMD's TCB, hwID, product and CSP
//! extensions, and on the CAs the X.509 extensions AMD's real ARK, ASK and ASVK carry: the ARK
//! KeyUsage keyCertSign and cRLSign, a SubjectKeyIdentifier, BasicConstraints CA:TRUE and a CRL
//! distribution point naming `/vcek/v1/{product}/crl`; the ASK and ASVK a SubjectKeyIdentifier,
//! the ARK's key as AuthorityKeyIdentifier, BasicConstraints CA:TRUE with pathlen 0, KeyUsage
//! keyCertSign, and a CRL distribution point naming `/vcek/v1/{product}/crl` and
//! `/vlek/v1/{product}/crl` respectively; VCEKs and VLEKs, as AMD's, none of them), so the
//! verifier checks them exactly as it checks real ones. RSA keys are 3072 bits where AMD's are
//! 4096 (shipped test keys, faster than generating). They are trusted
//! only where a test's attestation config sets `amdRootKey` to [`SimulatedAmd::ark_pem`].

use std::str::FromStr;

use attestation::Variant;
use std::sync::Arc;

use attestation::snp::{InstanceRef, Product, SigningKey, Tcb, Trust};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair};
use x509_cert::crl::{CertificateList, RevokedCert, TbsCertList};
use x509_cert::der::asn1::Uint;
use x509_cert::der::asn1::{BitString, Ia5String, OctetString};
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Any, Decode, Encode};
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

const ARK_KEY: &[u8] = include_bytes!("../keys/rsa3072-ark-test.pk8");
const ASK_KEY: &[u8] = include_bytes!("../keys/rsa3072-ask-test.pk8");
const ASVK_KEY: &[u8] = include_bytes!("../keys/rsa3072-asvk-test.pk8");

pub(crate) const RSA_ENCRYPTION: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const SECP384R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const AMD_ARC: &str = "1.3.6.1.4.1.3704.1";
/// The host AMD's CRL distribution points name.
const KDS: &str = "https://kdsintf.amd.com";

/// Why simulated hardware could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error("simulated vendor key: {0}")]
    Key(String),
    #[error("simulated vendor certificate: {0}")]
    Der(#[from] x509_cert::der::Error),
    #[error("signing: {0}")]
    Sign(String),
}

struct Ca {
    key: RsaKeyPair,
    name: Name,
    cert_der: Vec<u8>,
}

/// A simulated AMD key distribution service's roots for one product.
pub struct SimulatedAmd {
    product: Product,
    ark: Ca,
    ask: Ca,
    asvk: Ca,
    pss: AlgorithmIdentifierOwned,
    rng: SystemRandom,
}

impl std::fmt::Debug for SimulatedAmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedAmd")
            .field("product", &self.product)
            .finish_non_exhaustive()
    }
}

fn amd_name(cn: &str) -> Result<Name, SimulationError> {
    Name::from_str(&format!(
        "CN={cn},O=Advanced Micro Devices,ST=CA,L=Santa Clara,C=US,OU=Engineering"
    ))
    .map_err(SimulationError::Der)
}

pub(crate) fn rsa_key(pkcs8: &[u8]) -> Result<RsaKeyPair, SimulationError> {
    RsaKeyPair::from_pkcs8(pkcs8).map_err(|e| SimulationError::Key(e.to_string()))
}

pub(crate) fn rsa_spki(key: &RsaKeyPair) -> Result<SubjectPublicKeyInfoOwned, SimulationError> {
    Ok(SubjectPublicKeyInfoOwned {
        algorithm: AlgorithmIdentifierOwned {
            oid: RSA_ENCRYPTION,
            parameters: Some(Any::null()),
        },
        subject_public_key: BitString::from_bytes(key.public_key().as_ref())?,
    })
}

fn validity() -> Result<Validity, SimulationError> {
    // 2020-01-01 to 2049-12-31, as UTCTime allows.
    let at = |secs: u64| {
        Time::try_from(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .map_err(SimulationError::Der)
    };
    Ok(Validity {
        not_before: at(1_577_836_800)?,
        not_after: at(2_524_521_600)?,
    })
}

fn extension(suffix: &str, value: Vec<u8>) -> Result<Extension, SimulationError> {
    Ok(Extension {
        extn_id: ObjectIdentifier::new(&format!("{AMD_ARC}.{suffix}"))
            .map_err(|e| SimulationError::Der(e.into()))?,
        critical: false,
        extn_value: OctetString::new(value)?,
    })
}

/// An X.509 extension from its x509-cert type.
pub(crate) fn pkix<T: AssociatedOid + Encode>(
    value: &T,
    critical: bool,
) -> Result<Extension, SimulationError> {
    Ok(Extension {
        extn_id: T::OID,
        critical,
        extn_value: OctetString::new(value.to_der()?)?,
    })
}

/// RFC 5280's key identifier (method 1): SHA-1 of the subjectPublicKey bits.
pub(crate) fn key_id(key: &RsaKeyPair) -> Vec<u8> {
    aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
        key.public_key().as_ref(),
    )
    .as_ref()
    .to_vec()
}

/// A CRL distribution point naming `url`.
fn crl_point(url: &str) -> Result<Extension, SimulationError> {
    pkix(
        &CrlDistributionPoints(vec![DistributionPoint {
            distribution_point: Some(DistributionPointName::FullName(vec![
                GeneralName::UniformResourceIdentifier(Ia5String::new(url)?),
            ])),
            reasons: None,
            crl_issuer: None,
        }]),
        false,
    )
}

/// What an issuing certificate of a simulated AMD lacks, for tests that an X.509 verifier refuses
/// such a chain (RFC 5280 6.1.4 (k) and (n)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssuerFlaw {
    /// The ASK and ASVK say BasicConstraints CA:FALSE.
    NotCa,
    /// The ASK's and ASVK's KeyUsage is digitalSignature, without keyCertSign.
    NoKeyCertSign,
    /// The ARK's KeyUsage has keyCertSign but not cRLSign.
    ArkNoCrlSign,
}

impl SimulatedAmd {
    /// The simulated roots of `product`: an ARK, and the ASK and ASVK it certified.
    pub fn new(product: Product) -> Result<SimulatedAmd, SimulationError> {
        SimulatedAmd::with_keys(product, [ARK_KEY, ASK_KEY, ASVK_KEY], None)
    }

    /// [`SimulatedAmd::new`]'s keys and names, its CA certificates issued with `flaw`.
    pub fn with_flaw(product: Product, flaw: IssuerFlaw) -> Result<SimulatedAmd, SimulationError> {
        SimulatedAmd::with_keys(product, [ARK_KEY, ASK_KEY, ASVK_KEY], Some(flaw))
    }

    /// Roots with AMD's names that [`SimulatedAmd::new`]'s ARK did not make: the same test keys
    /// in other roles (RSA keys are shipped, not generated), so its ARK is another key. A config
    /// that trusts `new`'s ARK must refuse everything this one signs.
    pub fn impostor(product: Product) -> Result<SimulatedAmd, SimulationError> {
        SimulatedAmd::with_keys(product, [ASVK_KEY, ARK_KEY, ASK_KEY], None)
    }

    /// `keys`: the ARK's, the ASK's and the ASVK's PKCS#8 RSA keys.
    fn with_keys(
        product: Product,
        keys: [&[u8]; 3],
        flaw: Option<IssuerFlaw>,
    ) -> Result<SimulatedAmd, SimulationError> {
        let [ark_key, ask_key, asvk_key] = keys;
        // AMD's own Milan ARK, read only for its signature algorithm identifier (RSASSA-PSS
        // with SHA-384, MGF1-SHA-384, a 48-byte salt), so ours is byte for byte AMD's.
        let trust = Trust::builtin();
        let amd_ark = trust
            .ark_for(Product::Milan)
            .ok_or_else(|| SimulationError::Key("no built-in Milan ARK".to_owned()))?;
        let pss = Certificate::from_der(amd_ark.der())?.signature_algorithm;
        let mut amd = SimulatedAmd {
            product,
            ark: Ca {
                key: rsa_key(ark_key)?,
                name: amd_name(&format!("ARK-{product}"))?,
                cert_der: Vec::new(),
            },
            ask: Ca {
                key: rsa_key(ask_key)?,
                name: amd_name(&format!("SEV-{product}"))?,
                cert_der: Vec::new(),
            },
            asvk: Ca {
                key: rsa_key(asvk_key)?,
                name: amd_name(&format!("SEV-VLEK-{product}"))?,
                cert_der: Vec::new(),
            },
            pss,
            rng: SystemRandom::new(),
        };
        // In the order AMD's certificates list them.
        let ark_usage = match flaw {
            Some(IssuerFlaw::ArkNoCrlSign) => KeyUsages::KeyCertSign.into(),
            _ => KeyUsages::KeyCertSign | KeyUsages::CRLSign,
        };
        let ark_ext = vec![
            pkix(&KeyUsage(ark_usage), true)?,
            pkix(
                &SubjectKeyIdentifier(OctetString::new(key_id(&amd.ark.key))?),
                false,
            )?,
            pkix(
                &BasicConstraints {
                    ca: true,
                    path_len_constraint: None,
                },
                true,
            )?,
            crl_point(&format!("{KDS}/vcek/v1/{product}/crl"))?,
        ];
        let intermediate_ext = |key: &RsaKeyPair, kind: &str| -> Result<_, SimulationError> {
            let usage = match flaw {
                Some(IssuerFlaw::NoKeyCertSign) => KeyUsages::DigitalSignature.into(),
                _ => KeyUsages::KeyCertSign.into(),
            };
            Ok(vec![
                pkix(&SubjectKeyIdentifier(OctetString::new(key_id(key))?), false)?,
                pkix(
                    &AuthorityKeyIdentifier {
                        key_identifier: Some(OctetString::new(key_id(&amd.ark.key))?),
                        authority_cert_issuer: None,
                        authority_cert_serial_number: None,
                    },
                    false,
                )?,
                pkix(
                    &BasicConstraints {
                        ca: flaw != Some(IssuerFlaw::NotCa),
                        path_len_constraint: (flaw != Some(IssuerFlaw::NotCa)).then_some(0),
                    },
                    true,
                )?,
                pkix(&KeyUsage(usage), true)?,
                crl_point(&format!("{KDS}/{kind}/v1/{product}/crl"))?,
            ])
        };
        let ask_ext = intermediate_ext(&amd.ask.key, "vcek")?;
        let asvk_ext = intermediate_ext(&amd.asvk.key, "vlek")?;
        amd.ark.cert_der = amd.sign(
            &amd.ark,
            amd.ark.name.clone(),
            rsa_spki(&amd.ark.key)?,
            1,
            ark_ext,
        )?;
        amd.ask.cert_der = amd.sign(
            &amd.ark,
            amd.ask.name.clone(),
            rsa_spki(&amd.ask.key)?,
            2,
            ask_ext,
        )?;
        amd.asvk.cert_der = amd.sign(
            &amd.ark,
            amd.asvk.name.clone(),
            rsa_spki(&amd.asvk.key)?,
            3,
            asvk_ext,
        )?;
        Ok(amd)
    }

    pub fn product(&self) -> Product {
        self.product
    }

    /// The ARK, ASK and ASVK, PEM: what [`SimulatedAmd::from_certificates_pem`] takes to stand
    /// for the same simulated AMD in another process (the certificates' RSA-PSS signatures are
    /// randomized, so a second [`SimulatedAmd::new`] makes different ones, which a config
    /// pinning the first ARK does not trust).
    pub fn certificates_pem(&self) -> String {
        [&self.ark, &self.ask, &self.asvk]
            .iter()
            .map(|ca| pem("CERTIFICATE", &ca.cert_der))
            .collect()
    }

    /// The simulated AMD whose ARK, ASK and ASVK are the certificates in `pem` (as
    /// [`SimulatedAmd::certificates_pem`] wrote them): each must be the one the simulation's
    /// own key certifies for `product`, or it is refused.
    pub fn from_certificates_pem(
        product: Product,
        pem: &str,
    ) -> Result<SimulatedAmd, SimulationError> {
        let mut amd = SimulatedAmd::new(product)?;
        let certs = attestation::snp::certs_from_pem(pem.as_bytes())
            .map_err(|e| SimulationError::Key(e.to_string()))?;
        for ca in [&mut amd.ark, &mut amd.ask, &mut amd.asvk] {
            let subject = ca.name.to_der()?;
            let spki = rsa_spki(&ca.key)?.to_der()?;
            let found = certs.iter().find_map(|cert| {
                let parsed = Certificate::from_der(cert.der()).ok()?;
                let tbs = &parsed.tbs_certificate;
                (tbs.subject.to_der().ok()? == subject
                    && tbs.subject_public_key_info.to_der().ok()? == spki)
                    .then(|| cert.der().to_vec())
            });
            ca.cert_der = found.ok_or_else(|| {
                SimulationError::Key(format!(
                    "no certificate in the PEM is the simulated {} with its key",
                    ca.name
                ))
            })?;
        }
        Ok(amd)
    }

    /// A certificate for `subject` signed by `issuer` with RSA-PSS as AMD signs.
    fn sign(
        &self,
        issuer: &Ca,
        subject: Name,
        spki: SubjectPublicKeyInfoOwned,
        serial: u8,
        extensions: Vec<Extension>,
    ) -> Result<Vec<u8>, SimulationError> {
        let tbs = TbsCertificate {
            version: Version::V3,
            serial_number: SerialNumber::new(&[serial])?,
            signature: self.pss.clone(),
            issuer: issuer.name.clone(),
            validity: validity()?,
            subject,
            subject_public_key_info: spki,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: (!extensions.is_empty()).then_some(extensions),
        };
        let sig = self.pss_sign(issuer, &tbs.to_der()?)?;
        Ok(Certificate {
            tbs_certificate: tbs,
            signature_algorithm: self.pss.clone(),
            signature: BitString::from_bytes(&sig)?,
        }
        .to_der()?)
    }

    /// The simulated ARK, PEM: what a test's `amdRootKey` sets.
    pub fn ark_pem(&self) -> String {
        pem("CERTIFICATE", &self.ark.cert_der)
    }

    pub fn ark_der(&self) -> &[u8] {
        &self.ark.cert_der
    }

    pub fn ask_der(&self) -> &[u8] {
        &self.ask.cert_der
    }

    pub fn asvk_der(&self) -> &[u8] {
        &self.asvk.cert_der
    }

    /// KDS's `cert_chain` for VCEKs: the ASK, then the ARK.
    pub fn vcek_chain_pem(&self) -> String {
        pem("CERTIFICATE", &self.ask.cert_der) + &pem("CERTIFICATE", &self.ark.cert_der)
    }

    /// KDS's `cert_chain` for VLEKs: the ASVK, then the ARK.
    pub fn vlek_chain_pem(&self) -> String {
        pem("CERTIFICATE", &self.asvk.cert_der) + &pem("CERTIFICATE", &self.ark.cert_der)
    }

    /// A chip: its VCEK for `tcb`, certified by the ASK. The hwID is the first 64 bytes of
    /// `chip_id` (8 on Turin, the rest zero).
    ///
    /// Real VCEKs carry serial 0; simulated ones carry `serial` so that a test can revoke one.
    pub fn chip(
        &self,
        chip_id: [u8; 64],
        tcb: Tcb,
        serial: u8,
    ) -> Result<SimulatedSigner, SimulationError> {
        let hw_id = match self.product {
            Product::Turin => chip_id[..8].to_vec(),
            Product::Milan | Product::Genoa => chip_id.to_vec(),
        };
        let mut chip_id = chip_id;
        if self.product == Product::Turin {
            chip_id[8..].fill(0);
        }
        let hw_id_ext = OctetString::new(hw_id)?.to_der()?;
        self.signer(
            SigningKey::Vcek,
            chip_id,
            tcb,
            serial,
            vec![extension("4", hw_id_ext)?],
        )
    }

    /// A cloud provider's VLEK for `tcb`, certified by the ASVK.
    pub fn vlek(&self, csp: &str, tcb: Tcb) -> Result<SimulatedSigner, SimulationError> {
        self.vlek_with_serial(csp, tcb, 0)
    }

    /// [`SimulatedAmd::vlek`] with a serial of its own, so that a test can revoke it.
    pub fn vlek_with_serial(
        &self,
        csp: &str,
        tcb: Tcb,
        serial: u8,
    ) -> Result<SimulatedSigner, SimulationError> {
        let csp = Ia5String::new(csp)?.to_der()?;
        self.signer(
            SigningKey::Vlek,
            [0; 64],
            tcb,
            serial,
            vec![extension("5", csp)?],
        )
    }

    /// A CRL of the product, signed by the ARK, valid from `this_update` to `next_update`
    /// (seconds since the epoch), revoking the certificates with the given serials (the simulated
    /// ASK is serial 2, the ASVK 3). AMD publishes two, both signed so: KDS
    /// `/vcek/v1/{product}/crl` (the ASK's distribution point) and `/vlek/v1/{product}/crl` (the
    /// ASVK's); a test makes each with what it revokes.
    pub fn crl(
        &self,
        revoked: &[u8],
        this_update: u64,
        next_update: u64,
    ) -> Result<Vec<u8>, SimulationError> {
        let time = |secs: u64| {
            Time::try_from(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .map_err(SimulationError::Der)
        };
        let revoked = revoked
            .iter()
            .map(|serial| {
                Ok(RevokedCert {
                    serial_number: SerialNumber::new(&[*serial])?,
                    revocation_date: time(this_update)?,
                    crl_entry_extensions: None,
                })
            })
            .collect::<Result<Vec<_>, SimulationError>>()?;
        let tbs = TbsCertList {
            version: Version::V2,
            signature: self.pss.clone(),
            issuer: self.ark.name.clone(),
            this_update: time(this_update)?,
            next_update: Some(time(next_update)?),
            revoked_certificates: (!revoked.is_empty()).then_some(revoked),
            // What RFC 5280 requires of a CRL issuer.
            crl_extensions: Some(vec![
                pkix(&CrlNumber(Uint::new(&[1])?), false)?,
                pkix(
                    &AuthorityKeyIdentifier {
                        key_identifier: Some(OctetString::new(key_id(&self.ark.key))?),
                        authority_cert_issuer: None,
                        authority_cert_serial_number: None,
                    },
                    false,
                )?,
            ]),
        };
        let sig = self.pss_sign(&self.ark, &tbs.to_der()?)?;
        Ok(CertificateList {
            tbs_cert_list: tbs,
            signature_algorithm: self.pss.clone(),
            signature: BitString::from_bytes(&sig)?,
        }
        .to_der()?)
    }

    fn pss_sign(&self, issuer: &Ca, message: &[u8]) -> Result<Vec<u8>, SimulationError> {
        let mut sig = vec![0u8; issuer.key.public_modulus_len()];
        issuer
            .key
            .sign(&signature::RSA_PSS_SHA384, &self.rng, message, &mut sig)
            .map_err(|e| SimulationError::Sign(e.to_string()))?;
        Ok(sig)
    }

    fn signer(
        &self,
        kind: SigningKey,
        chip_id: [u8; 64],
        tcb: Tcb,
        serial: u8,
        mut extensions: Vec<Extension>,
    ) -> Result<SimulatedSigner, SimulationError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P384_SHA384_FIXED_SIGNING, &rng)
            .map_err(|e| SimulationError::Key(e.to_string()))?;
        let key =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P384_SHA384_FIXED_SIGNING, pkcs8.as_ref())
                .map_err(|e| SimulationError::Key(e.to_string()))?;
        let spki = SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: EC_PUBLIC_KEY,
                parameters: Some(Any::from(&SECP384R1)),
            },
            subject_public_key: BitString::from_bytes(key.public_key().as_ref())?,
        };
        let spl = |v: u8| -> Result<Vec<u8>, SimulationError> { Ok(u32::from(v).to_der()?) };
        extensions.push(extension(
            "2",
            Ia5String::new(&format!("{}-B0", self.product))?.to_der()?,
        )?);
        extensions.push(extension("3.1", spl(tcb.bootloader)?)?);
        extensions.push(extension("3.2", spl(tcb.tee)?)?);
        extensions.push(extension("3.3", spl(tcb.snp)?)?);
        extensions.push(extension("3.8", spl(tcb.microcode)?)?);
        if self.product == Product::Turin {
            extensions.push(extension("3.9", spl(tcb.fmc.unwrap_or(0))?)?);
        }
        let (issuer, cn) = match kind {
            SigningKey::Vcek => (&self.ask, "SEV-VCEK"),
            SigningKey::Vlek => (&self.asvk, "SEV-VLEK"),
        };
        let cert_der = self.sign(issuer, amd_name(cn)?, spki, serial, extensions)?;
        Ok(SimulatedSigner {
            key,
            cert_der,
            kind,
            chip_id,
            tcb,
            product: self.product,
        })
    }
}

/// A VCEK or VLEK with its private key: signs reports as the chip's firmware would.
pub struct SimulatedSigner {
    key: EcdsaKeyPair,
    cert_der: Vec<u8>,
    kind: SigningKey,
    chip_id: [u8; 64],
    tcb: Tcb,
    product: Product,
}

impl std::fmt::Debug for SimulatedSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedSigner")
            .field("kind", &self.kind)
            .field("tcb", &self.tcb)
            .finish_non_exhaustive()
    }
}

/// The guest-chosen and firmware-chosen fields of a simulated report; the rest (signing key,
/// REPORTED_TCB, CHIP_ID, CPUID) follow from the signer.
#[derive(Clone, Debug)]
pub struct ReportFields {
    pub version: u32,
    pub policy: u64,
    pub vmpl: u32,
    pub report_data: [u8; 64],
    pub measurement: [u8; 48],
    pub id_key_digest: [u8; 48],
    /// `None`: the signer's TCB.
    pub current_tcb: Option<Tcb>,
    pub committed_tcb: Option<Tcb>,
    pub launch_tcb: Option<Tcb>,
}

impl Default for ReportFields {
    /// A version 3 report at VMPL 0 with Constellation's usual policy (SMT allowed, bit 17).
    fn default() -> Self {
        ReportFields {
            version: 3,
            policy: 0x30000,
            vmpl: 0,
            report_data: [0; 64],
            measurement: [0; 48],
            id_key_digest: [0; 48],
            current_tcb: None,
            committed_tcb: None,
            launch_tcb: None,
        }
    }
}

impl SimulatedSigner {
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    pub fn cert_pem(&self) -> String {
        pem("CERTIFICATE", &self.cert_der)
    }

    pub fn tcb(&self) -> Tcb {
        self.tcb
    }

    /// A VCEK's hwID (the chip's CHIP_ID, 8 bytes of it on Turin), as AMD's KDS names the
    /// chip; `None` for a VLEK.
    pub fn hw_id(&self) -> Option<Vec<u8>> {
        match (self.kind, self.product) {
            (SigningKey::Vlek, _) => None,
            (SigningKey::Vcek, Product::Turin) => Some(self.chip_id[..8].to_vec()),
            (SigningKey::Vcek, _) => Some(self.chip_id.to_vec()),
        }
    }

    /// A signed 1184-byte report.
    pub fn report(&self, fields: &ReportFields) -> Result<Vec<u8>, SimulationError> {
        let mut r = vec![0u8; 0x4A0];
        let put = |r: &mut Vec<u8>, offset: usize, bytes: &[u8]| {
            r[offset..offset + bytes.len()].copy_from_slice(bytes);
        };
        let tcb = |t: Option<Tcb>| t.unwrap_or(self.tcb).encode(self.product).to_le_bytes();
        put(&mut r, 0x00, &fields.version.to_le_bytes());
        put(&mut r, 0x08, &fields.policy.to_le_bytes());
        put(&mut r, 0x30, &fields.vmpl.to_le_bytes());
        put(&mut r, 0x34, &1u32.to_le_bytes());
        put(&mut r, 0x38, &tcb(fields.current_tcb));
        let signing_key: u32 = match self.kind {
            SigningKey::Vcek => 0,
            SigningKey::Vlek => 1,
        };
        put(&mut r, 0x48, &(signing_key << 2).to_le_bytes());
        put(&mut r, 0x50, &fields.report_data);
        put(&mut r, 0x90, &fields.measurement);
        put(&mut r, 0xE0, &fields.id_key_digest);
        put(&mut r, 0x180, &tcb(Some(self.tcb)));
        if fields.version >= 3 {
            let (family, model) = match self.product {
                Product::Milan => (0x19, 0x01),
                Product::Genoa => (0x19, 0x11),
                Product::Turin => (0x1A, 0x02),
            };
            put(&mut r, 0x188, &[family, model, 0x01]);
        }
        put(&mut r, 0x1A0, &self.chip_id);
        put(&mut r, 0x1E0, &tcb(fields.committed_tcb));
        put(&mut r, 0x1F0, &tcb(fields.launch_tcb));
        let sig = self
            .key
            .sign(&SystemRandom::new(), &r[..0x2A0])
            .map_err(|e| SimulationError::Sign(e.to_string()))?;
        // The provider gives big-endian r ‖ s; the report holds each little-endian in 72 bytes.
        for (i, component) in sig.as_ref().chunks(48).enumerate() {
            let start = 0x2A0 + i * 72;
            for (j, byte) in component.iter().rev().enumerate() {
                r[start + j] = *byte;
            }
        }
        Ok(r)
    }
}

pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// SNP `InstanceInfo` as Constellation's Go issuers write it with `encoding/json`.
pub fn instance_info_json(
    report: &[u8],
    signer_pem: Option<&str>,
    chain_pem: Option<&str>,
    azure_runtime_data: Option<&[u8]>,
) -> Vec<u8> {
    instance_info_value(report, signer_pem, chain_pem, azure_runtime_data, None)
        .to_string()
        .into_bytes()
}

fn instance_info_value(
    report: &[u8],
    signer_pem: Option<&str>,
    chain_pem: Option<&str>,
    azure_runtime_data: Option<&[u8]>,
    gcp: Option<&InstanceRef>,
) -> serde_json::Value {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let azure = azure_runtime_data
        .map(|runtime| serde_json::json!({ "RuntimeData": b64(runtime), "MAAToken": "" }));
    // go-tpm-tools' GCEInstanceInfo with the three fields Constellation's issuer sets (the
    // numbers are zero and, omitempty, left out).
    let gcp = gcp.map(|i| {
        serde_json::json!({
            "zone": i.zone, "project_id": i.project, "instance_name": i.instance,
        })
    });
    serde_json::json!({
        "ReportSigner": signer_pem.map(|p| b64(p.as_bytes())),
        "CertChain": chain_pem.map(|p| b64(p.as_bytes())),
        "AttestationReport": b64(report),
        "Azure": azure,
        "GCP": gcp,
    })
}

/// Azure's HCL runtime data naming an RSA attestation key (`n`, `e` big-endian) as `keys[0]`.
pub fn azure_runtime_data(n: &[u8], e: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let b64url = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    serde_json::json!({
        "keys": [
            { "kid": "HCLAkPub", "key_ops": ["sign"], "kty": "RSA", "e": b64url(e), "n": b64url(n) },
        ],
        "vm-configuration": { "secure-boot": true, "tpm-enabled": true },
        "user-data": "",
    })
    .to_string()
    .into_bytes()
}

/// Azure's HCL runtime data naming `ak` (RSA, as Azure's vTPM keys are) as `keys[0]`: what an
/// Azure CVM's hardware report binds, on SEV-SNP and TDX alike.
pub fn azure_runtime_data_for(ak: &crate::SoftIssuer) -> Result<Vec<u8>, SimulationError> {
    azure_runtime_data_for_public(ak.ak_public())
}

/// Azure's HCL runtime data naming the RSA key whose `TPMT_PUBLIC` is `ak_public` (a real
/// TPM's key, as the paravisor persists it) as `keys[0]`.
pub fn azure_runtime_data_for_public(ak_public: &[u8]) -> Result<Vec<u8>, SimulationError> {
    let public = attestation::tpm::Public::parse(ak_public)
        .map_err(|e| SimulationError::Key(e.to_string()))?;
    let attestation::tpm::PublicKey::Rsa {
        exponent, modulus, ..
    } = &public.key
    else {
        return Err(SimulationError::Key(
            "Azure's runtime data names an RSA attestation key".to_owned(),
        ));
    };
    let e = if *exponent == 0 { 65537u32 } else { *exponent }.to_be_bytes();
    let first = e.iter().position(|&b| b != 0).unwrap_or(e.len());
    Ok(azure_runtime_data(modulus, &e[first..]))
}

/// What a gcp-sev-snp node puts into REPORT_DATA, given the connection's extraData.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcpReportData {
    /// extraData ‖ 32 zero bytes, as a GCE node does.
    Bound,
    /// extraData followed by a nonzero tail.
    NonzeroTail,
    /// These 64 bytes, whatever the connection (a report made for another one).
    Fixed([u8; 64]),
}

/// A gcp-sev-snp node's hardware: its report is made per connection, since REPORT_DATA holds
/// the connection's extraData.
struct GcpEvidence {
    vcek: Arc<SimulatedSigner>,
    chain_pem: String,
    fields: ReportFields,
    instance: Option<InstanceRef>,
    report_data: GcpReportData,
}

/// A node of an SNP variant: a software AK whose vTPM documents carry a report from simulated
/// hardware that vouches for it.
pub struct SnpDocumentIssuer {
    variant: Variant,
    ak: crate::SoftIssuer,
    /// The InstanceInfo of every document (aws, azure, [`SnpDocumentIssuer::from_parts`]);
    /// empty for gcp nodes.
    instance_info: Vec<u8>,
    gcp: Option<GcpEvidence>,
}

impl std::fmt::Debug for SnpDocumentIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnpDocumentIssuer")
            .field("variant", &self.variant)
            .finish_non_exhaustive()
    }
}

impl SnpDocumentIssuer {
    /// aws-sev-snp: REPORT_DATA = SHA-512 of the AK's SubjectPublicKeyInfo, signed by `vlek`,
    /// which the document carries with `chain_pem`.
    pub fn aws(
        ak: crate::SoftIssuer,
        vlek: &SimulatedSigner,
        chain_pem: &str,
        mut fields: ReportFields,
    ) -> Result<Self, SimulationError> {
        let public = attestation::tpm::Public::parse(ak.ak_public())
            .map_err(|e| SimulationError::Key(e.to_string()))?;
        let spki = public
            .spki_der()
            .map_err(|e| SimulationError::Key(e.to_string()))?;
        fields
            .report_data
            .copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, &spki).as_ref());
        let report = vlek.report(&fields)?;
        Ok(SnpDocumentIssuer {
            variant: Variant::AwsSevSnp,
            ak,
            instance_info: instance_info_json(
                &report,
                Some(&vlek.cert_pem()),
                Some(chain_pem),
                None,
            ),
            gcp: None,
        })
    }

    /// azure-sev-snp: REPORT_DATA[0:32] = SHA-256 of runtime data naming the (RSA) AK, signed by
    /// `vcek`, which the document carries with `chain_pem`.
    pub fn azure(
        ak: crate::SoftIssuer,
        vcek: &SimulatedSigner,
        chain_pem: &str,
        mut fields: ReportFields,
    ) -> Result<Self, SimulationError> {
        let runtime = azure_runtime_data_for(&ak)?;
        fields.report_data[..32].copy_from_slice(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &runtime).as_ref(),
        );
        let report = vcek.report(&fields)?;
        Ok(SnpDocumentIssuer {
            variant: Variant::AzureSevSnp,
            ak,
            instance_info: instance_info_json(
                &report,
                Some(&vcek.cert_pem()),
                Some(chain_pem),
                Some(&runtime),
            ),
            gcp: None,
        })
    }

    /// gcp-sev-snp: each document's report, signed by `vcek` (carried with `chain_pem`), holds
    /// the connection's extraData as `report_data` says, and InstanceInfo's `GCP` names
    /// `instance` (none: the field is `null`). The GCE API (its stand-in) must be told this
    /// node's AK for `instance`: [`SnpDocumentIssuer::ak_spki_der`].
    pub fn gcp(
        ak: crate::SoftIssuer,
        vcek: Arc<SimulatedSigner>,
        chain_pem: &str,
        fields: ReportFields,
        instance: Option<InstanceRef>,
        report_data: GcpReportData,
    ) -> Self {
        SnpDocumentIssuer {
            variant: Variant::GcpSevSnp,
            ak,
            instance_info: Vec::new(),
            gcp: Some(GcpEvidence {
                vcek,
                chain_pem: chain_pem.to_owned(),
                fields,
                instance,
                report_data,
            }),
        }
    }

    /// The DER SubjectPublicKeyInfo of this node's attestation key: what the GCE API returns
    /// (as PEM) in `signingKey.ekPub` for a gcp node.
    pub fn ak_spki_der(&self) -> Result<Vec<u8>, SimulationError> {
        attestation::tpm::Public::parse(self.ak.ak_public())
            .map_err(|e| SimulationError::Key(e.to_string()))?
            .spki_der()
            .map_err(|e| SimulationError::Key(e.to_string()))
    }

    /// The InstanceInfo this node sends on a connection with `user_data` and `nonce`.
    pub fn instance_info_for(
        &self,
        user_data: &[u8],
        nonce: &[u8],
    ) -> Result<Vec<u8>, SimulationError> {
        let Some(gcp) = &self.gcp else {
            return Ok(self.instance_info.clone());
        };
        let extra = attestation::vtpm::make_extra_data(user_data, nonce);
        let mut fields = gcp.fields.clone();
        fields.report_data = match gcp.report_data {
            GcpReportData::Bound => {
                let mut data = [0; 64];
                data[..32].copy_from_slice(&extra);
                data
            }
            GcpReportData::NonzeroTail => {
                let mut data = [1; 64];
                data[..32].copy_from_slice(&extra);
                data
            }
            GcpReportData::Fixed(data) => data,
        };
        let report = gcp.vcek.report(&fields)?;
        Ok(instance_info_value(
            &report,
            Some(&gcp.vcek.cert_pem()),
            Some(&gcp.chain_pem),
            None,
            gcp.instance.as_ref(),
        )
        .to_string()
        .into_bytes())
    }

    /// A node whose InstanceInfo is exactly `instance_info` (for tampering tests).
    pub fn from_parts(variant: Variant, ak: crate::SoftIssuer, instance_info: Vec<u8>) -> Self {
        SnpDocumentIssuer {
            variant,
            ak,
            instance_info,
            gcp: None,
        }
    }

    /// The InstanceInfo every document of this node carries; empty for a gcp node, whose
    /// InstanceInfo is made per connection ([`SnpDocumentIssuer::instance_info_for`]).
    pub fn instance_info(&self) -> &[u8] {
        &self.instance_info
    }

    /// This node's InstanceInfo without its signer and chain (`ReportSigner` and `CertChain`
    /// null), as a node sends it that leaves them to the verifier's collateral source.
    pub fn instance_info_without_certificates(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut info: serde_json::Value = serde_json::from_slice(&self.instance_info)?;
        info["ReportSigner"] = serde_json::Value::Null;
        info["CertChain"] = serde_json::Value::Null;
        serde_json::to_vec(&info)
    }
}

impl attestation::Issuer for SnpDocumentIssuer {
    fn variant(&self) -> Variant {
        self.variant
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, attestation::IssueError> {
        let instance_info = self
            .instance_info_for(user_data, nonce)
            .map_err(|e| attestation::IssueError::from_error(self.variant, e))?;
        self.ak
            .issue_document_with_instance_info(user_data, nonce, Some(&instance_info))
            .map_err(|e| attestation::IssueError::from_error(self.variant, e))
    }
}
