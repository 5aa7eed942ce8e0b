//! `attest-tool dry-run`: the nodes a new attestation config would refuse, decided again from
//! the evidence attest-proxy kept ([`attestation::evidence`]), offline.
//!
//! The validator is the one attest-proxy builds from the config for the variant. SEV-SNP
//! documents need AMD's collateral: `--collateral-dir` reads what attest-proxy's cache
//! persisted (its `--collateral-dir`, copied off the pod), and the decision is made now, as
//! attest-proxy's own dry run and reload guard make it; a CRL past its `nextUpdate` is accepted
//! for `--collateral-max-stale`, as attest-proxy accepts it. gcp-sev-snp (which asks the GCE
//! API) and the TDX variants are tried by attest-proxy itself (`POST /dry-run` on its admin
//! port), over its live caches.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use attestation::Variant;
use attestation::dry_run::Report;
use attestation::snp::{Cert, CollateralError, Crl, Product, SigningKey, SnpCollateral, Tcb};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};

use crate::read;

/// Where attest-proxy keeps evidence in the deployed pod.
pub const DEFAULT_EVIDENCE_DIR: &str = "/var/cache/joinservice/evidence";

#[derive(Debug, clap::Args)]
pub struct DryRunArgs {
    /// The new attestation config (the variant's JSON object), as attest-proxy would read it.
    #[arg(long)]
    pub config: PathBuf,
    /// attest-proxy's evidence directory (`--evidence-dir`), or a copy of it: on the
    /// control-plane node, the pod's `proxy-cache` emptyDir holds it (deploy/README.md).
    #[arg(long, default_value = DEFAULT_EVIDENCE_DIR)]
    pub evidence: PathBuf,
    /// The variant to decide for; the newest record's if omitted.
    #[arg(long)]
    pub variant: Option<Variant>,
    /// aws-sev-snp, azure-sev-snp: attest-proxy's collateral directory (`--collateral-dir`), or
    /// a copy of it: AMD's CRLs, chains and the VCEKs its nodes needed, as its cache persisted
    /// them.
    #[arg(long)]
    pub collateral_dir: Option<PathBuf>,
    /// How long past its nextUpdate a CRL from `--collateral-dir` is still accepted, as
    /// attest-proxy's `--collateral-max-stale`.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub collateral_max_stale: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the dry run and prints its report; `Ok(true)` when the config would refuse no node.
pub fn run(args: DryRunArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let raw = read(&args.config)?;
    let kept = attestation::evidence::read_dir(&args.evidence).with_context(|| {
        format!(
            "cannot read the evidence directory {}",
            args.evidence.display()
        )
    })?;
    let variant = match args.variant {
        Some(variant) => variant,
        None => match kept.records.last() {
            Some(record) => record.variant()?,
            None => bail!(
                "{} holds no kept decision: nothing to try the config on (give --variant to check the config alone)",
                args.evidence.display()
            ),
        },
    };
    let (validator, digest) = validator(
        variant,
        &raw,
        args.collateral_dir.as_deref(),
        args.collateral_max_stale,
    )
    .with_context(|| {
        format!(
            "{} is not a valid {variant} attestation config",
            args.config.display()
        )
    })?;
    let mut report: Report = attestation::dry_run::run(&kept.records, validator.as_ref(), &digest);
    report.skipped.extend(
        kept.skipped
            .iter()
            .map(|(path, why)| format!("{}: {why}", path.display())),
    );
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(out, "{}", report.explain())?;
    }
    Ok(report.refused.is_empty())
}

/// The validator attest-proxy builds for `variant` from `raw`, and its policy digest.
fn validator(
    variant: Variant,
    raw: &[u8],
    collateral_dir: Option<&Path>,
    max_stale: Duration,
) -> anyhow::Result<(Box<dyn attestation::Validator>, String)> {
    match variant {
        Variant::QemuVtpm => {
            if collateral_dir.is_some() {
                bail!("--collateral-dir is for the SEV-SNP variants");
            }
            let config = attestation::QemuVtpmConfig::from_attestation_config(raw)?;
            let digest = config.digest();
            Ok((
                Box::new(attestation::QemuVtpmValidator::from_config(config)),
                digest,
            ))
        }
        Variant::AwsSevSnp | Variant::AzureSevSnp => {
            let binding = if variant == Variant::AwsSevSnp {
                Binding::Aws
            } else {
                Binding::Azure
            };
            let collateral = match collateral_dir {
                Some(dir) => CacheDirCollateral::read(dir, max_stale)?,
                None => CacheDirCollateral::default(),
            };
            let (validator, digest) =
                SevSnpValidator::from_attestation_config(binding, raw, Arc::new(collateral))?;
            Ok((Box::new(validator), digest))
        }
        other => bail!(
            "{other} is not tried offline: it needs what only attest-proxy has (the GCE API, Intel's collateral cache); POST the config to attest-proxy's /dry-run instead"
        ),
    }
}

/// AMD's collateral as attest-proxy's cache persisted it, by the cache's keys.
#[derive(Debug, Default)]
struct CacheDirCollateral {
    items: HashMap<String, Vec<u8>>,
    max_stale: Duration,
}

impl CacheDirCollateral {
    fn read(dir: &Path, max_stale: Duration) -> anyhow::Result<Self> {
        let items = collateral::persisted(dir)
            .with_context(|| format!("cannot read the collateral directory {}", dir.display()))?;
        Ok(Self { items, max_stale })
    }

    fn item(&self, key: &str) -> Result<&[u8], CollateralError> {
        self.items.get(key).map(Vec::as_slice).ok_or_else(|| {
            CollateralError(format!(
                "{key} is not in the collateral directory (attest-proxy had not fetched it)"
            ))
        })
    }
}

impl SnpCollateral for CacheDirCollateral {
    fn crl(&self, product: Product, key: SigningKey) -> Result<Crl, CollateralError> {
        let bytes = self.item(&collateral::kds::crl_key(product, key))?;
        Crl::from_der(bytes.to_vec()).map_err(|e| CollateralError(e.to_string()))
    }

    fn vcek(&self, product: Product, hw_id: &[u8], tcb: &Tcb) -> Result<Cert, CollateralError> {
        let bytes = self.item(&collateral::kds::vcek_key(product, hw_id, tcb))?;
        Cert::from_der(bytes.to_vec()).map_err(|e| CollateralError(e.to_string()))
    }

    fn intermediate(&self, product: Product, key: SigningKey) -> Result<Cert, CollateralError> {
        let bytes = self.item(&collateral::kds::chain_key(product, key))?;
        collateral::kds::intermediate_of(bytes, product, key)
    }

    fn crl_max_stale(&self) -> i64 {
        i64::try_from(self.max_stale.as_secs()).unwrap_or(i64::MAX)
    }
}
