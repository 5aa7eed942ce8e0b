//! aws-sev-snp and azure-sev-snp: a vTPM document whose attestation key an AMD SEV-SNP report
//! vouches for.
//!
//! The order follows the trust chain: the vTPM quotes verify with the document's AK (as for
//! qemu-vtpm); the SNP report in InstanceInfo verifies with AMD's chain up to a configured ARK,
//! against AMD's current CRL; the configured SNP policy accepts it; the report binds that very
//! AK (aws: REPORT_DATA = SHA-512 of its SubjectPublicKeyInfo; azure: REPORT_DATA[0:32] =
//! SHA-256 of the HCL runtime data, whose `keys[0]` is the AK); and only then are the quoted
//! PCRs compared with `measurements`.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::policy::Policy;
use crate::snp::instance_info::check_azure_binding;
use crate::snp::{
    Cert, InstanceInfo, Product, SigningKey, SnpCollateral, SnpConfig, SnpError, VerifiedReport,
    verify_report,
};
use crate::tpm;
use crate::vtpm::{compare_pcrs, verify_document};
use crate::{Error, Validator, Variant, Verified};

/// How the report binds the attestation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// REPORT_DATA = SHA-512(DER SubjectPublicKeyInfo of the AK); signed by a VLEK.
    Aws,
    /// REPORT_DATA[0:32] = SHA-256(HCL runtime data), its `keys[0]` the AK.
    Azure,
}

/// The verification time, in seconds since the epoch.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

pub(crate) fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    })
}

/// Validates the documents of an SNP variant.
#[derive(Clone)]
pub struct SevSnpValidator {
    binding: Binding,
    policy: Policy,
    snp: SnpConfig,
    collateral: Arc<dyn SnpCollateral>,
    clock: Clock,
}

impl fmt::Debug for SevSnpValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SevSnpValidator")
            .field("binding", &self.binding)
            .field("policy", &self.policy)
            .field("snp", &self.snp)
            .field("collateral", &self.collateral)
            .finish_non_exhaustive()
    }
}

impl SevSnpValidator {
    pub fn new(
        binding: Binding,
        policy: Policy,
        snp: SnpConfig,
        collateral: Arc<dyn SnpCollateral>,
    ) -> Self {
        SevSnpValidator {
            binding,
            policy,
            snp,
            collateral,
            clock: system_clock(),
        }
    }

    /// The validator an attestation config describes: its measurements (at least one enforced)
    /// and its SNP settings, with collateral from `collateral`. Returns it with the digest that
    /// covers everything it decides by.
    pub fn from_attestation_config(
        binding: Binding,
        json: &[u8],
        collateral: Arc<dyn SnpCollateral>,
    ) -> Result<(SevSnpValidator, String), crate::PolicyError> {
        let policy = Policy::from_attestation_config(json)?;
        if !policy.enforces_any() {
            return Err(crate::PolicyError::NothingEnforced);
        }
        let snp = SnpConfig::from_attestation_config(json)?;
        let canonical = policy.canonical() + &snp.canonical();
        let digest = hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            canonical.as_bytes(),
        ));
        Ok((
            SevSnpValidator::new(binding, policy, snp, collateral),
            digest,
        ))
    }

    /// Verifies at the time `clock` gives instead of now (tests, offline verification).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The same validator over another collateral source.
    pub fn with_collateral(mut self, collateral: Arc<dyn SnpCollateral>) -> Self {
        self.collateral = collateral;
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Verifies the report in `info` with AMD's chain and CRL and applies the SNP policy.
    fn verify_hardware(&self, info: &InstanceInfo) -> Result<(VerifiedReport, Vec<String>), Error> {
        let report = &info.report;
        let key = report.signing_key();
        if self.binding == Binding::Aws && key != SigningKey::Vlek {
            return Err(SnpError::ReportField(
                "aws-sev-snp reports are signed by a VLEK, this one by a VCEK".to_owned(),
            )
            .into());
        }
        let product = product_of(info)?;
        let intermediate = match &info.intermediate {
            Some(cert) => cert.clone(),
            None => self
                .collateral
                .intermediate(product, key)
                .map_err(|e| Error::CollateralUnavailable(e.to_string()))?,
        };
        let signer = match (&info.signer, key) {
            (Some(cert), _) => cert.clone(),
            (None, SigningKey::Vlek) => {
                return Err(SnpError::InstanceInfo(
                    "the report is VLEK-signed but the document carries no VLEK (AMD serves none)"
                        .to_owned(),
                )
                .into());
            }
            (None, SigningKey::Vcek) => {
                if report.chip_id_masked() {
                    return Err(SnpError::InstanceInfo(
                        "the report masks its CHIP_ID and the document carries no VCEK".to_owned(),
                    )
                    .into());
                }
                let hw_id = match product {
                    Product::Turin => &report.chip_id()[..8],
                    Product::Milan | Product::Genoa => &report.chip_id()[..],
                };
                self.collateral
                    .vcek(product, hw_id, &report.reported_tcb(product))
                    .map_err(|e| Error::CollateralUnavailable(e.to_string()))?
            }
        };
        let ark = self.snp.trust.ark_for(product).ok_or_else(|| {
            SnpError::UntrustedRoot(format!(
                "none configured for {product} (amdRootKey names another product)"
            ))
        })?;
        let now = (self.clock)();
        let verified = verify_report(report, &signer, &intermediate, ark, &self.snp.trust, now)?;
        let crl = self
            .collateral
            .crl(product)
            .map_err(|e| Error::CollateralUnavailable(e.to_string()))?;
        crl.check(
            ark,
            &intermediate,
            &signer,
            now,
            self.collateral.crl_max_stale(),
        )?;
        let warnings = self.snp.check(&verified)?;
        Ok((verified, warnings))
    }
}

/// The product a report is for: its CPUID (versions 3 and later), else the intermediate the
/// node sent.
fn product_of(info: &InstanceInfo) -> Result<Product, Error> {
    if let Some((family, model)) = info.report.cpuid() {
        return Product::from_cpuid(family, model).ok_or_else(|| {
            SnpError::ReportField(format!(
                "CPU family {family:#x} model {model:#x} is no SEV-SNP product this verifier knows"
            ))
            .into()
        });
    }
    info.intermediate
        .as_ref()
        .and_then(product_of_intermediate)
        .ok_or_else(|| {
            SnpError::InstanceInfo(
                "a version 2 report does not name its CPU, and no ASK or ASVK came with it"
                    .to_owned(),
            )
            .into()
        })
}

fn product_of_intermediate(cert: &Cert) -> Option<Product> {
    let cn = cert.common_name();
    let name = cn
        .strip_prefix("SEV-VLEK-")
        .or_else(|| cn.strip_prefix("SEV-"))?;
    Product::from_name(name)
}

/// The AK binding the report must carry.
fn check_binding(
    binding: Binding,
    report: &VerifiedReport,
    ak: &tpm::Public,
    info: &InstanceInfo,
) -> Result<(), Error> {
    let report_data = report.report.report_data();
    match binding {
        Binding::Aws => {
            let spki = ak
                .spki_der()
                .map_err(|e| Error::Binding(format!("the AK has no SubjectPublicKeyInfo: {e}")))?;
            let digest = ring::digest::digest(&ring::digest::SHA512, &spki);
            if !bool::from(digest.as_ref().ct_eq(report_data.as_slice())) {
                return Err(Error::Binding(
                    "REPORT_DATA is not SHA-512 of the attestation key's SubjectPublicKeyInfo"
                        .to_owned(),
                ));
            }
        }
        Binding::Azure => {
            let runtime = info.azure_runtime_data.as_deref().ok_or_else(|| {
                Error::Binding("the document carries no Azure runtime data".to_owned())
            })?;
            check_azure_binding(report_data.as_slice(), runtime, ak)?;
        }
    }
    Ok(())
}

/// The hardware facts the decision rests on, for the audit line.
fn facts(verified: &VerifiedReport) -> String {
    let product = verified.product();
    let report = &verified.report;
    let signer = match (&verified.signer.csp_id, verified.signer.key) {
        (Some(csp), SigningKey::Vlek) => format!("VLEK of {csp}"),
        (_, key) => format!("{key} of chip {}", hex::encode(&report.chip_id()[..8])),
    };
    format!(
        "SEV-SNP {product}, report v{}, {signer}, reported TCB {}, launch TCB {}, policy {:#x}, VMPL {}, measurement {}",
        report.version(),
        report.reported_tcb(product),
        report.launch_tcb(product),
        report.policy(),
        report.vmpl(),
        hex::encode(report.measurement()),
    )
}

impl Validator for SevSnpValidator {
    fn variant(&self) -> Variant {
        match self.binding {
            Binding::Aws => Variant::AwsSevSnp,
            Binding::Azure => Variant::AzureSevSnp,
        }
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        let info = doc
            .instance_info
            .as_deref()
            .filter(|i| !i.is_empty())
            .ok_or(Error::Missing(
                "the document has no InstanceInfo (SNP evidence)",
            ))?;
        let info = InstanceInfo::parse(info)?;
        let (verified, mut notes) = self.verify_hardware(&info)?;
        let ak_pub = doc
            .attestation
            .as_ref()
            .map(|a| a.ak_pub.as_slice())
            .unwrap_or_default();
        let ak = tpm::Public::parse(ak_pub).map_err(Error::AkPublic)?;
        check_binding(self.binding, &verified, &ak, &info)?;
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        notes.insert(0, facts(&verified));
        Ok(Verified {
            variant: self.variant(),
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes,
        })
    }
}
