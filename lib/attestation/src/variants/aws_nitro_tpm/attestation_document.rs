//! The AWS-signed NitroTPM attestation document: what EC2's Nitro system says about an
//! instance's NitroTPM, signed by the AWS Nitro Attestation PKI.
//!
//! Format (AWS EC2 user guide, "Validate a NitroTPM attestation document"; the Nitro Enclaves
//! attestation process of `aws-nitro-enclaves-nsm-api` for the limits): a `COSE_Sign1`
//! (RFC 9052; tagged 18 or not) whose protected header names ES384 and whose payload is a CBOR
//! map with text keys `module_id` (non-empty text), `timestamp` (milliseconds since the epoch,
//! positive), `digest` (`"SHA384"`), `nitrotpm_pcrs` (1..=32 entries, index 0..31 → 48 bytes, as `digest` says),
//! `certificate` (DER, 1..=1024 bytes), `cabundle` (1 or more DER certificates, each 1..=1024
//! bytes, root first), and the caller's optional `public_key` (1..=1024 bytes), `user_data` and
//! `nonce` (0..=512 bytes each). No mandatory value may be null; an optional one that is null
//! (as the NSM encodes an absent one) is absent.
//!
//! [`verify`] checks, in this order: the size of the whole document; the COSE structure and
//! ES384; every payload field's type and bounds; the chain `certificate` ← `cabundle[n-1]` ←
//! … ← `cabundle[1]` ← `cabundle[0]`, where `cabundle[0]` must be byte for byte one of the
//! trusted roots ([`NitroRoots`]: AWS's `aws.nitro-enclaves` G1 root built in, or the config's);
//! names chaining (issuer = next subject), every signature (aws-lc-rs, through x509-parser), every
//! issuer a CA with keyCertSign ([`crate::issuer`]) within its pathLenConstraint, and every
//! certificate valid both at the document's `timestamp` (AWS vouched then) and at the
//! verification time (its key was not retired since: AWS's leaf certificates live hours, so an
//! old document cannot be replayed with its chain); then the COSE signature (ECDSA P-384
//! SHA-384, raw r‖s) by the leaf's key. What the fields must equal (nonce, user data, PCRs) is
//! the validator's business ([`super::AwsNitroTpmValidator`]).

use std::collections::BTreeMap;

use ciborium::value::Value;
use coset::{CborSerializable as _, CoseSign1, TaggedCborSerializable as _, iana};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer as _;
use x509_parser::time::ASN1Time;

use crate::issuer::{Usage, may_sign};

/// AWS's Nitro Attestation PKI root for the commercial partitions (`CN=aws.nitro-enclaves`,
/// P-384, valid 2019-10-28 to 2049-10-28), as AWS publishes it in `AWS_NitroEnclaves_Root-G1`
/// (SHA-256 of the DER: [`AWS_NITRO_ROOT_G1_SHA256`]).
pub const AWS_NITRO_ROOT_G1_PEM: &str = "-----BEGIN CERTIFICATE-----
MIICETCCAZagAwIBAgIRAPkxdWgbkK/hHUbMtOTn+FYwCgYIKoZIzj0EAwMwSTEL
MAkGA1UEBhMCVVMxDzANBgNVBAoMBkFtYXpvbjEMMAoGA1UECwwDQVdTMRswGQYD
VQQDDBJhd3Mubml0cm8tZW5jbGF2ZXMwHhcNMTkxMDI4MTMyODA1WhcNNDkxMDI4
MTQyODA1WjBJMQswCQYDVQQGEwJVUzEPMA0GA1UECgwGQW1hem9uMQwwCgYDVQQL
DANBV1MxGzAZBgNVBAMMEmF3cy5uaXRyby1lbmNsYXZlczB2MBAGByqGSM49AgEG
BSuBBAAiA2IABPwCVOumCMHzaHDimtqQvkY4MpJzbolL//Zy2YlES1BR5TSksfbb
48C8WBoyt7F2Bw7eEtaaP+ohG2bnUs990d0JX28TcPQXCEPZ3BABIeTPYwEoCWZE
h8l5YoQwTcU/9KNCMEAwDwYDVR0TAQH/BAUwAwEB/zAdBgNVHQ4EFgQUkCW1DdkF
R+eWw5b6cp3PmanfS5YwDgYDVR0PAQH/BAQDAgGGMAoGCCqGSM49BAMDA2kAMGYC
MQCjfy+Rocm9Xue4YnwWmNJVA44fA0P5W2OpYow9OYCVRaEevL8uO1XYru5xtMPW
rfMCMQCi85sWBbJwKKXdS6BptQFuZbT73o/gBh1qUxl/nNr12UO8Yfwr6wPLb+6N
IwLz3/Y=
-----END CERTIFICATE-----
";

/// The SHA-256 fingerprint AWS publishes for its Nitro root G1.
pub const AWS_NITRO_ROOT_G1_SHA256: &str =
    "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b";

/// The largest document read: a payload of at most 16 KiB (AWS's bound), its headers and a
/// 96-byte signature.
pub const MAX_DOCUMENT: usize = 17 * 1024;
/// The most CA certificates a `cabundle` may carry; AWS's chains have four.
pub const MAX_CABUNDLE: usize = 8;
/// AWS's bounds on the fields.
pub const MAX_CERT: usize = 1024;
pub const MAX_USER_DATA: usize = 512;
pub const MAX_NONCE: usize = 512;
pub const MAX_PUBLIC_KEY: usize = 1024;
pub const MAX_MODULE_ID: usize = 256;
/// The only `digest` AWS documents.
pub const DIGEST_SHA384: &str = "SHA384";

/// Why an AWS NitroTPM attestation document is refused. Each names the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NitroDocError {
    #[error("the AWS NitroTPM attestation document is {size} bytes, more than {MAX_DOCUMENT}")]
    TooLarge { size: usize },
    #[error("the AWS NitroTPM attestation document is not a COSE_Sign1: {0}")]
    Cose(String),
    #[error("the AWS NitroTPM attestation document is signed with {0}, not ES384")]
    Algorithm(String),
    #[error("the AWS NitroTPM attestation document's payload is malformed: {0}")]
    Payload(String),
    #[error("the AWS NitroTPM attestation document's digest is {0:?}, not \"SHA384\"")]
    Digest(String),
    #[error(
        "the AWS NitroTPM attestation document's {which} is not an X.509 certificate: {reason}"
    )]
    Certificate { which: String, reason: String },
    #[error(
        "the AWS NitroTPM attestation document does not chain to a trusted Nitro root: its cabundle starts with {subject} (SHA-256 {sha256}); trusted: {trusted}"
    )]
    ForeignRoot {
        subject: String,
        sha256: String,
        trusted: String,
    },
    #[error("the AWS NitroTPM attestation document's certificate chain is broken: {0}")]
    Chain(String),
    #[error("the AWS NitroTPM attestation document's {which} is not valid {when}: {reason}")]
    Validity {
        which: String,
        when: &'static str,
        reason: String,
    },
    #[error(
        "the AWS NitroTPM attestation document's signature does not verify with its certificate: {0}"
    )]
    Signature(String),
    /// The document was made for another connection (or none): its nonce is not this
    /// connection's extraData.
    #[error(
        "the AWS NitroTPM attestation document's nonce is not this connection's extraData (stale or from another connection)"
    )]
    NonceMismatch,
    /// The document's user_data is not the SHA-256 of the attestation key's public area.
    #[error(
        "the AWS NitroTPM attestation document does not bind the attestation key: its user_data is not SHA-256 of the AK's TPMT_PUBLIC (sha256:{ak})"
    )]
    AkNotBound { ak: String },
    /// AWS's word on a PCR differs from what the AK quoted.
    #[error(
        "the AWS NitroTPM attestation document's PCR {index} differs from the quote's SHA-384 PCR {index}"
    )]
    PcrMismatch { index: u32 },
    /// A PCR the policy checks is absent from the document or the quote.
    #[error("PCR {index}, which the policy checks, is absent from {from}")]
    PcrMissing { index: u32, from: &'static str },
    /// The policy's values are not of the bank AWS signs, so the document cannot vouch for them.
    #[error(
        "the AWS NitroTPM attestation document vouches for SHA-384 PCRs, but the policy's measurements are {len}-byte values: write them as SHA-384 values"
    )]
    PolicyBank { len: usize },
    /// The node sent no document and the config requires one.
    #[error(
        "the node sent no AWS NitroTPM attestation document, and the attestation config requires one (requireNitroTpmAttestation)"
    )]
    Required,
    /// InstanceInfo's document field is not base64.
    #[error("InstanceInfo's nitroTpmAttestationDocument is not standard base64")]
    Base64,
}

/// The Nitro roots a verifier trusts, as DER certificates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NitroRoots {
    roots: Vec<Vec<u8>>,
}

impl NitroRoots {
    /// AWS's Nitro root G1.
    pub fn aws() -> NitroRoots {
        // The constant is a well-formed PEM (checked by a test): no input reaches this.
        NitroRoots::from_pem(AWS_NITRO_ROOT_G1_PEM).unwrap_or(NitroRoots { roots: Vec::new() })
    }

    /// Every certificate of `pem`; refuses text without one or with one that does not parse.
    pub fn from_pem(pem: &str) -> Result<NitroRoots, NitroDocError> {
        let mut roots = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
            let block = block.map_err(|e| NitroDocError::Certificate {
                which: "configured root".to_owned(),
                reason: e.to_string(),
            })?;
            X509Certificate::from_der(&block.contents).map_err(|e| NitroDocError::Certificate {
                which: "configured root".to_owned(),
                reason: e.to_string(),
            })?;
            roots.push(block.contents);
        }
        if roots.is_empty() {
            return Err(NitroDocError::Certificate {
                which: "configured root".to_owned(),
                reason: "no PEM certificate".to_owned(),
            });
        }
        Ok(NitroRoots { roots })
    }

    /// The DER certificates `roots`; refuses an empty list or one that does not parse.
    pub fn from_der(roots: Vec<Vec<u8>>) -> Result<NitroRoots, NitroDocError> {
        if roots.is_empty() {
            return Err(NitroDocError::Certificate {
                which: "configured root".to_owned(),
                reason: "no certificate".to_owned(),
            });
        }
        for root in &roots {
            X509Certificate::from_der(root).map_err(|e| NitroDocError::Certificate {
                which: "configured root".to_owned(),
                reason: e.to_string(),
            })?;
        }
        Ok(NitroRoots { roots })
    }

    /// The SHA-256 of each root's DER, for the config digest and refusals.
    pub fn fingerprints(&self) -> Vec<String> {
        self.roots.iter().map(|r| sha256_hex(r)).collect()
    }

    fn describe(&self) -> String {
        self.roots
            .iter()
            .map(|r| {
                let subject = X509Certificate::from_der(r)
                    .map(|(_, c)| c.subject().to_string())
                    .unwrap_or_default();
                format!("{subject} SHA-256 {}", sha256_hex(r))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes))
}

/// A parsed document whose signature and chain verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NitroDocument {
    pub module_id: String,
    /// Milliseconds since the epoch.
    pub timestamp_ms: u64,
    pub digest: String,
    pub pcrs: BTreeMap<u32, Vec<u8>>,
    pub certificate: Vec<u8>,
    pub cabundle: Vec<Vec<u8>>,
    pub public_key: Option<Vec<u8>>,
    pub user_data: Option<Vec<u8>>,
    pub nonce: Option<Vec<u8>>,
}

/// Parses the COSE envelope and the payload, checking structure and bounds only: nothing in the
/// result is trusted. Exposed for the fuzz target and `attest-tool`.
pub fn parse(bytes: &[u8]) -> Result<(CoseSign1, NitroDocument), NitroDocError> {
    if bytes.len() > MAX_DOCUMENT {
        return Err(NitroDocError::TooLarge { size: bytes.len() });
    }
    // AWS's tooling emits the untagged array; RFC 9052 allows tag 18 too.
    let sign1 = if bytes.first() == Some(&0xd2) {
        CoseSign1::from_tagged_slice(bytes)
    } else {
        CoseSign1::from_slice(bytes)
    }
    .map_err(|e| NitroDocError::Cose(e.to_string()))?;
    match &sign1.protected.header.alg {
        Some(coset::RegisteredLabelWithPrivate::Assigned(iana::Algorithm::ES384)) => {}
        Some(other) => return Err(NitroDocError::Algorithm(format!("{other:?}"))),
        None => return Err(NitroDocError::Algorithm("no algorithm".to_owned())),
    }
    let payload = sign1
        .payload
        .as_deref()
        .ok_or_else(|| NitroDocError::Cose("no payload".to_owned()))?;
    let doc = parse_payload(payload)?;
    Ok((sign1, doc))
}

fn parse_payload(payload: &[u8]) -> Result<NitroDocument, NitroDocError> {
    let bad = |m: String| NitroDocError::Payload(m);
    let value: Value =
        ciborium::de::from_reader(payload).map_err(|e| bad(format!("not CBOR: {e}")))?;
    let Value::Map(entries) = value else {
        return Err(bad("not a CBOR map".to_owned()));
    };
    let mut fields: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in entries {
        let Value::Text(key) = key else {
            return Err(bad("a key is not text".to_owned()));
        };
        if value.is_null() {
            // The NSM encodes an absent optional field as null; a null mandatory one is refused.
            if matches!(key.as_str(), "public_key" | "user_data" | "nonce") {
                continue;
            }
            return Err(bad(format!(
                "{} is null",
                key.chars().take(40).collect::<String>()
            )));
        }
        let shown = key.chars().take(40).collect::<String>();
        if fields.insert(key, value).is_some() {
            return Err(bad(format!("{shown} appears twice")));
        }
    }
    let mut take = |name: &'static str| fields.remove(name);
    let bytes = |name: &'static str, v: Value, min: usize, max: usize| match v {
        Value::Bytes(b) if (min..=max).contains(&b.len()) => Ok(b),
        Value::Bytes(b) => Err(bad(format!(
            "{name} is {} bytes, not {min}..={max}",
            b.len()
        ))),
        _ => Err(bad(format!("{name} is not a byte string"))),
    };
    let module_id = match take("module_id") {
        Some(Value::Text(t)) if !t.is_empty() && t.len() <= MAX_MODULE_ID => t,
        Some(_) => {
            return Err(bad(format!(
                "module_id is not text of 1..={MAX_MODULE_ID} bytes"
            )));
        }
        None => return Err(bad("module_id is missing".to_owned())),
    };
    let timestamp_ms = match take("timestamp") {
        Some(Value::Integer(i)) => u64::try_from(i)
            .ok()
            .filter(|&t| t > 0)
            .ok_or_else(|| bad("timestamp is not a positive 64-bit integer".to_owned()))?,
        Some(_) => return Err(bad("timestamp is not an integer".to_owned())),
        None => return Err(bad("timestamp is missing".to_owned())),
    };
    let digest = match take("digest") {
        Some(Value::Text(t)) if t == DIGEST_SHA384 => t,
        Some(Value::Text(t)) => return Err(NitroDocError::Digest(t.chars().take(40).collect())),
        Some(_) => return Err(bad("digest is not text".to_owned())),
        None => return Err(bad("digest is missing".to_owned())),
    };
    let pcrs = match take("nitrotpm_pcrs") {
        Some(Value::Map(entries)) => {
            if entries.is_empty() || entries.len() > 32 {
                return Err(bad(format!(
                    "nitrotpm_pcrs has {} entries, not 1..=32",
                    entries.len()
                )));
            }
            let mut pcrs = BTreeMap::new();
            for (index, value) in entries {
                let index = match index {
                    Value::Integer(i) => u32::try_from(i).ok().filter(|&i| i < 32),
                    _ => None,
                }
                .ok_or_else(|| bad("a nitrotpm_pcrs index is not an integer 0..31".to_owned()))?;
                let value = match value {
                    Value::Bytes(b) if b.len() == 48 => b,
                    Value::Bytes(b) => {
                        return Err(bad(format!(
                            "nitrotpm_pcrs[{index}] is {} bytes, not the 48 of SHA-384",
                            b.len()
                        )));
                    }
                    _ => return Err(bad(format!("nitrotpm_pcrs[{index}] is not bytes"))),
                };
                if pcrs.insert(index, value).is_some() {
                    return Err(bad(format!("nitrotpm_pcrs[{index}] appears twice")));
                }
            }
            pcrs
        }
        Some(_) => return Err(bad("nitrotpm_pcrs is not a map".to_owned())),
        None => return Err(bad("nitrotpm_pcrs is missing".to_owned())),
    };
    let certificate = bytes(
        "certificate",
        take("certificate").ok_or_else(|| bad("certificate is missing".to_owned()))?,
        1,
        MAX_CERT,
    )?;
    let cabundle = match take("cabundle") {
        Some(Value::Array(items)) => {
            if items.is_empty() || items.len() > MAX_CABUNDLE {
                return Err(bad(format!(
                    "cabundle has {} certificates, not 1..={MAX_CABUNDLE}",
                    items.len()
                )));
            }
            items
                .into_iter()
                .map(|item| bytes("a cabundle certificate", item, 1, MAX_CERT))
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => return Err(bad("cabundle is not an array".to_owned())),
        None => return Err(bad("cabundle is missing".to_owned())),
    };
    let public_key = take("public_key")
        .map(|v| bytes("public_key", v, 1, MAX_PUBLIC_KEY))
        .transpose()?;
    let user_data = take("user_data")
        .map(|v| bytes("user_data", v, 0, MAX_USER_DATA))
        .transpose()?;
    let nonce = take("nonce")
        .map(|v| bytes("nonce", v, 0, MAX_NONCE))
        .transpose()?;
    // Other keys are ignored: AWS may add fields, and nothing here depends on them.
    Ok(NitroDocument {
        module_id,
        timestamp_ms,
        digest,
        pcrs,
        certificate,
        cabundle,
        public_key,
        user_data,
        nonce,
    })
}

/// Parses and verifies `bytes` against `roots` at `now` (seconds since the epoch); see the module
/// documentation for what is checked.
pub fn verify(bytes: &[u8], roots: &NitroRoots, now: i64) -> Result<NitroDocument, NitroDocError> {
    let (sign1, doc) = parse(bytes)?;
    let timestamp = i64::try_from(doc.timestamp_ms / 1000)
        .map_err(|_| NitroDocError::Payload("timestamp is out of range".to_owned()))?;
    let leaf_key = verify_chain(
        &doc,
        roots,
        &[(timestamp, "at the document's timestamp"), (now, "now")],
    )?;
    let key = aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P384_SHA384_FIXED,
        leaf_key,
    );
    sign1
        .verify_signature(b"", |signature, data| key.verify(data, signature))
        .map_err(|_| {
            NitroDocError::Signature(format!(
                "ECDSA P-384 SHA-384 over the Sig_structure fails ({} signature bytes)",
                sign1.signature.len()
            ))
        })?;
    Ok(doc)
}

/// The chain checks; returns the leaf's P-384 public point.
fn verify_chain(
    doc: &NitroDocument,
    roots: &NitroRoots,
    times: &[(i64, &'static str)],
) -> Result<Vec<u8>, NitroDocError> {
    let root_der = &doc.cabundle[0];
    if !roots.roots.iter().any(|r| r == root_der) {
        let subject = X509Certificate::from_der(root_der)
            .map(|(_, c)| c.subject().to_string())
            .unwrap_or_else(|_| "an unparsable certificate".to_owned());
        return Err(NitroDocError::ForeignRoot {
            subject,
            sha256: sha256_hex(root_der),
            trusted: roots.describe(),
        });
    }
    // Root first, leaf last: each certificate is signed by the one before it.
    let mut chain = Vec::with_capacity(doc.cabundle.len() + 1);
    for (i, der) in doc.cabundle.iter().chain([&doc.certificate]).enumerate() {
        let which = if i == doc.cabundle.len() {
            "certificate".to_owned()
        } else {
            format!("cabundle[{i}]")
        };
        let (rest, cert) =
            X509Certificate::from_der(der).map_err(|e| NitroDocError::Certificate {
                which: which.clone(),
                reason: e.to_string(),
            })?;
        if !rest.is_empty() {
            return Err(NitroDocError::Certificate {
                which,
                reason: "trailing bytes after the certificate".to_owned(),
            });
        }
        chain.push((which, cert));
    }
    for (which, cert) in &chain {
        for &(at, when) in times {
            let time = ASN1Time::from_timestamp(at).map_err(|e| NitroDocError::Validity {
                which: which.clone(),
                when,
                reason: e.to_string(),
            })?;
            if !cert.validity().is_valid_at(time) {
                return Err(NitroDocError::Validity {
                    which: which.clone(),
                    when,
                    reason: format!(
                        "{} is valid from {} to {}",
                        cert.subject(),
                        cert.validity().not_before,
                        cert.validity().not_after
                    ),
                });
            }
        }
    }
    for i in 1..chain.len() {
        let (issuer_name, issuer) = &chain[i - 1];
        let (subject_name, subject) = &chain[i];
        if subject.issuer().as_raw() != issuer.subject().as_raw() {
            return Err(NitroDocError::Chain(format!(
                "{subject_name}'s issuer {} is not {issuer_name}'s subject {}",
                subject.issuer(),
                issuer.subject()
            )));
        }
        may_sign(issuer, Usage::Certificates)
            .map_err(|reason| NitroDocError::Chain(format!("{issuer_name} {reason}")))?;
        // RFC 5280 4.2.1.9: CA certificates below this one, the leaf not counted.
        let cas_below = chain.len() - 1 - i;
        if let Ok(Some(bc)) = issuer.basic_constraints()
            && let Some(limit) = bc.value.path_len_constraint
            && cas_below > limit as usize
        {
            return Err(NitroDocError::Chain(format!(
                "{issuer_name} allows {limit} CA certificates below it, the chain has {cas_below}"
            )));
        }
        subject
            .verify_signature(Some(issuer.public_key()))
            .map_err(|e| {
                NitroDocError::Chain(format!(
                    "{subject_name} is not signed by {issuer_name}: {e}"
                ))
            })?;
    }
    let (_, leaf) = &chain[chain.len() - 1];
    let spki = leaf.public_key();
    let p384 = x509_parser::oid_registry::OID_NIST_EC_P384;
    let curve_ok = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .is_some_and(|oid| oid == p384);
    if spki.algorithm.algorithm != x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        || !curve_ok
    {
        return Err(NitroDocError::Chain(
            "the signing certificate's key is not an ECDSA P-384 key".to_owned(),
        ));
    }
    Ok(spki.subject_public_key.data.to_vec())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_built_in_root_is_awss_published_g1() {
        let roots = NitroRoots::aws();
        assert_eq!(
            roots.fingerprints(),
            vec![AWS_NITRO_ROOT_G1_SHA256.to_owned()]
        );
        let (_, cert) = X509Certificate::from_der(&roots.roots[0]).unwrap();
        assert!(cert.subject().to_string().contains("CN=aws.nitro-enclaves"));
        may_sign(&cert, Usage::Certificates).unwrap();
    }

    #[test]
    fn garbage_and_oversize_are_refused_by_name() {
        assert!(matches!(parse(b"\x01\x02"), Err(NitroDocError::Cose(_))));
        let big = vec![0u8; MAX_DOCUMENT + 1];
        assert!(matches!(parse(&big), Err(NitroDocError::TooLarge { .. })));
    }
}
