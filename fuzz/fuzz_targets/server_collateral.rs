//! The collateral extension of the join service's certificate, as a node with an SEV-SNP or TDX
//! service policy reads it (lib/atls/src/server_collateral.rs): the size bound, the JSON shape,
//! base64, AMD's CRL and certificates, Intel's dcap-qvl collateral; what decodes must encode
//! again and answer as the validators' collateral source.
#![no_main]

use std::time::Duration;

use atls::server_collateral::{
    CertificateSnpCollateral, CertificateTdxCollateral, ServerCollateral,
};
use attestation::snp::{Product, SigningKey, SnpCollateral, Tcb};
use attestation::tdx::{PckCa, TdxCollateral};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = ServerCollateral::decode(data) else {
        return;
    };
    let encoded = decoded.encode().expect("what decodes within the bound encodes");
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
});
