//! aws-nitro-tpm's InstanceInfo and EC2's XML answers (see src/targets.rs).
#![no_main]

#[path = "../src/targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::aws_nitro_tpm(data));
