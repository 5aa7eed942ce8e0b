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
}

#[derive(Debug, Args)]
struct Common {
    /// The join service (attest-proxy), host:port.
    #[arg(long, env = "JOIN_CLIENT_ENDPOINT")]
    endpoint: SocketAddr,
    /// The TPM, as a TSS TCTI string: `device:/dev/tpmrm0`, or `swtpm:host=127.0.0.1,port=2321`.
    #[arg(long, env = "JOIN_CLIENT_TCTI", default_value = "device:/dev/tpmrm0")]
    tcti: String,
    /// The attestation key type.
    #[arg(long, env = "JOIN_CLIENT_AK", value_enum, default_value_t = AkType::Rsa)]
    ak: AkType,
    /// The attestation variant the service verifies: `qemu-vtpm` (the TPM alone),
    /// `aws-sev-snp` (the TPM, and an SEV-SNP report vouching for its key), `azure-sev-snp` or
    /// `azure-tdx` (the vTPM, attesting with the key of Azure's paravisor, and the SEV-SNP
    /// report or TD quote its HCL report holds), `qemu-tdx` (a TD quote alone, no TPM) or
    /// `aws-nitro-tpm` (the NitroTPM, with EC2's instance identity document as InstanceInfo).
    /// `--ak` applies to qemu-vtpm, aws-sev-snp and aws-nitro-tpm only.
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
    /// aws-sev-snp: the SEV guest device, for kernels without configfs-tsm.
    #[arg(long, env = "JOIN_CLIENT_SEV_GUEST_DEVICE", default_value = snp_issuer::sev_guest::DEFAULT_DEVICE)]
    sev_guest_device: PathBuf,
    /// The firmware event log to send with the quote, e.g.
    /// `/sys/kernel/security/tpm0/binary_bios_measurements`.
    #[arg(long, env = "JOIN_CLIENT_EVENT_LOG")]
    event_log: Option<PathBuf>,
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

fn client(common: &Common) -> anyhow::Result<Client> {
    // Refuse what cannot be issued before touching the TPM.
    match common.variant {
        Variant::QemuVtpm
        | Variant::AwsSevSnp
        | Variant::AzureSevSnp
        | Variant::QemuTdx
        | Variant::AzureTdx
        | Variant::AwsNitroTpm => {}
        other => anyhow::bail!(
            "join-client issues qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx, azure-tdx and \
             aws-nitro-tpm documents only, not {other}"
        ),
    }
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
    let issuer = issuer(common)?;
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
fn issuer(common: &Common) -> anyhow::Result<Arc<dyn attestation::Issuer>> {
    // qemu-tdx attests with the TD's quote alone: no TPM.
    if common.variant == Variant::QemuTdx {
        let tdx = tdx_issuer::QemuTdxIssuer::open(&common.tsm_report_dir)
            .context("opening the TDX quote interface")?;
        return Ok(Arc::new(tdx));
    }
    // The Azure variants attest with the key Azure's paravisor persisted, which its HCL report
    // names.
    if matches!(common.variant, Variant::AzureSevSnp | Variant::AzureTdx) {
        let mut config = tpm_issuer::azure::tpm_config(&common.tcti);
        config.event_log = common.event_log.clone();
        let tpm = tpm_issuer::TpmIssuer::open(&config).with_context(|| {
            format!(
                "opening the TPM at {} with the attestation key of Azure's paravisor",
                common.tcti
            )
        })?;
        return Ok(if common.variant == Variant::AzureSevSnp {
            Arc::new(tpm_issuer::azure::sev_snp::AzureSnpIssuer::new(tpm))
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
        return Ok(Arc::new(tpm_issuer::aws_nitro_tpm::AwsNitroTpmIssuer::new(
            tpm,
            Box::new(imds),
        )));
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
        for azure in ["azure-sev-snp", "azure-tdx"] {
            let err = format!("{:#}", client(&common(azure)).unwrap_err());
            assert!(
                err.contains(
                    "opening the TPM at device:/nonexistent/tpm with the attestation key of \
                     Azure's paravisor"
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
