//! Side-by-side micro-benchmark of the signature verifications an attestation costs, in the
//! candidate crypto providers: ring (the workspace's provider), aws-lc-rs (rustls's other
//! provider) and RustCrypto's `p384`/`p256`.
//!
//! - **P-384**: a real AWS SEV-SNP report (lib/attestation/testdata/snp/vlek-report.bin) and the
//!   VLEK that signed it (vlek-cc-test.der): ECDSA P-384 with SHA-384 over the report's first
//!   0x2A0 bytes, the one signature of an SEV-SNP join that cannot be cached (a new report per
//!   node).
//! - **P-256**: an ECDSA P-256 SHA-256 signature over a message of a TDX quote's signed size,
//!   made here with ring, as a TDX quote's and QE report's signatures are.
//!
//! Each verification is checked to succeed before it is timed, and a flipped message to fail,
//! so a provider that accepted anything would be seen. Prints ns per verification, the median
//! of several rounds, and each one's ratio to ring.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The report's signed bytes.
const SIGNED_LEN: usize = 0x2A0;
/// Where the signature's `r` and `s` start (each 72 bytes, little-endian, zero-padded).
const SIG_R: usize = 0x2A0;
const SIG_S: usize = 0x2E8;

fn testdata(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../lib/attestation/testdata/snp")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A 48-byte little-endian component as big-endian, as the providers take it.
fn component(le: &[u8]) -> [u8; 48] {
    assert!(
        le[48..72].iter().all(|b| *b == 0),
        "unused high bytes are zero"
    );
    let mut be = [0u8; 48];
    for (i, b) in le[..48].iter().enumerate() {
        be[47 - i] = *b;
    }
    be
}

/// Times `f` over `iterations`, `rounds` times, and returns the median ns per call.
fn time(rounds: usize, iterations: u32, mut f: impl FnMut() -> bool) -> f64 {
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                assert!(black_box(f()));
            }
            start.elapsed().as_nanos() as f64 / f64::from(iterations)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[rounds / 2]
}

struct Case {
    name: &'static str,
    verify: Box<dyn Fn(&[u8]) -> bool>,
}

fn run(title: &str, message: &[u8], cases: Vec<Case>, budget: Duration) {
    let mut tampered = message.to_vec();
    tampered[0] ^= 1;
    println!("{title}");
    let mut ring_ns = None;
    for case in cases {
        assert!(
            (case.verify)(message),
            "{}: the genuine signature fails",
            case.name
        );
        assert!(
            !(case.verify)(&tampered),
            "{}: a changed message passes",
            case.name
        );
        // Size the rounds so each provider gets about the same wall time.
        let probe = time(1, 20, || (case.verify)(message));
        let iterations = ((budget.as_nanos() as f64 / 7.0 / probe) as u32).max(10);
        let ns = time(7, iterations, || (case.verify)(message));
        let ratio = ring_ns.map(|r: f64| ns / r).unwrap_or(1.0);
        ring_ns.get_or_insert(ns);
        println!(
            "  {:<28} {:>9.1} µs/verify   {:>5.2}× ring",
            case.name,
            ns / 1000.0,
            ratio
        );
    }
}

fn main() {
    let budget = Duration::from_millis(
        std::env::args()
            .nth(1)
            .map(|s| s.parse().expect("milliseconds per provider"))
            .unwrap_or(1500),
    );

    // P-384: the real AWS report.
    let report = testdata("vlek-report.bin");
    let vlek = testdata("vlek-cc-test.der");
    let (_, cert) = x509_parser::parse_x509_certificate(&vlek).expect("the VLEK parses");
    let point = cert.public_key().subject_public_key.data.to_vec();
    let mut fixed = Vec::with_capacity(96);
    fixed.extend_from_slice(&component(&report[SIG_R..SIG_R + 72]));
    fixed.extend_from_slice(&component(&report[SIG_S..SIG_S + 72]));
    let message = report[..SIGNED_LEN].to_vec();

    let (p, s) = (point.clone(), fixed.clone());
    let ring_p384 = Case {
        name: "ring",
        verify: Box::new(move |m| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P384_SHA384_FIXED, &p)
                .verify(m, &s)
                .is_ok()
        }),
    };
    let (p, s) = (point.clone(), fixed.clone());
    let aws_p384 = Case {
        name: "aws-lc-rs",
        verify: Box::new(move |m| {
            aws_lc_rs::signature::UnparsedPublicKey::new(
                &aws_lc_rs::signature::ECDSA_P384_SHA384_FIXED,
                &p,
            )
            .verify(m, &s)
            .is_ok()
        }),
    };
    let key = p384::ecdsa::VerifyingKey::from_sec1_bytes(&point).expect("a P-384 point");
    let sig = p384::ecdsa::Signature::from_slice(&fixed).expect("r ‖ s");
    let rust_p384 = Case {
        name: "RustCrypto p384",
        verify: Box::new(move |m| {
            use p384::ecdsa::signature::Verifier;
            key.verify(m, &sig).is_ok()
        }),
    };
    run(
        "ECDSA P-384 SHA-384, a real AWS SEV-SNP report and its VLEK:",
        &message,
        vec![ring_p384, aws_p384, rust_p384],
        budget,
    );

    // P-256: a signature made here over a quote-sized message.
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &rng,
    )
    .expect("a P-256 key");
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .expect("the key loads");
    use ring::signature::KeyPair;
    let quote: Vec<u8> = (0..632u32).map(|i| (i * 31 % 251) as u8).collect();
    let point = pair.public_key().as_ref().to_vec();
    let fixed = pair.sign(&rng, &quote).expect("signs").as_ref().to_vec();

    let (p, s) = (point.clone(), fixed.clone());
    let ring_p256 = Case {
        name: "ring",
        verify: Box::new(move |m| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &p)
                .verify(m, &s)
                .is_ok()
        }),
    };
    let (p, s) = (point.clone(), fixed.clone());
    let aws_p256 = Case {
        name: "aws-lc-rs",
        verify: Box::new(move |m| {
            aws_lc_rs::signature::UnparsedPublicKey::new(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
                &p,
            )
            .verify(m, &s)
            .is_ok()
        }),
    };
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).expect("a P-256 point");
    let sig = p256::ecdsa::Signature::from_slice(&fixed).expect("r ‖ s");
    let rust_p256 = Case {
        name: "RustCrypto p256",
        verify: Box::new(move |m| {
            use p256::ecdsa::signature::Verifier;
            key.verify(m, &sig).is_ok()
        }),
    };
    run(
        "ECDSA P-256 SHA-256, a TDX-quote-sized message:",
        &quote,
        vec![ring_p256, aws_p256, rust_p256],
        budget,
    );
}
