//! Simulated SEV-SNP hardware and AMD's key distribution service, for a whole system on one
//! machine: the simulated AMD whose ARK the attestation config trusts (`amdRootKey`, the only way
//! a simulated root is ever trusted), and a KDS stand-in serving its chains, its CRL and the
//! VCEKs of its chips, from which attest-proxy fetches collateral into a collateral directory.
//!
//! `local-cluster --variant aws-sev-snp` and the load generator's benchmark set it up through
//! [`SnpSite::start`]; the SNP storm tests too.
//!
//! gcp-sev-snp also needs Google: [`GceSite`] runs the GCE stand-in that gce-identity asks which
//! attestation key an instance has, and each gcp node's instance is registered there with its
//! key as the node is made ([`GceRegistry`]).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use attestation::snp::{Crl, InstanceRef, Product, Tcb};
use gce_standin::GceStandin;
use kds_standin::KdsStandin;
use soft_issuer::snp::{SimulatedAmd, SimulatedSigner};

use crate::harness::{GceEndpoints, SiteDir, boot_measurements, boot_pcrs};

/// The TCB of every simulated chip and VLEK, and the minimum the configs written here enforce.
pub const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

/// The file (in the site's directory) holding the simulated AMD's certificates, from which
/// another process takes it up again ([`SimulatedAmd::from_certificates_pem`]).
pub const AMD_CERTIFICATES: &str = "simulated-amd.pem";

/// A Constellation attestation config for an SNP variant: the harness's boot measurements
/// enforced, [`TCB`] as the minimum TCB of every product, the simulated reports' ID key digest
/// (zero) accepted, and `amd`'s ARK as the only trusted root.
pub fn attestation_config(amd: &SimulatedAmd) -> String {
    attestation_config_enforcing(amd, boot_measurements().into())
}

/// [`attestation_config`] enforcing `measurements` (an attestation config's `measurements`)
/// instead of the harness's.
pub fn attestation_config_enforcing(amd: &SimulatedAmd, measurements: serde_json::Value) -> String {
    serde_json::json!({
        "measurements": measurements,
        "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
        "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
        "minimumTcb": {
            "Genoa": {
                "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
                "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
            },
            "Turin": {
                "fmcVersion": TCB.fmc.unwrap_or(0),
                "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
                "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
            },
        },
        "firmwareSignerConfig": { "acceptedKeyDigests": [hex::encode([0u8; 48])] },
        "amdRootKey": amd.ark_pem(),
    })
    .to_string()
}

/// `amd`'s CRL revoking nothing, current now: issued an hour ago, next due in a day.
pub fn current_crl(amd: &SimulatedAmd) -> anyhow::Result<Crl> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    Ok(Crl::from_der(amd.crl(&[], now - 3600, now + 86_400)?)?)
}

/// The KDS path (with query) of the VCEK of chip `hw_id` at `tcb`, as attest-proxy asks for it.
pub fn vcek_path(product: Product, hw_id: &[u8], tcb: &Tcb) -> String {
    let fmc = match product {
        Product::Turin => format!("fmcSPL={:02}&", tcb.fmc.unwrap_or(0)),
        Product::Milan | Product::Genoa => String::new(),
    };
    format!(
        "/vcek/v1/{product}/{}?{fmc}blSPL={:02}&teeSPL={:02}&snpSPL={:02}&ucodeSPL={:02}",
        hex::encode(hw_id),
        tcb.bootloader,
        tcb.tee,
        tcb.snp,
        tcb.microcode
    )
}

/// A simulated AMD and the KDS stand-in serving its collateral.
#[derive(Debug)]
pub struct SnpSite {
    pub amd: Arc<SimulatedAmd>,
    pub kds: KdsStandin,
    dir: SiteDir,
}

impl SnpSite {
    /// Starts a KDS stand-in serving `amd`'s VCEK and VLEK chains and their two CRLs (revoking nothing)
    /// valid from an hour ago for `crl_valid_for`, and prepares `dir`: the stand-in's CA
    /// (`kds-ca.pem`), the simulated AMD's certificates ([`AMD_CERTIFICATES`]), the attestation
    /// config (`attestationConfig`) and the collateral directory (`collateral/`, owned by
    /// `proxy_uid` when attest-proxy runs as another uid).
    pub async fn start(
        amd: Arc<SimulatedAmd>,
        dir: &Path,
        crl_valid_for: Duration,
        proxy_uid: Option<u32>,
    ) -> anyhow::Result<SnpSite> {
        let kds = KdsStandin::start()
            .await
            .context("starting the KDS stand-in")?;
        let product = amd.product().name();
        kds.put_vcek_chain(product, &amd.vcek_chain_pem());
        kds.put_vlek_chain(product, &amd.vlek_chain_pem());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("clock before 1970")?
            .as_secs();
        // AMD publishes a CRL per signing-key kind; each revokes nothing here.
        let crl = amd.crl(&[], now - 3600, now + crl_valid_for.as_secs())?;
        kds.put_vcek_crl(product, crl);
        let crl = amd.crl(&[], now - 3600, now + crl_valid_for.as_secs())?;
        kds.put_vlek_crl(product, crl);
        let dir = SiteDir::prepare(
            dir,
            &[
                ("kds-ca.pem", kds.ca_pem().to_owned()),
                (AMD_CERTIFICATES, amd.certificates_pem()),
                ("attestationConfig", attestation_config(&amd)),
            ],
            proxy_uid,
        )?;
        Ok(SnpSite { amd, kds, dir })
    }

    /// The attestation config written at start.
    pub fn attestation_config_path(&self) -> PathBuf {
        self.dir.attestation_config_path()
    }

    /// Where attest-proxy keeps fetched collateral.
    pub fn collateral_dir(&self) -> PathBuf {
        self.dir.collateral_dir()
    }

    /// attest-proxy's collateral flags: the stand-in's URL and CA, the collateral directory, and
    /// `--collateral-wait` (how long a join waits for collateral not cached yet).
    pub fn proxy_args(&self, collateral_wait: Duration) -> Vec<String> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--kds-url".to_owned(),
            self.kds.url().to_owned(),
            "--kds-ca-file".to_owned(),
            path(self.dir.file("kds-ca.pem")),
            "--collateral-dir".to_owned(),
            path(self.collateral_dir()),
            "--collateral-wait".to_owned(),
            humantime::format_duration(collateral_wait).to_string(),
        ]
    }
}

/// The file (in a [`GceSite`]'s directory) holding the GCE stand-in's control address, where
/// another process registers its nodes' instances ([`GceRegistry::Control`]).
pub const GCE_CONTROL: &str = "gce-standin-control";

/// The project and zone every simulated gcp node's instance is in.
pub const GCE_PROJECT: &str = "constellation-local";
pub const GCE_ZONE: &str = "europe-west3-b";

/// The GCE stand-in (metadata server and Compute API) for gcp-sev-snp, in this process.
#[derive(Debug)]
pub struct GceSite {
    pub standin: Arc<GceStandin>,
    ca_file: PathBuf,
}

impl GceSite {
    /// Starts the stand-in and writes into `dir` (which every uid must be able to traverse) its
    /// Compute API's CA (`gce-ca.pem`, for gce-identity) and its control address
    /// ([`GCE_CONTROL`]).
    pub async fn start(dir: &Path) -> anyhow::Result<GceSite> {
        let standin = GceStandin::start()
            .await
            .context("starting the GCE stand-in")?;
        let ca_file = dir.join("gce-ca.pem");
        for (path, contents) in [
            (&ca_file, standin.ca_pem().to_owned()),
            (&dir.join(GCE_CONTROL), standin.control_addr().to_string()),
        ] {
            std::fs::write(path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(GceSite {
            standin: Arc::new(standin),
            ca_file,
        })
    }

    /// What the harness gives gce-identity (and `proxy_args` to attest-proxy).
    pub fn endpoints(&self, proxy_args: Vec<String>) -> GceEndpoints {
        GceEndpoints {
            metadata_url: self.standin.metadata_url(),
            compute_url: self.standin.compute_url(),
            compute_ca_file: self.ca_file.clone(),
            proxy_args,
        }
    }

    /// Registers nodes' instances with this stand-in, in process.
    pub fn registry(&self) -> GceRegistry {
        GceRegistry::InProcess(self.standin.clone())
    }
}

/// Where gcp nodes' instances are registered with their attestation keys, so that the GCE API
/// (its stand-in) vouches for each node's key when gce-identity asks.
#[derive(Clone, Debug)]
pub enum GceRegistry {
    /// A stand-in in this process.
    InProcess(Arc<GceStandin>),
    /// A stand-in in another process (local-cluster's), through its control endpoint: the
    /// address in its site's [`GCE_CONTROL`] file ([`GceRegistry::from_dir`]).
    Control(SocketAddr),
}

impl GceRegistry {
    /// The stand-in whose site wrote `dir`.
    pub fn from_dir(dir: &Path) -> anyhow::Result<GceRegistry> {
        let path = dir.join(GCE_CONTROL);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let addr = text
            .trim()
            .parse()
            .with_context(|| format!("{} holds no address: {text:?}", path.display()))?;
        Ok(GceRegistry::Control(addr))
    }

    /// Registers `instance` with `signing_spki` (DER) as the key the API vouches for.
    pub fn register(&self, instance: &InstanceRef, signing_spki: &[u8]) -> anyhow::Result<()> {
        let instance = gce_standin::Instance {
            project: instance.project.clone(),
            zone: instance.zone.clone(),
            name: instance.instance.clone(),
        };
        match self {
            GceRegistry::InProcess(standin) => standin.put_instance(instance, signing_spki, None),
            GceRegistry::Control(addr) => {
                gce_standin::put_instance_at(*addr, &instance, signing_spki)?;
            }
        }
        Ok(())
    }
}

/// The simulated SEV-SNP machines the nodes of one variant run on, and how each node's document
/// is made.
///
/// - **aws-sev-snp**: AWS signs its guests' reports with one VLEK per cloud provider (and TCB),
///   loaded into every host, so every node's report is signed by the one simulated VLEK, and its
///   document carries that VLEK and the ASVK chain, as AWS nodes' do (AMD serves no VLEK). Each
///   node has its own ECDSA P-256 attestation key, which its report binds.
/// - **azure-sev-snp**: each host is a chip with its own VCEK; nodes are spread over `hosts`
///   chips as VMs over a data centre's hosts. Constellation's Azure nodes send the VCEK (from
///   the host's HCL) and its chain in their documents, and so do these unless told to leave the
///   certificates out ([`SnpMachines::leave_out_certificates`]: the verifier then fetches each
///   chip's VCEK from the KDS). Azure attestation keys are RSA, and an RSA key takes longer to make
///   than a join, so every node shares soft-issuer's one RSA key (each report still binds it).
/// - **gcp-sev-snp**: chips per host as for azure; each node is a GCE instance of its own
///   (`<random prefix>-<n>` in [`GCE_PROJECT`], [`GCE_ZONE`]) with its own ECDSA P-256 key,
///   registered with the GCE stand-in as the instance's key when the node is made
///   ([`SnpMachines::register_instances_with`]); its reports hold each connection's extraData.
///
/// Every quote carries the harness's boot measurements ([`crate::harness::BOOT_MEASUREMENTS`]), as
/// [`attestation_config`] expects.
pub struct SnpMachines {
    variant: attestation::Variant,
    signers: Vec<Arc<SimulatedSigner>>,
    chain_pem: String,
    issue: IssueFn,
    /// Shared by every node where the variant needs an RSA key (slow to generate).
    shared_ak: Option<soft_issuer::SoftIssuer>,
    next: std::sync::atomic::AtomicUsize,
    with_certificates: bool,
    /// gcp-sev-snp: where each node's instance is registered.
    gce: Option<GceRegistry>,
    /// gcp-sev-snp: the start of every instance name, new for every set of machines, so that
    /// two runs against one service never present one instance with two keys.
    instance_prefix: String,
}

/// A node's document issuer from its AK, its machine's signer and its index.
type IssueFn = fn(
    &SnpMachines,
    soft_issuer::SoftIssuer,
    &Arc<SimulatedSigner>,
    usize,
) -> anyhow::Result<soft_issuer::snp::SnpDocumentIssuer>;

impl std::fmt::Debug for SnpMachines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnpMachines")
            .field("variant", &self.variant)
            .field("signers", &self.signers.len())
            .field("with_certificates", &self.with_certificates)
            .finish_non_exhaustive()
    }
}

/// The `index`-th simulated chip's CHIP_ID.
fn chip_id(index: usize) -> [u8; 64] {
    let mut id = [0x5a; 64];
    id[..8].copy_from_slice(&(index as u64 + 1).to_be_bytes());
    id
}

impl SnpMachines {
    /// The machines of `variant` under `amd`: for a variant with a chip per host, `hosts` chips.
    /// Fails for a variant not simulated here.
    pub fn new(
        variant: attestation::Variant,
        amd: &SimulatedAmd,
        hosts: usize,
    ) -> anyhow::Result<SnpMachines> {
        use attestation::Variant;
        use soft_issuer::snp::{GcpReportData, ReportFields, SnpDocumentIssuer};
        use soft_issuer::{KeyType, SoftIssuer};
        let chips = || -> anyhow::Result<Vec<Arc<SimulatedSigner>>> {
            (0..hosts.max(1))
                .map(|i| Ok(Arc::new(amd.chip(chip_id(i), TCB, 0)?)))
                .collect()
        };
        let (signers, chain_pem, issue, shared_ak): (_, _, IssueFn, _) = match variant {
            Variant::AwsSevSnp => (
                vec![Arc::new(amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB)?)],
                amd.vlek_chain_pem(),
                |m, ak, vlek, _| {
                    Ok(SnpDocumentIssuer::aws(
                        ak,
                        vlek,
                        &m.chain_pem,
                        ReportFields::default(),
                    )?)
                },
                None,
            ),
            Variant::AzureSevSnp => (
                chips()?,
                amd.vcek_chain_pem(),
                |m, ak, vcek, _| {
                    Ok(SnpDocumentIssuer::azure(
                        ak,
                        vcek,
                        &m.chain_pem,
                        ReportFields::default(),
                    )?)
                },
                Some(SoftIssuer::new(KeyType::Rsa2048)?.with_pcrs(boot_pcrs())?),
            ),
            Variant::GcpSevSnp => (
                chips()?,
                amd.vcek_chain_pem(),
                |m, ak, vcek, index| {
                    let gce = m.gce.as_ref().context(
                        "gcp-sev-snp machines need a GCE stand-in to register their instances \
                         with (SnpMachines::register_instances_with)",
                    )?;
                    let instance = InstanceRef {
                        project: GCE_PROJECT.to_owned(),
                        zone: GCE_ZONE.to_owned(),
                        instance: format!("{}-{index}", m.instance_prefix),
                    };
                    let node = SnpDocumentIssuer::gcp(
                        ak,
                        vcek.clone(),
                        &m.chain_pem,
                        ReportFields::default(),
                        Some(instance.clone()),
                        GcpReportData::Bound,
                    );
                    gce.register(&instance, &node.ak_spki_der()?)?;
                    Ok(node)
                },
                None,
            ),
            other => anyhow::bail!("no simulated SEV-SNP machines for {other}"),
        };
        Ok(SnpMachines {
            variant,
            signers,
            chain_pem,
            issue,
            shared_ak,
            next: std::sync::atomic::AtomicUsize::new(0),
            with_certificates: true,
            gce: None,
            instance_prefix: format!(
                "n{}",
                hex::encode(rand::Rng::random::<[u8; 4]>(&mut rand::rng()))
            ),
        })
    }

    /// gcp-sev-snp: each node's instance is registered with `gce` as the node is made, before
    /// it can connect.
    pub fn register_instances_with(mut self, gce: GceRegistry) -> Self {
        self.gce = Some(gce);
        self
    }

    /// Documents carry no signer certificate and no chain: the verifier gets them from the KDS
    /// (azure-sev-snp; an aws-sev-snp document without its VLEK is refused, as AMD serves none).
    pub fn leave_out_certificates(mut self) -> Self {
        self.with_certificates = false;
        self
    }

    pub fn variant(&self) -> attestation::Variant {
        self.variant
    }

    /// A new node on the next machine (round robin): its own attestation key (or the shared
    /// one) and a report from the machine's firmware binding it.
    pub fn node(&self) -> anyhow::Result<soft_issuer::snp::SnpDocumentIssuer> {
        let index = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let signer = &self.signers[index % self.signers.len()];
        let ak = match &self.shared_ak {
            Some(ak) => ak.clone(),
            None => soft_issuer::SoftIssuer::new(soft_issuer::KeyType::EcdsaP256)?
                .with_pcrs(boot_pcrs())?,
        };
        let node = (self.issue)(self, ak.clone(), signer, index)?;
        if self.with_certificates {
            return Ok(node);
        }
        let bare = node.instance_info_without_certificates()?;
        Ok(soft_issuer::snp::SnpDocumentIssuer::from_parts(
            self.variant,
            ak,
            bare,
        ))
    }

    /// Serves every chip's VCEK at its KDS path, as AMD serves every chip's.
    pub fn publish_vceks(&self, kds: &KdsStandin, product: Product) {
        for signer in &self.signers {
            if let Some(hw_id) = signer.hw_id() {
                kds.put_vcek(
                    &vcek_path(product, &hw_id, &signer.tcb()),
                    signer.cert_der().to_vec(),
                );
            }
        }
    }
}
