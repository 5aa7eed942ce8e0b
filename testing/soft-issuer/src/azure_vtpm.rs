//! Azure's vTPM certificate authority, simulated: the root and the CA that certify a Trusted
//! Launch VM's attestation key, and the AK certificates Azure writes to the vTPM's NV index
//! 0x01C101D0.
//!
//! The certificates carry what Azure's do. The root as "Azure Virtual TPM Root Certificate
//! Authority 2023": `C=US, O=Microsoft Corporation`, RSA-4096, sha384WithRSAEncryption, KeyUsage
//! (critical) digitalSignature, keyCertSign, cRLSign, BasicConstraints (critical) CA:TRUE, a
//! SubjectKeyIdentifier and Microsoft's CA version extension (1.3.6.1.4.1.311.21.1, 0). The CA as
//! "Global Virtual TPM CA - 03": RSA-2048 signed with sha384WithRSAEncryption, BasicConstraints
//! (critical) CA:TRUE pathlen 0, KeyUsage (critical) keyCertSign, ExtendedKeyUsage
//! tcg-kp-EKCertificate (2.23.133.8.1) and tcg-kp-AIKCertificate (2.23.133.8.3), key
//! identifiers, a CRL distribution point and the root's URL as authorityInfoAccess caIssuers;
//! valid for two years, as Azure's. The AK certificate for `<vm id>.TrustedVM.Azure.windows.net`,
//! with ExtendedKeyUsage tcg-kp-AIKCertificate and 1.3.6.1.4.1.311.10.3.12 (what observed Azure
//! AK certificates carry), KeyUsage (critical) digitalSignature (the TCG AK profile's), the
//! CA's key identifier and, when given, the CA's URLs as authorityInfoAccess caIssuers (the URL
//! Constellation's node fetches the CA from). Signed with sha256WithRSAEncryption.
//!
//! [`SimulatedAzureVtpmCa::deeper`] puts an intermediate between root and CA, as some Azure VMs'
//! chains have one.
//!
//! A chain it issues is trusted only where a test's attestation config lists
//! [`SimulatedAzureVtpmCa::root_pem`] (or the intermediate) in `azureVtpmRoots`.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, RsaKeyPair};
use x509_cert::der::asn1::{Ia5String, OctetString, UtcTime};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Any, Decode, Encode};
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::crl::dp::DistributionPoint;
use x509_cert::ext::pkix::name::{DistributionPointName, GeneralName};
use x509_cert::ext::pkix::{
    AccessDescription, AuthorityInfoAccessSyntax, AuthorityKeyIdentifier, BasicConstraints,
    CrlDistributionPoints, ExtendedKeyUsage, KeyUsage, KeyUsages, SubjectKeyIdentifier,
};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::time::{Time, Validity};
use x509_cert::{Certificate, TbsCertificate, Version};

use crate::snp::{SimulationError, key_id, pem, pkix, rsa_key, rsa_spki};

const ROOT_KEY: &[u8] = include_bytes!("../keys/rsa4096-azure-vtpm-root-test.pk8");
const CA_KEY: &[u8] = include_bytes!("../keys/rsa2048-azure-vtpm-ca-test.pk8");
const INTERMEDIATE_KEY: &[u8] = include_bytes!("../keys/rsa3072-azure-vtpm-intermediate-test.pk8");

const SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const SHA384_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
/// tcg-kp-EKCertificate.
pub const TCG_KP_EK_CERTIFICATE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.8.1");
/// tcg-kp-AIKCertificate.
pub const TCG_KP_AIK_CERTIFICATE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.8.3");
/// The Microsoft EKU Azure's AK certificates carry beside tcg-kp-AIKCertificate.
pub const MS_KP_DOCUMENT_SIGNING: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.10.3.12");
const MS_CA_VERSION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.21.1");
const CA_ISSUERS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.2");

/// Where the simulated CA says the root is published (Azure's root URL).
const ROOT_URL: &str = "http://www.microsoft.com/pkiops/certs/Azure%20Virtual%20TPM%20Root%20Certificate%20Authority%202023.crt";
const ROOT_CRL_URL: &str = "http://www.microsoft.com/pkiops/crl/Azure%20Virtual%20TPM%20Root%20Certificate%20Authority%202023.crl";

/// The subject name of the simulated root.
pub const ROOT_NAME: &str =
    "CN=Azure Virtual TPM Root Certificate Authority 2023,O=Microsoft Corporation,C=US";
/// The subject name of the simulated CA.
pub const CA_NAME: &str = "CN=Global Virtual TPM CA - 03";
/// The subject names of the deeper hierarchy's intermediate and CA.
pub const INTERMEDIATE_NAME: &str = "CN=Azure Cloud Virtual TPM CA 2025";
pub const DEEPER_CA_NAME: &str = "CN=Azure Cloud Virtual TPM CA - 11";

struct Ca {
    key: RsaKeyPair,
    name: Name,
    cert_der: Vec<u8>,
}

/// A simulated Azure vTPM CA hierarchy: a root and the CA it certified.
pub struct SimulatedAzureVtpmCa {
    root: Ca,
    /// Between the root and the CA in a deeper hierarchy.
    intermediate: Option<Ca>,
    ca: Ca,
    rng: SystemRandom,
}

impl std::fmt::Debug for SimulatedAzureVtpmCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedAzureVtpmCa")
            .finish_non_exhaustive()
    }
}

/// When an AK certificate is valid, in seconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub not_before: u64,
    pub not_after: u64,
}

impl Window {
    /// From a day ago to a year from now.
    pub fn current() -> Window {
        let now = now();
        Window {
            not_before: now.saturating_sub(86_400),
            not_after: now + 365 * 86_400,
        }
    }

    /// A window that ended a day ago.
    pub fn expired() -> Window {
        let now = now();
        Window {
            not_before: now.saturating_sub(400 * 86_400),
            not_after: now.saturating_sub(86_400),
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// UTCTime, as RFC 5280 asks for dates before 2050 and Azure's certificates carry.
fn validity(window: Window) -> Result<Validity, SimulationError> {
    let at = |secs: u64| {
        UtcTime::from_system_time(UNIX_EPOCH + Duration::from_secs(secs))
            .map(Time::UtcTime)
            .map_err(SimulationError::Der)
    };
    Ok(Validity {
        not_before: at(window.not_before)?,
        not_after: at(window.not_after)?,
    })
}

fn uri(url: &str) -> Result<GeneralName, SimulationError> {
    Ok(GeneralName::UniformResourceIdentifier(Ia5String::new(url)?))
}

fn ca_issuers(urls: &[&str]) -> Result<Extension, SimulationError> {
    let access = urls
        .iter()
        .map(|url| {
            Ok(AccessDescription {
                access_method: CA_ISSUERS,
                access_location: uri(url)?,
            })
        })
        .collect::<Result<Vec<_>, SimulationError>>()?;
    pkix(&AuthorityInfoAccessSyntax(access), false)
}

fn authority_key_id(key: &RsaKeyPair) -> Result<Extension, SimulationError> {
    pkix(
        &AuthorityKeyIdentifier {
            key_identifier: Some(OctetString::new(key_id(key))?),
            authority_cert_issuer: None,
            authority_cert_serial_number: None,
        },
        false,
    )
}

/// The extensions of a CA certificate for `key` issued by `issuer_key`, as Azure's CA - 03
/// carries them, with `path_len`.
fn ca_extensions(
    key: &RsaKeyPair,
    issuer_key: &RsaKeyPair,
    path_len: u8,
) -> Result<Vec<Extension>, SimulationError> {
    Ok(vec![
        pkix(
            &BasicConstraints {
                ca: true,
                path_len_constraint: Some(path_len),
            },
            true,
        )?,
        pkix(&KeyUsage(KeyUsages::KeyCertSign.into()), true)?,
        pkix(
            &ExtendedKeyUsage(vec![TCG_KP_EK_CERTIFICATE, TCG_KP_AIK_CERTIFICATE]),
            false,
        )?,
        pkix(&SubjectKeyIdentifier(OctetString::new(key_id(key))?), false)?,
        authority_key_id(issuer_key)?,
        pkix(
            &CrlDistributionPoints(vec![DistributionPoint {
                distribution_point: Some(DistributionPointName::FullName(vec![uri(ROOT_CRL_URL)?])),
                reasons: None,
                crl_issuer: None,
            }]),
            false,
        )?,
        ca_issuers(&[ROOT_URL])?,
    ])
}

impl SimulatedAzureVtpmCa {
    /// The simulated root and CA.
    pub fn new() -> Result<Self, SimulationError> {
        SimulatedAzureVtpmCa::with_keys(ROOT_KEY, CA_KEY, None)
    }

    /// A hierarchy with Azure's names that [`SimulatedAzureVtpmCa::new`]'s root did not make:
    /// its root is another key (the test keys in swapped roles). A config trusting `new`'s root
    /// must refuse every AK certificate this one issues.
    pub fn impostor() -> Result<Self, SimulationError> {
        SimulatedAzureVtpmCa::with_keys(CA_KEY, ROOT_KEY, None)
    }

    /// A deeper hierarchy, as some Azure VMs present: the root, an intermediate ("Azure Cloud
    /// Virtual TPM CA 2025", pathlen 1) and under it the CA that issues AK certificates ("Azure
    /// Cloud Virtual TPM CA - 11"). A document carries only the last CA, so a config must trust
    /// the intermediate as an anchor ([`SimulatedAzureVtpmCa::intermediate_pem`]).
    pub fn deeper() -> Result<Self, SimulationError> {
        SimulatedAzureVtpmCa::with_keys(ROOT_KEY, CA_KEY, Some(INTERMEDIATE_KEY))
    }

    fn with_keys(
        root_key: &[u8],
        ca_key: &[u8],
        intermediate_key: Option<&[u8]>,
    ) -> Result<Self, SimulationError> {
        let ca_name = if intermediate_key.is_some() {
            DEEPER_CA_NAME
        } else {
            CA_NAME
        };
        let mut sim = SimulatedAzureVtpmCa {
            root: Ca {
                key: rsa_key(root_key)?,
                name: Name::from_str(ROOT_NAME)?,
                cert_der: Vec::new(),
            },
            intermediate: intermediate_key
                .map(|key| {
                    Ok::<_, SimulationError>(Ca {
                        key: rsa_key(key)?,
                        name: Name::from_str(INTERMEDIATE_NAME)?,
                        cert_der: Vec::new(),
                    })
                })
                .transpose()?,
            ca: Ca {
                key: rsa_key(ca_key)?,
                name: Name::from_str(ca_name)?,
                cert_der: Vec::new(),
            },
            rng: SystemRandom::new(),
        };
        let root_ext = vec![
            pkix(
                &KeyUsage(
                    KeyUsages::DigitalSignature | KeyUsages::KeyCertSign | KeyUsages::CRLSign,
                ),
                true,
            )?,
            pkix(
                &BasicConstraints {
                    ca: true,
                    path_len_constraint: None,
                },
                true,
            )?,
            pkix(
                &SubjectKeyIdentifier(OctetString::new(key_id(&sim.root.key))?),
                false,
            )?,
            Extension {
                extn_id: MS_CA_VERSION,
                critical: false,
                extn_value: OctetString::new(0u32.to_der()?)?,
            },
        ];
        // Azure's root: 2023-06-01 to 2048-06-01.
        let root_window = Window {
            not_before: 1_685_642_933,
            not_after: 2_474_561_741,
        };
        sim.root.cert_der = sim.sign(
            &sim.root,
            sim.root.name.clone(),
            rsa_spki(&sim.root.key)?,
            root_window,
            SHA384_WITH_RSA,
            root_ext,
        )?;
        // Two years, as Azure's CA - 03; issued half a year ago.
        let now = now();
        let ca_window = Window {
            not_before: now.saturating_sub(182 * 86_400),
            not_after: now + 548 * 86_400,
        };
        if let Some(intermediate) = &sim.intermediate {
            let der = sim.sign(
                &sim.root,
                intermediate.name.clone(),
                rsa_spki(&intermediate.key)?,
                ca_window,
                SHA384_WITH_RSA,
                ca_extensions(&intermediate.key, &sim.root.key, 1)?,
            )?;
            if let Some(intermediate) = sim.intermediate.as_mut() {
                intermediate.cert_der = der;
            }
        }
        let issuer = sim.intermediate.as_ref().unwrap_or(&sim.root);
        sim.ca.cert_der = sim.sign(
            issuer,
            sim.ca.name.clone(),
            rsa_spki(&sim.ca.key)?,
            ca_window,
            SHA384_WITH_RSA,
            ca_extensions(&sim.ca.key, &issuer.key, 0)?,
        )?;
        Ok(sim)
    }

    /// The intermediate of a [`SimulatedAzureVtpmCa::deeper`] hierarchy, PEM.
    pub fn intermediate_pem(&self) -> Option<String> {
        self.intermediate
            .as_ref()
            .map(|ca| pem("CERTIFICATE", &ca.cert_der))
    }

    /// The root, DER.
    pub fn root_der(&self) -> &[u8] {
        &self.root.cert_der
    }

    /// The root, PEM: what a test's `azureVtpmRoots` lists.
    pub fn root_pem(&self) -> String {
        pem("CERTIFICATE", &self.root.cert_der)
    }

    /// The CA that issues AK certificates, DER: what a node fetches from the AK certificate's
    /// caIssuers URL.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca.cert_der
    }

    /// The AK certificate Azure writes for the VM `vm_id`, certifying the TPM key `ak_public`
    /// (a marshalled `TPMT_PUBLIC`, RSA as Azure's AK is), valid in `window`, naming `ca_urls`
    /// as where its CA is published (no authorityInfoAccess when empty).
    pub fn ak_cert(
        &self,
        ak_public: &[u8],
        vm_id: &str,
        window: Window,
        ca_urls: &[&str],
    ) -> Result<Vec<u8>, SimulationError> {
        self.ak_cert_for(
            ak_public,
            vm_id,
            window,
            ca_urls,
            &[TCG_KP_AIK_CERTIFICATE, MS_KP_DOCUMENT_SIGNING],
        )
    }

    /// [`SimulatedAzureVtpmCa::ak_cert`] with `usages` as its ExtendedKeyUsage instead of
    /// Azure's (tcg-kp-AIKCertificate and Microsoft's document signing).
    pub fn ak_cert_for(
        &self,
        ak_public: &[u8],
        vm_id: &str,
        window: Window,
        ca_urls: &[&str],
        usages: &[ObjectIdentifier],
    ) -> Result<Vec<u8>, SimulationError> {
        let ak = attestation::tpm::Public::parse(ak_public)
            .map_err(|e| SimulationError::Key(format!("the AK's TPMT_PUBLIC: {e}")))?;
        let spki_der = ak
            .spki_der()
            .map_err(|e| SimulationError::Key(format!("the AK's SubjectPublicKeyInfo: {e}")))?;
        let spki = SubjectPublicKeyInfoOwned::from_der(&spki_der)?;
        let mut extensions = vec![
            pkix(&KeyUsage(KeyUsages::DigitalSignature.into()), true)?,
            pkix(&ExtendedKeyUsage(usages.to_vec()), false)?,
            authority_key_id(&self.ca.key)?,
        ];
        if !ca_urls.is_empty() {
            extensions.push(ca_issuers(ca_urls)?);
        }
        self.sign(
            &self.ca,
            Name::from_str(&format!("CN={vm_id}.TrustedVM.Azure.windows.net"))?,
            spki,
            window,
            SHA256_WITH_RSA,
            extensions,
        )
    }

    fn sign(
        &self,
        issuer: &Ca,
        subject: Name,
        spki: SubjectPublicKeyInfoOwned,
        window: Window,
        algorithm: ObjectIdentifier,
        extensions: Vec<Extension>,
    ) -> Result<Vec<u8>, SimulationError> {
        let algorithm = AlgorithmIdentifierOwned {
            oid: algorithm,
            parameters: Some(Any::null()),
        };
        let mut serial = [0u8; 16];
        aws_lc_rs::rand::SecureRandom::fill(&self.rng, &mut serial)
            .map_err(|e| SimulationError::Sign(e.to_string()))?;
        serial[0] = (serial[0] & 0x7f) | 0x01;
        let tbs = TbsCertificate {
            version: Version::V3,
            serial_number: SerialNumber::new(&serial)?,
            signature: algorithm.clone(),
            issuer: issuer.name.clone(),
            validity: validity(window)?,
            subject,
            subject_public_key_info: spki,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: Some(extensions),
        };
        let scheme = if algorithm.oid == SHA384_WITH_RSA {
            &signature::RSA_PKCS1_SHA384
        } else {
            &signature::RSA_PKCS1_SHA256
        };
        let message = tbs.to_der()?;
        let mut sig = vec![0u8; issuer.key.public_modulus_len()];
        issuer
            .key
            .sign(scheme, &self.rng, &message, &mut sig)
            .map_err(|e| SimulationError::Sign(e.to_string()))?;
        Ok(Certificate {
            tbs_certificate: tbs,
            signature_algorithm: algorithm,
            signature: x509_cert::der::asn1::BitString::from_bytes(&sig)?,
        }
        .to_der()?)
    }
}
