//! The AK certificate of an Azure Trusted Launch vTPM, as Constellation's InstanceInfo carries it,
//! and its chain to a trusted Azure vTPM CA.
//!
//! InstanceInfo is `{"AkCert": <DER>, "CA": <DER>}` (Go `encoding/json`, bytes standard base64):
//! the certificate Azure wrote to the vTPM's NV index 0x01C101D0 for the key it persisted at
//! 0x81000003, and the CA certificate the node fetched from the AK certificate's
//! authorityInfoAccess URL. The chain is AK certificate ← CA ← a trust anchor of the config (a
//! root, or any CA certificate the operator trusts as an anchor, such as an intermediate of a
//! deeper Azure hierarchy). Checked at the verification time: names chain, signatures verify
//! (no SHA-1), every certificate is within its validity, the CA and the anchor are CAs with
//! keyCertSign (RFC 5280 6.1.4 (k), (n); [`crate::issuer`]), an anchor with pathlen 0 certifies no
//! CA, no certificate carries a critical extension this verifier does not understand, an
//! ExtendedKeyUsage on the AK certificate names tcg-kp-AIKCertificate (2.23.133.8.3), and the
//! certificate's key is the attestation key the quotes verified with.

use serde::Deserialize;
use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::oid::Oid;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer as _;
use x509_parser::public_key::PublicKey;
use x509_parser::time::ASN1Time;

use crate::issuer::{Usage, may_sign};
use crate::tpm;

/// The largest InstanceInfo accepted: two certificates of under 2 KiB each, in base64.
pub const MAX_INSTANCE_INFO: usize = 64 * 1024;

/// tcg-kp-AIKCertificate: the ExtendedKeyUsage of a TPM attestation key's certificate.
pub const TCG_KP_AIK_CERTIFICATE: &str = "2.23.133.8.3";
/// anyExtendedKeyUsage (RFC 5280 4.2.1.12).
const ANY_EXTENDED_KEY_USAGE: &str = "2.5.29.37.0";

/// Why the AK certificate does not vouch for the attestation key.
#[derive(Debug, thiserror::Error)]
pub enum AkCertError {
    /// InstanceInfo is not `{"AkCert", "CA"}` or lacks one of them.
    #[error("InstanceInfo is not azure-trustedlaunch's {{\"AkCert\", \"CA\"}}: {0}")]
    InstanceInfo(String),
    /// A certificate does not parse.
    #[error("the {which} is not an X.509 certificate: {reason}")]
    Certificate { which: &'static str, reason: String },
    /// A certificate of the chain is not valid at the verification time.
    #[error("the {which} {reason}")]
    Expired { which: &'static str, reason: String },
    /// The CA was not issued by any trust anchor of the config.
    #[error("the AK certificate does not chain to a trusted Azure vTPM root: {0}")]
    UntrustedRoot(String),
    /// Names, signatures or issuer rights of the chain are wrong.
    #[error("the AK certificate chain is broken: {0}")]
    Chain(String),
    /// The AK certificate is for another purpose than certifying an attestation key.
    #[error("the AK certificate is not for an attestation key: {0}")]
    Usage(String),
    /// The AK certificate certifies another key than the one the quotes verify with.
    #[error("the AK certificate certifies another key than the attestation key: {0}")]
    KeyMismatch(String),
}

/// Constellation's azure-trustedlaunch `InstanceInfo`. Unknown fields are ignored, as Go does.
#[derive(Deserialize)]
struct RawInstanceInfo {
    #[serde(rename = "AkCert", default, with = "crate::vtpm::document::b64")]
    ak_cert: Vec<u8>,
    #[serde(rename = "CA", default, with = "crate::vtpm::document::b64")]
    ca: Vec<u8>,
}

/// The two certificates of an InstanceInfo, DER, each parsed once to check it is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceInfo {
    pub ak_cert: Vec<u8>,
    pub ca: Vec<u8>,
}

impl InstanceInfo {
    /// Parses InstanceInfo bytes: JSON within [`MAX_INSTANCE_INFO`], both certificates present
    /// and each exactly one DER certificate.
    pub fn parse(bytes: &[u8]) -> Result<InstanceInfo, AkCertError> {
        if bytes.len() > MAX_INSTANCE_INFO {
            return Err(AkCertError::InstanceInfo(format!(
                "{} bytes, more than the limit of {MAX_INSTANCE_INFO}",
                bytes.len()
            )));
        }
        let raw: RawInstanceInfo =
            serde_json::from_slice(bytes).map_err(|e| AkCertError::InstanceInfo(e.to_string()))?;
        if raw.ak_cert.is_empty() {
            return Err(AkCertError::InstanceInfo(
                "AkCert is empty (the certificate from NV index 0x01C101D0)".to_owned(),
            ));
        }
        if raw.ca.is_empty() {
            return Err(AkCertError::InstanceInfo(
                "CA is empty (the AK certificate's issuing CA)".to_owned(),
            ));
        }
        parse_cert(&raw.ak_cert, "AK certificate")?;
        parse_cert(&raw.ca, "CA certificate")?;
        Ok(InstanceInfo {
            ak_cert: raw.ak_cert,
            ca: raw.ca,
        })
    }

    /// The JSON Constellation's issuer writes: `{"AkCert":"<base64>","CA":"<base64>"}`.
    pub fn to_json(&self) -> Vec<u8> {
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        serde_json::json!({"AkCert": b64(&self.ak_cert), "CA": b64(&self.ca)})
            .to_string()
            .into_bytes()
    }
}

/// Parses exactly one DER certificate.
pub(crate) fn parse_cert<'a>(
    der: &'a [u8],
    which: &'static str,
) -> Result<X509Certificate<'a>, AkCertError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(AkCertError::Certificate {
            which,
            reason: format!("{} bytes after the certificate", rest.len()),
        }),
        Err(e) => Err(AkCertError::Certificate {
            which,
            reason: e.to_string(),
        }),
    }
}

/// The caIssuers URLs of an AK certificate's authorityInfoAccess, in order: where the node fetches
/// the CA that issued it, as Constellation's issuer does. `der` must be exactly one certificate.
pub fn ca_issuer_urls(der: &[u8]) -> Result<Vec<String>, AkCertError> {
    let cert = parse_cert(der, "AK certificate")?;
    let mut urls = Vec::new();
    for ext in cert.extensions() {
        if let ParsedExtension::AuthorityInfoAccess(aia) = ext.parsed_extension() {
            for access in &aia.accessdescs {
                if access.access_method
                    == x509_parser::oid_registry::OID_PKIX_ACCESS_DESCRIPTOR_CA_ISSUERS
                {
                    if let x509_parser::extensions::GeneralName::URI(url) = access.access_location {
                        urls.push(url.to_owned());
                    }
                }
            }
        }
    }
    Ok(urls)
}

/// Whether `der` is exactly one X.509 certificate; the error names it `which`.
pub fn check_certificate(der: &[u8], which: &'static str) -> Result<(), AkCertError> {
    parse_cert(der, which).map(|_| ())
}

/// A trust anchor: a CA certificate, DER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anchor {
    der: Vec<u8>,
    subject: String,
    /// The subject name's DER, which issuer names are compared with.
    subject_raw: Vec<u8>,
    sha256: [u8; 32],
}

impl Anchor {
    /// An anchor from one DER certificate.
    pub fn from_der(der: Vec<u8>) -> Result<Anchor, AkCertError> {
        let parsed = parse_cert(&der, "trusted root")?;
        let subject = parsed.subject().to_string();
        let subject_raw = parsed.subject().as_raw().to_vec();
        let mut sha256 = [0u8; 32];
        sha256
            .copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &der).as_ref());
        Ok(Anchor {
            der,
            subject,
            subject_raw,
            sha256,
        })
    }

    /// Every certificate of a PEM text as an anchor; none is an error.
    pub fn from_pem(pem: &[u8]) -> Result<Vec<Anchor>, AkCertError> {
        let mut out = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
            let block = block.map_err(|e| AkCertError::Certificate {
                which: "trusted root",
                reason: format!("bad PEM: {e}"),
            })?;
            if block.label == "CERTIFICATE" {
                out.push(Anchor::from_der(block.contents)?);
            }
        }
        if out.is_empty() {
            return Err(AkCertError::Certificate {
                which: "trusted root",
                reason: "no CERTIFICATE block in the PEM".to_owned(),
            });
        }
        Ok(out)
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// SHA-256 of the DER, the anchor's name in digests and messages.
    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }
}

/// What a verified chain established, for the audit line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedAkCert {
    pub subject: String,
    pub ca: String,
    pub anchor: String,
    pub anchor_sha256: [u8; 32],
}

/// Verifies `info`'s chain to one of `anchors` at `at` (seconds since the epoch) and that the AK
/// certificate certifies `ak`.
pub fn verify(
    info: &InstanceInfo,
    ak: &tpm::Public,
    anchors: &[Anchor],
    at: i64,
) -> Result<VerifiedAkCert, AkCertError> {
    let time = ASN1Time::from_timestamp(at)
        .map_err(|e| AkCertError::Chain(format!("verification time {at}: {e}")))?;
    let leaf = parse_cert(&info.ak_cert, "AK certificate")?;
    let ca = parse_cert(&info.ca, "CA certificate")?;

    if leaf.issuer().as_raw() != ca.subject().as_raw() {
        return Err(AkCertError::Chain(format!(
            "the AK certificate was issued by {}, not by the CA the document carries ({})",
            leaf.issuer(),
            ca.subject()
        )));
    }
    let named: Vec<&Anchor> = anchors
        .iter()
        .filter(|a| a.subject_raw == ca.issuer().as_raw())
        .collect();
    if named.is_empty() {
        return Err(AkCertError::UntrustedRoot(format!(
            "its CA {} was issued by {}, which is none of the trusted roots ({}); add that root to azureVtpmRoots if Azure issues it",
            ca.subject(),
            ca.issuer(),
            trusted_list(anchors)
        )));
    }
    // Several anchors may share a name (a re-keyed root); the one whose key signed the CA is it.
    let mut anchor_found = None;
    let mut reasons = Vec::new();
    for candidate in named {
        let parsed = parse_cert(&candidate.der, "trusted root")?;
        match check_signature(&ca, &parsed) {
            Ok(()) => {
                anchor_found = Some(candidate);
                break;
            }
            Err(reason) => reasons.push(format!(
                "its signature does not verify with the key of {} (SHA-256 {}): {reason}",
                candidate.subject,
                hex::encode(candidate.sha256)
            )),
        }
    }
    let Some(anchor) = anchor_found else {
        return Err(AkCertError::UntrustedRoot(format!(
            "its CA {} names {} as its issuer, but no trusted root of that name signed it: {}",
            ca.subject(),
            ca.issuer(),
            reasons.join("; ")
        )));
    };
    let root = parse_cert(&anchor.der, "trusted root")?;

    for (which, cert) in [
        ("AK certificate", &leaf),
        ("CA certificate", &ca),
        ("trusted root", &root),
    ] {
        if !cert.validity().is_valid_at(time) {
            return Err(AkCertError::Expired {
                which,
                reason: format!(
                    "{} is not valid at {time}: it is valid from {} to {}",
                    cert.subject(),
                    cert.validity().not_before,
                    cert.validity().not_after
                ),
            });
        }
        critical_extensions_understood(cert, which)?;
    }
    for (which, cert) in [("CA", &ca), ("trusted root", &root)] {
        may_sign(cert, Usage::Certificates).map_err(|reason| {
            AkCertError::Chain(format!("the {which} {} {reason}", cert.subject()))
        })?;
    }
    let root_path_len = root
        .basic_constraints()
        .ok()
        .flatten()
        .and_then(|bc| bc.value.path_len_constraint);
    if root_path_len == Some(0) && ca.subject().as_raw() != root.subject().as_raw() {
        return Err(AkCertError::Chain(format!(
            "the trusted root {} has pathlen 0, so it may not certify the CA {}",
            root.subject(),
            ca.subject()
        )));
    }
    check_signature(&leaf, &ca).map_err(|reason| {
        AkCertError::Chain(format!(
            "the AK certificate's signature does not verify with the CA's key: {reason}"
        ))
    })?;
    check_usage(&leaf)?;
    check_same_key(&leaf, ak)?;
    Ok(VerifiedAkCert {
        subject: leaf.subject().to_string(),
        ca: ca.subject().to_string(),
        anchor: anchor.subject.clone(),
        anchor_sha256: anchor.sha256,
    })
}

fn trusted_list(anchors: &[Anchor]) -> String {
    if anchors.is_empty() {
        return "none".to_owned();
    }
    anchors
        .iter()
        .map(|a| format!("{} SHA-256 {}", a.subject, hex::encode(a.sha256)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `issuer`'s key signed `cert`; SHA-1 signatures are refused as forgeable.
fn check_signature(cert: &X509Certificate<'_>, issuer: &X509Certificate<'_>) -> Result<(), String> {
    use x509_parser::oid_registry::{OID_PKCS1_SHA1WITHRSA, OID_SHA1_WITH_RSA};
    let algorithm = &cert.signature_algorithm.algorithm;
    if *algorithm == OID_PKCS1_SHA1WITHRSA || *algorithm == OID_SHA1_WITH_RSA {
        return Err("it is signed with SHA-1, which is not accepted".to_owned());
    }
    cert.verify_signature(Some(issuer.public_key()))
        .map_err(|e| format!("{e} (algorithm {algorithm})"))
}

/// RFC 5280 4.2: a certificate with a critical extension the verifier does not process is
/// refused.
fn critical_extensions_understood(
    cert: &X509Certificate<'_>,
    which: &'static str,
) -> Result<(), AkCertError> {
    for ext in cert.extensions() {
        if !ext.critical {
            continue;
        }
        if matches!(
            ext.parsed_extension(),
            ParsedExtension::UnsupportedExtension { .. } | ParsedExtension::ParseError { .. }
        ) {
            return Err(AkCertError::Chain(format!(
                "the {which} {} has a critical extension {} this verifier does not understand",
                cert.subject(),
                ext.oid
            )));
        }
    }
    Ok(())
}

/// An ExtendedKeyUsage on the AK certificate must allow certifying an attestation key; a
/// certificate without one is unrestricted (RFC 5280 4.2.1.12).
fn check_usage(leaf: &X509Certificate<'_>) -> Result<(), AkCertError> {
    let eku = leaf
        .extended_key_usage()
        .map_err(|e| AkCertError::Usage(format!("unreadable ExtendedKeyUsage: {e}")))?;
    let Some(eku) = eku else {
        return Ok(());
    };
    let eku = eku.value;
    let aik: Oid<'static> = Oid::from(&[2, 23, 133, 8, 3])
        .map_err(|_| AkCertError::Usage("tcg-kp-AIKCertificate OID".to_owned()))?;
    if eku.any || eku.other.contains(&aik) {
        return Ok(());
    }
    let mut named: Vec<String> = eku.other.iter().map(|o| o.to_id_string()).collect();
    for (set, oid) in [
        (eku.server_auth, "1.3.6.1.5.5.7.3.1"),
        (eku.client_auth, "1.3.6.1.5.5.7.3.2"),
        (eku.code_signing, "1.3.6.1.5.5.7.3.3"),
        (eku.email_protection, "1.3.6.1.5.5.7.3.4"),
        (eku.time_stamping, "1.3.6.1.5.5.7.3.8"),
        (eku.ocsp_signing, "1.3.6.1.5.5.7.3.9"),
    ] {
        if set {
            named.push(oid.to_owned());
        }
    }
    Err(AkCertError::Usage(format!(
        "its ExtendedKeyUsage ({}) names neither tcg-kp-AIKCertificate ({TCG_KP_AIK_CERTIFICATE}) nor anyExtendedKeyUsage ({ANY_EXTENDED_KEY_USAGE}); a check stricter than Constellation's, which accepts any ExtendedKeyUsage",
        named.join(", ")
    )))
}

fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

/// The certificate's public key is the RSA attestation key (modulus and exponent), as
/// Constellation's validator requires: Azure's AK is RSA.
fn check_same_key(leaf: &X509Certificate<'_>, ak: &tpm::Public) -> Result<(), AkCertError> {
    let tpm::PublicKey::Rsa {
        exponent, modulus, ..
    } = &ak.key
    else {
        return Err(AkCertError::KeyMismatch(
            "the attestation key is not an RSA key (Azure's is)".to_owned(),
        ));
    };
    let parsed = leaf
        .public_key()
        .parsed()
        .map_err(|e| AkCertError::KeyMismatch(format!("unreadable certificate key: {e}")))?;
    let PublicKey::RSA(cert_key) = parsed else {
        return Err(AkCertError::KeyMismatch(
            "the certificate's key is not an RSA key".to_owned(),
        ));
    };
    // The TPM writes the default exponent 65537 as 0.
    let ak_exponent = if *exponent == 0 { 65537 } else { *exponent };
    let same_modulus = strip_zeros(cert_key.modulus) == strip_zeros(modulus);
    let same_exponent = strip_zeros(cert_key.exponent) == strip_zeros(&ak_exponent.to_be_bytes());
    if !(same_modulus && same_exponent) {
        return Err(AkCertError::KeyMismatch(format!(
            "the certificate {} is for RSA modulus {}…, the quotes are signed by {}…",
            leaf.subject(),
            hex::encode(
                &strip_zeros(cert_key.modulus)[..8.min(strip_zeros(cert_key.modulus).len())]
            ),
            hex::encode(&strip_zeros(modulus)[..8.min(strip_zeros(modulus).len())]),
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_info_is_constellations_shape_and_refused_by_what_is_missing() {
        let root = include_bytes!("roots/ame-root.pem");
        let der = Anchor::from_pem(root).unwrap()[0].der().to_vec();
        let info = InstanceInfo {
            ak_cert: der.clone(),
            ca: der.clone(),
        };
        let json = info.to_json();
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.starts_with("{\"AkCert\":\"MIIF"), "{text}");
        assert_eq!(InstanceInfo::parse(&json).unwrap(), info);

        for (input, want) in [
            (r#"{"CA":"AA=="}"#.to_owned(), "AkCert is empty"),
            (r#"{"AkCert":null,"CA":null}"#.to_owned(), "AkCert is empty"),
            (r#"[1]"#.to_owned(), "InstanceInfo is not"),
            (r#"{"AkCert":"!!"}"#.to_owned(), "invalid base64"),
        ] {
            let err = InstanceInfo::parse(input.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(want), "{input}: {err}");
        }
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
        let no_ca = format!(r#"{{"AkCert":"{b64}"}}"#);
        let err = InstanceInfo::parse(no_ca.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("CA is empty"), "{err}");
        let trailing =
            base64::engine::general_purpose::STANDARD.encode([der.as_slice(), &[0]].concat());
        let bad = format!(r#"{{"AkCert":"{trailing}","CA":"{b64}"}}"#);
        let err = InstanceInfo::parse(bad.as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the AK certificate is not an X.509 certificate: 1 bytes after the certificate"
        );
        let huge = vec![b' '; MAX_INSTANCE_INFO + 1];
        assert!(
            InstanceInfo::parse(&huge)
                .unwrap_err()
                .to_string()
                .contains("more than the limit")
        );
    }
}
