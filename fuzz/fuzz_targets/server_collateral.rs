//! The collateral extension of the join service's certificate, as a node with an SEV-SNP or TDX
//! service policy reads it (lib/atls/src/server_collateral.rs): the size bound, the JSON shape,
//! base64, AMD's CRL and certificates, Intel's dcap-qvl collateral; what decodes must encode
//! again and answer as the validators' collateral source.
//! The body is in src/atls_targets.rs, which lib/atls/tests/fuzz_regressions.rs replays.
#![no_main]

#[path = "../src/atls_targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod atls_targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| atls_targets::server_collateral(data));
