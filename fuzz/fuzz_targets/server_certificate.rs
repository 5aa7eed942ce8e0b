//! The join service's certificate as a node with a service policy receives it: X.509 parsing,
//! the self-signature, the window, finding the evidence and validating it with the qemu-vtpm
//! validator (lib/atls/src/server_evidence.rs, `verify_server_certificate`).
//! The body is in src/atls_targets.rs, which lib/atls/tests/fuzz_regressions.rs replays.
#![no_main]

#[path = "../src/atls_targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod atls_targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| atls_targets::server_certificate(data));
