//! Simulated SEV-SNP hardware and AMD's key distribution service, for a whole system on one
//! machine: the simulated AMD whose ARK the attestation config trusts (`amdRootKey`, the only way
//! a simulated root is ever trusted), and a KDS stand-in serving its chains, its CRL and the
//! VCEKs of its chips, from which attest-proxy fetches collateral into a collateral directory.
//!
//! `local-cluster --variant aws-sev-snp` and the load generator's benchmark set it up through
//! [`SnpSite::start`]; the SNP storm tests too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use attestation::snp::{Product, Tcb};
use kds_standin::KdsStandin;
use soft_issuer::snp::SimulatedAmd;

use crate::harness::{SiteDir, boot_measurements, boot_pcrs};

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
/// enforced, [`TCB`] as the minimum TCB, and `amd`'s ARK as the only trusted root.
pub fn attestation_config(amd: &SimulatedAmd) -> String {
    serde_json::json!({
        "measurements": boot_measurements(),
        "bootloaderVersion": TCB.bootloader, "teeVersion": TCB.tee,
        "snpVersion": TCB.snp, "microcodeVersion": TCB.microcode,
        "amdRootKey": amd.ark_pem(),
    })
    .to_string()
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
    /// Starts a KDS stand-in serving `amd`'s VCEK and VLEK chains and a CRL (revoking nothing)
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
        kds.put_crl(
            product,
            amd.crl(&[], now - 3600, now + crl_valid_for.as_secs())?,
        );
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
///   chip's VCEK from the KDS). Azure attestation keys are RSA, and ring makes no RSA keys, so
///   every node shares soft-issuer's one RSA key (each report still binds it).
///
/// Every quote carries the harness's boot measurements ([`crate::harness::BOOT_MEASUREMENTS`]), as
/// [`attestation_config`] expects.
pub struct SnpMachines {
    variant: attestation::Variant,
    signers: Vec<soft_issuer::snp::SimulatedSigner>,
    chain_pem: String,
    issue: IssueFn,
    /// Shared by every node where the variant needs a key type ring cannot generate.
    shared_ak: Option<soft_issuer::SoftIssuer>,
    next: std::sync::atomic::AtomicUsize,
    with_certificates: bool,
}

type IssueFn = fn(
    &SnpMachines,
    soft_issuer::SoftIssuer,
    &soft_issuer::snp::SimulatedSigner,
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
        use soft_issuer::snp::{ReportFields, SnpDocumentIssuer};
        use soft_issuer::{KeyType, SoftIssuer};
        let (signers, chain_pem, issue, shared_ak): (_, _, IssueFn, _) = match variant {
            Variant::AwsSevSnp => (
                vec![amd.vlek("aws.simulated.example", TCB)?],
                amd.vlek_chain_pem(),
                |m, ak, vlek| {
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
                (0..hosts.max(1))
                    .map(|i| amd.chip(chip_id(i), TCB, 0))
                    .collect::<Result<Vec<_>, _>>()?,
                amd.vcek_chain_pem(),
                |m, ak, vcek| {
                    Ok(SnpDocumentIssuer::azure(
                        ak,
                        vcek,
                        &m.chain_pem,
                        ReportFields::default(),
                    )?)
                },
                Some(SoftIssuer::new(KeyType::Rsa2048)?.with_pcrs(boot_pcrs())?),
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
        })
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
        let node = (self.issue)(self, ak.clone(), signer)?;
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
