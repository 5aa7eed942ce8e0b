//! The aTLS client certificate as the server receives it: X.509 parsing and the lookup of the
//! attestation extension (lib/atls/src/extension.rs), for every variant.
//! The body is in src/atls_targets.rs, which lib/atls/tests/fuzz_regressions.rs replays.
#![no_main]

#[path = "../src/atls_targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod atls_targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| atls_targets::cert_extension(data));
