//! AWS's NitroTPM attestation document and the PEM of configured Nitro roots (see src/targets.rs).
#![no_main]

#[path = "../src/targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::nitro_tpm_document(data));
