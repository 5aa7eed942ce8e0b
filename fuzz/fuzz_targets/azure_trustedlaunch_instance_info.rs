//! azure_trustedlaunch_instance_info (see src/targets.rs).
#![no_main]

#[path = "../src/targets.rs"]
#[allow(dead_code)] // Each target uses one function of the shared module.
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::azure_trustedlaunch_instance_info(data));
