//! The aTLS client certificate as the server receives it: X.509 parsing and the lookup of the
//! attestation extension (lib/atls/src/extension.rs), for every variant.
#![no_main]

use attestation::Variant;
use libfuzzer_sys::fuzz_target;
use x509_parser::prelude::{FromDer, X509Certificate};

fuzz_target!(|data: &[u8]| {
    // The server refuses larger certificates before parsing them.
    if data.len() > atls::MAX_CLIENT_CERTIFICATE_SIZE {
        return;
    }
    if let Ok((_, cert)) = X509Certificate::from_der(data) {
        for variant in Variant::ALL {
            let _ = atls::extension::find_document(&cert, variant);
        }
        let _ = atls::extension::attestation_oids(&cert);
        let _ = atls::extension::user_data_for_spki(cert.tbs_certificate.subject_pki.raw);
        let _ = cert.validity().is_valid();
    }
});
