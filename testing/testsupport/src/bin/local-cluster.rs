//! `local-cluster`: the whole join system on this machine, and a node joining through it.
//!
//! Starts swtpm, the key service, a real Kubernetes control plane (etcd and kube-apiserver),
//! token-issuer, join-core and attest-proxy, then joins and rejoins a node attesting with the swtpm. With `--serve` it keeps
//! serving in the foreground, so any aTLS client (a Constellation node, say) can join, until
//! SIGTERM or Ctrl-C. Every process it starts ends with it, also when it is killed (SIGKILL) or
//! crashes: the kernel sends each one SIGKILL when local-cluster ends (a parent-death signal,
//! `testsupport::process::spawn_tied`).
//!
//! With `--variant aws-sev-snp` or `azure-sev-snp` it also simulates AMD: a simulated ARK the
//! attestation config trusts as `amdRootKey`, and a KDS stand-in (in this process) that
//! attest-proxy fetches AMD's CRL and chains from into a collateral directory. The demo node then
//! runs on a simulated SNP machine; `loadgen run --variant ... --simulated-amd
//! <snp-dir>/simulated-amd.pem` sends more.
//!
//! With `--variant gcp-sev-snp` it also stands in for Google: a GCE stand-in (metadata server and
//! Compute API, in this process) that the gce-identity process asks which key each instance has.
//! Each simulated node's instance is registered there before it joins; `loadgen run --variant
//! gcp-sev-snp --gce-standin <address>` registers its nodes' through the stand-in's control
//! endpoint, whose address local-cluster prints and writes to `<snp-dir>/gce-standin-control`.
//!
//! With `--variant gcp-sev-es` it stands in for Google alone (there is no hardware report): the
//! GCE stand-in vouches for the demo node's key and calls its instance an AMD SEV confidential
//! VM, and the demo node is a software key on a simulated GCE confidential VM (the boot record
//! Google's firmware measures). The attestation config enforces that record's PCR 0 and admits
//! the simulated project only (`allowedGcpProjects`); files go to `--gce-dir`.
//!
//! With `--variant aws-nitro-tpm` it also stands in for AWS: an EC2 stand-in (IMDSv2 and
//! `DescribeImages`, in this process) that the ec2-identity process asks whether the node's image
//! supports TPM 2.0. The demo node quotes with the swtpm, as a NitroTPM, and reads its identity
//! document from the stand-in's IMDS; with `--serve`, local-cluster prints the `join-client
//! --variant aws-nitro-tpm --imds-url` command line that does the same.
//!
//! With `--variant qemu-tdx` or `azure-tdx` it simulates Intel: a simulated Intel SGX root the
//! attestation config trusts as `intelRootKey`, and a PCS stand-in (in this process) that
//! attest-proxy fetches TCB info, QE identity and CRLs from into a collateral directory. The
//! demo node then runs in a TD on a simulated TDX machine; `loadgen run --variant ...
//! --simulated-intel <tdx-dir>/simulated-intel.pem` sends more.
//!
//! With `--variant azure-trustedlaunch` it simulates Azure's vTPM CA: a simulated root the
//! attestation config trusts in `azureVtpmRoots`, and a stand-in (in this process) publishing
//! the CA the AK certificates name; the demo node is a second swtpm on which Azure's Trusted
//! Launch setup is played (its AK at 0x81000003 and certificate in NV index 0x01C101D0).
//!
//! With `--attested-service` the service attests itself (ARCHITECTURE.md, "The service attests
//! itself"): a second swtpm stands for the control-plane node's TPM, the certifier process holds
//! it and certifies attest-proxy's server key, and the nodes' service policy (that swtpm's boot
//! measurements and attestation keys, read from it) is written beside the service's own policy.
//! The demo node then verifies the service before it sends anything; with `--serve`,
//! local-cluster prints the `join-client --service-policy` command line that does the same, and
//! `loadgen run --service-policy` sends nodes that verify it.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use attestation::Variant;
use clap::Parser;
use node_client::{ServicePolicy, keys, ticket};
use soft_issuer::snp::SimulatedAmd;
use testsupport::harness::{Options, System, Uids, own_uid};
use testsupport::nitro::NitroSite;
use testsupport::snp::{GceSite, SnpMachines, SnpSite};
use testsupport::tdx::{TdxMachines, TdxSite};
use testsupport::trustedlaunch::TrustedLaunchSite;

#[derive(Debug, Parser)]
#[command(
    name = "local-cluster",
    about = "Run the join service locally and join a node through it"
)]
struct Args {
    /// Keep serving after the demo join, until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// attest-proxy's address (e.g. 0.0.0.0:9090 for external nodes); a free loopback port if unset.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The measurement policy (Constellation attestation config JSON); one matching the local
    /// swtpm's measurements if unset.
    #[arg(long)]
    attestation_config: Option<PathBuf>,
    /// Skip the demo join (with --serve, for a policy the local swtpm does not satisfy).
    #[arg(long)]
    no_demo: bool,
    /// Trust any attestation key in the policy written when --attestation-config is unset,
    /// instead of only the local swtpm's: for `loadgen run`, whose nodes attest with software
    /// keys. Development only: anyone who reaches the proxy can then forge a quote.
    #[arg(long)]
    trust_any_ak: bool,
    /// The attestation variant attest-proxy serves: qemu-vtpm, aws-sev-snp / azure-sev-snp /
    /// gcp-sev-snp on simulated AMD hardware (a KDS stand-in in this process; for gcp-sev-snp
    /// also a GCE stand-in, and the gce-identity process asking it), or qemu-tdx / azure-tdx on
    /// simulated Intel hardware (a PCS stand-in in this process), azure-trustedlaunch with a
    /// simulated Azure vTPM CA (the CA published by a stand-in in this process), gcp-sev-es on a
    /// simulated GCE confidential VM (a GCE stand-in in this process, and gce-identity asking it),
    /// or aws-nitro-tpm (the swtpm as the NitroTPM, an EC2 stand-in in this process, and the
    /// ec2-identity process asking it).
    #[arg(long, default_value = "qemu-vtpm")]
    variant: Variant,
    /// With gcp-sev-es: where the GCE stand-in's CA and control address and the attestation
    /// config go; a new temporary directory if unset (kept with --serve).
    #[arg(long)]
    gce_dir: Option<PathBuf>,
    /// With an SNP variant: where the KDS stand-in's CA, the simulated AMD's certificates
    /// (`simulated-amd.pem`), the attestation config and the collateral directory go (and for
    /// gcp-sev-snp the GCE stand-in's CA and control address, `gce-standin-control`); a new
    /// temporary directory if unset (kept with --serve).
    #[arg(long)]
    snp_dir: Option<PathBuf>,
    /// With a TDX variant: where the PCS stand-in's CA, the simulated Intel root
    /// (`simulated-intel-root.pem`) and its CAs' keys (`simulated-intel.pem`, for `loadgen run
    /// --simulated-intel`), the attestation config and the collateral directory go; a new
    /// temporary directory if unset (kept with --serve).
    #[arg(long)]
    tdx_dir: Option<PathBuf>,
    /// With an SNP variant: fetch AMD's collateral from this KDS (a mirror, a caching proxy, a
    /// test server) instead of the KDS stand-in, as attest-proxy's `--kds-url`. It must serve
    /// what the attestation config's AMD root signed: the simulated AMD's nodes (the demo
    /// node, `loadgen`) verify only against the stand-in, so pair it with `--no-demo` and an
    /// `--attestation-config` for the nodes that will join.
    #[arg(long)]
    kds_url: Option<String>,
    /// Extra CA certificates (PEM) to trust for `--kds-url`, beside the system's roots.
    #[arg(long, requires = "kds_url")]
    kds_ca_file: Option<PathBuf>,
    /// With a TDX variant: fetch Intel's collateral from this PCS (API v4; a PCCS, a test
    /// server) instead of the PCS stand-in, as attest-proxy's `--pcs-url`; the Intel root CA's
    /// CRL then comes from attest-proxy's `--intel-root-crl-url` default (Intel's). As with
    /// `--kds-url`, the simulated Intel's nodes verify only against the stand-in.
    #[arg(long)]
    pcs_url: Option<String>,
    /// Extra CA certificates (PEM) to trust for `--pcs-url`, beside the system's roots.
    #[arg(long, requires = "pcs_url")]
    pcs_ca_file: Option<PathBuf>,
    /// With an SNP or TDX variant: how long a join waits for collateral not cached yet.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    collateral_wait: Duration,
    /// The service attests itself: start the certifier on a second swtpm (the control-plane
    /// node's TPM), let attest-proxy have its server key certified, write the nodes' service
    /// policy, and have the demo node verify the service with it (qemu-vtpm only: the certifier
    /// attests with a TPM).
    #[arg(long)]
    attested_service: bool,
}

/// The simulated hardware a variant's nodes run on: its site (the simulated vendor and its
/// collateral service) and its machines, and where the site's files are.
enum Hardware {
    Snp {
        site: SnpSite,
        /// gcp-sev-snp's GCE stand-in.
        gce: Option<GceSite>,
        machines: SnpMachines,
    },
    Tdx {
        site: TdxSite,
        machines: TdxMachines,
    },
    TrustedLaunch {
        site: Box<TrustedLaunchSite>,
        /// The demo node's vTPM.
        vm: testsupport::swtpm::Swtpm,
    },
    /// gcp-sev-es: Google's word only.
    Google {
        gce: GceSite,
        attestation_config: PathBuf,
        node: soft_issuer::gce::GceSevEsNode,
    },
}

struct Simulated {
    hardware: Hardware,
    /// Removed at exit unless kept.
    _dir: Option<tempfile::TempDir>,
}

impl Simulated {
    fn attestation_config_path(&self) -> PathBuf {
        match &self.hardware {
            Hardware::Snp { site, .. } => site.attestation_config_path(),
            Hardware::Tdx { site, .. } => site.attestation_config_path(),
            Hardware::TrustedLaunch { site, .. } => site.attestation_config_path(),
            Hardware::Google {
                attestation_config, ..
            } => attestation_config.clone(),
        }
    }

    /// attest-proxy's collateral flags: the stand-in's, or the collateral service `args` names.
    fn proxy_args(&self, args: &Args) -> Vec<String> {
        let (site_args, own) = match &self.hardware {
            Hardware::Snp { site, .. } => (
                site.proxy_args(args.collateral_wait),
                own_service("--kds", args.kds_url.as_ref(), args.kds_ca_file.as_ref()),
            ),
            Hardware::Tdx { site, .. } => (
                site.proxy_args(args.collateral_wait),
                own_service("--pcs", args.pcs_url.as_ref(), args.pcs_ca_file.as_ref()),
            ),
            Hardware::TrustedLaunch { .. } => return Vec::new(),
            Hardware::Google { .. } => (Vec::new(), None),
        };
        let Some(own) = own else {
            return site_args;
        };
        // The stand-in's URL and CA (and Intel's root CRL there) give way to the operator's;
        // the site's flags come in flag-value pairs.
        const STANDIN: [&str; 5] = [
            "--kds-url",
            "--kds-ca-file",
            "--pcs-url",
            "--pcs-ca-file",
            "--intel-root-crl-url",
        ];
        let mut kept: Vec<String> = site_args
            .chunks(2)
            .filter(|pair| !STANDIN.contains(&pair[0].as_str()))
            .flatten()
            .cloned()
            .collect();
        kept.extend(own);
        kept
    }

    /// gcp-sev-snp and gcp-sev-es: where gce-identity finds Google (the GCE stand-in).
    fn gce(&self) -> Option<testsupport::harness::GceEndpoints> {
        match &self.hardware {
            Hardware::Snp { gce: Some(gce), .. } | Hardware::Google { gce, .. } => {
                Some(gce.endpoints(Vec::new()))
            }
            _ => None,
        }
    }

    fn node(&self) -> anyhow::Result<(Arc<dyn attestation::Issuer>, &'static str)> {
        Ok(match &self.hardware {
            Hardware::Snp { machines, .. } => {
                (Arc::new(machines.node()?), "simulated SEV-SNP machine")
            }
            Hardware::Tdx { machines, .. } => (Arc::new(machines.node()?), "simulated TDX machine"),
            Hardware::TrustedLaunch { vm, .. } => (
                testsupport::trustedlaunch::issuer(vm)?,
                "swtpm as an Azure Trusted Launch vTPM",
            ),
            Hardware::Google { node, .. } => (
                Arc::new(node.clone()),
                "simulated GCE confidential VM (AMD SEV)",
            ),
        })
    }
}

/// attest-proxy's `{prefix}-url` and `{prefix}-ca-file` for the operator's own collateral
/// service, when one is named.
fn own_service(
    prefix: &str,
    url: Option<&String>,
    ca_file: Option<&PathBuf>,
) -> Option<Vec<String>> {
    let mut args = vec![format!("{prefix}-url"), url?.clone()];
    if let Some(ca_file) = ca_file {
        args.extend([
            format!("{prefix}-ca-file"),
            ca_file.to_string_lossy().into_owned(),
        ]);
    }
    Some(args)
}

/// `dir`, or a new temporary directory named after `prefix` (kept with --serve).
fn site_dir(
    dir: Option<&PathBuf>,
    prefix: &str,
    keep: bool,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(dir) = dir {
        return Ok((dir.clone(), None));
    }
    let temp = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let path = temp.path().to_owned();
    if keep {
        let _ = temp.keep();
        return Ok((path, None));
    }
    Ok((path, Some(temp)))
}

async fn simulate_hardware(args: &Args) -> anyhow::Result<Option<Simulated>> {
    match args.variant {
        // aws-nitro-tpm's simulated AWS is no hardware: main starts it beside the swtpm.
        Variant::QemuVtpm | Variant::AwsNitroTpm => Ok(None),
        Variant::QemuTdx | Variant::AzureTdx => simulate_intel(args).await.map(Some),
        Variant::AzureTrustedLaunch => simulate_azure_vtpm(args).map(Some),
        Variant::GcpSevEs => simulate_google(args).await.map(Some),
        _ => simulate_amd(args).await.map(Some),
    }
}

fn simulate_azure_vtpm(args: &Args) -> anyhow::Result<Simulated> {
    let (dir, temp) = site_dir(None, "joinservice-trustedlaunch-", args.serve)?;
    let site = TrustedLaunchSite::start(&dir)?;
    let vm = site.vm("local-node", soft_issuer::azure_vtpm::Window::current())?;
    println!(
        "simulated Azure vTPM CA: CA published at {}, root and attestation config in {}",
        site.publisher.url(),
        dir.display()
    );
    Ok(Simulated {
        hardware: Hardware::TrustedLaunch {
            site: Box::new(site),
            vm,
        },
        _dir: temp,
    })
}

/// gcp-sev-es: the GCE stand-in, a simulated GCE confidential VM registered with it, and the
/// attestation config its boot record satisfies.
async fn simulate_google(args: &Args) -> anyhow::Result<Simulated> {
    let (dir, temp) = site_dir(args.gce_dir.as_ref(), "joinservice-gce-", args.serve)?;
    let gce = GceSite::start(&dir).await?;
    let instance = attestation::gce::InstanceRef {
        project: testsupport::snp::GCE_PROJECT.to_owned(),
        zone: testsupport::snp::GCE_ZONE.to_owned(),
        instance: "worker-local".to_owned(),
    };
    let node = testsupport::gce::es_node(&instance)?;
    gce.registry()
        .register(&instance, &node.ak_spki_der().map_err(anyhow::Error::msg)?)?;
    let config = testsupport::gce::es_attestation_config()?;
    let attestation_config = dir.join("attestationConfig");
    std::fs::write(&attestation_config, config)?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&attestation_config, std::fs::Permissions::from_mode(0o644))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    }
    println!(
        "GCE stand-in (gcp-sev-es): metadata server at {}, Compute API at {}, instances registered at {}, files in {}",
        gce.standin.metadata_url(),
        gce.standin.compute_url(),
        gce.standin.control_addr(),
        dir.display()
    );
    Ok(Simulated {
        hardware: Hardware::Google {
            gce,
            attestation_config,
            node,
        },
        _dir: temp,
    })
}

async fn simulate_intel(args: &Args) -> anyhow::Result<Simulated> {
    let intel = Arc::new(pcs_standin::SimulatedIntel::new()?);
    // Spread over the fleet's platform models, so the PCS stand-in serves (and attest-proxy
    // fetches at start) the TCB info of each, as `loadgen run`'s nodes need.
    let machines = TdxMachines::fleet(args.variant, &intel, 4)?;
    let (dir, temp) = site_dir(args.tdx_dir.as_ref(), "joinservice-tdx-", args.serve)?;
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid()? == 0).then_some(Uids::POD.proxy);
    let site = TdxSite::start(
        args.variant,
        intel,
        &machines.fmspcs(),
        &dir,
        Duration::from_secs(7 * 86_400),
        proxy_uid,
    )
    .await?;
    println!(
        "simulated Intel TDX ({}): PCS stand-in at {}, files in {}",
        args.variant,
        site.pcs.url(),
        dir.display()
    );
    Ok(Simulated {
        hardware: Hardware::Tdx { site, machines },
        _dir: temp,
    })
}

async fn simulate_amd(args: &Args) -> anyhow::Result<Simulated> {
    let amd = Arc::new(SimulatedAmd::new(attestation::snp::Product::Milan)?);
    let machines = SnpMachines::new(args.variant, &amd, 4)?;
    let (dir, temp) = site_dir(args.snp_dir.as_ref(), "joinservice-snp-", args.serve)?;
    // As root the harness runs attest-proxy as the pod's uid, which writes the collateral.
    let proxy_uid = (own_uid()? == 0).then_some(Uids::POD.proxy);
    let site = SnpSite::start(amd, &dir, Duration::from_secs(7 * 86_400), proxy_uid).await?;
    machines.publish_vceks(&site.kds, site.amd.product());
    println!(
        "simulated AMD SEV-SNP ({}): KDS stand-in at {}, files in {}",
        args.variant,
        site.kds.url(),
        dir.display()
    );
    let (gce, machines) = if args.variant == Variant::GcpSevSnp {
        let gce = GceSite::start(&dir).await?;
        println!(
            "GCE stand-in: metadata server at {}, Compute API at {}, instances registered at {}",
            gce.standin.metadata_url(),
            gce.standin.compute_url(),
            gce.standin.control_addr()
        );
        let machines = machines.register_instances_with(gce.registry());
        (Some(gce), machines)
    } else {
        (None, machines)
    };
    Ok(Simulated {
        hardware: Hardware::Snp {
            site,
            gce,
            machines,
        },
        _dir: temp,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    plumbing::telemetry::init(plumbing::telemetry::LogFormat::Text);
    ensure!(
        !args.attested_service || args.variant == Variant::QemuVtpm,
        "--attested-service runs the certifier on the local swtpm, so the service attests as \
         qemu-vtpm; local-cluster gives the certifier no simulated SEV-SNP or TDX device, and \
         nodes checking a {} service would refuse qemu-vtpm evidence",
        args.variant
    );
    let snp = matches!(
        args.variant,
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp
    );
    let tdx = matches!(args.variant, Variant::QemuTdx | Variant::AzureTdx);
    ensure!(
        args.kds_url.is_none() || snp,
        "--kds-url names where AMD's collateral comes from, which only the SEV-SNP variants \
         fetch; --variant {} fetches none",
        args.variant
    );
    ensure!(
        args.pcs_url.is_none() || tdx,
        "--pcs-url names where Intel's collateral comes from, which only the TDX variants \
         fetch; --variant {} fetches none",
        args.variant
    );
    let simulated = simulate_hardware(&args).await?;
    // aws-nitro-tpm: the swtpm is the node's NitroTPM; AWS is simulated beside it.
    let (nitro, _nitro_dir) = if args.variant == Variant::AwsNitroTpm {
        // Only ec2-identity reads it (the stand-in's CA): removed when local-cluster ends.
        let (dir, temp) = site_dir(None, "nitro-site-", false)?;
        let site = NitroSite::start(&dir).await?;
        println!(
            "EC2 stand-in: instance metadata (IMDSv2) on {}, EC2 API on {} (image {} in {} \
             supports TPM 2.0)",
            site.ec2.imds_url(),
            site.ec2.ec2_url(),
            testsupport::nitro::IMAGE,
            testsupport::nitro::REGION
        );
        (Some(site), temp)
    } else {
        (None, None)
    };
    if let Some(url) = args.kds_url.as_ref().or(args.pcs_url.as_ref()) {
        println!("attest-proxy fetches collateral from {url}, not from the stand-in");
    }
    let options = Options {
        proxy_listen: args.listen,
        attestation_config: args
            .attestation_config
            .clone()
            .or_else(|| simulated.as_ref().map(Simulated::attestation_config_path)),
        keep_dir: args.serve,
        trust_any_ak: args.trust_any_ak,
        variant: Some(args.variant),
        proxy_args: simulated
            .as_ref()
            .map(|s| s.proxy_args(&args))
            .unwrap_or_default(),
        gce: simulated.as_ref().and_then(Simulated::gce),
        ec2: nitro.as_ref().map(|site| site.endpoints(Vec::new())),
        certifier: args.attested_service,
        own_control_plane: true,
        ..Options::default()
    };
    let system = System::start(options).await?;
    println!(
        "join service up: attest-proxy on {} (files and logs in {})",
        system.proxy_addr,
        system.paths.root.display()
    );
    // Before the admin endpoint's line, which the benchmark waits for.
    println!(
        "kube-apiserver admin kubeconfig in {}",
        system.kube.plane().admin_kubeconfig_path().display()
    );
    println!("attest-proxy admin endpoint on {}", system.admin.proxy);
    let service_policy = if args.attested_service {
        println!(
            "the service attests itself: the certifier certifies attest-proxy's key with the \
             control-plane swtpm; nodes' service policy in {}",
            system.paths.service_policy.display()
        );
        Some(ServicePolicy::load(
            Variant::QemuVtpm,
            &system.paths.service_policy,
        )?)
    } else {
        None
    };

    if !args.no_demo {
        let (issuer, how): (Arc<dyn attestation::Issuer>, String) = match &simulated {
            Some(simulated) => {
                let (issuer, machine) = simulated.node()?;
                (issuer, format!("{machine}, {}", args.variant))
            }
            None => match &nitro {
                Some(site) => (
                    site.node(&system.swtpm.tcti())?,
                    "swtpm as a NitroTPM, aws-nitro-tpm".to_owned(),
                ),
                None => (system.issuer()?, "swtpm, qemu-vtpm".to_owned()),
            },
        };
        if let Err(error) = demo(&system, issuer, &how, service_policy.as_ref()).await {
            eprintln!("{}", system.logs());
            return Err(error);
        }
    }

    if args.serve {
        println!(
            "serving on {} with the policy in {}; Ctrl-C to stop",
            system.proxy_addr,
            system.paths.attestation_config.display()
        );
        if args.attested_service {
            println!(
                "a node that verifies the service before it joins (the node's swtpm):\n  {}",
                join_client_command(&system)?
            );
        }
        if let Some(site) = &nitro {
            println!(
                "an aws-nitro-tpm node (the swtpm, its identity document from the stand-in):\n  \
                 {} join --variant aws-nitro-tpm --imds-url {} --endpoint {} --tcti {} \
                 --disk-uuid 3f0e9c1a-7d2b-4e5f-8a6c-1b9d0e2f4a7d --node-name worker-2 \
                 --ip 10.0.0.8 --out {}",
                std::env::current_exe()?
                    .with_file_name("join-client")
                    .display(),
                site.ec2.imds_url(),
                system.proxy_addr,
                system.swtpm.tcti(),
                system.paths.root.join("node-2").display()
            );
        }
        plumbing::shutdown::signal().await;
    }
    Ok(())
}

/// `join-client join` against `system` with the nodes' service policy, attesting with the
/// system's swtpm (free again once the demo is over), as a second node with a disk of its own.
fn join_client_command(system: &System) -> anyhow::Result<String> {
    let join_client = std::env::current_exe()
        .context("locating local-cluster")?
        .with_file_name("join-client");
    Ok(format!(
        "{} join --endpoint {} --tcti {} --service-policy {} \
         --disk-uuid 3f0e9c1a-7d2b-4e5f-8a6c-1b9d0e2f4a7c --node-name worker-2 --ip 10.0.0.8 \
         --out {}",
        join_client.display(),
        system.proxy_addr,
        system.swtpm.tcti(),
        system.paths.service_policy.display(),
        system.paths.root.join("node-2").display()
    ))
}

async fn demo(
    system: &System,
    issuer: Arc<dyn attestation::Issuer>,
    how: &str,
    service_policy: Option<&ServicePolicy>,
) -> anyhow::Result<()> {
    let out = system.paths.root.join("node");
    let disk_uuid = "7c6a1b0e-5b1f-4d2e-9a3c-2f8d4e6b1a90";
    let kubelet = keys::kubelet_request("worker-local", &["10.0.0.7".parse()?])?;
    let ssh = keys::SshHostKey::generate()?;
    let client = match service_policy {
        Some(policy) => system.client(issuer)?.with_service_policy(policy.clone()),
        None => system.client(issuer)?,
    };
    let joined = client
        .join(proto::join::IssueJoinTicketRequest {
            disk_uuid: disk_uuid.to_owned(),
            certificate_request: kubelet.csr_der.clone(),
            is_control_plane: false,
            host_public_key: ssh.public_wire.clone(),
            host_certificate_principals: vec![],
        })
        .await
        .context("joining")?;
    let node_keys = ticket::NodeKeys {
        kubelet_key_pem: &kubelet.key_pem,
        ssh_host_key_pkcs8: &ssh.pkcs8,
        ssh_host_public_line: &ssh.public_line(),
    };
    ticket::write_join(&out, &joined, &node_keys)?;
    if let Some(policy) = service_policy {
        println!(
            "node worker-local verified the service first: attest-proxy's certificate carries \
             qemu-vtpm evidence of the control-plane swtpm that its service policy accepts \
             (policy {})",
            short(policy.digest())
        );
    }
    println!("node worker-local joined (attested with {how}):");
    println!("{}", ticket::summary(&joined));
    println!("  ticket written to   {}", out.display());

    let rejoined = client.rejoin(disk_uuid).await.context("rejoining")?;
    ensure!(
        rejoined.state_disk_key == joined.state_disk_key,
        "rejoin returned a different disk key"
    );
    println!(
        "node worker-local rejoined: same state disk key {}",
        ticket::fingerprint(&rejoined.state_disk_key)
    );

    // What the API server holds after the join, as it returns it (the token's secret half
    // withheld: the ticket above carries it).
    println!("kube-apiserver {} holds:", system.kube.plane().url());
    for mut secret in system.kube.bootstrap_tokens().await {
        secret.metadata.managed_fields = None;
        let data: serde_json::Map<String, serde_json::Value> = secret
            .data
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| key != "token-secret")
            .map(|(key, value)| (key, String::from_utf8_lossy(&value.0).into_owned().into()))
            .collect();
        let mut shown = serde_json::to_value(&secret)?;
        shown["data"] = data.into();
        println!(
            "  Secret (data decoded, token-secret withheld):\n{}",
            indent(&shown)?
        );
    }
    for mut node in system.kube.joining_nodes().await {
        node.metadata.managed_fields = None;
        println!("  JoiningNode:\n{}", indent(&serde_json::to_value(&node)?)?);
    }
    Ok(())
}

/// `value` as pretty JSON, indented under a heading.
fn indent(value: &serde_json::Value) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    Ok(text
        .lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// A policy digest as a short, recognisable prefix.
fn short(digest: &str) -> &str {
    digest.get(..16).unwrap_or(digest)
}
