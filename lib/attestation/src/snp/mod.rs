//! AMD SEV-SNP: the attestation report, AMD's certificate chain, and the checks that decide
//! whether a report was made by a genuine AMD chip running a guest the policy accepts.
//!
//! Who checks what:
//! - [`report`] reads the report's fixed layout and checks the length, the known versions,
//!   reserved bytes and bits and the signature algorithm, and decodes the TCB for the product
//!   the chain names (it says why the `sev` crate's decoder is not used);
//! - x509-parser parses the certificates and aws-lc-rs verifies every signature (the chain's
//!   RSA-PSS and the report's ECDSA P-384);
//! - [`certs`] checks the chain's shape: names, validity at the verification time, an ARK the
//!   configuration trusts, one product along the chain, VCEK vs VLEK consistent with the
//!   report, and reads AMD's extensions;
//! - [`verify_report`] ties them together: the signer's TCB equals the report's REPORTED_TCB,
//!   a VCEK's hwID equals CHIP_ID, and a report that names its CPU (version 3 and later) names
//!   the product the chain is for.
//!
//! [`config`] reads the SNP settings of Constellation's attestation config and applies them to a
//! [`VerifiedReport`]: minimum TCBs per product, CURRENT ≥ COMMITTED, guest policy bits, VMPL,
//! ID key digest and the firmware pins (launch measurement, author key, HOST_DATA, CHIP_ID).

pub mod certs;
pub mod collateral;
pub mod config;
pub mod crl;
pub mod instance_info;
pub mod report;

/// The GCE identity gcp-sev-snp shares with gcp-sev-es, at its old path.
pub use crate::gce;
pub use crate::gce::{
    GceIdentity, GceKeyError, GcpProjects, GcpProjectsError, InstanceRef, StaticGceIdentity,
};
pub use certs::{Cert, LeafFacts, certs_from_pem};
pub use collateral::{CollateralError, SnpCollateral, StaticCollateral};
pub use config::{
    Enforcement, FirmwarePins, FirmwareSigner, MinimumTcbs, SnpConfig, SnpConfigError,
    SnpPolicyError,
};
pub use crl::Crl;
pub use instance_info::InstanceInfo;
pub use report::{Report, SigningKey, Tcb};

use std::fmt;

/// An AMD EPYC generation with SEV-SNP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Product {
    Milan,
    Genoa,
    Turin,
}

impl Product {
    /// The name AMD uses in certificate names and KDS paths.
    pub fn name(self) -> &'static str {
        match self {
            Product::Milan => "Milan",
            Product::Genoa => "Genoa",
            Product::Turin => "Turin",
        }
    }

    pub fn from_name(name: &str) -> Option<Product> {
        [Product::Milan, Product::Genoa, Product::Turin]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// The product a report's CPUID family and model name (AMD family 19h: Milan models
    /// 00h–0Fh, Genoa 10h–1Fh and A0h–AFh; family 1Ah: Turin 00h–11h).
    pub fn from_cpuid(family: u8, model: u8) -> Option<Product> {
        match (family, model) {
            (0x19, 0x00..=0x0F) => Some(Product::Milan),
            (0x19, 0x10..=0x1F | 0xA0..=0xAF) => Some(Product::Genoa),
            (0x1A, 0x00..=0x11) => Some(Product::Turin),
            _ => None,
        }
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a report or its chain was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnpError {
    #[error("the SNP report has {0} bytes, expected 1184")]
    ReportLength(usize),
    #[error("SNP report version {0} is not one this verifier knows (2, 3, 4, 5)")]
    ReportVersion(u32),
    #[error("SNP report byte 0x{0:x} is reserved and must be zero")]
    ReportReserved(usize),
    #[error("SNP report: {0}")]
    ReportField(String),
    #[error("the SNP report's signature does not verify with the signer's key")]
    ReportSignature,
    #[error("AMD certificate: {0}")]
    Certificate(String),
    #[error("AMD certificate chain: {0}")]
    Chain(String),
    #[error("AMD certificate chain: the {which}'s signature: {reason}")]
    ChainSignature { which: &'static str, reason: String },
    #[error(
        "AMD certificate chain: the {which} is not valid at the verification time (valid {not_before} to {not_after})"
    )]
    Expired {
        which: &'static str,
        not_before: String,
        not_after: String,
    },
    #[error("SNP InstanceInfo: {0}")]
    InstanceInfo(String),
    #[error("AMD CRL: {0}")]
    Crl(String),
    #[error(
        "AMD CRL: not current at the verification time (thisUpdate {this_update}, nextUpdate {next_update})"
    )]
    CrlNotCurrent {
        this_update: String,
        next_update: String,
    },
    #[error("{which} (serial {serial}) is revoked by AMD's CRL")]
    Revoked { which: String, serial: String },
    #[error("the AMD root key (SHA-256 {0}) is not one the configuration trusts")]
    UntrustedRoot(String),
    #[error("the report is signed by a {report} but the certificate is a {cert}")]
    SignerKind {
        report: SigningKey,
        cert: SigningKey,
    },
    #[error("the signer's TCB ({cert}) is not the report's REPORTED_TCB ({report})")]
    TcbMismatch { cert: Tcb, report: Tcb },
    #[error("the VCEK's hwID is not the report's CHIP_ID")]
    ChipId,
    #[error("the report names CPU family {family:#x} model {model:#x}, its chain is for {chain}")]
    ProductMismatch {
        family: u8,
        model: u8,
        chain: Product,
    },
}

/// The ARKs a verifier trusts.
#[derive(Clone, Debug)]
pub struct Trust {
    arks: Vec<Cert>,
}

const BUILTIN_ARKS: [&[u8]; 3] = [
    include_bytes!("roots/ark-milan.pem"),
    include_bytes!("roots/ark-genoa.pem"),
    include_bytes!("roots/ark-turin.pem"),
];

impl Trust {
    /// AMD's Milan, Genoa and Turin ARKs.
    pub fn builtin() -> Trust {
        let arks = BUILTIN_ARKS
            .iter()
            .flat_map(|pem| certs_from_pem(pem).unwrap_or_default())
            .collect();
        Trust { arks }
    }

    /// Only the ARKs in `pem` (Constellation's `amdRootKey`).
    pub fn from_pem(pem: &[u8]) -> Result<Trust, SnpError> {
        Ok(Trust {
            arks: certs_from_pem(pem)?,
        })
    }

    /// The trusted ARK of `product`, to complete a chain that lacks it.
    pub fn ark_for(&self, product: Product) -> Option<&Cert> {
        self.arks
            .iter()
            .find(|a| a.common_name() == format!("ARK-{product}"))
    }

    pub fn arks(&self) -> &[Cert] {
        &self.arks
    }
}

/// A report whose signature and chain verified.
#[derive(Clone, Debug)]
pub struct VerifiedReport {
    pub report: Report,
    pub signer: LeafFacts,
}

impl VerifiedReport {
    pub fn product(&self) -> Product {
        self.signer.product
    }
}

/// Verifies `report` with its signer (`leaf`), the signer's intermediate (ASK or ASVK) and
/// `ark`, at `at` (seconds since the epoch).
pub fn verify_report(
    report: &Report,
    leaf: &Cert,
    intermediate: &Cert,
    ark: &Cert,
    trust: &Trust,
    at: i64,
) -> Result<VerifiedReport, SnpError> {
    let signer = certs::verify_chain(leaf, intermediate, ark, trust.arks(), at)?;
    if signer.key != report.signing_key() {
        return Err(SnpError::SignerKind {
            report: report.signing_key(),
            cert: signer.key,
        });
    }
    if let Some((family, model)) = report.cpuid() {
        if Product::from_cpuid(family, model) != Some(signer.product) {
            return Err(SnpError::ProductMismatch {
                family,
                model,
                chain: signer.product,
            });
        }
    }
    let reported = report.reported_tcb(signer.product);
    if reported != signer.tcb {
        return Err(SnpError::TcbMismatch {
            cert: signer.tcb,
            report: reported,
        });
    }
    if let Some(hw_id) = &signer.hw_id {
        let chip = report.chip_id();
        let (head, tail) = chip.split_at(hw_id.len());
        if head != hw_id.as_slice() || tail.iter().any(|&b| b != 0) {
            return Err(SnpError::ChipId);
        }
    }
    // Last, so that a report whose fields disagree with its certificate is named as such; nothing
    // above is trusted before this passes, and nothing leaves this function unless it passes.
    certs::verify_report_signature(leaf, report.signed_bytes(), &report.signature_fixed())?;
    Ok(VerifiedReport {
        report: report.clone(),
        signer,
    })
}
