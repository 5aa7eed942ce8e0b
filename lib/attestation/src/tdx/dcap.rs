//! The backend dcap-qvl verifies with: its own audited X.509 parser and signature encoder, and
//! the workspace's one crypto provider (aws-lc-rs, through rustls-webpki's ECDSA P-256 SHA-256)
//! for every signature and digest.
//!
//! Signatures are remembered once verified ([`SIGNATURES`]). A TDX quote carries about ten
//! ECDSA signatures, and all but one are the same for every quote of a platform: the PCK chain,
//! Intel's CRLs, the TCB info and QE identity with their issuer chains, and the QE report that
//! certifies the platform's attestation key. Only the quote's own signature by that key is new
//! with each quote. dcap-qvl still runs every other check (times, revocation, TCB levels, QE
//! identity, the QE report's binding of the attestation key) on every quote.

use std::sync::LazyLock;

use dcap_qvl::config::{Config, CryptoProvider};
use rustls_pki_types::{AlgorithmIdentifier, InvalidSignature, SignatureVerificationAlgorithm};

use crate::signature_memo::SignatureMemo;

/// The signatures every TDX quote verification in this process shares.
pub(crate) static SIGNATURES: LazyLock<SignatureMemo> = LazyLock::new(SignatureMemo::default);

/// dcap-qvl's [`Config`]: its audited parser and encoder, our provider.
pub(crate) struct Backend;

impl Config for Backend {
    type X509 = dcap_qvl::x509::X509CertBackend;
    type SigEncoder = dcap_qvl::signature::DerSigEncoder;
    type Crypto = AwsLc;
}

/// aws-lc-rs for dcap-qvl's digests and (remembered) signature checks.
pub(crate) struct AwsLc;

impl CryptoProvider for AwsLc {
    fn sig_algo() -> &'static dyn SignatureVerificationAlgorithm {
        &REMEMBERED_P256_SHA256
    }

    fn sha256(data: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data).as_ref());
        out
    }

    fn sha384(data: &[u8]) -> [u8; 48] {
        let mut out = [0u8; 48];
        out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA384, data).as_ref());
        out
    }
}

/// rustls-webpki's ECDSA P-256 SHA-256 verification, answered from [`SIGNATURES`] when the same
/// key already verified the same signature over the same message.
#[derive(Debug)]
struct Remembered(&'static dyn SignatureVerificationAlgorithm);

static REMEMBERED_P256_SHA256: Remembered = Remembered(webpki::aws_lc_rs::ECDSA_P256_SHA256);

impl SignatureVerificationAlgorithm for Remembered {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        SIGNATURES.check(&[message, signature], public_key, || {
            self.0.verify_signature(public_key, message, signature)
        })
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        self.0.public_key_alg_id()
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        self.0.signature_alg_id()
    }

    fn fips(&self) -> bool {
        self.0.fips()
    }
}
