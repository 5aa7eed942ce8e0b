//! RFC 5869 appendix A test vectors, run through the same function that derives production keys.

#![allow(clippy::unwrap_used)] // Tests may panic on unexpected failures.

use aws_lc_rs::hkdf::{Algorithm, HKDF_SHA1_FOR_LEGACY_USE_ONLY, HKDF_SHA256};
use keyservice::derive::hkdf_derive;

fn range(first: u8, last: u8) -> Vec<u8> {
    (first..=last).collect()
}

fn check(algorithm: Algorithm, ikm: &[u8], salt: &[u8], info: &[u8], okm_hex: &str) {
    let expected = hex::decode(okm_hex).unwrap();
    let okm = hkdf_derive(algorithm, ikm, salt, info, expected.len()).unwrap();
    assert_eq!(hex::encode(&*okm), okm_hex);
}

#[test]
fn case_1_sha256_basic() {
    check(
        HKDF_SHA256,
        &[0x0b; 22],
        &range(0x00, 0x0c),
        &range(0xf0, 0xf9),
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
    );
}

#[test]
fn case_2_sha256_long_inputs() {
    check(
        HKDF_SHA256,
        &range(0x00, 0x4f),
        &range(0x60, 0xaf),
        &range(0xb0, 0xff),
        "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c\
         59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71\
         cc30c58179ec3e87c14c01d5c1f3434f1d87",
    );
}

#[test]
fn case_3_sha256_empty_salt_and_info() {
    check(
        HKDF_SHA256,
        &[0x0b; 22],
        &[],
        &[],
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
    );
}

#[test]
fn case_4_sha1_basic() {
    check(
        HKDF_SHA1_FOR_LEGACY_USE_ONLY,
        &[0x0b; 11],
        &range(0x00, 0x0c),
        &range(0xf0, 0xf9),
        "085a01ea1b10f36933068b56efa5ad81a4f14b822f5b091568a9cdd4f155fda2c22e422478d305f3f896",
    );
}

#[test]
fn case_5_sha1_long_inputs() {
    check(
        HKDF_SHA1_FOR_LEGACY_USE_ONLY,
        &range(0x00, 0x4f),
        &range(0x60, 0xaf),
        &range(0xb0, 0xff),
        "0bd770a74d1160f7c9f12cd5912a06ebff6adcae899d92191fe4305673ba2ffe\
         8fa3f1a4e5ad79f3f334b3b202b2173c486ea37ce3d397ed034c7f9dfeb15c5e\
         927336d0441f4c4300e2cff0d0900b52d3b4",
    );
}

#[test]
fn case_6_sha1_empty_salt_and_info() {
    check(
        HKDF_SHA1_FOR_LEGACY_USE_ONLY,
        &[0x0b; 22],
        &[],
        &[],
        "0ac1af7002b3d761d1e55298da9d0506b9ae52057220a306e07b6b87e8df21d0ea00033de03984d34918",
    );
}

#[test]
fn case_7_sha1_salt_not_provided() {
    // "Not provided" means HashLen zero bytes; HMAC pads an empty key to exactly that, so both
    // spellings must give the RFC's output.
    let okm =
        "2c91117204d745f3500d636a62f64f0ab3bae548aa53d423b0d1f27ebba6f5e5673a081d70cce7acfc48";
    check(HKDF_SHA1_FOR_LEGACY_USE_ONLY, &[0x0c; 22], &[], &[], okm);
    check(
        HKDF_SHA1_FOR_LEGACY_USE_ONLY,
        &[0x0c; 22],
        &[0; 20],
        &[],
        okm,
    );
}
