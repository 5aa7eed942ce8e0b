//! AMD's certificate chain: ARK → ASK → VCEK, or ARK → ASVK → VLEK.
//!
//! x509-parser parses the certificates; aws-lc-rs verifies their RSA-PSS signatures (SHA-384, MGF1
//! with SHA-384, 48-byte salt, as AMD signs them) and the report's ECDSA P-384 signature. What
//! neither does is done here: the names chain, every issuer (ARK, ASK, ASVK) is a CA
//! (BasicConstraints CA:TRUE) with KeyUsage keyCertSign as RFC 5280 asks, the signature
//! parameters are the ones AMD uses,
//! each certificate is valid at the verification time, the ARK is one the configuration
//! trusts, the product is the same along the chain, and AMD's extensions (TCB, hwID, product
//! name, CSP) are read.
//!
//! A chain is verified once per certificate, not per join: whether an issuer's key signed a
//! certificate (or a CRL) depends on nothing but the two DER encodings, so a signature that
//! verified is remembered by their digests ([`crate::signature_memo::SignatureMemo`]), and the
//! next join with the same ARK, ASK and VCEK (or ASVK and VLEK) spends no RSA verification on
//! them. Everything that
//! depends on the moment or on AMD's current CRL (validity periods, the trusted ARK, the CRL's
//! freshness, revocation) is checked on every join.

use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::oid::Oid;
use x509_parser::oid_registry::{OID_NIST_HASH_SHA384, OID_PKCS1_RSASSAPSS};
use x509_parser::signature_algorithm::SignatureAlgorithm;
use x509_parser::time::ASN1Time;
use x509_parser::x509::AlgorithmIdentifier;

use super::report::{SigningKey, Tcb};
use super::{Product, SnpError};
pub(crate) use crate::issuer::Usage;
use crate::parse_memo::ParseMemo;
use crate::signature_memo::SignatureMemo;

/// `1.3.6.1.4.1.3704.1` is AMD's arc for SEV certificate extensions.
const AMD_ARC: [u64; 8] = [1, 3, 6, 1, 4, 1, 3704, 1];
const EXT_PRODUCT_NAME: [u64; 1] = [2];
const EXT_BL: [u64; 2] = [3, 1];
const EXT_TEE: [u64; 2] = [3, 2];
const EXT_SNP: [u64; 2] = [3, 3];
const EXT_UCODE: [u64; 2] = [3, 8];
const EXT_FMC: [u64; 2] = [3, 9];
const EXT_HWID: [u64; 1] = [4];
const EXT_CSP_ID: [u64; 1] = [5];

/// One certificate, DER, parsed on demand; its subject's common name, which every check names
/// it by, read once.
#[derive(Clone, Debug)]
pub struct Cert {
    der: Vec<u8>,
    common_name: String,
}

impl Cert {
    pub fn from_der(der: Vec<u8>) -> Result<Cert, SnpError> {
        let common_name = common_name_of(&parse(&der)?);
        Ok(Cert { der, common_name })
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// SHA-256 of the DER.
    pub fn sha256(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &self.der).as_ref(),
        );
        out
    }

    pub(crate) fn parsed(&self) -> X509Certificate<'_> {
        // Parsed once in `from_der`, so this cannot fail.
        parse(&self.der).unwrap_or_else(|_| unreachable!("checked in Cert::from_der"))
    }

    /// The subject's common name.
    pub fn common_name(&self) -> &str {
        &self.common_name
    }
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, SnpError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(SnpError::Certificate(format!(
            "{} bytes after the certificate",
            rest.len()
        ))),
        Err(e) => Err(SnpError::Certificate(format!(
            "not an X.509 certificate: {e}"
        ))),
    }
}

/// Bundles parsed lately: the VCEKs or VLEKs and intermediates nodes send are the same for
/// every node of a chip or cloud. AMD's are a few KiB of PEM; at most 2 × 256 of up to
/// 16 KiB are kept.
static PARSED: std::sync::LazyLock<ParseMemo<Vec<Cert>>> =
    std::sync::LazyLock::new(|| ParseMemo::new(256, 16 * 1024));

/// Every certificate in a PEM bundle, in order.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<Cert>, SnpError> {
    PARSED.get_or_parse(pem, parse_pem)
}

fn parse_pem(pem: &[u8]) -> Result<Vec<Cert>, SnpError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| SnpError::Certificate(format!("bad PEM: {e}")))?;
        if block.label == "CERTIFICATE" {
            out.push(Cert::from_der(block.contents)?);
        }
    }
    if out.is_empty() {
        return Err(SnpError::Certificate(
            "no certificate in the PEM".to_owned(),
        ));
    }
    Ok(out)
}

/// What the leaf certificate (VCEK or VLEK) says about the chip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafFacts {
    pub key: SigningKey,
    pub product: Product,
    pub tcb: Tcb,
    /// The VCEK's hardware id (64 bytes, 8 on Turin); `None` for a VLEK.
    pub hw_id: Option<Vec<u8>>,
    /// The cloud provider a VLEK was issued to; `None` for a VCEK.
    pub csp_id: Option<String>,
    /// The leaf's serial, for revocation checks.
    pub serial: Vec<u8>,
}

/// The product an AMD CA certificate names: `ARK-Milan`, `SEV-Milan` (ASK), `SEV-VLEK-Milan`
/// (ASVK).
fn product_of_ca(cn: &str) -> Option<Product> {
    let name = cn
        .strip_prefix("ARK-")
        .or_else(|| cn.strip_prefix("SEV-VLEK-"))
        .or_else(|| cn.strip_prefix("SEV-"))?;
    Product::from_name(name)
}

/// The memo every chain and CRL verification of AMD's certificates in this process shares.
pub(crate) static SIGNATURES: std::sync::LazyLock<SignatureMemo> =
    std::sync::LazyLock::new(SignatureMemo::default);

/// Verifies `leaf` ← `intermediate` ← `ark` at `at` (seconds since the epoch), with `ark` one
/// of `trusted` (compared by DER), and returns what the leaf says. Each signature is verified
/// once per process ([`crate::signature_memo::SignatureMemo`]); everything else on every call.
pub fn verify_chain(
    leaf: &Cert,
    intermediate: &Cert,
    ark: &Cert,
    trusted: &[Cert],
    at: i64,
) -> Result<LeafFacts, SnpError> {
    verify_chain_in(&SIGNATURES, leaf, intermediate, ark, trusted, at)
}

fn verify_chain_in(
    memo: &SignatureMemo,
    leaf: &Cert,
    intermediate: &Cert,
    ark: &Cert,
    trusted: &[Cert],
    at: i64,
) -> Result<LeafFacts, SnpError> {
    if !trusted.iter().any(|t| t.der == ark.der) {
        return Err(SnpError::UntrustedRoot(hex::encode(ark.sha256())));
    }
    let time = ASN1Time::from_timestamp(at)
        .map_err(|e| SnpError::Certificate(format!("verification time {at}: {e}")))?;
    let (ark_c, int_c, leaf_c) = (ark.parsed(), intermediate.parsed(), leaf.parsed());

    let ark_cn = ark.common_name();
    let product = product_of_ca(ark_cn)
        .filter(|_| ark_cn.starts_with("ARK-"))
        .ok_or_else(|| SnpError::Chain(format!("the root is {ark_cn:?}, not an AMD ARK")))?;
    let int_cn = intermediate.common_name();
    let expected_key = match int_cn.strip_prefix("SEV-VLEK-") {
        Some(_) => SigningKey::Vlek,
        None => SigningKey::Vcek,
    };
    if product_of_ca(int_cn) != Some(product) {
        return Err(SnpError::Chain(format!(
            "the intermediate {int_cn:?} is not {product}'s ASK or ASVK"
        )));
    }
    let leaf_cn = leaf.common_name();
    let leaf_key = match leaf_cn {
        "SEV-VCEK" => SigningKey::Vcek,
        "SEV-VLEK" => SigningKey::Vlek,
        other => {
            return Err(SnpError::Chain(format!(
                "the signer is {other:?}, not a VCEK or VLEK"
            )));
        }
    };
    if leaf_key != expected_key {
        return Err(SnpError::Chain(format!(
            "a {leaf_key} certified by {int_cn:?}"
        )));
    }

    // RFC 5280 6.1.4 (k), (n): a certificate signs certificates only as a CA with keyCertSign.
    for (name, cert) in [("ARK", &ark_c), ("intermediate", &int_c)] {
        issuer_may_sign(cert, name, Usage::Certificates)?;
    }

    for (name, (subject, subject_der), (issuer, issuer_der)) in [
        ("ARK", (&ark_c, ark.der()), (&ark_c, ark.der())),
        (
            "intermediate",
            (&int_c, intermediate.der()),
            (&ark_c, ark.der()),
        ),
        (
            "signer",
            (&leaf_c, leaf.der()),
            (&int_c, intermediate.der()),
        ),
    ] {
        if subject.issuer().as_raw() != issuer.subject().as_raw() {
            return Err(SnpError::Chain(format!(
                "the {name}'s issuer is not the next certificate's subject"
            )));
        }
        if !subject.validity().is_valid_at(time) {
            return Err(SnpError::Expired {
                which: name,
                not_before: subject.validity().not_before.to_string(),
                not_after: subject.validity().not_after.to_string(),
            });
        }
        memo.check(&[subject_der], issuer_der, || {
            verify_pss(
                &subject.signature_algorithm,
                subject.tbs_certificate.as_ref(),
                subject.signature_value.data.as_ref(),
                issuer,
            )
        })
        .map_err(|reason| SnpError::ChainSignature {
            which: name,
            reason,
        })?;
    }

    let facts = leaf_facts(&leaf_c, leaf_key, product)?;
    Ok(facts)
}

/// Refuses `cert` (the `which`) as an issuer for `usage` unless RFC 5280 lets it sign
/// ([`crate::issuer`]).
pub(crate) fn issuer_may_sign(
    cert: &X509Certificate<'_>,
    which: &str,
    usage: Usage,
) -> Result<(), SnpError> {
    crate::issuer::may_sign(cert, usage).map_err(|reason| {
        SnpError::Chain(format!("the {which} {:?} {reason}", common_name_of(cert)))
    })
}

/// The subject's first common name, empty if it has none.
fn common_name_of(cert: &X509Certificate<'_>) -> String {
    crate::issuer::common_name(cert.subject()).to_owned()
}

/// Checks that `signed` (a certificate's or CRL's to-be-signed bytes) is signed by `issuer`'s key
/// with RSA-PSS as AMD signs: SHA-384, MGF1 with SHA-384, a 48-byte salt.
pub(crate) fn verify_pss(
    algorithm: &AlgorithmIdentifier<'_>,
    signed: &[u8],
    signature: &[u8],
    issuer: &X509Certificate<'_>,
) -> Result<(), String> {
    if algorithm.algorithm != OID_PKCS1_RSASSAPSS {
        return Err(format!(
            "signature algorithm {}, expected RSASSA-PSS",
            algorithm.algorithm
        ));
    }
    let Ok(SignatureAlgorithm::RSASSA_PSS(params)) = SignatureAlgorithm::try_from(algorithm) else {
        return Err("unreadable RSASSA-PSS parameters".to_owned());
    };
    let mgf_hash = params
        .mask_gen_algorithm()
        .map_err(|e| format!("unreadable MGF: {e}"))?
        .hash;
    if *params.hash_algorithm_oid() != OID_NIST_HASH_SHA384 || mgf_hash != OID_NIST_HASH_SHA384 {
        return Err("RSASSA-PSS without SHA-384".to_owned());
    }
    if params.salt_length() != 48 {
        return Err(format!("salt length {}, expected 48", params.salt_length()));
    }
    let key = issuer.public_key().subject_public_key.data.as_ref();
    aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::RSA_PSS_2048_8192_SHA384,
        key,
    )
    .verify(signed, signature)
    .map_err(|_| "the signature does not verify".to_owned())
}

fn amd_oid(suffix: &[u64]) -> Oid<'static> {
    let arcs: Vec<u64> = AMD_ARC.iter().chain(suffix).copied().collect();
    Oid::from(&arcs).unwrap_or_else(|_| unreachable!("AMD's arcs are valid"))
}

fn extension<'a>(cert: &'a X509Certificate<'_>, suffix: &[u64]) -> Option<&'a [u8]> {
    let oid = amd_oid(suffix);
    cert.extensions()
        .iter()
        .find(|e| e.oid == oid)
        .map(|e| e.value)
}

/// A DER INTEGER that fits a byte (AMD's SVNs).
fn svn(cert: &X509Certificate<'_>, suffix: &[u64], name: &str) -> Result<u8, SnpError> {
    let value = extension(cert, suffix)
        .ok_or_else(|| SnpError::Certificate(format!("the signer has no {name} extension")))?;
    let bad = || {
        SnpError::Certificate(format!(
            "the signer's {name} extension is not a small INTEGER"
        ))
    };
    match value {
        [0x02, len, body @ ..] if usize::from(*len) == body.len() => {
            let digits = match body {
                [0x00, rest @ ..] if !rest.is_empty() => rest,
                body => body,
            };
            match digits {
                // Positive: either no sign byte was needed, or one was present.
                [b] if body.len() == 2 || b & 0x80 == 0 => Ok(*b),
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

fn leaf_facts(
    cert: &X509Certificate<'_>,
    key: SigningKey,
    product: Product,
) -> Result<LeafFacts, SnpError> {
    let ec_ok = cert.public_key().algorithm.algorithm
        == x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        && cert
            .public_key()
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            == Some(x509_parser::oid_registry::OID_NIST_EC_P384);
    if !ec_ok {
        return Err(SnpError::Certificate(
            "the signer's key is not ECDSA P-384".to_owned(),
        ));
    }
    if let Some(name) = extension(cert, &EXT_PRODUCT_NAME) {
        let name = match name {
            // IA5String
            [0x16, len, body @ ..] if usize::from(*len) == body.len() => body,
            body => body,
        };
        let name = String::from_utf8_lossy(name);
        let family = name.split('-').next().unwrap_or_default();
        if Product::from_name(family) != Some(product) {
            return Err(SnpError::Chain(format!(
                "the signer is for {name:?}, its chain for {product}"
            )));
        }
    }
    let tcb = Tcb {
        fmc: match product {
            Product::Turin => Some(svn(cert, &EXT_FMC, "FMC SPL")?),
            Product::Milan | Product::Genoa => None,
        },
        bootloader: svn(cert, &EXT_BL, "bootloader SPL")?,
        tee: svn(cert, &EXT_TEE, "TEE SPL")?,
        snp: svn(cert, &EXT_SNP, "SNP SPL")?,
        microcode: svn(cert, &EXT_UCODE, "microcode SPL")?,
    };
    let hw_id = match key {
        SigningKey::Vcek => {
            let raw = extension(cert, &EXT_HWID)
                .ok_or_else(|| SnpError::Certificate("the VCEK has no hwID".to_owned()))?;
            let expected = match product {
                Product::Turin => 8,
                Product::Milan | Product::Genoa => 64,
            };
            // Stored raw by older KDS, as a DER OCTET STRING by newer.
            let id = match raw {
                [0x04, len, body @ ..]
                    if usize::from(*len) == body.len() && body.len() == expected =>
                {
                    body
                }
                raw => raw,
            };
            if id.len() != expected {
                return Err(SnpError::Certificate(format!(
                    "the VCEK's hwID has {} bytes, {product} uses {expected}",
                    id.len()
                )));
            }
            Some(id.to_vec())
        }
        SigningKey::Vlek => None,
    };
    let csp_id = extension(cert, &EXT_CSP_ID).map(|raw| {
        let body = match raw {
            [0x16 | 0x0c, len, body @ ..] if usize::from(*len) == body.len() => body,
            body => body,
        };
        String::from_utf8_lossy(body).into_owned()
    });
    Ok(LeafFacts {
        key,
        product,
        tcb,
        hw_id,
        csp_id,
        serial: cert.raw_serial().to_vec(),
    })
}

/// Verifies the report's ECDSA P-384 signature with the leaf certificate's key.
pub fn verify_report_signature(
    leaf: &Cert,
    signed: &[u8],
    signature_fixed: &[u8],
) -> Result<(), SnpError> {
    let parsed = leaf.parsed();
    let key = parsed.public_key().subject_public_key.data.as_ref();
    aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P384_SHA384_FIXED,
        key,
    )
    .verify(signed, signature_fixed)
    .map_err(|_| SnpError::ReportSignature)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TURIN_VCEK: &[u8] = include_bytes!("../../testdata/snp/turin-vcek/vcek.der");
    const TURIN_CHAIN: &[u8] = include_bytes!("../../testdata/snp/amd-roots/turin-ask-ark.pem");
    /// 2026-11-25, inside every validity period of the Turin chain.
    const AT: i64 = 1_795_564_800;

    fn chain() -> (Cert, Cert, Cert) {
        let mut chain = certs_from_pem(TURIN_CHAIN).unwrap().into_iter();
        let (ask, ark) = (chain.next().unwrap(), chain.next().unwrap());
        (Cert::from_der(TURIN_VCEK.to_vec()).unwrap(), ask, ark)
    }

    #[test]
    fn a_chain_is_verified_once_and_a_tampered_or_expired_one_still_fails() {
        let memo = SignatureMemo::default();
        let (vcek, ask, ark) = chain();
        let trusted = [ark.clone()];
        let first = verify_chain_in(&memo, &vcek, &ask, &ark, &trusted, AT).unwrap();
        assert_eq!((memo.verified(), memo.hits()), (3, 0));
        // The same chain again: no signature verified, the same facts.
        let again = verify_chain_in(&memo, &vcek, &ask, &ark, &trusted, AT).unwrap();
        assert_eq!(again, first);
        assert_eq!((memo.verified(), memo.hits()), (3, 3));

        // A VCEK whose signature was altered is another certificate: verified, and refused.
        let mut der = TURIN_VCEK.to_vec();
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = Cert::from_der(der).unwrap();
        let err = verify_chain_in(&memo, &tampered, &ask, &ark, &trusted, AT).unwrap_err();
        assert!(
            matches!(
                err,
                SnpError::ChainSignature {
                    which: "signer",
                    ..
                }
            ),
            "{err}"
        );
        // ... and stays refused: failures are not remembered.
        assert!(verify_chain_in(&memo, &tampered, &ask, &ark, &trusted, AT).is_err());
        assert_eq!(memo.verified(), 3);

        // What depends on time is checked every time: the remembered chain, long after.
        let later = AT + 100 * 365 * 86_400;
        let err = verify_chain_in(&memo, &vcek, &ask, &ark, &trusted, later).unwrap_err();
        assert!(matches!(err, SnpError::Expired { .. }), "{err}");
        // And so is the trusted root.
        let err = verify_chain_in(&memo, &vcek, &ask, &ark, &[], AT).unwrap_err();
        assert!(matches!(err, SnpError::UntrustedRoot(_)), "{err}");
    }
}
