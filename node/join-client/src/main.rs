//! `join-client`: join (or rejoin) a cluster as a node would, and write the ticket to disk.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use attestation::Variant;
use clap::{Args, Parser, Subcommand};
use node_client::{Backoff, Client, keys, ticket};

#[derive(Debug, Parser)]
#[command(
    name = "join-client",
    about = "Join a cluster through its join service, attesting with the node's TPM (and SEV-SNP report) or its TDX quote"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[arg(long, env = "JOIN_CLIENT_LOG_FORMAT", value_enum, default_value_t = plumbing::telemetry::LogFormat::Text, global = true)]
    log_format: plumbing::telemetry::LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Attest, send a kubelet CSR and SSH host key, and write the join ticket.
    Join(JoinArgs),
    /// Attest and fetch the state disk key again after a reboot.
    Rejoin(Common),
    /// Make this node's attestation document and save it, with the nonce and user data it was
    /// issued for, for `attest-tool policy --document` (derive a policy from it) and
    /// `attest-tool verify` (check one against it). Nothing is sent anywhere.
    ///
    /// The file is JSON: `{"variant", "nonce" (hex), "userData" (hex), "document" (base64 of
    /// the document's bytes, as the aTLS certificate extension carries them)}`. On a
    /// control-plane node it is what `attest-tool policy --service-policy` derives the nodes'
    /// service policy from.
    Attest(AttestArgs),
}

#[derive(Debug, Args)]
struct AttestArgs {
    #[command(flatten)]
    issuer: IssuerArgs,
    /// Where to write the saved attestation (JSON; an existing file is replaced).
    #[arg(long)]
    out: PathBuf,
    /// The nonce to issue the document for (hex, not empty); 32 random bytes if omitted,
    /// as attest-proxy draws for each connection. Either way it is saved in the file.
    #[arg(long)]
    nonce: Option<String>,
    /// The user data the document binds (hex); empty if omitted. In a join,
    /// aTLS binds the SHA-256 of the certificate's public key here.
    #[arg(long, default_value = "")]
    user_data: String,
}

#[derive(Debug, Args)]
struct Common {
    /// The join service (attest-proxy), host:port.
    #[arg(long, env = "JOIN_CLIENT_ENDPOINT")]
    endpoint: SocketAddr,
    #[command(flatten)]
    issuer: IssuerArgs,
    /// The node's service policy: an attestation config (the service's format) that the join
    /// service's own evidence must satisfy before anything is sent to it. Without it the server
    /// is not verified, as with a Constellation node, and join-client says so.
    #[arg(long, env = "JOIN_CLIENT_SERVICE_POLICY")]
    service_policy: Option<PathBuf>,
    /// The attestation variant of the control-plane node the service runs on: qemu-vtpm,
    /// aws-sev-snp, azure-sev-snp, qemu-tdx or azure-tdx.
    #[arg(long, env = "JOIN_CLIENT_SERVICE_VARIANT", default_value = "qemu-vtpm")]
    service_variant: Variant,
    /// SEV-SNP and TDX services: how long past its nextUpdate the AMD or Intel collateral in the
    /// service's certificate is still accepted (the service serves what it has while the vendor
    /// is unreachable). The default is attest-proxy's `--collateral-max-stale` default.
    #[arg(long, env = "JOIN_CLIENT_SERVICE_COLLATERAL_MAX_STALE", default_value = "24h", value_parser = humantime::parse_duration)]
    service_collateral_max_stale: Duration,
    /// The state disk's UUID.
    #[arg(long, env = "JOIN_CLIENT_DISK_UUID")]
    disk_uuid: String,
    /// Where the ticket's parts are written (secrets mode 0600).
    #[arg(long, env = "JOIN_CLIENT_OUT")]
    out: PathBuf,
    /// Deadline for each call, including the attested handshake.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// How long to keep retrying when the service says to (`ResourceExhausted`, `Unavailable`,
    /// `Aborted`), with jittered exponential backoff. `0s` tries once.
    #[arg(long, env = "JOIN_CLIENT_RETRY_FOR", default_value = "5m", value_parser = humantime::parse_duration)]
    retry_for: Duration,
}

/// How the node makes its attestation document.
#[derive(Debug, Args)]
struct IssuerArgs {
    /// The TPM, as a TSS TCTI string: `device:/dev/tpmrm0`, or `swtpm:host=127.0.0.1,port=2321`.
    #[arg(long, env = "JOIN_CLIENT_TCTI", default_value = "device:/dev/tpmrm0")]
    tcti: String,
    /// The attestation key type.
    #[arg(long, env = "JOIN_CLIENT_AK", value_enum, default_value_t = AkType::Rsa)]
    ak: AkType,
    /// The attestation variant the service verifies: `qemu-vtpm` (the TPM alone),
    /// `aws-sev-snp` (the TPM, and an SEV-SNP report vouching for its key), `azure-sev-snp` or
    /// `azure-tdx` (the vTPM, attesting with the key of Azure's paravisor, and the SEV-SNP
    /// report or TD quote its HCL report holds), `azure-trustedlaunch` (the vTPM, attesting with
    /// the key Azure persisted and Azure's certificate for it), `gcp-sev-es` (the vTPM, attesting
    /// with Google's AK, and the instance the metadata server names), `qemu-tdx` (a TD quote alone,
    /// no TPM) or `aws-nitro-tpm` (the NitroTPM, with EC2's instance identity document as
    /// InstanceInfo). `--ak` applies to qemu-vtpm, aws-sev-snp and aws-nitro-tpm only.
    #[arg(long, env = "JOIN_CLIENT_VARIANT", default_value = "qemu-vtpm")]
    variant: Variant,
    /// aws-sev-snp and qemu-tdx: Linux's configfs-tsm report directory. aws-sev-snp uses the
    /// SEV guest device instead when it does not exist; qemu-tdx needs it.
    #[arg(long, env = "JOIN_CLIENT_TSM_REPORT_DIR", default_value = snp_issuer::configfs::DEFAULT_ROOT)]
    tsm_report_dir: PathBuf,
    /// azure-tdx: Azure's quote service, which turns the HCL's TD report into a TD quote.
    #[arg(long, env = "JOIN_CLIENT_AZURE_QUOTE_URL", default_value = tpm_issuer::azure::tdx::IMDS_QUOTE_URL)]
    azure_quote_url: String,
    /// aws-nitro-tpm: EC2's instance metadata service (IMDSv2), for the identity document.
    #[arg(long, env = "JOIN_CLIENT_IMDS_URL", default_value = tpm_issuer::aws_nitro_tpm::IMDS_URL)]
    imds_url: String,
    /// aws-nitro-tpm: AWS's `nitro-tpm-attest` utility (e.g. /usr/bin/nitro-tpm-attest on an
    /// Attestable AMI). When given, each document also carries AWS's NitroTPM attestation
    /// document binding the AK to this connection, which lets the service trust the AK without
    /// `trustedAkDigests`; unset, documents are Constellation's as they are.
    #[arg(long, env = "JOIN_CLIENT_NITRO_TPM_ATTEST")]
    nitro_tpm_attest: Option<PathBuf>,
    /// gcp-sev-es: the GCE metadata server, which names this instance (project, zone, name).
    #[arg(long, env = "JOIN_CLIENT_GCE_METADATA_URL", default_value = tpm_issuer::gce::METADATA_URL)]
    gce_metadata_url: String,
    /// aws-sev-snp: the SEV guest device, for kernels without configfs-tsm.
    #[arg(long, env = "JOIN_CLIENT_SEV_GUEST_DEVICE", default_value = snp_issuer::sev_guest::DEFAULT_DEVICE)]
    sev_guest_device: PathBuf,
    /// The firmware event log to send with the quote, e.g.
    /// `/sys/kernel/security/tpm0/binary_bios_measurements` (gcp-sev-es: that path unless
    /// given, as its verifier reads Google's PCR 0 record from the log).
    #[arg(long, env = "JOIN_CLIENT_EVENT_LOG")]
    event_log: Option<PathBuf>,
}

impl Common {
    fn backoff(&self) -> Backoff {
        Backoff {
            give_up_after: self.retry_for,
            ..Backoff::default()
        }
    }
}

#[derive(Debug, Args)]
struct JoinArgs {
    #[command(flatten)]
    common: Common,
    /// The node's Kubernetes name.
    #[arg(long, env = "JOIN_CLIENT_NODE_NAME")]
    node_name: String,
    /// The node's IPs, put into the kubelet certificate.
    #[arg(long = "ip", env = "JOIN_CLIENT_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// Join as a control-plane node.
    #[arg(long)]
    control_plane: bool,
    /// Extra SSH principals for the host certificate. The node name and every `--ip` are always
    /// asked for, as a Constellation node asks for its hostname and addresses.
    #[arg(
        long = "principal",
        env = "JOIN_CLIENT_PRINCIPALS",
        value_delimiter = ','
    )]
    principals: Vec<String>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AkType {
    Rsa,
    Ecc,
}

/// Refuses a variant join-client cannot issue, before anything is opened.
fn check_issuable(variant: Variant) -> anyhow::Result<()> {
    match variant {
        Variant::QemuVtpm
        | Variant::AwsSevSnp
        | Variant::AzureSevSnp
        | Variant::AzureTrustedLaunch
        | Variant::GcpSevEs
        | Variant::QemuTdx
        | Variant::AzureTdx
        | Variant::AwsNitroTpm => Ok(()),
        other => anyhow::bail!(
            "join-client issues qemu-vtpm, aws-sev-snp, azure-sev-snp, azure-trustedlaunch, \
             gcp-sev-es, qemu-tdx, azure-tdx and aws-nitro-tpm documents only, not {other}"
        ),
    }
}

fn client(common: &Common) -> anyhow::Result<Client> {
    // Refuse what cannot be issued before touching the TPM.
    check_issuable(common.issuer.variant)?;
    // Likewise a service policy that cannot be used.
    let service_policy = common
        .service_policy
        .as_deref()
        .map(|path| {
            node_client::ServicePolicy::load_allowing_stale(
                common.service_variant,
                path,
                common.service_collateral_max_stale,
            )
        })
        .transpose()?;
    let issuer = issuer(&common.issuer)?;
    let client = Client::new(common.endpoint, issuer, common.timeout)?;
    Ok(match service_policy {
        Some(policy) => {
            eprintln!(
                "verifying the join service at {} against service policy {} ({})",
                common.endpoint,
                policy.digest(),
                common.service_variant
            );
            client.with_service_policy(policy)
        }
        None => {
            eprintln!("{}", unverified_warning(common.endpoint));
            client
        }
    })
}

/// The node's issuer for its variant (one join-client can issue).
fn issuer(common: &IssuerArgs) -> anyhow::Result<Arc<dyn attestation::Issuer>> {
    // qemu-tdx attests with the TD's quote alone: no TPM.
    if common.variant == Variant::QemuTdx {
        let tdx = tdx_issuer::QemuTdxIssuer::open(&common.tsm_report_dir)
            .context("opening the TDX quote interface")?;
        return Ok(Arc::new(tdx));
    }
    // The Azure variants attest with the key Azure persisted: its paravisor's HCL report names
    // it (azure-sev-snp, azure-tdx), or Azure's certificate in the vTPM (azure-trustedlaunch).
    if matches!(
        common.variant,
        Variant::AzureSevSnp | Variant::AzureTdx | Variant::AzureTrustedLaunch
    ) {
        let mut config = tpm_issuer::azure::tpm_config(&common.tcti);
        config.event_log = common.event_log.clone();
        let tpm = tpm_issuer::TpmIssuer::open(&config).with_context(|| {
            format!(
                "opening the TPM at {} with the attestation key Azure persisted at {:#010x}",
                common.tcti,
                tpm_issuer::azure::HCL_AK_HANDLE
            )
        })?;
        return Ok(if common.variant == Variant::AzureSevSnp {
            Arc::new(tpm_issuer::azure::sev_snp::AzureSnpIssuer::new(tpm))
        } else if common.variant == Variant::AzureTrustedLaunch {
            use tpm_issuer::azure::trustedlaunch::{
                DEFAULT_FETCH_TIMEOUT, HttpCaFetcher, TrustedLaunchIssuer,
            };
            Arc::new(TrustedLaunchIssuer::new(
                tpm,
                Box::new(HttpCaFetcher::new(DEFAULT_FETCH_TIMEOUT)),
            ))
        } else {
            let quotes = tpm_issuer::azure::tdx::ImdsQuoteClient::new(
                &common.azure_quote_url,
                tpm_issuer::azure::tdx::DEFAULT_QUOTE_TIMEOUT,
            )?;
            Arc::new(tpm_issuer::azure::tdx::AzureTdxIssuer::new(
                tpm,
                Box::new(quotes),
            ))
        });
    }
    // gcp-sev-es attests with Google's AK, which the GCE API vouches for.
    if common.variant == Variant::GcpSevEs {
        let mut config = tpm_issuer::gce::tpm_config(&common.tcti);
        config.event_log = Some(
            common
                .event_log
                .clone()
                .unwrap_or_else(|| PathBuf::from(tpm_issuer::gce::KERNEL_EVENT_LOG)),
        );
        let tpm = tpm_issuer::TpmIssuer::open(&config).with_context(|| {
            format!(
                "opening the TPM at {} with Google's attestation key",
                common.tcti
            )
        })?;
        let metadata = tpm_issuer::gce::MetadataClient::new(
            &common.gce_metadata_url,
            tpm_issuer::gce::DEFAULT_METADATA_TIMEOUT,
        )?;
        return Ok(Arc::new(tpm_issuer::gce::GcpSevEsIssuer::new(
            tpm, &metadata,
        )?));
    }
    let mut config = tpm_issuer::TpmIssuerConfig::new(&common.tcti);
    config.ak = match common.ak {
        AkType::Rsa => tpm_issuer::AkSpec::RSA_DEFAULT,
        AkType::Ecc => tpm_issuer::AkSpec::ECC_DEFAULT,
    };
    config.event_log = common.event_log.clone();
    let tpm = tpm_issuer::TpmIssuer::open(&config)
        .with_context(|| format!("opening the TPM at {}", common.tcti))?;
    if common.variant == Variant::AwsNitroTpm {
        let imds = tpm_issuer::aws_nitro_tpm::ImdsClient::new(
            &common.imds_url,
            tpm_issuer::aws_nitro_tpm::DEFAULT_IMDS_TIMEOUT,
        )?;
        let mut issuer = tpm_issuer::aws_nitro_tpm::AwsNitroTpmIssuer::new(tpm, Box::new(imds));
        if let Some(path) = &common.nitro_tpm_attest {
            issuer = issuer.with_nitro_document(Box::new(
                tpm_issuer::aws_nitro_tpm::NitroTpmAttestCommand { path: path.clone() },
            ));
        }
        return Ok(Arc::new(issuer));
    }
    Ok(if common.variant == Variant::AwsSevSnp {
        let source =
            snp_issuer::open_kernel_source(&common.tsm_report_dir, &common.sev_guest_device)
                .context("opening the SEV-SNP report interface")?;
        Arc::new(tpm_issuer::aws_sev_snp::AwsSnpIssuer::new(tpm, source)?)
    } else {
        Arc::new(tpm)
    })
}

/// The nonce `attest` issues for: `--nonce`, or 32 random bytes.
fn attest_nonce(nonce: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let Some(nonce) = nonce else {
        let mut nonce = vec![0u8; 32];
        aws_lc_rs::rand::SecureRandom::fill(&aws_lc_rs::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| anyhow::anyhow!("the system's random number generator failed"))?;
        return Ok(nonce);
    };
    let bytes = hex::decode(nonce).with_context(|| format!("--nonce {nonce:?} is not hex"))?;
    if bytes.is_empty() {
        anyhow::bail!("--nonce is empty; attest-proxy's nonces are 32 bytes");
    }
    Ok(bytes)
}

/// Issues a document as the node would in a join and writes it with its nonce and user data.
fn attest(args: &AttestArgs) -> anyhow::Result<attestation::saved::SavedAttestation> {
    check_issuable(args.issuer.variant)?;
    let nonce = attest_nonce(args.nonce.as_deref())?;
    let user_data = hex::decode(&args.user_data)
        .with_context(|| format!("--user-data {:?} is not hex", args.user_data))?;
    let issuer = issuer(&args.issuer)?;
    let document = issuer.issue(&user_data, &nonce)?;
    let saved = attestation::saved::SavedAttestation {
        variant: args.issuer.variant,
        nonce,
        user_data,
        document,
    };
    std::fs::write(&args.out, saved.to_json())
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(saved)
}

/// What join-client says when it will not check the server: the secrets it receives could come
/// from, and go to, whoever controls the network.
fn unverified_warning(endpoint: SocketAddr) -> String {
    format!(
        "WARNING: the join service at {endpoint} is NOT VERIFIED (no --service-policy): anyone \
         who controls the network can impersonate it, read this node's ticket and replace its \
         state disk key"
    )
}

/// Prints the audit record of a refused server before the error itself.
fn report<T>(result: Result<T, node_client::ClientError>) -> anyhow::Result<T> {
    result.map_err(|error| {
        if let node_client::ClientError::ServerRefused { decision, .. } = &error {
            eprintln!("{}", decision.explain_as(attestation::audit::Role::Service));
            return refusal_error(&error);
        }
        anyhow::Error::new(error)
    })
}

/// The error of a refused server, whose record (with every cause) is already printed: its
/// headline alone, so the causes are not printed a second time.
fn refusal_error(error: &node_client::ClientError) -> anyhow::Error {
    anyhow::anyhow!("{error}; the audit record above says why")
}

/// The host certificate principals to ask for: the node's addresses and name, then the extras,
/// each once.
fn host_principals(args: &JoinArgs) -> Vec<String> {
    let mut principals: Vec<String> = Vec::new();
    let all = args
        .ips
        .iter()
        .map(ToString::to_string)
        .chain([args.node_name.clone()])
        .chain(args.principals.iter().cloned());
    for principal in all {
        if !principals.contains(&principal) {
            principals.push(principal);
        }
    }
    principals
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    plumbing::telemetry::init(cli.log_format);
    match cli.command {
        Command::Join(args) => {
            let kubelet = keys::kubelet_request(&args.node_name, &args.ips)?;
            let ssh = keys::SshHostKey::generate()?;
            let request = proto::join::IssueJoinTicketRequest {
                disk_uuid: args.common.disk_uuid.clone(),
                certificate_request: kubelet.csr_der.clone(),
                is_control_plane: args.control_plane,
                host_public_key: ssh.public_wire.clone(),
                host_certificate_principals: host_principals(&args),
            };
            let client = client(&args.common)?;
            let ticket = args
                .common
                .backoff()
                .run(|| client.join(request.clone()))
                .await
                .result;
            let ticket = report(ticket)?;
            let keys = ticket::NodeKeys {
                kubelet_key_pem: &kubelet.key_pem,
                ssh_host_key_pkcs8: &ssh.pkcs8,
                ssh_host_public_line: &ssh.public_line(),
            };
            ticket::write_join(&args.common.out, &ticket, &keys)?;
            println!(
                "joined: node {} ({})",
                args.node_name,
                if args.control_plane {
                    "control plane"
                } else {
                    "worker"
                }
            );
            println!("{}", ticket::summary(&ticket));
            println!("  written to          {}", args.common.out.display());
        }
        Command::Attest(args) => {
            let saved = attest(&args)?;
            println!(
                "attested: {} document of {} bytes, nonce {}",
                saved.variant,
                saved.document.len(),
                hex::encode(&saved.nonce)
            );
            println!("  written to          {}", args.out.display());
            println!(
                "  derive a policy:    attest-tool policy --document {}",
                args.out.display()
            );
        }
        Command::Rejoin(common) => {
            let client = client(&common)?;
            let ticket = common
                .backoff()
                .run(|| client.rejoin(&common.disk_uuid))
                .await
                .result;
            let ticket = report(ticket)?;
            ticket::write_rejoin(&common.out, &ticket)?;
            println!("rejoined: disk {}", common.disk_uuid);
            println!(
                "  state disk key      {} ({} bytes)",
                ticket::fingerprint(&ticket.state_disk_key),
                ticket.state_disk_key.len()
            );
            println!("  written to          {}", common.out.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(variant: &str) -> Common {
        let cli = Cli::try_parse_from([
            "join-client",
            "rejoin",
            "--endpoint",
            "10.0.0.1:30090",
            "--disk-uuid",
            "d",
            "--out",
            "/tmp/x",
            "--tcti",
            "device:/nonexistent/tpm",
            "--tsm-report-dir",
            "/nonexistent/tsm/report",
            "--variant",
            variant,
        ])
        .unwrap();
        let Command::Rejoin(common) = cli.command else {
            panic!("parsed as rejoin");
        };
        common
    }

    #[test]
    fn variants_without_an_issuer_are_refused_by_name_before_the_tpm_is_opened() {
        let err = client(&common("gcp-sev-snp")).unwrap_err().to_string();
        assert!(err.contains("not gcp-sev-snp"), "{err}");
        // The supported ones get as far as the TPM, or for qemu-tdx the TSM (the test's
        // --tsm-report-dir does not exist).
        for tpm in ["aws-sev-snp", "aws-nitro-tpm"] {
            let err = format!("{:#}", client(&common(tpm)).unwrap_err());
            assert!(
                err.contains("opening the TPM at device:/nonexistent/tpm"),
                "{tpm}: {err}"
            );
        }
        let err = format!("{:#}", client(&common("gcp-sev-es")).unwrap_err());
        assert!(
            err.contains(
                "opening the TPM at device:/nonexistent/tpm with Google's attestation key"
            ),
            "{err}"
        );
        for azure in ["azure-sev-snp", "azure-tdx", "azure-trustedlaunch"] {
            let err = format!("{:#}", client(&common(azure)).unwrap_err());
            assert!(
                err.contains(
                    "opening the TPM at device:/nonexistent/tpm with the attestation key Azure \
                     persisted at 0x81000003"
                ),
                "{azure}: {err}"
            );
        }
        let err = format!("{:#}", client(&common("qemu-tdx")).unwrap_err());
        assert!(
            err.contains(
                "opening the TDX quote interface: asking configfs-tsm at /nonexistent/tsm/report \
                 for a TD quote: configfs-tsm is not available at /nonexistent/tsm/report"
            ),
            "{err}"
        );
        assert!(Cli::try_parse_from(["join-client", "rejoin", "--variant", "sev"]).is_err());
    }

    #[test]
    fn an_unusable_service_policy_is_refused_before_the_tpm_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("policy.json");
        std::fs::write(&bad, br#"{"measurements": {}}"#).unwrap();
        let mut with_bad = common("qemu-vtpm");
        with_bad.service_policy = Some(bad.clone());
        let err = format!("{:#}", client(&with_bad).unwrap_err());
        assert!(
            err.contains("is not a valid qemu-vtpm attestation config"),
            "{err}"
        );

        let mut missing = common("qemu-vtpm");
        missing.service_policy = Some(dir.path().join("absent.json"));
        let err = format!("{:#}", client(&missing).unwrap_err());
        assert!(err.contains("cannot read the service policy"), "{err}");

        let mut hardware = common("qemu-vtpm");
        hardware.service_policy = Some(bad.clone());
        hardware.service_variant = Variant::AwsSevSnp;
        let err = format!("{:#}", client(&hardware).unwrap_err());
        assert!(
            err.contains("is not a valid aws-sev-snp attestation config"),
            "{err}"
        );

        let mut gcp = common("qemu-vtpm");
        gcp.service_policy = Some(bad.clone());
        gcp.service_variant = Variant::GcpSevSnp;
        let err = format!("{:#}", client(&gcp).unwrap_err());
        assert!(
            err.contains("cannot verify a gcp-sev-snp service: its attestation key is vouched for by the GCE API"),
            "{err}"
        );

        let mut nitro = common("qemu-vtpm");
        nitro.service_policy = Some(bad);
        nitro.service_variant = Variant::AwsNitroTpm;
        let err = format!("{:#}", client(&nitro).unwrap_err());
        assert!(err.contains("services, not aws-nitro-tpm"), "{err}");
    }

    fn attest_args(args: &[&str]) -> AttestArgs {
        let cli = Cli::try_parse_from(
            ["join-client", "attest", "--tcti", "device:/nonexistent/tpm"]
                .iter()
                .chain(args),
        )
        .unwrap();
        let Command::Attest(args) = cli.command else {
            panic!("parsed as attest");
        };
        args
    }

    #[test]
    fn attest_refuses_bad_input_by_name_before_the_tpm_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("node.json");
        let out = out.to_str().unwrap();
        let err = |args: &[&str]| format!("{:#}", attest(&attest_args(args)).unwrap_err());
        let e = err(&["--out", out, "--variant", "gcp-sev-snp"]);
        assert!(e.contains("not gcp-sev-snp"), "{e}");
        let e = err(&["--out", out, "--nonce", "xyz"]);
        assert!(e.contains("--nonce \"xyz\" is not hex"), "{e}");
        let e = err(&["--out", out, "--nonce", ""]);
        assert!(e.contains("--nonce is empty"), "{e}");
        let e = err(&["--out", out, "--user-data", "0"]);
        assert!(e.contains("--user-data \"0\" is not hex"), "{e}");
        // Valid input gets as far as the TPM, and nothing is written.
        let e = err(&["--out", out, "--nonce", "0a0b"]);
        assert!(
            e.contains("opening the TPM at device:/nonexistent/tpm"),
            "{e}"
        );
        assert!(!dir.path().join("node.json").exists());
    }

    #[test]
    fn attest_draws_a_fresh_32_byte_nonce_unless_given_one() {
        let (a, b) = (attest_nonce(None).unwrap(), attest_nonce(None).unwrap());
        assert_eq!((a.len(), b.len()), (32, 32));
        assert_ne!(a, b);
        assert_eq!(attest_nonce(Some("0A0b")).unwrap(), [0x0a, 0x0b]);
    }

    #[test]
    fn the_service_collateral_staleness_defaults_to_the_services_own() {
        assert_eq!(
            common("qemu-vtpm").service_collateral_max_stale,
            node_client::service_policy::DEFAULT_COLLATERAL_MAX_STALE
        );
    }

    #[test]
    fn without_a_service_policy_the_warning_says_the_server_is_not_verified() {
        let warning = unverified_warning("10.0.0.1:30090".parse().unwrap());
        assert!(warning.starts_with("WARNING: the join service at 10.0.0.1:30090 is NOT VERIFIED"));
        assert!(warning.contains("--service-policy"));
        assert!(common("qemu-vtpm").service_policy.is_none());
    }

    #[test]
    fn principals_are_the_addresses_the_name_and_the_extras_once() {
        let cli = Cli::try_parse_from([
            "join-client",
            "join",
            "--endpoint",
            "10.0.0.1:30090",
            "--disk-uuid",
            "d",
            "--out",
            "/tmp/x",
            "--node-name",
            "worker-7",
            "--ip",
            "10.0.0.7,fd00::7",
            "--principal",
            "worker-7.example,10.0.0.7",
        ])
        .unwrap();
        let Command::Join(args) = cli.command else {
            panic!("parsed as join");
        };
        assert_eq!(
            host_principals(&args),
            ["10.0.0.7", "fd00::7", "worker-7", "worker-7.example"]
        );
    }
}
