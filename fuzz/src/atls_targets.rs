//! What each aTLS fuzz target does with its input: the certificates and the collateral extension
//! a peer sends. The targets in `fuzz_targets/` call these, and `lib/atls/tests/fuzz_regressions.rs`
//! replays every seed and saved crash input through the same functions in the normal test run.
//!
//! Every function must return without panicking for any input.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use atls::server_collateral::{
    CertificateSnpCollateral, CertificateTdxCollateral, ServerCollateral,
};
use attestation::snp::{Product, SigningKey, SnpCollateral, Tcb};
use attestation::tdx::{PckCa, TdxCollateral};
use attestation::{AkTrust, Measurement, Policy, QemuVtpmValidator, Variant};
use x509_parser::prelude::{FromDer, X509Certificate};

/// A target: one input, no panic.
pub type Target = fn(&[u8]);

/// Every target, by the name of its directory under `fuzz/seeds/`.
pub const TARGETS: [(&str, Target); 3] = [
    ("cert_extension", cert_extension),
    ("server_certificate", server_certificate),
    ("server_collateral", server_collateral),
];

/// The aTLS client certificate as the server receives it: X.509 parsing and the lookup of the
/// attestation extension (lib/atls/src/extension.rs), for every variant.
pub fn cert_extension(data: &[u8]) {
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
}

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

/// The join service's certificate as a node with a service policy receives it: X.509 parsing,
/// the self-signature, the window, finding the evidence and validating it with the qemu-vtpm
/// validator (lib/atls/src/server_evidence.rs, `verify_server_certificate`).
pub fn server_certificate(data: &[u8]) {
    // Inside the window of the seed certificates (made 2026-11-25), and at the present.
    for now in [
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_640_000),
        SystemTime::now(),
    ] {
        let _ = atls::server_evidence::verify_server_certificate(data, validator(), now);
    }
}

/// The collateral extension of the join service's certificate, as a node with an SEV-SNP or
/// TDX service policy reads it (lib/atls/src/server_collateral.rs): the size bound, the JSON
/// shape, base64, AMD's CRL and certificates, Intel's dcap-qvl collateral; what decodes must
/// encode again and answer as the validators' collateral source.
pub fn server_collateral(data: &[u8]) {
    let Ok(decoded) = ServerCollateral::decode(data) else {
        return;
    };
    let encoded = decoded
        .encode()
        .expect("what decodes within the bound encodes");
    let again = ServerCollateral::decode(&encoded).expect("an encoding decodes");
    assert_eq!(again.vendor(), decoded.vendor());
    let stale = Duration::from_secs(86_400);
    match decoded {
        ServerCollateral::Amd(amd) => {
            let source = CertificateSnpCollateral::new(amd, stale);
            let _ = source.crl(Product::Milan, SigningKey::Vlek);
            let _ = source.intermediate(Product::Genoa, SigningKey::Vlek);
            let tcb = Tcb {
                fmc: None,
                bootloader: 0,
                tee: 0,
                snp: 0,
                microcode: 0,
            };
            let _ = source.vcek(Product::Turin, &[0; 8], &tcb);
        }
        ServerCollateral::Intel(intel) => {
            let (fmspc, ca) = (intel.fmspc(), intel.ca());
            let source = CertificateTdxCollateral::new(intel, stale);
            assert!(source.collateral(fmspc, ca).is_ok());
            let other = if ca == PckCa::Platform {
                PckCa::Processor
            } else {
                PckCa::Platform
            };
            assert!(source.collateral(fmspc, other).is_err());
        }
    }
}
