//! The join service's certificate as a node with a service policy receives it: X.509 parsing,
//! the self-signature, the window, finding the evidence and validating it with the qemu-vtpm
//! validator (lib/atls/src/server_evidence.rs, `verify_server_certificate`).
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use attestation::{AkTrust, Measurement, Policy, QemuVtpmValidator};
use libfuzzer_sys::fuzz_target;

fn validator() -> &'static QemuVtpmValidator {
    static VALIDATOR: OnceLock<Arc<QemuVtpmValidator>> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let policy = Policy::new(
            [(
                4,
                Measurement {
                    expected: vec![0x44; 32],
                    warn_only: false,
                },
            )]
            .into_iter()
            .collect(),
        )
        .expect("policy");
        Arc::new(QemuVtpmValidator::new(policy, AkTrust::AnyKey))
    })
}

fuzz_target!(|data: &[u8]| {
    // Inside the window of the seed certificates (made 2026-11-25), and at the present.
    for now in [
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_640_000),
        SystemTime::now(),
    ] {
        let _ = atls::server_evidence::verify_server_certificate(data, validator(), now);
    }
});
