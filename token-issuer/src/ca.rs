//! The cluster CA: loading kubeadm's `ca.crt`/`ca.key`, the discovery hash, and signing kubelet
//! certificates.

use std::path::{Path, PathBuf};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::prelude::FromDer;

use crate::csr::NodeRequest;

/// Kubelet certificates are valid this long (Constellation signs for one year).
const CERT_LIFETIME: time::Duration = time::Duration::days(365);
/// Backdating of `notBefore`, so a node whose clock runs a little behind accepts the cert.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// Errors loading the CA at startup.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0} holds no PEM certificate")]
    CertPem(PathBuf),
    /// The certificate does not parse.
    #[error("{path} is not an X.509 certificate: {reason}")]
    CertParse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key file holds no PKCS#1, PKCS#8 or SEC1 PEM private key.
    #[error("{0} holds no PEM private key (PKCS#1 RSA, PKCS#8 or SEC1 EC)")]
    KeyPem(PathBuf),
    /// The key is of a type or curve the crypto provider cannot sign with.
    #[error("{path}: unsupported or malformed private key")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
    /// The key does not belong to the certificate.
    #[error("{key} is not the private key of {cert}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rcgen could not use the certificate as an issuer.
    #[error("{path} cannot be used as an issuer")]
    Issuer {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
}

/// Errors signing a kubelet certificate.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The CSR's key algorithm cannot be put into a certificate by rcgen.
    #[error("unsupported public key in certificate request")]
    PublicKey(#[source] rcgen::Error),
    /// Signing failed.
    #[error("signing failed")]
    Sign(#[source] rcgen::Error),
}

/// The loaded cluster CA.
pub struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    discovery_hash: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("ClusterCa")
            .field("discovery_hash", &self.discovery_hash)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })
}

/// DER encoding helpers, only as much as wrapping a key into PKCS#8 needs.
fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | bytes.len() as u8];
    out.extend(bytes);
    out
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_len(content.len()));
    out.extend_from_slice(content);
    out
}

/// PKCS#8 PrivateKeyInfo { version 0, algorithm, privateKey OCTET STRING }.
fn pkcs8(algorithm_identifier: &[u8], inner: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend(der_tlv(0x30, algorithm_identifier));
    body.extend(der_tlv(0x04, inner));
    der_tlv(0x30, &body)
}

// rsaEncryption, NULL
const RSA_ALG_ID: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];
// id-ecPublicKey + prime256v1 / secp384r1
const EC_P256_ALG_ID: &[u8] = &[
    0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d,
    0x03, 0x01, 0x07,
];
const EC_P384_ALG_ID: &[u8] = &[
    0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22,
];

/// A signing key from kubeadm's key file. aws-lc-rs (our one crypto provider) is given PKCS#8, so
/// PKCS#1 RSA (what kubeadm writes) and SEC1 EC keys are re-wrapped into PKCS#8 first.
fn load_key(path: &Path, pem: &[u8]) -> Result<KeyPair, LoadError> {
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| LoadError::KeyPem(path.to_owned()))?;
    let key_err = |source| LoadError::Key {
        path: path.to_owned(),
        source,
    };
    let from_pkcs8 = |der: Vec<u8>| KeyPair::try_from(&PrivatePkcs8KeyDer::from(der));
    match key {
        PrivateKeyDer::Pkcs8(der) => from_pkcs8(der.secret_pkcs8_der().to_vec()).map_err(key_err),
        PrivateKeyDer::Pkcs1(der) => {
            from_pkcs8(pkcs8(RSA_ALG_ID, der.secret_pkcs1_der())).map_err(key_err)
        }
        PrivateKeyDer::Sec1(der) => {
            // The curve is inside the SEC1 structure; aws-lc-rs checks it against the wrapper's, so
            // trying each supported curve is both simple and exact.
            from_pkcs8(pkcs8(EC_P256_ALG_ID, der.secret_sec1_der()))
                .or_else(|_| from_pkcs8(pkcs8(EC_P384_ALG_ID, der.secret_sec1_der())))
                .map_err(key_err)
        }
        _ => Err(LoadError::KeyPem(path.to_owned())),
    }
}

impl ClusterCa {
    /// Loads the CA certificate and key, checking that they belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, LoadError> {
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        let cert = CertificateDer::from_pem_slice(&cert_pem)
            .map_err(|_| LoadError::CertPem(cert_path.to_owned()))?;
        let key = load_key(key_path, &key_pem)?;
        Self::new(cert_path, key_path, cert, key)
    }

    fn new(
        cert_path: &Path,
        key_path: &Path,
        cert: CertificateDer<'static>,
        key: KeyPair,
    ) -> Result<Self, LoadError> {
        let (_, parsed) =
            x509_parser::certificate::X509Certificate::from_der(&cert).map_err(|e| {
                LoadError::CertParse {
                    path: cert_path.to_owned(),
                    reason: e.to_string(),
                }
            })?;
        let spki = parsed.tbs_certificate.subject_pki.raw;
        if key.subject_public_key_info() != spki {
            return Err(LoadError::Mismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            });
        }
        let discovery_hash = discovery_hash(spki);
        let issuer = Issuer::from_ca_cert_der(&cert, key).map_err(|source| LoadError::Issuer {
            path: cert_path.to_owned(),
            source,
        })?;
        Ok(Self {
            issuer,
            discovery_hash,
        })
    }

    /// `sha256:<hex>` over the CA's SubjectPublicKeyInfo, as `kubeadm join
    /// --discovery-token-ca-cert-hash` expects.
    pub fn discovery_hash(&self) -> &str {
        &self.discovery_hash
    }

    /// Signs the kubelet certificate for a validated request; returns PEM.
    pub fn sign_kubelet(&self, req: &NodeRequest) -> Result<String, SignError> {
        let public_key = rcgen::SubjectPublicKeyInfo::from_der(&req.public_key_der)
            .map_err(SignError::PublicKey)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, req.organization());
        dn.push(DnType::CommonName, req.common_name());
        params.distinguished_name = dn;
        params.subject_alt_names = req.ips.iter().copied().map(SanType::IpAddress).collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + CERT_LIFETIME;
        params.serial_number = Some(random_serial());
        let cert = params
            .signed_by(&public_key, &self.issuer)
            .map_err(SignError::Sign)?;
        Ok(cert.pem())
    }
}

/// `sha256:` + lowercase hex SHA-256 of a DER SubjectPublicKeyInfo.
pub fn discovery_hash(spki_der: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex::encode(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            spki_der
        ))
    )
}

/// 128 random bits with the top bit clear: positive and at most 20 octets (RFC 5280 4.1.2.2).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths() {
        assert_eq!(der_len(5), [5]);
        assert_eq!(der_len(0x80), [0x81, 0x80]);
        assert_eq!(der_len(0x1234), [0x82, 0x12, 0x34]);
    }
}
