//! A simulated AWS Nitro Attestation PKI that issues NitroTPM attestation documents as EC2's
//! Nitro system does, for tests only: a P-384 root (`CN=<name>.nitro-enclaves`, C=US, O=Amazon,
//! OU=AWS, as AWS names its partitions' roots), a chain of intermediates with pathlen 2, 1 and
//! 0, and a leaf signing key, all ECDSA P-384 with SHA-384, carrying the extensions AWS's
//! certificates carry (critical BasicConstraints, critical KeyUsage: digitalSignature,
//! keyCertSign and cRLSign on CAs, digitalSignature on the leaf; subject and authority key
//! identifiers). Documents are untagged `COSE_Sign1` with ES384 in the protected header and the
//! payload map of AWS's EC2 user guide (`nitrotpm_pcrs`, SHA-384 values), `cabundle` root first.

use std::collections::BTreeMap;

use aws_lc_rs::signature::{ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair};
use ciborium::value::Value;
use coset::{CborSerializable as _, CoseSign1Builder, HeaderBuilder, iana};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P384_SHA384,
};

/// What a simulated document carries.
#[derive(Clone, Debug, Default)]
pub struct NitroRequest {
    pub pcrs: BTreeMap<u32, Vec<u8>>,
    pub user_data: Option<Vec<u8>>,
    pub nonce: Option<Vec<u8>>,
    pub public_key: Option<Vec<u8>>,
    /// Milliseconds since the epoch; now if 0.
    pub timestamp_ms: u64,
}

/// The simulated PKI: its root, intermediates and signing key.
pub struct NitroPki {
    /// DER, root first.
    cabundle: Vec<Vec<u8>>,
    leaf: Vec<u8>,
    leaf_key: EcdsaKeyPair,
    root_pem: String,
    chain_pem: String,
}

impl std::fmt::Debug for NitroPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NitroPki").finish_non_exhaustive()
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CountryName, "US");
    dn.push(DnType::OrganizationName, "Amazon");
    dn.push(DnType::OrganizationalUnitName, "AWS");
    dn.push(DnType::CommonName, cn);
    dn
}

fn params(cn: &str, ca: Option<u8>, from: i64, to: i64) -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = name(cn);
    p.not_before = time::OffsetDateTime::from_unix_timestamp(from)?;
    p.not_after = time::OffsetDateTime::from_unix_timestamp(to)?;
    p.use_authority_key_identifier_extension = true;
    match ca {
        Some(255) => {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        Some(len) => {
            p.is_ca = IsCa::Ca(BasicConstraints::Constrained(len));
        }
        None => {
            p.is_ca = IsCa::ExplicitNoCa;
        }
    }
    p.key_usages = if ca.is_some() {
        vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ]
    } else {
        vec![KeyUsagePurpose::DigitalSignature]
    };
    Ok(p)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

impl NitroPki {
    /// A PKI whose root is `CN=<partition>.nitro-enclaves`; its leaf is valid for three hours
    /// around now, as AWS's are short-lived.
    pub fn new(partition: &str) -> anyhow::Result<NitroPki> {
        let t = now();
        NitroPki::with_leaf_validity(partition, t - 3600, t + 3 * 3600)
    }

    /// A PKI whose leaf is valid from `from` to `to` (seconds since the epoch).
    pub fn with_leaf_validity(partition: &str, from: i64, to: i64) -> anyhow::Result<NitroPki> {
        let t = now();
        let root_key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384)?;
        let root_params = params(
            &format!("{partition}.nitro-enclaves"),
            Some(255),
            t - 86400 * 365,
            t + 86400 * 365 * 30,
        )?;
        let root = root_params.self_signed(&root_key)?;
        let mut cabundle = vec![root.der().to_vec()];
        let mut chain_pem = String::new();
        let mut issuer = Issuer::new(root_params, root_key);
        for (i, len) in [2u8, 1, 0].into_iter().enumerate() {
            let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384)?;
            let p = params(
                &format!("{i}.{partition}.nitro-enclaves.simulated"),
                Some(len),
                t - 86400,
                t + 86400 * (30 - 10 * i as i64),
            )?;
            let cert = p.signed_by(&key, &issuer)?;
            cabundle.push(cert.der().to_vec());
            chain_pem.insert_str(0, &pem(cert.der()));
            issuer = Issuer::new(p, key);
        }
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384)?;
        let leaf = params("i-0fedcba9876543210.simulated.nitro", None, from, to)?
            .signed_by(&leaf_key, &issuer)?;
        let signer =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, &leaf_key.serialize_der())
                .map_err(|e| anyhow::anyhow!("the leaf key: {e}"))?;
        Ok(NitroPki {
            root_pem: pem(&cabundle[0]),
            cabundle,
            leaf: leaf.der().to_vec(),
            leaf_key: signer,
            chain_pem,
        })
    }

    /// The root, PEM (what `nitroTpmRoots` names).
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// The intermediates, PEM, leaf side first (for `openssl verify -untrusted`).
    pub fn intermediates_pem(&self) -> &str {
        &self.chain_pem
    }

    /// The signing certificate, PEM.
    pub fn leaf_pem(&self) -> String {
        pem(&self.leaf)
    }

    /// The payload map of a document.
    pub fn payload(&self, request: &NitroRequest) -> Value {
        let ts = if request.timestamp_ms == 0 {
            now() as u64 * 1000
        } else {
            request.timestamp_ms
        };
        let text = |s: &str| Value::Text(s.to_owned());
        let mut map = vec![
            (text("module_id"), text("i-0fedcba9876543210-nitrotpm")),
            (text("digest"), text("SHA384")),
            (text("timestamp"), Value::Integer(ts.into())),
            (
                text("nitrotpm_pcrs"),
                Value::Map(
                    request
                        .pcrs
                        .iter()
                        .map(|(i, v)| (Value::Integer((*i).into()), Value::Bytes(v.clone())))
                        .collect(),
                ),
            ),
            (text("certificate"), Value::Bytes(self.leaf.clone())),
            (
                text("cabundle"),
                Value::Array(self.cabundle.iter().cloned().map(Value::Bytes).collect()),
            ),
        ];
        for (key, value) in [
            ("public_key", &request.public_key),
            ("user_data", &request.user_data),
            ("nonce", &request.nonce),
        ] {
            map.push((
                text(key),
                value.clone().map(Value::Bytes).unwrap_or(Value::Null),
            ));
        }
        Value::Map(map)
    }

    /// A signed document for `request`.
    pub fn document(&self, request: &NitroRequest) -> anyhow::Result<Vec<u8>> {
        self.sign(&self.payload(request))
    }

    /// Signs any payload map as the leaf (tests of malformed payloads).
    pub fn sign(&self, payload: &Value) -> anyhow::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(payload, &mut bytes)?;
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let mut failed = false;
        let sign1 = CoseSign1Builder::new()
            .protected(
                HeaderBuilder::new()
                    .algorithm(iana::Algorithm::ES384)
                    .build(),
            )
            .payload(bytes)
            .create_signature(b"", |data| match self.leaf_key.sign(&rng, data) {
                Ok(sig) => sig.as_ref().to_vec(),
                Err(_) => {
                    failed = true;
                    Vec::new()
                }
            })
            .build();
        anyhow::ensure!(!failed, "signing failed");
        sign1
            .to_vec()
            .map_err(|e| anyhow::anyhow!("encoding the COSE_Sign1: {e}"))
    }
}
