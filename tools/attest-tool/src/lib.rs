//! The operator's offline attestation tool.
//!
//! Everything the join service decides about a node's evidence can be reproduced here from
//! files, without a cluster:
//!
//! - `replay-eventlog <file>` replays a TCG event log (crypto-agile or legacy SHA-1) and prints
//!   the PCR values per bank as policy measurements (see [`replay_eventlog`] for the shape);
//! - `verify --config <file> [--variant V --nonce <hex>] [--user-data <hex>] <document>`
//!   verifies a saved attestation document exactly as attest-proxy does and prints the
//!   decision as the audit line explains it ([`attestation::audit::Decision::explain`]); the
//!   SEV-SNP and TDX variants, azure-trustedlaunch and aws-nitro-tpm (for AWS's NitroTPM
//!   document) take `--at` for the verification time; a
//!   saved attestation from `join-client attest` ([`attestation::saved`]) carries its variant,
//!   nonce and user data;
//! - `policy --document <file> [--service-policy]` prints the complete attestation config a
//!   node's document shows, as attest-proxy (or, for a service policy, join-client) reads it,
//!   and on stderr what it could not decide ([`derive`]);
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
//! - `dry-run --config NEW [--evidence DIR] [--variant V]` decides the evidence attest-proxy kept
//!   again under a new config and prints which nodes it would refuse, by check ([`dry_run`]);
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
use attestation::variants::azure_trustedlaunch::TrustedLaunchValidator;
use attestation::{AkTrust, QemuVtpmConfig, QemuVtpmValidator, Validator, Variant};
use clap::{Parser, Subcommand};
use serde::ser::{SerializeMap, Serializer};

/// The refusal of `verify --at` or `--collateral-dir` for a variant that takes neither.
const TIME_AND_COLLATERAL_ONLY: &str = "--at and --collateral-dir are for the SEV-SNP and TDX \
    variants (and --at for azure-trustedlaunch and aws-nitro-tpm's AWS document)";

pub mod audit;
pub mod derive;
pub mod dry_run;
pub mod gce;
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
        /// The attestation variant, e.g. qemu-vtpm; a saved attestation (`join-client attest`)
        /// names its own.
        #[arg(long)]
        variant: Option<Variant>,
        /// The nonce the document must have been issued for (hex); a saved attestation carries
        /// its own.
        #[arg(long)]
        nonce: Option<String>,
        /// The user data the document must bind (hex); aTLS binds the hash of the
        /// certificate's public key. A saved attestation's is checked; otherwise not checked
        /// when omitted.
        #[arg(long)]
        user_data: Option<String>,
        /// Print the audit record as the JSON line attest-proxy logs instead of prose.
        #[arg(long)]
        json: bool,
        /// SEV-SNP and TDX variants: the verification time for AMD's certificates and CRL or
        /// Intel's collateral; azure-trustedlaunch: for the AK certificate's chain (RFC 3339 or
        /// seconds since the epoch); now if omitted.
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
        ///
        /// qemu-tdx, azure-tdx: Intel's collateral for the quote's platform, as `attest-tool tdx
        /// verify --collateral` reads it (dcap-qvl's `collateral.json`, or the PCS answers as
        /// files); required.
        #[arg(long)]
        collateral_dir: Option<PathBuf>,
        /// gcp-sev-es: the GCE API's `instances.getShieldedInstanceIdentity` answer (its JSON)
        /// for the instance the document names, in place of gce-identity: its
        /// `signingKey.ekPub` must be the document's AK. Without it, the decision says the API
        /// could not be asked.
        #[arg(long)]
        gce_identity: Option<PathBuf>,
        /// gcp-sev-es: the GCE API's `instances.get` answer (its JSON, whole or
        /// `?fields=confidentialInstanceConfig`) for that instance: it must call the instance an
        /// AMD SEV confidential VM.
        #[arg(long)]
        gce_instance: Option<PathBuf>,
        /// aws-nitro-tpm: EC2's answer for the image the document names, in place of
        /// ec2-identity's: the `TpmSupport` that `aws ec2 describe-images --image-ids <imageId>
        /// --region <region>` reports (`v2.0`), or `none` for an image without it. Without it,
        /// the decision names EC2's answer as unavailable.
        #[arg(long, value_name = "v2.0|none")]
        ec2_tpm_support: Option<String>,
        /// The attestation document (the bytes of the certificate extension), or a saved
        /// attestation from `join-client attest`, which carries its variant, nonce and user data.
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
    /// Decide the evidence attest-proxy kept of the nodes it decided on lately again, under a
    /// new attestation config, and print which nodes it would refuse and why (by check, as the
    /// audit line names them), then a summary. Exit code 0: none would be refused, 1: some
    /// would. attest-proxy answers the same for a config POSTed to its admin `/dry-run`.
    DryRun(dry_run::DryRunArgs),
    /// Audit logs: check their hash chains.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Print a complete attestation config derived from a node's document (`--document`), or
    /// the measurement policy the service would enforce from an attestation config
    /// (`--config`).
    ///
    /// With `--document`, stdout is the attestation config of the variant, as attest-proxy reads
    /// it (`--service-policy`: the nodes' service policy, as join-client reads it, from a
    /// control-plane node's document). Every pin the document shows is set: its PCRs (the
    /// strongest quoted bank, all enforced), the attestation key (qemu-vtpm), the TCB as the
    /// minimum, launch measurement, ID and author key digests, HOST_DATA and SMT (SEV-SNP), the
    /// MRTD, RTMRs, MRSEAM, XFAM, QE vendor and SVNs (TDX). stderr says what the document could
    /// not decide and what was chosen, and the config's digest as audit lines name it.
    Policy {
        /// The attestation config (the variant's JSON object with its measurements).
        #[arg(
            long,
            conflicts_with = "document",
            required_unless_present = "document"
        )]
        config: Option<PathBuf>,
        /// A saved attestation (`join-client attest --out`) or a bare document, to derive the
        /// config from. Repeat for several nodes of one image: the config then admits each
        /// (their keys, chips, launch measurements, the lowest TCB and SVNs) and refuses
        /// documents whose measurements differ.
        #[arg(long)]
        document: Vec<PathBuf>,
        /// The attestation variant, e.g. qemu-vtpm; required with --config, and with a bare
        /// document whose shape does not name it (a vTPM document without hardware evidence).
        #[arg(long)]
        variant: Option<Variant>,
        /// Derive the nodes' service policy (join-client --service-policy) from a control-plane
        /// node's document.
        #[arg(long, requires = "document")]
        service_policy: bool,
        /// SEV-SNP: pin this machine's CHIP_ID (allowedChipIds). Off by default: a policy is
        /// for a fleet, and pinning chips refuses every other machine.
        #[arg(long, requires = "document")]
        pin_chip_id: bool,
        /// gcp-sev-snp: a GCP project whose instances may join (allowedGcpProjects); repeat
        /// for each. Without it, any project's instances are admitted.
        #[arg(long = "gcp-project", requires = "document")]
        gcp_projects: Vec<String>,
        /// TDX: a TCB status to accept (acceptedTcbStatuses), e.g. OutOfDate; repeat for each.
        /// UpToDate only if omitted. The status comes from Intel's collateral, not the document.
        #[arg(long = "accept-tcb-status", requires = "document")]
        tcb_statuses: Vec<String>,
        /// SEV-SNP: trust this AMD root (PEM file, amdRootKey) instead of AMD's built-in ones.
        #[arg(long, requires = "document")]
        amd_root_key: Option<PathBuf>,
        /// TDX: trust this Intel root (PEM file, intelRootKey) instead of the built-in one.
        #[arg(long, requires = "document")]
        intel_root_key: Option<PathBuf>,
    },
    /// Print the SHA-256 digest of the attestation key (the document's `ak_pub`, a marshalled
    /// TPMT_PUBLIC) in the form `trustedAkDigests` lists it.
    ///
    /// The document is what a node puts in its aTLS certificate (the extension of OID
    /// 1.3.9900.5.1): save one on the machine with `join-client attest --out FILE` (on the TPM
    /// the node joins with), or take the extension's bytes from a node's certificate. This
    /// tool does not open TPMs itself. The AK
    /// is a primary key of the TPM, the same every time it is opened, so one document per
    /// machine is enough; it changes when the TPM is cleared.
    AkDigest {
        /// A saved attestation (`join-client attest`) or a bare document (JSON, as the aTLS
        /// certificate extension carries it).
        #[arg(long)]
        document: PathBuf,
    },
}

/// How a command ended, apart from errors (which exit with 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// `verify` rejected the document, `audit verify` found a break, or `dry-run` found nodes
    /// the config would refuse.
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
            gce_identity,
            gce_instance,
            document,
        } => {
            let input = Input::read(&document, variant)?;
            let (variant, doc) = (input.variant, input.document);
            if ec2_tpm_support.is_some() && variant != Variant::AwsNitroTpm {
                bail!("--ec2-tpm-support is for aws-nitro-tpm");
            }
            let nonce = match (nonce, input.nonce) {
                (Some(nonce), saved) => {
                    let nonce = hex::decode(&nonce).context("--nonce is not hex")?;
                    if saved.is_some_and(|saved| saved != nonce) {
                        bail!(
                            "--nonce differs from the nonce saved in {}; leave it out",
                            document.display()
                        );
                    }
                    nonce
                }
                (None, Some(saved)) => saved,
                (None, None) => bail!(
                    "--nonce is required: {} is a bare document, which does not carry the nonce it was issued for",
                    document.display()
                ),
            };
            let user_data = match user_data {
                Some(u) => Some(hex::decode(u).context("--user-data is not hex")?),
                None => input.user_data,
            };
            let name = document.display().to_string();
            // Each hardware or cloud variant builds its validator from the config and what
            // stands in for its vendor or cloud; qemu-vtpm verifies from the config alone.
            let config_name = config.display().to_string();
            let invalid = || format!("{config_name} is not a valid attestation config");
            let built: Option<(Box<dyn Validator>, String)> = match variant {
                Variant::QemuTdx | Variant::AzureTdx => {
                    let at = snp::parse_time(at.as_deref())?;
                    let dir = collateral_dir.as_deref().with_context(|| {
                        format!("--collateral-dir (Intel's collateral) is required for {variant}")
                    })?;
                    let (validator, digest) =
                        tdx::document_validator(&read(&config)?, variant, dir, at)
                            .with_context(invalid)?;
                    Some((Box::new(validator), digest))
                }
                Variant::AwsSevSnp | Variant::AzureSevSnp => {
                    let at = snp::parse_time(at.as_deref())?;
                    let (validator, digest) = snp::document_validator(
                        &read(&config)?,
                        variant,
                        collateral_dir.as_deref(),
                        at,
                    )
                    .with_context(invalid)?;
                    Some((Box::new(validator), digest))
                }
                Variant::AzureTrustedLaunch => {
                    if collateral_dir.is_some() {
                        bail!(
                            "--collateral-dir is for the SEV-SNP variants: an azure-trustedlaunch \
                             document carries its AK certificate and CA"
                        );
                    }
                    let at = snp::parse_time(at.as_deref())?;
                    let (validator, digest) =
                        TrustedLaunchValidator::from_attestation_config(&read(&config)?)
                            .with_context(invalid)?;
                    let validator = validator.with_clock(std::sync::Arc::new(move || at));
                    Some((Box::new(validator), digest))
                }
                Variant::GcpSevEs => {
                    if at.is_some() || collateral_dir.is_some() {
                        bail!(TIME_AND_COLLATERAL_ONLY);
                    }
                    let (validator, digest) = gce::document_validator(
                        &read(&config)?,
                        &doc,
                        gce_identity.as_deref(),
                        gce_instance.as_deref(),
                    )
                    .with_context(invalid)?;
                    Some((Box::new(validator), digest))
                }
                Variant::AwsNitroTpm => {
                    if collateral_dir.is_some() {
                        bail!(TIME_AND_COLLATERAL_ONLY);
                    }
                    let (mut validator, digest) =
                        nitro_validator(&read(&config)?, &doc, ec2_tpm_support.as_deref())
                            .with_context(invalid)?;
                    // AWS's NitroTPM document chains to certificates that live hours: a saved
                    // one is checked as of when it was made.
                    if at.is_some() {
                        validator = validator.at(snp::parse_time(at.as_deref())?);
                    }
                    Some((Box::new(validator), digest))
                }
                _ => None,
            };
            let decision = match built {
                Some((validator, digest)) => decide(
                    validator.as_ref(),
                    &digest,
                    variant,
                    &doc,
                    &nonce,
                    user_data.as_deref(),
                    &name,
                ),
                None => {
                    if at.is_some() || collateral_dir.is_some() {
                        bail!(TIME_AND_COLLATERAL_ONLY);
                    }
                    if gce_identity.is_some() || gce_instance.is_some() {
                        bail!("--gce-identity and --gce-instance are for gcp-sev-es");
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
        Command::DryRun(args) => Ok(if dry_run::run(args, out)? {
            Outcome::Success
        } else {
            Outcome::Rejected
        }),
        Command::Policy {
            config,
            document,
            variant,
            service_policy,
            pin_chip_id,
            gcp_projects,
            tcb_statuses,
            amd_root_key,
            intel_root_key,
        } => {
            if !document.is_empty() {
                let options = derive::DeriveOptions {
                    pin_chip_id,
                    gcp_projects,
                    tcb_statuses,
                    amd_root_key: read_pem(amd_root_key.as_deref())?,
                    intel_root_key: read_pem(intel_root_key.as_deref())?,
                    service_policy,
                };
                print_derived(&document, variant, &options, out)?;
                return Ok(Outcome::Success);
            }
            let (Some(config), Some(variant)) = (config, variant) else {
                bail!("--config needs --variant");
            };
            let config = load_config(&config, variant)?;
            write!(out, "{}", describe_policy(&config, variant))?;
            Ok(Outcome::Success)
        }
        Command::AkDigest { document } => {
            let bytes = read(&document)?;
            let bytes = if attestation::saved::SavedAttestation::is_saved(&bytes) {
                attestation::saved::SavedAttestation::parse(&bytes)
                    .with_context(|| format!("reading {}", document.display()))?
                    .document
            } else {
                bytes
            };
            writeln!(out, "{}", ak_digest_of_document(&bytes)?)?;
            Ok(Outcome::Success)
        }
    }
}

/// Derives the config of the documents at `paths` (`policy --document`): the config to `out`,
/// its digest and what is left to decide to stderr.
fn print_derived(
    paths: &[PathBuf],
    variant: Option<Variant>,
    options: &derive::DeriveOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut inputs: Vec<(&PathBuf, Input)> = Vec::new();
    for path in paths {
        let input = Input::read(path, variant)?;
        if let Some((first, earlier)) = inputs.first() {
            if earlier.variant != input.variant {
                bail!(
                    "{} is a {} document and {} a {} one: one config is for one variant",
                    first.display(),
                    earlier.variant,
                    path.display(),
                    input.variant
                );
            }
        }
        inputs.push((path, input));
    }
    let Some(variant) = inputs.first().map(|(_, input)| input.variant) else {
        bail!("no --document given");
    };
    let documents: Vec<(String, Vec<u8>)> = inputs
        .into_iter()
        .map(|(path, input)| (path.display().to_string(), input.document))
        .collect();
    let derived = derive::derive(variant, &documents, options)?;
    writeln!(out, "{}", derived.json)?;
    eprintln!(
        "attest-tool: {variant} {} from {}, policy digest {}",
        if options.service_policy {
            "service policy"
        } else {
            "attestation config"
        },
        documents
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        derived.digest
    );
    for note in &derived.notes {
        eprintln!("  decide: {note}");
    }
    Ok(())
}

/// A PEM file's text.
fn read_pem(path: Option<&Path>) -> anyhow::Result<Option<String>> {
    path.map(|p| {
        String::from_utf8(read(p)?).with_context(|| format!("{} is not a PEM file", p.display()))
    })
    .transpose()
}

/// A document to verify or derive from: a saved attestation with what it was issued for, or a
/// bare document whose variant the operator names.
struct Input {
    variant: Variant,
    document: Vec<u8>,
    nonce: Option<Vec<u8>>,
    user_data: Option<Vec<u8>>,
}

impl Input {
    fn read(path: &Path, variant: Option<Variant>) -> anyhow::Result<Input> {
        let bytes = read(path)?;
        if !attestation::saved::SavedAttestation::is_saved(&bytes) {
            let variant = variant
                .or_else(|| derive::infer_variant(&bytes))
                .with_context(|| {
                    format!(
                        "--variant is required: {} is a bare document whose shape does not name its variant (a vTPM document without hardware evidence may be qemu-vtpm, aws-nitro-tpm, azure-trustedlaunch or gcp-sev-es; a file from join-client attest names it)",
                        path.display()
                    )
                })?;
            return Ok(Input {
                variant,
                document: bytes,
                nonce: None,
                user_data: None,
            });
        }
        let saved = attestation::saved::SavedAttestation::parse(&bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        if let Some(variant) = variant.filter(|v| *v != saved.variant) {
            bail!(
                "--variant {variant} differs from the variant {} saved in {}",
                saved.variant,
                path.display()
            );
        }
        Ok(Input {
            variant: saved.variant,
            document: saved.document,
            nonce: Some(saved.nonce),
            user_data: Some(saved.user_data),
        })
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
