//! Simulated Intel TDX machines and Intel's PCS, for a whole system on one machine: the simulated
//! Intel whose root the attestation config trusts (`intelRootKey`, the only way a simulated root
//! is ever trusted), and a PCS stand-in serving its TCB info, QE identity and CRLs, from which
//! attest-proxy fetches collateral into a collateral directory.
//!
//! `local-cluster --variant qemu-tdx|azure-tdx` sets it up through [`TdxSite::start`]; the TDX
//! end-to-end tests too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use attestation::Variant;
use pcs_standin::{PckCa, PcsStandin, SimulatedIntel};
use soft_issuer::tdx::{PckSpec, ReportData, TdFields, TdxDocumentIssuer, TdxMachine};

use crate::harness::{SiteDir, boot_measurements, boot_pcrs};

/// The file (in the site's directory) holding the simulated Intel's root, PEM.
pub const INTEL_ROOT: &str = "simulated-intel-root.pem";

/// The file (in the site's directory, readable by its owner only) holding the simulated Intel's
/// CA certificates and keys ([`SimulatedIntel::keys_pem`]), from which another process (`loadgen
/// run --simulated-intel`) takes it up again to make machines the site's config trusts.
pub const INTEL_KEYS: &str = "simulated-intel.pem";

/// The platform models ([`TdxMachines::fleet`]) a simulated fleet is spread over: the default
/// FMSPC and two more, so a verifier needs one TCB info for each, as for a real cluster on a few
/// kinds of hosts.
pub const FLEET_FMSPCS: [[u8; 6]; 3] = [
    soft_issuer::tdx::FMSPC,
    [0x00, 0x80, 0x6f, 0x05, 0x00, 0x01],
    [0x00, 0xc0, 0x6f, 0x00, 0x00, 0x00],
];

/// A Constellation attestation config for a TDX variant, trusting only `intel`'s root:
/// qemu-tdx enforces the simulated TDs' MRTD and RTMR0..3 at 0..4
/// ([`soft_issuer::tdx::qemu_attestation_config`]);
/// azure-tdx the harness's boot measurements in the vTPM's PCRs, as for the SNP variants, and
/// the simulated TDs' MRTD; both the simulated MRSEAM.
pub fn attestation_config(variant: Variant, intel: &SimulatedIntel) -> anyhow::Result<String> {
    match variant {
        Variant::QemuTdx => Ok(soft_issuer::tdx::qemu_attestation_config(intel).to_string()),
        Variant::AzureTdx => Ok(serde_json::json!({
            "measurements": boot_measurements(),
            "intelRootKey": intel.root_pem(),
            "mrtds": [hex::encode(soft_issuer::tdx::MRTD)],
            "mrSeams": [hex::encode(soft_issuer::tdx::MRSEAM)],
        })
        .to_string()),
        other => anyhow::bail!("{other} is not a TDX variant"),
    }
}

/// A simulated Intel and the PCS stand-in serving its collateral.
#[derive(Debug)]
pub struct TdxSite {
    pub intel: Arc<SimulatedIntel>,
    pub pcs: PcsStandin,
    fmspcs: Vec<String>,
    dir: SiteDir,
    /// When the served collateral was issued and when it runs out.
    window: (SystemTime, SystemTime),
}

impl TdxSite {
    /// Starts a PCS stand-in serving `intel`'s TCB info for each of `fmspcs`, its QE identity,
    /// both PCK CRLs and the root CRL (revoking nothing), valid from an hour ago for
    /// `valid_for`, and prepares `dir`: the stand-in's CA (`pcs-ca.pem`), the simulated root
    /// ([`INTEL_ROOT`]), the attestation config of `variant` (`attestationConfig`) and the
    /// collateral directory (`collateral/`, owned by `proxy_uid` when attest-proxy runs as
    /// another uid).
    pub async fn start(
        variant: Variant,
        intel: Arc<SimulatedIntel>,
        fmspcs: &[String],
        dir: &Path,
        valid_for: Duration,
        proxy_uid: Option<u32>,
    ) -> anyhow::Result<TdxSite> {
        let pcs = PcsStandin::start()
            .await
            .context("starting the PCS stand-in")?;
        let now = SystemTime::now();
        let window = (now - Duration::from_secs(3600), now + valid_for);
        let names: Vec<&str> = fmspcs.iter().map(String::as_str).collect();
        pcs.serve_intel(&intel, &names, window.0, window.1)?;
        let dir = SiteDir::prepare(
            dir,
            &[
                ("pcs-ca.pem", pcs.ca_pem().to_owned()),
                (INTEL_ROOT, intel.root_pem()),
                ("attestationConfig", attestation_config(variant, &intel)?),
            ],
            proxy_uid,
        )?;
        let keys = dir.file(INTEL_KEYS);
        std::fs::write(&keys, intel.keys_pem())
            .with_context(|| format!("writing {}", keys.display()))?;
        std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        Ok(TdxSite {
            intel,
            pcs,
            fmspcs: fmspcs.to_vec(),
            dir,
            window,
        })
    }

    /// The PCK CA `ca`'s CRL now revokes the PCK certificates with `serials` (served from the
    /// next request on; attest-proxy keeps what it already fetched until it refreshes).
    pub fn revoke(&self, ca: PckCa, serials: &[u64]) -> anyhow::Result<()> {
        let crl = self
            .intel
            .pck_crl(ca, serials, self.window.0, self.window.1)?;
        self.pcs
            .put_pck_crl(ca, crl, &self.intel.pck_issuer_chain_pem(ca));
        Ok(())
    }

    /// The attestation config written at start.
    pub fn attestation_config_path(&self) -> PathBuf {
        self.dir.attestation_config_path()
    }

    /// Where attest-proxy keeps fetched collateral.
    pub fn collateral_dir(&self) -> PathBuf {
        self.dir.collateral_dir()
    }

    /// attest-proxy's collateral flags: the stand-in's URL and CA, where the root CRL is, the
    /// FMSPCs to fetch collateral for at start, the collateral directory, and
    /// `--collateral-wait` (how long a join waits for collateral not cached yet).
    pub fn proxy_args(&self, collateral_wait: Duration) -> Vec<String> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let mut args = vec![
            "--pcs-url".to_owned(),
            self.pcs.url().to_owned(),
            "--pcs-ca-file".to_owned(),
            path(self.dir.file("pcs-ca.pem")),
            "--intel-root-crl-url".to_owned(),
            self.pcs.root_crl_url(),
        ];
        for fmspc in &self.fmspcs {
            args.extend(["--tdx-fmspc".to_owned(), fmspc.clone()]);
        }
        args.extend([
            "--collateral-dir".to_owned(),
            path(self.collateral_dir()),
            "--collateral-wait".to_owned(),
            humantime::format_duration(collateral_wait).to_string(),
        ]);
        args
    }
}

/// The simulated TDX hosts the nodes of one variant run on, and how each node's document is
/// made.
///
/// Every host is a machine of the same platform model (one FMSPC, so one TCB info serves them
/// all) with its own PCK from the Platform CA (serials `0x1000 + host`); nodes are spread over
/// the hosts round robin. Every TD is a production TD at the UpToDate level with soft-issuer's
/// `MRTD` and `RTMRS` (qemu-tdx measures them). azure-tdx nodes share soft-issuer's one RSA key as
/// their vTPM key (Azure's are RSA, slow to generate), quoting the harness's boot
/// measurements; each node's TD quote still binds it through the runtime data.
pub struct TdxMachines {
    variant: Variant,
    hosts: Vec<Arc<TdxMachine>>,
    shared_ak: Option<soft_issuer::SoftIssuer>,
    next: AtomicUsize,
}

impl std::fmt::Debug for TdxMachines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TdxMachines")
            .field("variant", &self.variant)
            .field("hosts", &self.hosts.len())
            .finish_non_exhaustive()
    }
}

impl TdxMachines {
    /// `hosts` machines (at least one) certified by `intel`, for `variant`. Fails for a variant
    /// not simulated here.
    pub fn new(
        variant: Variant,
        intel: &SimulatedIntel,
        hosts: usize,
    ) -> anyhow::Result<TdxMachines> {
        Self::spread(variant, intel, hosts, &[soft_issuer::tdx::FMSPC])
    }

    /// `hosts` machines spread round robin over the platform models of [`FLEET_FMSPCS`], as a
    /// real cluster's hosts are: the site must serve TCB info for each ([`TdxMachines::fmspcs`]).
    pub fn fleet(
        variant: Variant,
        intel: &SimulatedIntel,
        hosts: usize,
    ) -> anyhow::Result<TdxMachines> {
        Self::spread(variant, intel, hosts, &FLEET_FMSPCS)
    }

    /// Host `i` of `hosts` has the FMSPC `fmspcs[i % fmspcs.len()]`.
    fn spread(
        variant: Variant,
        intel: &SimulatedIntel,
        hosts: usize,
        fmspcs: &[[u8; 6]],
    ) -> anyhow::Result<TdxMachines> {
        let shared_ak = match variant {
            Variant::QemuTdx => None,
            Variant::AzureTdx => Some(
                soft_issuer::SoftIssuer::new(soft_issuer::KeyType::Rsa2048)?
                    .with_pcrs(boot_pcrs())?,
            ),
            other => anyhow::bail!("no simulated TDX machines for {other}"),
        };
        let hosts = (0..hosts.max(1))
            .map(|i| {
                let pck = PckSpec {
                    serial: 0x1000 + i as u64,
                    fmspc: fmspcs
                        .get(i % fmspcs.len().max(1))
                        .copied()
                        .unwrap_or(soft_issuer::tdx::FMSPC),
                    ..PckSpec::default()
                };
                Ok(Arc::new(TdxMachine::new(intel, pck)?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(TdxMachines {
            variant,
            hosts,
            shared_ak,
            next: AtomicUsize::new(0),
        })
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The FMSPCs of the hosts, lower-case hex, each once: what PCS must serve TCB info for.
    pub fn fmspcs(&self) -> Vec<String> {
        let mut fmspcs: Vec<String> = self.hosts.iter().map(|h| h.fmspc_hex()).collect();
        fmspcs.sort();
        fmspcs.dedup();
        fmspcs
    }

    /// The `index`-th host.
    pub fn host(&self, index: usize) -> Arc<TdxMachine> {
        self.hosts[index % self.hosts.len()].clone()
    }

    /// A production TD on the next host, bound as a node binds its documents.
    pub fn node(&self) -> anyhow::Result<TdxDocumentIssuer> {
        self.node_with(TdFields::default(), ReportData::Bound)
    }

    /// A TD with `td`'s report body on the next host, its REPORT_DATA as `report_data` says.
    pub fn node_with(
        &self,
        td: TdFields,
        report_data: ReportData,
    ) -> anyhow::Result<TdxDocumentIssuer> {
        let host = self.host(self.next.fetch_add(1, Ordering::Relaxed));
        self.node_on(host, td, report_data)
    }

    /// A TD on `host` (which may be another Intel's machine, or one with another PCK).
    pub fn node_on(
        &self,
        host: Arc<TdxMachine>,
        td: TdFields,
        report_data: ReportData,
    ) -> anyhow::Result<TdxDocumentIssuer> {
        Ok(match &self.shared_ak {
            None => TdxDocumentIssuer::qemu(host, td, report_data),
            Some(ak) => TdxDocumentIssuer::azure(ak.clone(), host, td, report_data)?,
        })
    }
}
