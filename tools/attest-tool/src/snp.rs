//! `attest-tool snp ...`: a bare SEV-SNP report, verified offline as the service verifies it.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::read;
use anyhow::{Context, bail};
use attestation::snp::{
    Cert, Crl, Product, Report, SnpConfig, Tcb, Trust, VerifiedReport, certs_from_pem,
    verify_report,
};
use clap::Subcommand;
use serde_json::json;

/// AMD's key distribution service.
pub const KDS: &str = "https://kdsintf.amd.com";

#[derive(Debug, Subcommand)]
pub enum SnpCommand {
    /// Verify a report with its signer (VCEK or VLEK) and AMD's chain at a given time; print its
    /// fields and the verdict. Exit code 0: accepted, 1: rejected.
    Verify {
        /// The 1184-byte report (with --from-hcl: an Azure HCL report holding one at 0x20).
        #[arg(long)]
        report: PathBuf,
        /// Take the report from an Azure HCL report.
        #[arg(long)]
        from_hcl: bool,
        /// The VCEK or VLEK that signed it (DER, or PEM, possibly bundled with its chain).
        #[arg(long)]
        signer: PathBuf,
        /// The ASK or ASVK (PEM; a KDS cert_chain file, whose ARK is ignored).
        #[arg(long)]
        chain: PathBuf,
        /// Trust only this ARK (PEM; Constellation's amdRootKey) instead of AMD's built-in ones.
        #[arg(long)]
        ark: Option<PathBuf>,
        /// AMD's CRL for the product (DER); without it, revocation is not checked and the output
        /// says so.
        #[arg(long)]
        crl: Option<PathBuf>,
        /// An attestation config whose SNP settings apply: the minimum TCB of the report's
        /// product, SMT, ID key digests, and the firmware pins (`launchMeasurements`,
        /// `acceptedAuthorKeyDigests`, `hostData`, `allowedChipIds`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Read --config as the service reads it for this variant (aws-sev-snp, azure-sev-snp,
        /// gcp-sev-snp): azure-sev-snp's must then pin the firmware (`firmwareSignerConfig`).
        #[arg(long, requires = "config")]
        variant: Option<attestation::Variant>,
        /// The verification time: RFC 3339 or seconds since the epoch; now if omitted.
        #[arg(long)]
        at: Option<String>,
        /// Print JSON (the default is the same JSON, pretty-printed).
        #[arg(long)]
        json: bool,
    },
    /// Print the KDS URL of the VCEK a report needs.
    KdsUrl {
        /// The 1184-byte report.
        #[arg(long)]
        report: PathBuf,
        /// The product, for a version 2 report, which does not name its CPU.
        #[arg(long)]
        product: Option<String>,
    },
}

/// The signer from a DER file or a PEM file; a PEM bundle (as Azure serves the VCEK with its
/// chain) gives its VCEK or VLEK.
fn signer_cert(bytes: Vec<u8>) -> anyhow::Result<Cert> {
    if bytes.trim_ascii_start().starts_with(b"-----") {
        let certs = certs_from_pem(&bytes)?;
        let mut leaves: Vec<Cert> = certs
            .into_iter()
            .filter(|c| matches!(c.common_name(), "SEV-VCEK" | "SEV-VLEK"))
            .collect();
        if leaves.len() != 1 {
            bail!("expected one VCEK or VLEK, found {}", leaves.len());
        }
        Ok(leaves.remove(0))
    } else {
        Ok(Cert::from_der(bytes)?)
    }
}

/// Seconds since the epoch from RFC 3339 or a plain number.
pub fn parse_time(at: Option<&str>) -> anyhow::Result<i64> {
    match at {
        None => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            .try_into()?),
        Some(s) if s.bytes().all(|b| b.is_ascii_digit()) => Ok(s.parse()?),
        Some(s) => {
            let t = humantime::parse_rfc3339(s)
                .with_context(|| format!("--at {s:?} is neither RFC 3339 nor seconds"))?;
            Ok(t.duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
                .try_into()?)
        }
    }
}

fn product_of(report: &Report, product: Option<&str>) -> anyhow::Result<Product> {
    if let Some(name) = product {
        return Product::from_name(name)
            .with_context(|| format!("--product {name:?} is not Milan, Genoa or Turin"));
    }
    match report.cpuid() {
        Some((family, model)) => Product::from_cpuid(family, model)
            .with_context(|| format!("CPU family {family:#x} model {model:#x} is unknown")),
        None => bail!("a version 2 report does not name its CPU: give --product"),
    }
}

/// The KDS URL of the VCEK for `report`.
pub fn kds_vcek_url(report: &Report, product: Product) -> String {
    let tcb = report.reported_tcb(product);
    let chip = report.chip_id();
    let (hw_id, fmc) = match product {
        Product::Turin => (&chip[..8], format!("fmcSPL={:02}&", tcb.fmc.unwrap_or(0))),
        Product::Milan | Product::Genoa => (&chip[..], String::new()),
    };
    format!(
        "{KDS}/vcek/v1/{product}/{}?{fmc}blSPL={:02}&teeSPL={:02}&snpSPL={:02}&ucodeSPL={:02}",
        hex::encode(hw_id),
        tcb.bootloader,
        tcb.tee,
        tcb.snp,
        tcb.microcode
    )
}

fn tcb_json(tcb: Tcb) -> serde_json::Value {
    serde_json::to_value(tcb).unwrap_or_default()
}

fn report_json(report: &Report, product: Option<Product>) -> serde_json::Value {
    let mut fields = json!({
        "version": report.version(),
        "guest_svn": report.guest_svn(),
        "policy": format!("{:#x}", report.policy()),
        "vmpl": report.vmpl(),
        "signing_key": report.signing_key().to_string(),
        "chip_id_masked": report.chip_id_masked(),
        "chip_id": hex::encode(report.chip_id()),
        "measurement": hex::encode(report.measurement()),
        "report_data": hex::encode(report.report_data()),
        "host_data": hex::encode(report.host_data()),
        "id_key_digest": hex::encode(report.id_key_digest()),
        "author_key_digest": hex::encode(report.author_key_digest()),
    });
    if let Some(product) = product {
        fields["product"] = json!(product.name());
        fields["reported_tcb"] = tcb_json(report.reported_tcb(product));
        fields["current_tcb"] = tcb_json(report.current_tcb(product));
        fields["committed_tcb"] = tcb_json(report.committed_tcb(product));
        fields["launch_tcb"] = tcb_json(report.launch_tcb(product));
    }
    fields
}

/// The verdict on a report, as JSON; `true` if it was accepted.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    report: &[u8],
    signer: Cert,
    chain: &[u8],
    ark: Option<&[u8]>,
    crl: Option<Crl>,
    config: Option<SnpConfig>,
    at: i64,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let report = Report::parse(report)?;
    let trust = match (&config, ark) {
        (_, Some(pem)) => Trust::from_pem(pem)?,
        (Some(config), None) => config.trust.clone(),
        (None, None) => Trust::builtin(),
    };
    let intermediate = certs_from_pem(chain)?
        .into_iter()
        .find(|c| !c.common_name().starts_with("ARK-"))
        .context("the chain holds no ASK or ASVK")?;
    let product = intermediate
        .common_name()
        .rsplit('-')
        .next()
        .and_then(Product::from_name);
    let mut out = json!({ "at": at, "report": report_json(&report, product) });
    let result: Result<(VerifiedReport, Vec<String>), String> = (|| {
        let product = product.ok_or("the intermediate names no known product")?;
        let ark = trust
            .ark_for(product)
            .ok_or_else(|| format!("no trusted ARK for {product}"))?;
        let verified = verify_report(&report, &signer, &intermediate, ark, &trust, at)
            .map_err(|e| e.to_string())?;
        let mut notes = Vec::new();
        match &crl {
            Some(crl) => crl
                .check(ark, &intermediate, &signer, at, 0)
                .map_err(|e| e.to_string())?,
            None => notes.push("revocation not checked: no --crl given".to_owned()),
        }
        if let Some(config) = &config {
            notes.extend(config.check(&verified).map_err(|e| e.to_string())?);
        } else {
            notes.push("no --config: minimum TCB and guest policy not checked".to_owned());
        }
        Ok((verified, notes))
    })();
    let accepted = result.is_ok();
    match result {
        Ok((verified, notes)) => {
            out["signer"] = json!({
                "kind": verified.signer.key.to_string(),
                "product": verified.product().name(),
                "tcb": tcb_json(verified.signer.tcb),
                "hw_id": verified.signer.hw_id.as_ref().map(hex::encode),
                "csp_id": verified.signer.csp_id,
            });
            out["verdict"] = json!("accepted");
            out["notes"] = json!(notes);
        }
        Err(reason) => {
            out["verdict"] = json!("rejected");
            out["reason"] = json!(reason);
        }
    }
    Ok((out, accepted))
}

/// Runs an `snp` subcommand; `Ok(false)` when a report was rejected.
pub fn run(command: SnpCommand, out: &mut dyn Write) -> anyhow::Result<bool> {
    match command {
        SnpCommand::Verify {
            report,
            from_hcl,
            signer,
            chain,
            ark,
            crl,
            config,
            variant,
            at,
            json,
        } => {
            let mut bytes = read(&report)?;
            if from_hcl {
                bytes = bytes
                    .get(0x20..0x20 + 1184)
                    .context("the HCL report is too short to hold an SNP report")?
                    .to_vec();
            }
            let crl = crl
                .map(|p| read(&p).and_then(|d| Ok(Crl::from_der(d)?)))
                .transpose()?;
            let config = config
                .map(|p| {
                    read(&p).and_then(|d| {
                        match variant {
                            Some(variant) => SnpConfig::for_variant(variant, &d),
                            None => SnpConfig::from_attestation_config(&d),
                        }
                        .with_context(|| format!("the SNP settings of {}", p.display()))
                    })
                })
                .transpose()?;
            let ark = ark.map(|p| read(&p)).transpose()?;
            let (value, accepted) = verify(
                &bytes,
                signer_cert(read(&signer)?)?,
                &read(&chain)?,
                ark.as_deref(),
                crl,
                config,
                parse_time(at.as_deref())?,
            )?;
            if json {
                writeln!(out, "{value}")?;
            } else {
                writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
            }
            Ok(accepted)
        }
        SnpCommand::KdsUrl { report, product } => {
            let report = Report::parse(&read(&report)?)?;
            let product = product_of(&report, product.as_deref())?;
            writeln!(out, "{}", kds_vcek_url(&report, product))?;
            Ok(true)
        }
    }
}

/// The validator attest-proxy builds for an SNP `variant` from `config`, with collateral from
/// `collateral_dir` (see `attest-tool verify --help`) in place of the KDS, verifying at `at`;
/// and the policy digest audit lines name.
pub fn document_validator(
    config: &[u8],
    variant: attestation::Variant,
    collateral_dir: Option<&Path>,
    at: i64,
) -> anyhow::Result<(attestation::variants::sev_snp::SevSnpValidator, String)> {
    use attestation::snp::{SigningKey, StaticCollateral};
    use attestation::variants::sev_snp::{Binding, SevSnpValidator};
    let binding = match variant {
        attestation::Variant::AwsSevSnp => Binding::Aws,
        attestation::Variant::AzureSevSnp => Binding::Azure,
        other => bail!("{other} is not an SEV-SNP variant"),
    };
    let mut collateral = StaticCollateral::new();
    let mut vceks = Vec::new();
    if let Some(dir) = collateral_dir {
        if !dir.is_dir() {
            bail!("--collateral-dir {} is not a directory", dir.display());
        }
        for product in [Product::Milan, Product::Genoa, Product::Turin] {
            // KDS's /vcek/v1/{product}/crl and /vlek/v1/{product}/crl.
            for (name, key) in [("crl", SigningKey::Vcek), ("vlek-crl", SigningKey::Vlek)] {
                let crl = dir.join(format!("{name}-{product}.der"));
                if crl.exists() {
                    let crl = Crl::from_der(read(&crl)?)
                        .with_context(|| format!("{} is not an AMD CRL", crl.display()))?;
                    collateral = collateral.with_crl_for(product, key, crl);
                }
            }
            // KDS's /vcek/v1/{product}/{hwid}?...: served for whatever chip and TCB the report
            // names; the verifier checks that it is the report's.
            for extension in ["der", "pem"] {
                let path = dir.join(format!("vcek-{product}.{extension}"));
                if path.exists() {
                    let vcek = signer_cert(read(&path)?)
                        .with_context(|| format!("{} is not a VCEK", path.display()))?;
                    vceks.push((product, vcek));
                }
            }
            for (prefix, key) in [("ask", SigningKey::Vcek), ("asvk", SigningKey::Vlek)] {
                let path = dir.join(format!("{prefix}-{product}.pem"));
                if path.exists() {
                    let cert = certs_from_pem(&read(&path)?)?
                        .into_iter()
                        .next()
                        .with_context(|| format!("{} holds no certificate", path.display()))?;
                    collateral = collateral.with_intermediate(product, key, cert);
                }
            }
        }
    }
    let collateral = FileCollateral {
        files: collateral,
        vceks,
    };
    let (validator, digest) =
        SevSnpValidator::from_attestation_config(binding, config, std::sync::Arc::new(collateral))?;
    Ok((
        validator.with_clock(std::sync::Arc::new(move || at)),
        digest,
    ))
}

/// AMD's collateral from `--collateral-dir`: the CRLs and intermediates as files name them, and
/// each product's VCEK (`vcek-<Product>.der`) for a document that leaves its VCEK out, as
/// Azure's do.
#[derive(Debug)]
struct FileCollateral {
    files: attestation::snp::StaticCollateral,
    vceks: Vec<(Product, Cert)>,
}

impl attestation::snp::SnpCollateral for FileCollateral {
    fn crl(
        &self,
        product: Product,
        key: attestation::snp::SigningKey,
    ) -> Result<Crl, attestation::snp::CollateralError> {
        self.files.crl(product, key)
    }

    fn vcek(
        &self,
        product: Product,
        _hw_id: &[u8],
        _tcb: &Tcb,
    ) -> Result<Cert, attestation::snp::CollateralError> {
        self.vceks
            .iter()
            .find(|(p, _)| *p == product)
            .map(|(_, cert)| cert.clone())
            .ok_or_else(|| {
                attestation::snp::CollateralError(format!(
                    "the document carries no VCEK and --collateral-dir has no vcek-{product}.der (`attest-tool snp kds-url` names the KDS URL to fetch it from)"
                ))
            })
    }

    fn intermediate(
        &self,
        product: Product,
        key: attestation::snp::SigningKey,
    ) -> Result<Cert, attestation::snp::CollateralError> {
        self.files.intermediate(product, key)
    }
}
