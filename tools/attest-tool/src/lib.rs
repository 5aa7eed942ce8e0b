//! The operator's offline attestation tool.
//!
//! Everything the join service decides about a node's evidence can be reproduced here from
//! files, without a cluster:
//!
//! - `replay-eventlog <file>` replays a TCG event log (crypto-agile or legacy SHA-1) and prints
//!   the PCR values per bank as policy measurements (see [`replay_eventlog`] for the shape);
//! - `verify --config <file> --variant qemu-vtpm --nonce <hex> [--user-data <hex>] <document>`
//!   verifies a saved attestation document exactly as attest-proxy does and prints the
//!   decision as the audit line explains it ([`attestation::audit::Decision::explain`]);
//! - `policy --config <file> --variant qemu-vtpm` prints the measurement policy the service
//!   would enforce from that attestation config, with the digest attest-proxy logs;
//! - `snp verify --report R --signer CERT --chain PEM [--crl DER] [--config C] [--at T] --json`
//!   verifies a bare SEV-SNP report as the service does and prints its fields and the verdict;
//!   `snp kds-url --report R` prints where AMD serves the VCEK it needs ([`snp`]).
//!
//! The config file is what attest-proxy reads (`--attestation-config`): the attestation config
//! object of one variant, `{"measurements": {"<index>": {"expected": "<hex>", "warnOnly":
//! bool}, ...}, ...}`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use attestation::audit::{Decision, Evidence, Subject};
use attestation::eventlog::{EventLog, LogFormat};
use attestation::tpm::HashAlg;
use attestation::{Policy, QemuVtpmValidator, Validator, Variant};
use clap::{Parser, Subcommand};
use serde::ser::{SerializeMap, Serializer};

pub mod snp;

/// Offline tools for the join service's attestation.
#[derive(Debug, Parser)]
#[command(name = "attest-tool", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay a TCG event log and print the resulting PCRs per bank as policy measurements.
    ReplayEventlog {
        /// The event log, e.g. a copy of /sys/kernel/security/tpm0/binary_bios_measurements.
        file: PathBuf,
        /// Print only this bank (sha1, sha256, sha384, sha512), as a whole attestation config
        /// (`{"measurements": {...}}`) that attest-proxy and this tool read as it is.
        #[arg(long)]
        bank: Option<String>,
    },
    /// Verify a saved attestation document against a policy and a nonce, and explain the
    /// decision as attest-proxy's audit line does. Exit code 0: accepted, 1: rejected.
    Verify {
        /// The attestation config (the variant's JSON object with its measurements).
        #[arg(long)]
        config: PathBuf,
        /// The attestation variant, e.g. qemu-vtpm.
        #[arg(long)]
        variant: Variant,
        /// The nonce the document must have been issued for (hex).
        #[arg(long)]
        nonce: String,
        /// The user data the document must bind (hex); aTLS binds the hash of the
        /// certificate's public key. Not checked when omitted.
        #[arg(long)]
        user_data: Option<String>,
        /// Print the audit record as the JSON line attest-proxy logs instead of prose.
        #[arg(long)]
        json: bool,
        /// The attestation document (the bytes of the certificate extension).
        document: PathBuf,
    },
    /// SEV-SNP reports: verify one offline, print the KDS URL of its VCEK.
    Snp {
        #[command(subcommand)]
        command: snp::SnpCommand,
    },
    /// Print the measurement policy the service would enforce from an attestation config.
    Policy {
        /// The attestation config (the variant's JSON object with its measurements).
        #[arg(long)]
        config: PathBuf,
        /// The attestation variant, e.g. qemu-vtpm.
        #[arg(long)]
        variant: Variant,
    },
}

/// How a command ended, apart from errors (which exit with 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// `verify` rejected the document.
    Rejected,
}

/// Runs one command, writing its output to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::ReplayEventlog { file, bank } => {
            let log = read(&file)?;
            let json = match bank {
                None => replay_eventlog(&log)?,
                Some(name) => {
                    let bank = parse_bank(&name)?;
                    replay_eventlog_bank(&log, bank)?
                }
            };
            writeln!(out, "{json}")?;
            Ok(Outcome::Success)
        }
        Command::Verify {
            config,
            variant,
            nonce,
            user_data,
            json,
            document,
        } => {
            let nonce = hex::decode(&nonce).context("--nonce is not hex")?;
            let user_data = user_data
                .map(|u| hex::decode(u).context("--user-data is not hex"))
                .transpose()?;
            let policy = load_policy(&config)?;
            let doc = read(&document)?;
            let decision = verify(
                &policy,
                variant,
                &doc,
                &nonce,
                user_data.as_deref(),
                &document.display().to_string(),
            )?;
            if json {
                writeln!(out, "{}", decision.to_json_line())?;
            } else {
                writeln!(out, "{}", decision.explain())?;
            }
            Ok(match decision.result {
                attestation::audit::Outcome::Accepted => Outcome::Success,
                attestation::audit::Outcome::Rejected => Outcome::Rejected,
            })
        }
        Command::Snp { command } => Ok(if snp::run(command, out)? {
            Outcome::Success
        } else {
            Outcome::Rejected
        }),
        Command::Policy { config, variant } => {
            let policy = load_policy(&config)?;
            validator(variant, policy.clone())?;
            write!(out, "{}", describe_policy(&policy, variant))?;
            Ok(Outcome::Success)
        }
    }
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    Policy::from_attestation_config(&read(path)?)
        .with_context(|| format!("{} is not a valid attestation config", path.display()))
}

/// The validator attest-proxy builds for `variant`; the variants it cannot validate are refused
/// here as there.
fn validator(variant: Variant, policy: Policy) -> anyhow::Result<Box<dyn Validator>> {
    match variant {
        Variant::QemuVtpm => Ok(Box::new(QemuVtpmValidator::new(policy))),
        other => bail!("attestation variant {other} is not supported by this build"),
    }
}

/// The config's name for a bank.
fn bank_name(bank: HashAlg) -> &'static str {
    match bank {
        HashAlg::Sha1 => "sha1",
        HashAlg::Sha256 => "sha256",
        HashAlg::Sha384 => "sha384",
        HashAlg::Sha512 => "sha512",
    }
}

fn parse_bank(name: &str) -> anyhow::Result<HashAlg> {
    [
        HashAlg::Sha1,
        HashAlg::Sha256,
        HashAlg::Sha384,
        HashAlg::Sha512,
    ]
    .into_iter()
    .find(|&b| bank_name(b) == name)
    .with_context(|| format!("unknown bank {name:?} (sha1, sha256, sha384 or sha512)"))
}

/// PCR values as a policy's `measurements` object, in numeric register order (a JSON map keyed
/// by strings would otherwise sort "10" before "2").
struct Measurements<'a>(&'a BTreeMap<u32, Vec<u8>>);

impl serde::Serialize for Measurements<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (index, value) in self.0 {
            map.serialize_entry(
                &index.to_string(),
                &serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            )?;
        }
        map.end()
    }
}

/// The banks a log records that can be replayed: SHA-1 for a legacy log, the header's known
/// algorithms for a crypto-agile one, in the header's order.
fn logged_banks(log: &EventLog) -> Vec<HashAlg> {
    match &log.format {
        LogFormat::LegacySha1 => vec![HashAlg::Sha1],
        LogFormat::CryptoAgile { algorithms } => algorithms
            .iter()
            .filter_map(|&(id, _)| HashAlg::from_id(id))
            .collect(),
    }
}

/// Replays `log` and renders every logged bank as a policy measurements object:
///
/// ```json
/// {
///   "sha256": { "0": { "expected": "<hex>", "warnOnly": false }, "1": { ... }, ... },
///   "sha1":   { "0": { "expected": "<hex>", "warnOnly": false }, ... }
/// }
/// ```
///
/// Banks appear in the order the log header lists them; registers in ascending order; only
/// registers the log extends appear, all enforced (`warnOnly: false`). A bank's object is what
/// goes under `"measurements"` in the attestation config. The service compares SHA-256 (or
/// stronger) values only; SHA-1 values are printed for comparison with other tools, and a
/// policy containing them is refused.
pub fn replay_eventlog(log: &[u8]) -> anyhow::Result<String> {
    let parsed = EventLog::parse(log).context("cannot parse the event log")?;
    let mut banks = Vec::new();
    for bank in logged_banks(&parsed) {
        let pcrs = parsed
            .replay(bank)
            .with_context(|| format!("cannot replay the {bank} bank"))?;
        banks.push((bank, pcrs));
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::pretty(&mut out);
    let mut map = ser.serialize_map(Some(banks.len()))?;
    for (bank, pcrs) in &banks {
        map.serialize_entry(bank_name(*bank), &Measurements(pcrs))?;
    }
    map.end()?;
    Ok(String::from_utf8(out)?)
}

/// Replays `log` for one bank and renders a complete attestation config:
/// `{"measurements": {"<index>": {"expected": "<hex>", "warnOnly": false}, ...}}`.
pub fn replay_eventlog_bank(log: &[u8], bank: HashAlg) -> anyhow::Result<String> {
    let pcrs = EventLog::parse(log)
        .context("cannot parse the event log")?
        .replay(bank)
        .with_context(|| format!("cannot replay the {bank} bank"))?;
    Ok(serde_json::to_string_pretty(
        &serde_json::json!({ "measurements": Measurements(&pcrs) }),
    )?)
}

/// Verifies `document` as attest-proxy does and returns the audit record of the decision. The
/// evidence digest is over the document bytes (the proxy's is over the certificate).
pub fn verify(
    policy: &Policy,
    variant: Variant,
    document: &[u8],
    nonce: &[u8],
    user_data: Option<&[u8]>,
    name: &str,
) -> anyhow::Result<Decision> {
    let validator = validator(variant, policy.clone())?;
    let subject = Subject::now(name, variant, policy.digest(), Evidence::Document(document));
    Ok(match validator.validate(document, nonce) {
        Err(e) => Decision::rejected(subject, &e),
        Ok(verified) => match user_data {
            Some(wanted) if wanted != verified.user_data.as_slice() => {
                let e = UserDataMismatch {
                    wanted: hex::encode(wanted),
                    bound: hex::encode(&verified.user_data),
                };
                Decision::rejected(subject, &e).with_check("user_data")
            }
            _ => Decision::accepted(subject, &verified),
        },
    })
}

/// The document verified but binds other user data than the operator expected (for aTLS: it
/// was issued for another certificate key).
#[derive(Debug, thiserror::Error)]
#[error("the document binds user data {bound}, expected {wanted}")]
struct UserDataMismatch {
    wanted: String,
    bound: String,
}

/// The policy as attest-proxy would enforce it, for people.
pub fn describe_policy(policy: &Policy, variant: Variant) -> String {
    let mut s = format!("variant: {variant}\npolicy digest: {}\n", policy.digest());
    let Some(len) = policy.digest_len() else {
        s.push_str(
            "measurements: none (every document whose quote verifies is accepted; a SHA-256 quote is still required)\n",
        );
        return s;
    };
    let bank = HashAlg::from_digest_len(len)
        .map(|b| b.to_string())
        .unwrap_or_else(|| format!("{len}-byte"));
    let enforced = policy
        .measurements()
        .values()
        .filter(|m| !m.warn_only)
        .count();
    s.push_str(&format!(
        "bank: {bank} (compared with the verified quote of this bank only)\nmeasurements: {} ({enforced} enforced, {} warn-only)\n",
        policy.measurements().len(),
        policy.measurements().len() - enforced
    ));
    for (index, m) in policy.measurements() {
        s.push_str(&format!(
            "  PCR {index:>2}  {:<9}  {}\n",
            if m.warn_only { "warn-only" } else { "enforced" },
            hex::encode(&m.expected)
        ));
    }
    s
}
