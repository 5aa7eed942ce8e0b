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
//!   for `--variant aws-nitro-tpm`, `--ec2-tpm-support v2.0|none` stands for EC2's answer about
//!   the image the document names;
//! - `policy --config <file> --variant qemu-vtpm` prints the measurement policy and the trusted
//!   attestation keys the service would enforce from that attestation config, with the digest
//!   attest-proxy logs;
//! - `ak-digest --document <file>` prints the digest of the attestation key a saved document
//!   carries, the value that goes into `trustedAkDigests`;
//! - `snp verify --report R --signer CERT --chain PEM [--crl DER] [--config C] [--at T] --json`
//!   verifies a bare SEV-SNP report as the service does and prints its fields and the verdict;
//!   `snp kds-url --report R` prints where AMD serves the VCEK it needs ([`snp`]);
//! - `tdx verify --quote Q --collateral DIR [--config C] [--at T] --json` verifies a bare TDX
//!   quote with Intel's collateral from files and prints its TD fields, the TCB status and
//!   advisories, and the verdict ([`tdx`]).
//!
//! The config file is what attest-proxy reads (`--attestation-config`): the attestation config
//! object of one variant, `{"measurements": {"<index>": {"expected": "<hex>", "warnOnly":
//! bool}, ...}, "trustedAkDigests": ["<hex>", ...]}`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use attestation::audit::{Decision, Evidence, Subject};
use attestation::eventlog::{EventLog, LogFormat};
use attestation::tpm::HashAlg;
use attestation::variants::aws_nitro_tpm::{
    AwsNitroTpmValidator, IdentityDocument, ImageRef, StaticEc2Images,
};
use attestation::{AkTrust, QemuVtpmConfig, QemuVtpmValidator, Validator, Variant};
use clap::{Parser, Subcommand};
use serde::ser::{SerializeMap, Serializer};

pub mod audit;
pub mod snp;
pub mod tdx;

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
        /// (`{"measurements": {...}}`); with `--trusted-ak-digest` it is one that attest-proxy
        /// and this tool read as it is.
        #[arg(long)]
        bank: Option<String>,
        /// The digest of an attestation key to trust (`attest-tool ak-digest`), written into
        /// the config's `trustedAkDigests`; repeat for every machine's key. Needs `--bank`.
        #[arg(long = "trusted-ak-digest", requires = "bank")]
        trusted_ak_digests: Vec<String>,
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
        /// aws-sev-snp, azure-sev-snp: the verification time for AMD's certificates and CRL
        /// (RFC 3339 or seconds since the epoch); now if omitted.
        #[arg(long)]
        at: Option<String>,
        /// aws-sev-snp, azure-sev-snp: AMD's collateral as files, in place of attest-proxy's
        /// KDS cache: AMD's CRL for the report's signer, required (`crl-<Product>.der`, KDS's
        /// /vcek/v1/<Product>/crl, for VCEK-signed reports; `vlek-crl-<Product>.der`, KDS's
        /// /vlek/v1/<Product>/crl, for VLEK-signed ones), and for documents that leave them out
        /// `ask-<Product>.pem` / `asvk-<Product>.pem` (KDS's cert_chain) and the VCEK
        /// `vcek-<Product>.der` (KDS's /vcek/v1/<Product>/<hwid>?..., which `attest-tool snp
        /// kds-url` prints; Azure's documents carry none). Without it, the decision names what
        /// is unavailable.
        #[arg(long)]
        collateral_dir: Option<PathBuf>,
        /// aws-nitro-tpm: EC2's answer for the image the document names, in place of
        /// ec2-identity's: the `TpmSupport` that `aws ec2 describe-images --image-ids <imageId>
        /// --region <region>` reports (`v2.0`), or `none` for an image without it. Without it,
        /// the decision names EC2's answer as unavailable.
        #[arg(long, value_name = "v2.0|none")]
        ec2_tpm_support: Option<String>,
        /// The attestation document (the bytes of the certificate extension).
        document: PathBuf,
    },
    /// SEV-SNP reports: verify one offline, print the KDS URL of its VCEK.
    Snp {
        #[command(subcommand)]
        command: snp::SnpCommand,
    },
    /// Intel TDX quotes: verify one offline with Intel's collateral from files.
    Tdx {
        #[command(subcommand)]
        command: tdx::TdxCommand,
    },
    /// Audit logs: check their hash chains.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
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
    /// Print the SHA-256 digest of the attestation key (the document's `ak_pub`, a marshalled
    /// TPMT_PUBLIC) in the form `trustedAkDigests` lists it.
    ///
    /// The document is what a node puts in its aTLS certificate (the extension of OID
    /// 1.3.9900.5.1): save one on the machine with the node's issuer (`node/tpm-issuer`,
    /// `TpmIssuer::issue_document` with any nonce, on the TPM the node joins with), or take the
    /// extension's bytes from a node's certificate. This tool does not open TPMs itself. The AK
    /// is a primary key of the TPM, the same every time it is opened, so one document per
    /// machine is enough; it changes when the TPM is cleared.
    AkDigest {
        /// A saved attestation document (JSON, as the aTLS certificate extension carries it).
        #[arg(long)]
        document: PathBuf,
    },
}

/// How a command ended, apart from errors (which exit with 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// `verify` rejected the document, or `audit verify` found a break.
    Rejected,
}

/// Runs one command, writing its output to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::ReplayEventlog {
            file,
            bank,
            trusted_ak_digests,
        } => {
            let log = read(&file)?;
            let json = match bank {
                None => replay_eventlog(&log)?,
                Some(name) => {
                    let bank = parse_bank(&name)?;
                    replay_eventlog_bank(&log, bank, &trusted_ak_digests)?
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
            at,
            collateral_dir,
            ec2_tpm_support,
            document,
        } => {
            if ec2_tpm_support.is_some() && variant != Variant::AwsNitroTpm {
                bail!("--ec2-tpm-support is for aws-nitro-tpm");
            }
            let nonce = hex::decode(&nonce).context("--nonce is not hex")?;
            let user_data = user_data
                .map(|u| hex::decode(u).context("--user-data is not hex"))
                .transpose()?;
            let doc = read(&document)?;
            let name = document.display().to_string();
            let decision = match variant {
                Variant::AwsSevSnp | Variant::AzureSevSnp => {
                    let at = snp::parse_time(at.as_deref())?;
                    let snp = snp::document_validator(
                        &read(&config)?,
                        variant,
                        collateral_dir.as_deref(),
                        at,
                    )
                    .with_context(|| {
                        format!("{} is not a valid attestation config", config.display())
                    })?;
                    decide(
                        &snp.0,
                        &snp.1,
                        variant,
                        &doc,
                        &nonce,
                        user_data.as_deref(),
                        &name,
                    )
                }
                Variant::AwsNitroTpm => {
                    if at.is_some() || collateral_dir.is_some() {
                        bail!("--at and --collateral-dir are for the SEV-SNP variants");
                    }
                    let raw = read(&config)?;
                    let (validator, digest) =
                        nitro_validator(&raw, &doc, ec2_tpm_support.as_deref()).with_context(
                            || format!("{} is not a valid attestation config", config.display()),
                        )?;
                    decide(
                        &validator,
                        &digest,
                        variant,
                        &doc,
                        &nonce,
                        user_data.as_deref(),
                        &name,
                    )
                }
                _ => {
                    if at.is_some() || collateral_dir.is_some() {
                        bail!("--at and --collateral-dir are for the SEV-SNP variants");
                    }
                    let config = load_config(&config, variant)?;
                    verify(&config, variant, &doc, &nonce, user_data.as_deref(), &name)?
                }
            };
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
        Command::Tdx { command } => Ok(if tdx::run(command, out)? {
            Outcome::Success
        } else {
            Outcome::Rejected
        }),
        Command::Audit { command } => audit::run(command, out),
        Command::Policy { config, variant } => {
            let config = load_config(&config, variant)?;
            write!(out, "{}", describe_policy(&config, variant))?;
            Ok(Outcome::Success)
        }
        Command::AkDigest { document } => {
            writeln!(out, "{}", ak_digest_of_document(&read(&document)?)?)?;
            Ok(Outcome::Success)
        }
    }
}

/// A file's bytes, its path named when it cannot be read (every subcommand reads its inputs so).
pub(crate) fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The config attest-proxy would load for `variant`; the variants it cannot validate, and the
/// configs it refuses at start, are refused here as there.
fn load_config(path: &Path, variant: Variant) -> anyhow::Result<QemuVtpmConfig> {
    // aws-nitro-tpm's config is qemu-vtpm's: measurements and the keys to trust.
    if !matches!(variant, Variant::QemuVtpm | Variant::AwsNitroTpm) {
        bail!("attestation variant {variant} is not supported by this build");
    }
    QemuVtpmConfig::from_attestation_config(&read(path)?)
        .with_context(|| format!("{} is not a valid attestation config", path.display()))
}

/// The hex SHA-256 of the attestation key a vTPM document carries, after checking that it is
/// a key a validator can use (a document with an unusable key would be refused anyway).
pub fn ak_digest_of_document(document: &[u8]) -> anyhow::Result<String> {
    let doc: attestation::vtpm::AttestationDocument =
        serde_json::from_slice(document).context("not an attestation document (JSON)")?;
    let ak_pub = doc
        .attestation
        .map(|a| a.ak_pub)
        .filter(|k| !k.is_empty())
        .context("the document carries no attestation key (ak_pub)")?;
    attestation::tpm::Public::parse(&ak_pub)
        .context("the document's ak_pub is not a TPMT_PUBLIC")?;
    Ok(hex::encode(attestation::ak_digest(&ak_pub)))
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

/// Replays `log` for one bank and renders an attestation config:
/// `{"measurements": {"<index>": {"expected": "<hex>", "warnOnly": false}, ...},
/// "trustedAkDigests": [...]}`, the list only when `trusted_ak_digests` is not empty (without
/// it, the service refuses the config until the operator adds the keys).
pub fn replay_eventlog_bank(
    log: &[u8],
    bank: HashAlg,
    trusted_ak_digests: &[String],
) -> anyhow::Result<String> {
    let pcrs = EventLog::parse(log)
        .context("cannot parse the event log")?
        .replay(bank)
        .with_context(|| format!("cannot replay the {bank} bank"))?;
    let mut config = serde_json::json!({ "measurements": Measurements(&pcrs) });
    if !trusted_ak_digests.is_empty() {
        for digest in trusted_ak_digests {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(digest, &mut bytes).with_context(|| {
                format!("--trusted-ak-digest {digest:?} is not 64 hex digits (SHA-256)")
            })?;
        }
        config["trustedAkDigests"] = serde_json::json!(
            trusted_ak_digests
                .iter()
                .map(|d| d.to_lowercase())
                .collect::<Vec<_>>()
        );
    }
    Ok(serde_json::to_string_pretty(&config)?)
}

/// Verifies `document` as attest-proxy does and returns the audit record of the decision. The
/// evidence digest is over the document bytes (the proxy's is over the certificate).
pub fn verify(
    config: &QemuVtpmConfig,
    variant: Variant,
    document: &[u8],
    nonce: &[u8],
    user_data: Option<&[u8]>,
    name: &str,
) -> anyhow::Result<Decision> {
    if variant != Variant::QemuVtpm {
        bail!("attestation variant {variant} is not supported by this build");
    }
    let validator = QemuVtpmValidator::from_config(config.clone());
    Ok(decide(
        &validator,
        &config.digest(),
        variant,
        document,
        nonce,
        user_data,
        name,
    ))
}

/// aws-nitro-tpm's validator for `config`, with EC2's answer for the image `document` names
/// given as `tpm_support` (`v2.0`, or `none`); without it EC2 counts as unreachable.
fn nitro_validator(
    config: &[u8],
    document: &[u8],
    tpm_support: Option<&str>,
) -> anyhow::Result<(AwsNitroTpmValidator, String)> {
    let (validator, digest) = AwsNitroTpmValidator::from_attestation_config(config)?;
    let mut ec2 = StaticEc2Images::new();
    match tpm_support {
        None => {
            ec2 = ec2.unavailable(
                "offline: give EC2's answer for the document's image with --ec2-tpm-support",
            );
        }
        Some(answer) => {
            // The image the document names; a document that names none is refused by the
            // validator with its own reason.
            let image = attestation::vtpm::document::AttestationDocument::parse(document)
                .ok()
                .and_then(|d| d.instance_info)
                .and_then(|info| IdentityDocument::parse(&info).ok())
                .and_then(|id| ImageRef::from_identity(&id).ok());
            if let Some(image) = image {
                let answer = (answer != "none").then_some(answer);
                ec2 = ec2.with_image(image, answer);
            }
        }
    }
    Ok((validator.with_ec2_images(std::sync::Arc::new(ec2)), digest))
}

/// The audit record of `validator`'s decision on `document`.
fn decide(
    validator: &dyn Validator,
    policy_digest: &str,
    variant: Variant,
    document: &[u8],
    nonce: &[u8],
    user_data: Option<&[u8]>,
    name: &str,
) -> Decision {
    let subject = Subject::now(
        name,
        variant,
        policy_digest.to_owned(),
        Evidence::Document(document),
    );
    match validator.validate(document, nonce) {
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
    }
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
pub fn describe_policy(config: &QemuVtpmConfig, variant: Variant) -> String {
    let policy = &config.policy;
    let mut s = format!("variant: {variant}\npolicy digest: {}\n", config.digest());
    match &config.ak_trust {
        AkTrust::AnyKey => s.push_str(
            "attestation keys: ANY (trustAnyAk: development only, anyone can forge a quote)\n",
        ),
        AkTrust::Pinned(digests) => {
            s.push_str(&format!("attestation keys: {} trusted\n", digests.len()));
            for digest in digests {
                s.push_str(&format!("  AK sha256:{}\n", hex::encode(digest)));
            }
        }
    }
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
