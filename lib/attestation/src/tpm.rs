//! TPM 2.0 wire structures, parsed from untrusted bytes.
//!
//! A node sends these inside its attestation document: the attestation key's public area
//! (`TPMT_PUBLIC`), the quote (`TPMS_ATTEST`) and its signature (`TPMT_SIGNATURE`). Everything
//! is big-endian; variable-size buffers are `TPM2B`s (a `u16` length, then the bytes). Every
//! length is checked against the largest value the TPM specification allows for that field
//! before anything is allocated, every structure must be consumed exactly, and no input can make
//! a parser panic: these functions are the first code to touch bytes from an unauthenticated
//! peer (and are fuzzed).

use std::fmt;

/// TPM algorithm identifiers (TPM 2.0 Part 2, table "TPM_ALG_ID") that these parsers name.
pub mod alg {
    pub const RSA: u16 = 0x0001;
    pub const SHA1: u16 = 0x0004;
    pub const HMAC: u16 = 0x0005;
    pub const AES: u16 = 0x0006;
    pub const KEYEDHASH: u16 = 0x0008;
    pub const XOR: u16 = 0x000a;
    pub const SHA256: u16 = 0x000b;
    pub const SHA384: u16 = 0x000c;
    pub const SHA512: u16 = 0x000d;
    pub const NULL: u16 = 0x0010;
    pub const SM3_256: u16 = 0x0012;
    pub const SM4: u16 = 0x0013;
    pub const RSASSA: u16 = 0x0014;
    pub const RSAES: u16 = 0x0015;
    pub const RSAPSS: u16 = 0x0016;
    pub const OAEP: u16 = 0x0017;
    pub const ECDSA: u16 = 0x0018;
    pub const ECDH: u16 = 0x0019;
    pub const ECDAA: u16 = 0x001a;
    pub const SM2: u16 = 0x001b;
    pub const ECSCHNORR: u16 = 0x001c;
    pub const ECMQV: u16 = 0x001d;
    pub const KDF1_SP800_56A: u16 = 0x0020;
    pub const KDF2: u16 = 0x0021;
    pub const KDF1_SP800_108: u16 = 0x0022;
    pub const ECC: u16 = 0x0023;
    pub const SYMCIPHER: u16 = 0x0025;
    pub const CAMELLIA: u16 = 0x0026;
}

/// TPM ECC curve identifiers (TPM_ECC_CURVE).
pub mod curve {
    pub const NIST_P256: u16 = 0x0003;
    pub const NIST_P384: u16 = 0x0004;
    pub const NIST_P521: u16 = 0x0005;
}

/// `TPM_GENERATED_VALUE`: every structure the TPM signs itself starts with it, so a restricted
/// key can never be made to sign something that looks like a quote.
pub const TPM_GENERATED: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_QUOTE`: the structure tag of a `TPMS_ATTEST` produced by TPM2_Quote.
pub const ST_ATTEST_QUOTE: u16 = 0x8018;

/// `TPMA_OBJECT` bits the validator looks at.
pub mod object_attributes {
    pub const FIXED_TPM: u32 = 1 << 1;
    pub const FIXED_PARENT: u32 = 1 << 4;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    pub const RESTRICTED: u32 = 1 << 16;
    pub const DECRYPT: u32 = 1 << 17;
    pub const SIGN_ENCRYPT: u32 = 1 << 18;
}

/// The largest digest any supported hash produces (SHA-512); bounds `TPM2B_DIGEST`/`TPM2B_DATA`.
pub const MAX_DIGEST_SIZE: usize = 64;
/// `TPM2B_NAME` holds an algorithm id plus a digest, or a 4-byte handle.
pub const MAX_NAME_SIZE: usize = 2 + MAX_DIGEST_SIZE;
/// RSA moduli and signatures up to 8192 bits (TPMs implement at most 4096; aws-lc-rs verifies up to
/// 8192, so nothing legitimate is refused here).
pub const MAX_RSA_KEY_BYTES: usize = 1024;
/// ECC coordinates and signature scalars up to P-521 (66 bytes).
pub const MAX_ECC_KEY_BYTES: usize = 66;
/// The TPM has at most one selection per implemented hash algorithm.
pub const MAX_PCR_SELECTIONS: usize = 16;
/// A PCR selection bitmap; PC Client TPMs use 3 bytes (24 PCRs), the format allows more.
pub const MAX_PCR_SELECT_BYTES: usize = 8;

/// Why bytes are not the TPM structure they were supposed to be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The input ended inside a field.
    #[error("truncated: input ended inside {what}")]
    Truncated { what: &'static str },
    /// A length prefix or count exceeds what the TPM specification allows for the field.
    #[error("{what} has size {size}, more than the maximum of {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    /// Bytes follow the end of the structure.
    #[error("{count} unexpected bytes after the end of the structure")]
    TrailingBytes { count: usize },
    /// An algorithm or type this parser does not handle (or that is invalid in this field).
    #[error("unsupported {what} 0x{id:04x}")]
    Unsupported { what: &'static str, id: u16 },
    /// The `TPMS_ATTEST` does not start with `TPM_GENERATED`, so the TPM did not produce it.
    #[error("magic 0x{0:08x} is not TPM_GENERATED (0xff544347)")]
    BadMagic(u32),
    /// The `TPMS_ATTEST` is some other attestation (certify, time, ...), not a quote.
    #[error("structure tag 0x{0:04x} is not TPM_ST_ATTEST_QUOTE (0x8018)")]
    NotAQuote(u16),
}

/// A cursor over untrusted bytes whose every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ParseError> {
        if self.buf.len() < n {
            return Err(ParseError::Truncated { what });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ParseError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, ParseError> {
        Ok(u8::from_be_bytes(self.array(what)?))
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, ParseError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ParseError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, ParseError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// A `TPM2B`: the length is checked against `limit` before the bytes are taken.
    fn tpm2b(&mut self, limit: usize, what: &'static str) -> Result<Vec<u8>, ParseError> {
        let size = usize::from(self.u16(what)?);
        if size > limit {
            return Err(ParseError::TooLarge { what, size, limit });
        }
        Ok(self.bytes(size, what)?.to_vec())
    }

    fn finish(self) -> Result<(), ParseError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ParseError::TrailingBytes {
                count: self.buf.len(),
            })
        }
    }
}

/// A hash algorithm as TPM structures name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashAlg {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl HashAlg {
    /// The algorithm for a `TPM_ALG_ID`, if it is one of the supported hashes.
    pub fn from_id(id: u16) -> Option<HashAlg> {
        match id {
            alg::SHA1 => Some(HashAlg::Sha1),
            alg::SHA256 => Some(HashAlg::Sha256),
            alg::SHA384 => Some(HashAlg::Sha384),
            alg::SHA512 => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    /// The `TPM_ALG_ID`.
    pub fn id(self) -> u16 {
        match self {
            HashAlg::Sha1 => alg::SHA1,
            HashAlg::Sha256 => alg::SHA256,
            HashAlg::Sha384 => alg::SHA384,
            HashAlg::Sha512 => alg::SHA512,
        }
    }

    /// The digest size in bytes (also the size of a PCR in this bank).
    pub fn digest_len(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha256 => 32,
            HashAlg::Sha384 => 48,
            HashAlg::Sha512 => 64,
        }
    }

    /// The hash whose digests have this length (the PCR bank of such measurements).
    pub fn from_digest_len(len: usize) -> Option<HashAlg> {
        [
            HashAlg::Sha1,
            HashAlg::Sha256,
            HashAlg::Sha384,
            HashAlg::Sha512,
        ]
        .into_iter()
        .find(|h| h.digest_len() == len)
    }

    /// The provider's implementation of this hash.
    pub fn digest_algorithm(self) -> &'static aws_lc_rs::digest::Algorithm {
        match self {
            HashAlg::Sha1 => &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
            HashAlg::Sha256 => &aws_lc_rs::digest::SHA256,
            HashAlg::Sha384 => &aws_lc_rs::digest::SHA384,
            HashAlg::Sha512 => &aws_lc_rs::digest::SHA512,
        }
    }

    /// Hashes `data`.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        aws_lc_rs::digest::digest(self.digest_algorithm(), data)
            .as_ref()
            .to_vec()
    }
}

impl fmt::Display for HashAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HashAlg::Sha1 => "SHA-1",
            HashAlg::Sha256 => "SHA-256",
            HashAlg::Sha384 => "SHA-384",
            HashAlg::Sha512 => "SHA-512",
        })
    }
}

/// `TPMT_SYM_DEF_OBJECT`: the symmetric algorithm of a storage key (`None` for `TPM_ALG_NULL`,
/// which every signing key has).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymDefObject {
    pub algorithm: u16,
    pub key_bits: u16,
    pub mode: u16,
}

fn parse_sym_def_object(r: &mut Reader<'_>) -> Result<Option<SymDefObject>, ParseError> {
    let algorithm = r.u16("symmetric algorithm")?;
    match algorithm {
        alg::NULL => Ok(None),
        alg::AES | alg::SM4 | alg::CAMELLIA => Ok(Some(SymDefObject {
            algorithm,
            key_bits: r.u16("symmetric key bits")?,
            mode: r.u16("symmetric mode")?,
        })),
        id => Err(ParseError::Unsupported {
            what: "symmetric algorithm",
            id,
        }),
    }
}

/// A key's or signature's scheme: the algorithm and, for signing schemes, its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// `TPM_ALG_ID` of the scheme (RSASSA, RSAPSS, ECDSA, ...).
    pub scheme: u16,
    /// The scheme's hash, `None` for schemes without one (RSAES).
    pub hash: Option<u16>,
    /// ECDAA's commit count.
    pub count: Option<u16>,
}

fn parse_rsa_scheme(r: &mut Reader<'_>) -> Result<Option<Scheme>, ParseError> {
    let scheme = r.u16("RSA scheme")?;
    match scheme {
        alg::NULL => Ok(None),
        alg::RSAES => Ok(Some(Scheme {
            scheme,
            hash: None,
            count: None,
        })),
        alg::RSASSA | alg::RSAPSS | alg::OAEP => Ok(Some(Scheme {
            scheme,
            hash: Some(r.u16("RSA scheme hash")?),
            count: None,
        })),
        id => Err(ParseError::Unsupported {
            what: "RSA scheme",
            id,
        }),
    }
}

fn parse_ecc_scheme(r: &mut Reader<'_>) -> Result<Option<Scheme>, ParseError> {
    let scheme = r.u16("ECC scheme")?;
    match scheme {
        alg::NULL => Ok(None),
        alg::ECDSA | alg::ECDH | alg::SM2 | alg::ECSCHNORR | alg::ECMQV => Ok(Some(Scheme {
            scheme,
            hash: Some(r.u16("ECC scheme hash")?),
            count: None,
        })),
        alg::ECDAA => Ok(Some(Scheme {
            scheme,
            hash: Some(r.u16("ECC scheme hash")?),
            count: Some(r.u16("ECDAA count")?),
        })),
        id => Err(ParseError::Unsupported {
            what: "ECC scheme",
            id,
        }),
    }
}

fn parse_kdf_scheme(r: &mut Reader<'_>) -> Result<Option<Scheme>, ParseError> {
    let scheme = r.u16("KDF scheme")?;
    match scheme {
        alg::NULL => Ok(None),
        alg::KDF1_SP800_56A | alg::KDF2 | alg::KDF1_SP800_108 => Ok(Some(Scheme {
            scheme,
            hash: Some(r.u16("KDF hash")?),
            count: None,
        })),
        id => Err(ParseError::Unsupported {
            what: "KDF scheme",
            id,
        }),
    }
}

/// The algorithm-specific part of a `TPMT_PUBLIC`: parameters and unique (the public key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    Rsa {
        symmetric: Option<SymDefObject>,
        scheme: Option<Scheme>,
        key_bits: u16,
        /// The public exponent; the TPM encodes the default 65537 as 0, which this keeps.
        exponent: u32,
        modulus: Vec<u8>,
    },
    Ecc {
        symmetric: Option<SymDefObject>,
        scheme: Option<Scheme>,
        curve: u16,
        kdf: Option<Scheme>,
        x: Vec<u8>,
        y: Vec<u8>,
    },
}

/// Why a key has no SubjectPublicKeyInfo.
#[derive(Debug, thiserror::Error)]
pub enum SpkiError {
    #[error("encoding the key: {0}")]
    Der(spki::der::Error),
    #[error(
        "ECC curve 0x{0:04x} (or a coordinate longer than its field) has no SubjectPublicKeyInfo here (P-256 and P-384 do)"
    )]
    Curve(u16),
}

/// `TPMT_PUBLIC` of an asymmetric key (the attestation key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Public {
    /// The hash used for the key's name.
    pub name_alg: u16,
    /// `TPMA_OBJECT` bits (see [`object_attributes`]).
    pub object_attributes: u32,
    pub auth_policy: Vec<u8>,
    pub key: PublicKey,
}

impl Public {
    /// Parses a complete `TPMT_PUBLIC` (no TPM2B size prefix; what go-tpm-tools puts in
    /// `ak_pub`). Keyed-hash and symmetric objects are refused: an AK is RSA or ECC.
    pub fn parse(bytes: &[u8]) -> Result<Public, ParseError> {
        let mut r = Reader::new(bytes);
        let public = Self::read(&mut r)?;
        r.finish()?;
        Ok(public)
    }

    fn read(r: &mut Reader<'_>) -> Result<Public, ParseError> {
        let key_type = r.u16("public area type")?;
        let name_alg = r.u16("name algorithm")?;
        let object_attributes = r.u32("object attributes")?;
        let auth_policy = r.tpm2b(MAX_DIGEST_SIZE, "auth policy")?;
        let key = match key_type {
            alg::RSA => {
                let symmetric = parse_sym_def_object(r)?;
                let scheme = parse_rsa_scheme(r)?;
                let key_bits = r.u16("RSA key bits")?;
                let exponent = r.u32("RSA exponent")?;
                let modulus = r.tpm2b(MAX_RSA_KEY_BYTES, "RSA modulus")?;
                PublicKey::Rsa {
                    symmetric,
                    scheme,
                    key_bits,
                    exponent,
                    modulus,
                }
            }
            alg::ECC => {
                let symmetric = parse_sym_def_object(r)?;
                let scheme = parse_ecc_scheme(r)?;
                let curve = r.u16("ECC curve")?;
                let kdf = parse_kdf_scheme(r)?;
                let x = r.tpm2b(MAX_ECC_KEY_BYTES, "ECC point x")?;
                let y = r.tpm2b(MAX_ECC_KEY_BYTES, "ECC point y")?;
                PublicKey::Ecc {
                    symmetric,
                    scheme,
                    curve,
                    kdf,
                    x,
                    y,
                }
            }
            id => {
                return Err(ParseError::Unsupported {
                    what: "public area type (expected RSA or ECC)",
                    id,
                });
            }
        };
        Ok(Public {
            name_alg,
            object_attributes,
            auth_policy,
            key,
        })
    }

    /// The key as a DER SubjectPublicKeyInfo, as Go's `x509.MarshalPKIXPublicKey` writes it:
    /// RSA as `rsaEncryption` with NULL parameters and a PKCS#1 `RSAPublicKey` (the TPM's
    /// exponent 0 meaning 65537); ECC as `id-ecPublicKey` with the named curve and the
    /// uncompressed point, coordinates padded to the field size.
    pub fn spki_der(&self) -> Result<Vec<u8>, SpkiError> {
        use spki::der::Encode as _;
        use spki::der::asn1::{AnyRef, BitStringRef, ObjectIdentifier};
        use spki::{AlgorithmIdentifierRef, SubjectPublicKeyInfoRef};

        const RSA_ENCRYPTION: ObjectIdentifier =
            ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
        const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
        const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
        const P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");

        let encode = |oid, parameters, key: &[u8]| -> Result<Vec<u8>, SpkiError> {
            SubjectPublicKeyInfoRef {
                algorithm: AlgorithmIdentifierRef {
                    oid,
                    parameters: Some(parameters),
                },
                subject_public_key: BitStringRef::from_bytes(key).map_err(SpkiError::Der)?,
            }
            .to_der()
            .map_err(SpkiError::Der)
        };
        match &self.key {
            PublicKey::Rsa {
                exponent, modulus, ..
            } => {
                let e = if *exponent == 0 { 65537 } else { *exponent }.to_be_bytes();
                let rsa = pkcs1::RsaPublicKey {
                    modulus: pkcs1::UintRef::new(modulus).map_err(SpkiError::Der)?,
                    public_exponent: pkcs1::UintRef::new(&e).map_err(SpkiError::Der)?,
                }
                .to_der()
                .map_err(SpkiError::Der)?;
                encode(RSA_ENCRYPTION, AnyRef::NULL, &rsa)
            }
            PublicKey::Ecc { curve, x, y, .. } => {
                let (oid, len) = match *curve {
                    curve::NIST_P256 => (P256, 32),
                    curve::NIST_P384 => (P384, 48),
                    other => return Err(SpkiError::Curve(other)),
                };
                let mut point = vec![0x04];
                for coordinate in [x, y] {
                    if coordinate.len() > len {
                        return Err(SpkiError::Curve(*curve));
                    }
                    point.extend(std::iter::repeat_n(0, len - coordinate.len()));
                    point.extend_from_slice(coordinate);
                }
                encode(EC_PUBLIC_KEY, AnyRef::from(&oid), &point)
            }
        }
    }

    /// Whether all of `bits` are set in the object attributes.
    pub fn has_attributes(&self, bits: u32) -> bool {
        self.object_attributes & bits == bits
    }
}

/// `TPMS_PCR_SELECTION`: one bank and a bitmap of PCRs in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcrSelection {
    /// The bank's hash algorithm id.
    pub hash: u16,
    /// The bitmap: bit `i % 8` of byte `i / 8` selects PCR `i`.
    pub select: Vec<u8>,
}

impl PcrSelection {
    /// The selected PCR indices in ascending order, which is the order the TPM concatenates
    /// their values in for the quote's digest.
    pub fn indices(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (byte_index, byte) in (0u32..).zip(&self.select) {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    out.push(byte_index * 8 + bit);
                }
            }
        }
        out
    }
}

fn parse_pcr_selection_list(r: &mut Reader<'_>) -> Result<Vec<PcrSelection>, ParseError> {
    let count = r.u32("PCR selection count")?;
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count > MAX_PCR_SELECTIONS {
        return Err(ParseError::TooLarge {
            what: "PCR selection list",
            size: count,
            limit: MAX_PCR_SELECTIONS,
        });
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let hash = r.u16("PCR selection hash")?;
        let size = usize::from(r.u8("PCR selection size")?);
        if size > MAX_PCR_SELECT_BYTES {
            return Err(ParseError::TooLarge {
                what: "PCR selection bitmap",
                size,
                limit: MAX_PCR_SELECT_BYTES,
            });
        }
        let select = r.bytes(size, "PCR selection bitmap")?.to_vec();
        out.push(PcrSelection { hash, select });
    }
    Ok(out)
}

/// `TPMS_CLOCK_INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockInfo {
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    pub safe: u8,
}

/// `TPMS_QUOTE_INFO`: what a quote attests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuoteInfo {
    pub pcr_select: Vec<PcrSelection>,
    /// Digest of the selected PCR values, concatenated in selection order, computed with the
    /// hash of the signing scheme (not necessarily the bank's hash).
    pub pcr_digest: Vec<u8>,
}

/// `TPMS_ATTEST` of a quote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attest {
    /// Always [`TPM_GENERATED`] once parsed.
    pub magic: u32,
    /// Always [`ST_ATTEST_QUOTE`] once parsed.
    pub attest_type: u16,
    pub qualified_signer: Vec<u8>,
    /// The caller's qualifying data, which binds the quote to a nonce.
    pub extra_data: Vec<u8>,
    pub clock_info: ClockInfo,
    pub firmware_version: u64,
    pub quote: QuoteInfo,
}

impl Attest {
    /// Parses a complete `TPMS_ATTEST` and requires it to be a TPM-generated quote.
    pub fn parse(bytes: &[u8]) -> Result<Attest, ParseError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32("magic")?;
        if magic != TPM_GENERATED {
            return Err(ParseError::BadMagic(magic));
        }
        let attest_type = r.u16("attestation type")?;
        if attest_type != ST_ATTEST_QUOTE {
            return Err(ParseError::NotAQuote(attest_type));
        }
        let qualified_signer = r.tpm2b(MAX_NAME_SIZE, "qualified signer")?;
        let extra_data = r.tpm2b(MAX_DIGEST_SIZE, "extra data")?;
        let clock_info = ClockInfo {
            clock: r.u64("clock")?,
            reset_count: r.u32("reset count")?,
            restart_count: r.u32("restart count")?,
            safe: r.u8("safe flag")?,
        };
        let firmware_version = r.u64("firmware version")?;
        let pcr_select = parse_pcr_selection_list(&mut r)?;
        let pcr_digest = r.tpm2b(MAX_DIGEST_SIZE, "PCR digest")?;
        r.finish()?;
        Ok(Attest {
            magic,
            attest_type,
            qualified_signer,
            extra_data,
            clock_info,
            firmware_version,
            quote: QuoteInfo {
                pcr_select,
                pcr_digest,
            },
        })
    }
}

/// `TPMT_SIGNATURE` for the schemes a quote can carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signature {
    /// RSASSA-PKCS1-v1_5.
    RsaSsa {
        hash: u16,
        sig: Vec<u8>,
    },
    /// RSASSA-PSS (the TPM uses a salt as long as the digest).
    RsaPss {
        hash: u16,
        sig: Vec<u8>,
    },
    Ecdsa {
        hash: u16,
        r: Vec<u8>,
        s: Vec<u8>,
    },
}

impl Signature {
    /// Parses a complete `TPMT_SIGNATURE`. Schemes other than RSASSA, RSAPSS and ECDSA are
    /// refused: nothing else verifies a quote.
    pub fn parse(bytes: &[u8]) -> Result<Signature, ParseError> {
        let mut r = Reader::new(bytes);
        let sig_alg = r.u16("signature algorithm")?;
        let sig = match sig_alg {
            alg::RSASSA => Signature::RsaSsa {
                hash: r.u16("signature hash")?,
                sig: r.tpm2b(MAX_RSA_KEY_BYTES, "RSA signature")?,
            },
            alg::RSAPSS => Signature::RsaPss {
                hash: r.u16("signature hash")?,
                sig: r.tpm2b(MAX_RSA_KEY_BYTES, "RSA signature")?,
            },
            alg::ECDSA => Signature::Ecdsa {
                hash: r.u16("signature hash")?,
                r: r.tpm2b(MAX_ECC_KEY_BYTES, "ECDSA r")?,
                s: r.tpm2b(MAX_ECC_KEY_BYTES, "ECDSA s")?,
            },
            id => {
                return Err(ParseError::Unsupported {
                    what: "signature algorithm",
                    id,
                });
            }
        };
        r.finish()?;
        Ok(sig)
    }

    /// The hash algorithm id the signature was made with.
    pub fn hash(&self) -> u16 {
        match self {
            Signature::RsaSsa { hash, .. }
            | Signature::RsaPss { hash, .. }
            | Signature::Ecdsa { hash, .. } => *hash,
        }
    }

    /// A name for error messages.
    pub fn scheme_name(&self) -> &'static str {
        match self {
            Signature::RsaSsa { .. } => "RSASSA-PKCS1-v1_5",
            Signature::RsaPss { .. } => "RSASSA-PSS",
            Signature::Ecdsa { .. } => "ECDSA",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quote as a TPM would marshal it, for the parser tests.
    fn sample_attest() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&TPM_GENERATED.to_be_bytes());
        b.extend_from_slice(&ST_ATTEST_QUOTE.to_be_bytes());
        b.extend_from_slice(&[0, 4, 0x40, 0, 0, 1]); // qualified signer
        b.extend_from_slice(&[0, 2, 0x90, 0x09]); // extra data
        b.extend_from_slice(&7u64.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&2u32.to_be_bytes());
        b.push(1);
        b.extend_from_slice(&9u64.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&alg::SHA256.to_be_bytes());
        b.extend_from_slice(&[3, 0x11, 0x00, 0x80]);
        b.extend_from_slice(&[0, 32]);
        b.extend_from_slice(&[0xab; 32]);
        b
    }

    #[test]
    fn parses_quote() {
        let a = Attest::parse(&sample_attest()).unwrap();
        assert_eq!(a.extra_data, vec![0x90, 0x09]);
        assert_eq!(a.clock_info.restart_count, 2);
        assert_eq!(a.firmware_version, 9);
        assert_eq!(a.quote.pcr_select.len(), 1);
        assert_eq!(a.quote.pcr_select[0].indices(), vec![0, 4, 23]);
        assert_eq!(a.quote.pcr_digest, vec![0xab; 32]);
    }

    #[test]
    fn every_truncation_of_a_quote_is_an_error() {
        let full = sample_attest();
        for len in 0..full.len() {
            assert!(Attest::parse(&full[..len]).is_err(), "length {len}");
        }
        let mut long = full.clone();
        long.push(0);
        assert_eq!(
            Attest::parse(&long),
            Err(ParseError::TrailingBytes { count: 1 })
        );
    }

    #[test]
    fn wrong_magic_and_tag_are_named() {
        let mut b = sample_attest();
        b[0] = 0;
        assert!(matches!(Attest::parse(&b), Err(ParseError::BadMagic(_))));
        let mut b = sample_attest();
        b[5] = 0x17; // TPM_ST_ATTEST_CERTIFY
        assert_eq!(Attest::parse(&b), Err(ParseError::NotAQuote(0x8017)));
    }

    #[test]
    fn oversized_lengths_are_refused_before_reading() {
        let mut b = sample_attest();
        b[6] = 0xff; // qualified signer length 0xff04
        assert!(matches!(
            Attest::parse(&b),
            Err(ParseError::TooLarge {
                what: "qualified signer",
                ..
            })
        ));
        let sig = [0x00, 0x14, 0x00, 0x0b, 0xff, 0xff];
        assert!(matches!(
            Signature::parse(&sig),
            Err(ParseError::TooLarge { .. })
        ));
    }

    #[test]
    fn parses_rsa_and_ecc_public_areas() {
        let mut rsa = Vec::new();
        rsa.extend_from_slice(&alg::RSA.to_be_bytes());
        rsa.extend_from_slice(&alg::SHA256.to_be_bytes());
        rsa.extend_from_slice(&0x0005_0072u32.to_be_bytes());
        rsa.extend_from_slice(&[0, 0]); // auth policy
        rsa.extend_from_slice(&alg::NULL.to_be_bytes());
        rsa.extend_from_slice(&alg::RSASSA.to_be_bytes());
        rsa.extend_from_slice(&alg::SHA256.to_be_bytes());
        rsa.extend_from_slice(&2048u16.to_be_bytes());
        rsa.extend_from_slice(&0u32.to_be_bytes());
        rsa.extend_from_slice(&256u16.to_be_bytes());
        rsa.extend_from_slice(&[0xc5; 256]);
        let p = Public::parse(&rsa).unwrap();
        assert!(p.has_attributes(object_attributes::RESTRICTED | object_attributes::SIGN_ENCRYPT));
        match p.key {
            PublicKey::Rsa {
                key_bits,
                ref modulus,
                ref scheme,
                ..
            } => {
                assert_eq!(key_bits, 2048);
                assert_eq!(modulus.len(), 256);
                assert_eq!(scheme.as_ref().map(|s| s.scheme), Some(alg::RSASSA));
            }
            PublicKey::Ecc { .. } => panic!("expected RSA"),
        }
        for len in 0..rsa.len() {
            assert!(Public::parse(&rsa[..len]).is_err());
        }

        let mut ecc = Vec::new();
        ecc.extend_from_slice(&alg::ECC.to_be_bytes());
        ecc.extend_from_slice(&alg::SHA256.to_be_bytes());
        ecc.extend_from_slice(&0x0005_0072u32.to_be_bytes());
        ecc.extend_from_slice(&[0, 0]);
        ecc.extend_from_slice(&alg::NULL.to_be_bytes());
        ecc.extend_from_slice(&alg::ECDSA.to_be_bytes());
        ecc.extend_from_slice(&alg::SHA256.to_be_bytes());
        ecc.extend_from_slice(&curve::NIST_P256.to_be_bytes());
        ecc.extend_from_slice(&alg::NULL.to_be_bytes());
        ecc.extend_from_slice(&[0, 32]);
        ecc.extend_from_slice(&[1; 32]);
        ecc.extend_from_slice(&[0, 32]);
        ecc.extend_from_slice(&[2; 32]);
        let p = Public::parse(&ecc).unwrap();
        assert!(matches!(
            p.key,
            PublicKey::Ecc {
                curve: curve::NIST_P256,
                ..
            }
        ));
        for len in 0..ecc.len() {
            assert!(Public::parse(&ecc[..len]).is_err());
        }
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap deterministic stand-in for the fuzzer: many pseudo-random inputs, including
        // ones that start with valid prefixes so the parsers get past their first field.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let prefixes: [&[u8]; 4] = [
            &[],
            &[0xff, 0x54, 0x43, 0x47, 0x80, 0x18],
            &[0x00, 0x01, 0x00, 0x0b],
            &[0x00, 0x23, 0x00, 0x0b],
        ];
        for i in 0..20_000 {
            let len = (next() % 300) as usize;
            let mut buf = prefixes[i % prefixes.len()].to_vec();
            buf.extend((0..len).map(|_| next() as u8));
            let _ = Attest::parse(&buf);
            let _ = Public::parse(&buf);
            let _ = Signature::parse(&buf);
        }
    }
}
