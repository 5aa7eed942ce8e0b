//! `attest-tool tdx ...`: a bare TDX quote, verified offline with Intel's collateral from files,
//! as the service verifies it with the collateral it fetched from Intel's PCS.

use std::io::Write;
use std::path::PathBuf;

use crate::read;
use anyhow::Context;
use attestation::Variant;
use attestation::tdx::{Collateral, TdQuote, TdxConfig, VerifiedQuote, verify_quote};
use clap::Subcommand;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum TdxCommand {
    /// Verify a DCAP quote with Intel's collateral at a given time; print its TD fields, the TCB
    /// status and advisories Intel's collateral gives it, and the verdict. Exit code 0: accepted,
    /// 1: rejected.
    Verify {
        /// The quote (version 4 or 5; trailing zero padding is ignored).
        #[arg(long)]
        quote: PathBuf,
        /// Intel's collateral for the quote's platform: a directory holding either dcap-qvl's
        /// `collateral.json`, or the PCS v4 answers as files (`tcb_info.json`,
        /// `tcb_info_issuer_chain.pem`, `qe_identity.json`, `qe_identity_issuer_chain.pem`,
        /// `pck_crl.der`, `root_ca_crl.der`).
        #[arg(long)]
        collateral: PathBuf,
        /// An attestation config whose TDX settings (accepted TCB statuses, minimum SVNs,
        /// `mrtds`, `mrSeams`/`mrSeam`, `xfam`, `intelRootKey`) apply; without it, only UpToDate
        /// is accepted.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The variant the quote comes from: qemu-tdx (the default) requires SEPT_VE_DISABLE,
        /// azure-tdx does not. With --config, the config is read as the service reads it for
        /// this variant, so one that leaves the firmware unpinned is refused.
        #[arg(long, default_value = "qemu-tdx")]
        variant: attestation::Variant,
        /// The verification time: RFC 3339 or seconds since the epoch; now if omitted.
        #[arg(long)]
        at: Option<String>,
        /// Print JSON (the default is the same JSON, pretty-printed).
        #[arg(long)]
        json: bool,
    },
}

/// What the quote claims, before anything is trusted: the fields a policy is written from.
fn quote_json(quote: &TdQuote) -> serde_json::Value {
    let td = quote.td();
    json!({
        "version": quote.version(),
        "fmspc": hex::encode(quote.fmspc()),
        "pck_ca": quote.pck_ca().name(),
        "qe_svn": quote.qe_svn(),
        "pce_svn": quote.pce_svn(),
        "qe_vendor_id": hex::encode(quote.qe_vendor_id()),
        "tee_tcb_svn": hex::encode(td.tee_tcb_svn),
        "mrseam": hex::encode(td.mr_seam),
        "td_attributes": hex::encode(td.td_attributes),
        "xfam": hex::encode(td.xfam),
        "mrtd": hex::encode(td.mr_td),
        "rtmr0": hex::encode(td.rtmrs[0].0),
        "rtmr1": hex::encode(td.rtmrs[1].0),
        "rtmr2": hex::encode(td.rtmrs[2].0),
        "rtmr3": hex::encode(td.rtmrs[3].0),
        "report_data": hex::encode(td.report_data),
    })
}

/// The verdict on a quote, as JSON; `true` if it was accepted.
pub fn verify(
    quote: &[u8],
    collateral: &Collateral,
    config: &TdxConfig,
    at: i64,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let quote = TdQuote::parse(quote)?;
    let mut out = json!({ "at": at, "quote": quote_json(&quote) });
    let result: Result<(VerifiedQuote, Vec<String>), attestation::Error> = (|| {
        let verified = verify_quote(&quote, collateral, &config.trust, at)?;
        out["tcb"] = json!({
            "status": format!("{:?}", verified.status),
            "platform_status": format!("{:?}", verified.platform_status),
            "qe_status": format!("{:?}", verified.qe_status),
            "tcb_date": verified.tcb_date,
            "advisory_ids": verified.advisory_ids,
        });
        let notes = config.check(&verified)?;
        Ok((verified, notes))
    })();
    out["collateral_window"] = json!([collateral.issued(), collateral.next_update()]);
    let accepted = result.is_ok();
    match result {
        Ok((_, notes)) => {
            out["verdict"] = json!("accepted");
            out["notes"] = json!(notes);
        }
        Err(error) => {
            out["verdict"] = json!("rejected");
            out["check"] = json!(attestation::audit::check_name(&error));
            out["reason"] = json!(error.to_string());
        }
    }
    Ok((out, accepted))
}

/// Runs a `tdx` subcommand; `Ok(false)` when a quote was rejected.
pub fn run(command: TdxCommand, out: &mut dyn Write) -> anyhow::Result<bool> {
    match command {
        TdxCommand::Verify {
            quote,
            collateral,
            config,
            variant,
            at,
            json,
        } => {
            if !matches!(variant, Variant::QemuTdx | Variant::AzureTdx) {
                anyhow::bail!("--variant {variant} is not a TDX variant");
            }
            let collateral = Collateral::from_dir(&collateral)
                .with_context(|| format!("Intel collateral in {}", collateral.display()))?;
            let config = match config {
                Some(path) => {
                    let raw = read(&path)?;
                    let policy = attestation::Policy::from_attestation_config(&raw)
                        .with_context(|| format!("the measurements of {}", path.display()))?;
                    TdxConfig::for_variant(variant, &raw, &policy)
                        .with_context(|| format!("the TDX settings of {}", path.display()))?
                }
                None => TdxConfig {
                    sept_ve_disable_required: variant != Variant::AzureTdx,
                    ..TdxConfig::default()
                },
            };
            let (value, accepted) = verify(
                &read(&quote)?,
                &collateral,
                &config,
                crate::snp::parse_time(at.as_deref())?,
            )?;
            if json {
                writeln!(out, "{value}")?;
            } else {
                writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
            }
            Ok(accepted)
        }
    }
}

/// The validator attest-proxy builds for a TDX `variant` from `config`, with Intel's collateral
/// from `collateral_dir` (as `tdx verify --collateral` reads it) in place of the PCS, verifying
/// at `at`; and the policy digest audit lines name.
pub fn document_validator(
    config: &[u8],
    variant: Variant,
    collateral_dir: &std::path::Path,
    at: i64,
) -> anyhow::Result<(attestation::variants::tdx::TdxValidator, String)> {
    use attestation::variants::tdx::{TdxKind, TdxValidator};
    let kind = match variant {
        Variant::QemuTdx => TdxKind::Qemu,
        Variant::AzureTdx => TdxKind::Azure,
        other => anyhow::bail!("{other} is not a TDX variant"),
    };
    let collateral = Collateral::from_dir(collateral_dir)
        .with_context(|| format!("Intel collateral in {}", collateral_dir.display()))?;
    let source = attestation::tdx::StaticCollateral::new().with(collateral);
    let (validator, digest) =
        TdxValidator::from_attestation_config(kind, config, std::sync::Arc::new(source))?;
    Ok((
        validator.with_clock(std::sync::Arc::new(move || at)),
        digest,
    ))
}
