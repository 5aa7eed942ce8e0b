//! aws-sev-snp, azure-sev-snp and gcp-sev-snp: a vTPM document whose attestation key an AMD
//! SEV-SNP report (and, on GCP, the GCE API) vouches for.
//!
//! Everything that needs nothing from AMD comes first, so a made-up report costs no KDS fetch
//! (a VCEK is named by the report's unverified CHIP_ID and TCB): the vTPM quotes verify with the
//! document's AK (as for qemu-vtpm), the report parses, the configured SNP policy accepts its
//! fields, and REPORT_DATA binds the AK (aws: SHA-512 of its SubjectPublicKeyInfo; azure: the
//! first 32 bytes are SHA-256 of the HCL runtime data, whose `keys[0]` is the AK; gcp: this
//! connection's extraData and 32 zero bytes, and the instance InstanceInfo names is in one of
//! `allowedGcpProjects` when that is set). These verdicts hold once the same bytes verify. Then
//! the trust chain: the report verifies with AMD's chain up to a configured ARK, against AMD's
//! current CRL for its signer's kind (VCEK or VLEK); then the quoted PCRs are compared with
//! `measurements`; on GCP the GCE API is asked last whether its shielded-instance identity of
//! that instance is the AK (see [`crate::snp::gce`]), so a document that fails any other check
//! costs no call.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::policy::Policy;
use crate::snp::gce::{self, GceIdentity, GceKeyError, GcpProjects, InstanceRef};
use crate::snp::instance_info::check_azure_binding;
use crate::snp::{
    Cert, Crl, InstanceInfo, Product, SigningKey, SnpCollateral, SnpConfig, SnpError,
    VerifiedReport, verify_report,
};
use crate::tpm;
use crate::vtpm::{compare_pcrs, make_extra_data, verify_document};
use crate::{Error, Validator, Variant, Verified};

/// How the report binds the attestation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// REPORT_DATA = SHA-512(DER SubjectPublicKeyInfo of the AK); signed by a VLEK.
    Aws,
    /// REPORT_DATA[0:32] = SHA-256(HCL runtime data), its `keys[0]` the AK.
    Azure,
    /// REPORT_DATA = extraData ‖ 32 zero bytes; the AK is the one the GCE API vouches for.
    Gcp,
}

impl Binding {
    /// The variant whose reports bind their key this way.
    pub fn variant(self) -> Variant {
        match self {
            Binding::Aws => Variant::AwsSevSnp,
            Binding::Azure => Variant::AzureSevSnp,
            Binding::Gcp => Variant::GcpSevSnp,
        }
    }
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

/// What an SNP variant's document without its report is refused with.
const NO_SNP_EVIDENCE: &str = "the document has no InstanceInfo (SNP evidence)";

/// Validates the documents of an SNP variant.
#[derive(Clone)]
pub struct SevSnpValidator {
    binding: Binding,
    policy: Policy,
    snp: SnpConfig,
    collateral: Arc<dyn SnpCollateral>,
    /// Where gcp-sev-snp asks which key the GCE API vouches for.
    gce: Option<Arc<dyn GceIdentity>>,
    /// The GCP projects whose instances gcp-sev-snp admits.
    gcp_projects: GcpProjects,
    clock: Clock,
}

impl fmt::Debug for SevSnpValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SevSnpValidator")
            .field("binding", &self.binding)
            .field("policy", &self.policy)
            .field("snp", &self.snp)
            .field("collateral", &self.collateral)
            .field("gce", &self.gce)
            .field("gcp_projects", &self.gcp_projects)
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
            gce: None,
            gcp_projects: GcpProjects::default(),
            clock: system_clock(),
        }
    }

    /// The validator an attestation config describes: its measurements (at least one enforced),
    /// its SNP settings as [`SnpConfig::for_variant`] reads them and, for gcp-sev-snp,
    /// `allowedGcpProjects`, with collateral from `collateral`. Returns it with the digest that
    /// covers everything it decides by.
    pub fn from_attestation_config(
        binding: Binding,
        json: &[u8],
        collateral: Arc<dyn SnpCollateral>,
    ) -> Result<(SevSnpValidator, String), crate::PolicyError> {
        let policy = Policy::enforcing_from_attestation_config(json)?;
        let snp = SnpConfig::for_variant(binding.variant(), json)?;
        let gcp_projects = GcpProjects::from_attestation_config(json)?;
        if binding != Binding::Gcp && !gcp_projects.is_any() {
            return Err(crate::snp::GcpProjectsError::NotGcp(binding.variant().name()).into());
        }
        let digest = policy.digest_with(&(snp.canonical() + &gcp_projects.canonical()));
        Ok((
            SevSnpValidator::new(binding, policy, snp, collateral).with_gcp_projects(gcp_projects),
            digest,
        ))
    }

    /// gcp-sev-snp admits only instances of `projects` (`allowedGcpProjects`).
    pub fn with_gcp_projects(mut self, projects: GcpProjects) -> Self {
        self.gcp_projects = projects;
        self
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

    /// Where gcp-sev-snp learns the key the GCE API vouches for; without one every gcp-sev-snp
    /// document is refused.
    pub fn with_gce_identity(mut self, gce: Arc<dyn GceIdentity>) -> Self {
        self.gce = Some(gce);
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Verifies the report in `info` with AMD's chain and CRL and applies the SNP policy.
    fn verify_hardware(&self, info: &InstanceInfo) -> Result<(VerifiedReport, Vec<String>), Error> {
        let report = &info.report;
        let key = report.signing_key();
        let product = product_of(info)?;
        // Everything that needs nothing from AMD first: a report the policy refuses, whoever
        // signed it, makes the service fetch nothing (a VCEK is named by the unverified report).
        let warnings = self.snp.check_report(report, product)?;
        let intermediate = intermediate_of(info, product, self.collateral.as_ref())?;
        let signer = signer_of(info, product, self.collateral.as_ref())?;
        let ark = self.snp.trust.ark_for(product).ok_or_else(|| {
            SnpError::UntrustedRoot(format!(
                "none configured for {product} (amdRootKey names another product)"
            ))
        })?;
        let now = (self.clock)();
        let verified = verify_report(report, &signer, &intermediate, ark, &self.snp.trust, now)?;
        let crl = self
            .collateral
            .crl(product, key)
            .map_err(|e| Error::CollateralUnavailable(e.to_string()))?;
        crl.check(
            ark,
            &intermediate,
            &signer,
            now,
            self.collateral.crl_max_stale(),
        )?;
        Ok((verified, warnings))
    }
}

/// The ASK or ASVK of `info`'s report: the node's, else the source's.
fn intermediate_of(
    info: &InstanceInfo,
    product: Product,
    collateral: &dyn SnpCollateral,
) -> Result<Cert, Error> {
    match &info.intermediate {
        Some(cert) => Ok(cert.clone()),
        None => collateral
            .intermediate(product, info.report.signing_key())
            .map_err(|e| Error::CollateralUnavailable(e.to_string())),
    }
}

/// The VCEK or VLEK of `info`'s report: the node's, else (a VCEK) the source's.
fn signer_of(
    info: &InstanceInfo,
    product: Product,
    collateral: &dyn SnpCollateral,
) -> Result<Cert, Error> {
    let report = &info.report;
    match (&info.signer, report.signing_key()) {
        (Some(cert), _) => Ok(cert.clone()),
        (None, SigningKey::Vlek) => Err(SnpError::InstanceInfo(
            "the report is VLEK-signed but the document carries no VLEK (AMD serves none)"
                .to_owned(),
        )
        .into()),
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
            collateral
                .vcek(product, hw_id, &report.reported_tcb(product))
                .map_err(|e| Error::CollateralUnavailable(e.to_string()))
        }
    }
}

/// The AMD collateral a verifier needs beside an SNP document: the product's CRL for the report's
/// signing-key kind (VCEK or VLEK), and the
/// intermediate and signer when the document lacks them.
#[derive(Clone, Debug)]
pub struct DocumentCollateral {
    pub crl: Crl,
    /// The ASK or ASVK, `None` when the document carries it.
    pub intermediate: Option<Cert>,
    /// The VCEK, `None` when the document carries its signer.
    pub signer: Option<Cert>,
}

/// Takes from `collateral` what a verifier of `document` (a vTPM document with SNP
/// InstanceInfo, any SNP variant) will ask it for. Nothing is verified here: the service uses it
/// to hand nodes the collateral for its own document, and nodes verify it with the document.
pub fn collateral_for_document(
    document: &[u8],
    collateral: &dyn SnpCollateral,
) -> Result<DocumentCollateral, Error> {
    let doc = crate::vtpm::document::AttestationDocument::parse(document)?;
    let info = InstanceInfo::parse(doc.hardware_evidence(NO_SNP_EVIDENCE)?)?;
    let product = product_of(&info)?;
    let intermediate = match info.intermediate {
        Some(_) => None,
        None => Some(intermediate_of(&info, product, collateral)?),
    };
    let signer = match info.signer {
        Some(_) => None,
        None => Some(signer_of(&info, product, collateral)?),
    };
    let crl = collateral
        .crl(product, info.report.signing_key())
        .map_err(|e| Error::CollateralUnavailable(e.to_string()))?;
    Ok(DocumentCollateral {
        crl,
        intermediate,
        signer,
    })
}

/// The product a report is for: its CPUID (versions 3 and later), else the intermediate the
/// node sent.
pub fn product_of(info: &InstanceInfo) -> Result<Product, Error> {
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

/// The AK binding the report must carry, as far as it needs nothing but the document (on
/// gcp-sev-snp the GCE API's part is [`check_gce_vouches`], asked last). `extra_data` is this
/// connection's (SHA-256 of the document's user data and the nonce). For gcp-sev-snp it returns
/// the instance whose key the GCE API must vouch for.
fn check_binding(
    binding: Binding,
    report: &crate::snp::Report,
    ak: &tpm::Public,
    info: &InstanceInfo,
    extra_data: &[u8; 32],
    gcp_projects: &GcpProjects,
) -> Result<Option<InstanceRef>, Error> {
    let report_data = report.report_data();
    match binding {
        Binding::Gcp => {
            return gcp_instance(report_data, info, extra_data, gcp_projects).map(Some);
        }
        Binding::Aws => {
            let spki = ak
                .spki_der()
                .map_err(|e| Error::Binding(format!("the AK has no SubjectPublicKeyInfo: {e}")))?;
            let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, &spki);
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
    Ok(None)
}

/// gcp-sev-snp: the report was made for this connection, and the instance it names is one of
/// an allowed project.
fn gcp_instance(
    report_data: &[u8; 64],
    info: &InstanceInfo,
    extra_data: &[u8; 32],
    projects: &GcpProjects,
) -> Result<InstanceRef, Error> {
    let (head, tail) = report_data.split_at(32);
    if !bool::from(head.ct_eq(extra_data.as_slice())) {
        return Err(Error::Binding(
            "REPORT_DATA[0:32] is not this connection's extraData (SHA-256 of user data and nonce): the report was made for another connection".to_owned(),
        ));
    }
    if tail.iter().any(|&b| b != 0) {
        return Err(Error::Binding(
            "REPORT_DATA[32:64] is not 32 zero bytes, as a GCE node leaves it".to_owned(),
        ));
    }
    let named = info.gce.as_ref().ok_or_else(|| {
        Error::Binding(
            "InstanceInfo has no GCP field naming the instance whose key the GCE API vouches for"
                .to_owned(),
        )
    })?;
    let instance =
        InstanceRef::from_instance_info(named).map_err(|e| Error::Binding(e.to_string()))?;
    if !projects.admits(&instance.project) {
        return Err(Error::Binding(format!(
            "GCP project {} is not in allowedGcpProjects (a setting beyond Constellation's)",
            instance.project
        )));
    }
    Ok(instance)
}

/// gcp-sev-snp: the GCE API vouches for the AK as `instance`'s signing key.
fn check_gce_vouches(
    instance: &InstanceRef,
    ak: &tpm::Public,
    gce: Option<&dyn GceIdentity>,
) -> Result<(), Error> {
    let gce = gce
        .ok_or_else(|| Error::Binding("this validator has no way to ask the GCE API".to_owned()))?;
    let vouched = match gce.signing_key(instance) {
        Ok(key) => key,
        Err(GceKeyError::NotFound(what)) => {
            return Err(Error::Binding(format!(
                "the GCE API knows no instance {what}, so nothing vouches for the attestation key"
            )));
        }
        Err(unavailable @ GceKeyError::Unavailable(_)) => {
            return Err(Error::CollateralUnavailable(unavailable.to_string()));
        }
    };
    let ak_spki = ak
        .spki_der()
        .map_err(|e| Error::Binding(format!("the AK has no SubjectPublicKeyInfo: {e}")))?;
    match gce::same_key(&vouched, &ak_spki) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Binding(format!(
            "the attestation key is not the signing key the GCE API vouches for {instance}"
        ))),
        Err(reason) => Err(Error::Binding(reason)),
    }
}

/// aws-sev-snp: the VLEK must be one AMD issued to AWS. AMD issues VLEKs to several clouds, each
/// naming its CSP in extension 1.3.6.1.4.1.3704.1.5 (AWS's: `CN=cc-<region>.amazonaws.com`); a
/// VLEK of another cloud's would let that cloud's guests pass as AWS's (a check beyond
/// Constellation's, which does not read the CSP).
fn check_aws_vlek(csp_id: Option<&str>, domains: &[String]) -> Result<(), Error> {
    let Some(csp) = csp_id else {
        return Err(Error::Binding(
            "the VLEK names no CSP (extension 1.3.6.1.4.1.3704.1.5), so nothing says AMD issued it to AWS; a check beyond Constellation's"
                .to_owned(),
        ));
    };
    let host = csp.strip_prefix("CN=").unwrap_or(csp);
    let in_domain = |domain: &String| {
        host.strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|name| name.starts_with("cc-") && !name.contains('.'))
    };
    if domains.iter().any(in_domain) {
        return Ok(());
    }
    Err(Error::Binding(format!(
        "the VLEK was issued to {csp}, not to AWS (CN=cc-<region>.<one of vlekCspDomains: {}>); a check beyond Constellation's",
        domains.join(", ")
    )))
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
        self.binding.variant()
    }

    fn validate(&self, document: &[u8], nonce: &[u8]) -> Result<Verified, Error> {
        let (doc, quotes) = verify_document(document, nonce)?;
        let info = InstanceInfo::parse(doc.hardware_evidence(NO_SNP_EVIDENCE)?)?;
        let ak_pub = doc
            .attestation
            .as_ref()
            .map(|a| a.ak_pub.as_slice())
            .unwrap_or_default();
        let ak = tpm::Public::parse(ak_pub).map_err(Error::AkPublic)?;
        let extra_data = make_extra_data(doc.user_data.as_deref().unwrap_or_default(), nonce);
        // The binding needs nothing from AMD: checked on the report as sent, before anything is
        // fetched for it; it holds for the verified report, whose bytes these are.
        if self.binding == Binding::Aws && info.report.signing_key() != SigningKey::Vlek {
            return Err(SnpError::ReportField(
                "aws-sev-snp reports are signed by a VLEK, this one by a VCEK".to_owned(),
            )
            .into());
        }
        let gce_instance = check_binding(
            self.binding,
            &info.report,
            &ak,
            &info,
            &extra_data,
            &self.gcp_projects,
        )?;
        let (verified, mut notes) = self.verify_hardware(&info)?;
        if self.binding == Binding::Aws {
            check_aws_vlek(
                verified.signer.csp_id.as_deref(),
                &self.snp.vlek_csp_domains,
            )?;
        }
        let warnings = compare_pcrs(&self.policy, &quotes)?;
        if let Some(instance) = &gce_instance {
            check_gce_vouches(instance, &ak, self.gce.as_deref())?;
        }
        notes.insert(0, facts(&verified));
        if let (Binding::Gcp, Some(gce)) = (self.binding, &info.gce) {
            notes.insert(
                1,
                format!(
                    "AK vouched for by the GCE API for projects/{}/zones/{}/instances/{}",
                    gce.project_id, gce.zone, gce.instance_name
                ),
            );
        }
        Ok(Verified {
            variant: self.variant(),
            user_data: doc.user_data.unwrap_or_default(),
            warnings,
            notes,
        })
    }
}
