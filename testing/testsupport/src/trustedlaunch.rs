//! Simulated Azure Trusted Launch VMs for azure-trustedlaunch: soft-issuer's simulated Azure vTPM
//! CA, a stand-in of the site where Azure publishes its CA certificate, and vTPMs (swtpm) on which
//! Azure's setup is played ([`crate::azure::boot_trustedlaunch`]); the attestation config
//! attest-proxy reads trusts the simulated root through `azureVtpmRoots` and enforces the
//! harness's boot measurements.
//!
//! For load, [`SoftVms`] makes Trusted Launch VMs without a vTPM: a software AK with an AK
//! certificate of the simulated CA per VM.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use soft_issuer::azure_vtpm::{SimulatedAzureVtpmCa, Window};
use tpm_issuer::azure::trustedlaunch::{HttpCaFetcher, TrustedLaunchIssuer};

use crate::azure::CaPublisherStandin;
use crate::harness::{BOOT_MEASUREMENTS, SiteDir, boot_measurements};
use crate::swtpm::Swtpm;

/// The simulated Azure and where its CA is published, with the attestation config trusting it.
pub struct TrustedLaunchSite {
    pub azure: SimulatedAzureVtpmCa,
    pub publisher: CaPublisherStandin,
    pub dir: SiteDir,
}

impl std::fmt::Debug for TrustedLaunchSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedLaunchSite")
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

/// The config attest-proxy reads: the harness's boot measurements, and `azure`'s root.
pub fn attestation_config(azure: &SimulatedAzureVtpmCa) -> String {
    serde_json::json!({
        "measurements": boot_measurements(),
        "azureVtpmRoots": [azure.root_pem()],
    })
    .to_string()
}

impl TrustedLaunchSite {
    /// The simulated Azure, its CA published over HTTP, and `dir` holding the attestation config
    /// (`attestationConfig`, readable by every uid).
    pub fn start(dir: &Path) -> anyhow::Result<TrustedLaunchSite> {
        let azure = SimulatedAzureVtpmCa::new()?;
        let publisher = CaPublisherStandin::start(azure.ca_der().to_vec())?;
        let dir = SiteDir::prepare(
            dir,
            &[
                ("attestationConfig", attestation_config(&azure)),
                ("simulated-azure-vtpm-root.pem", azure.root_pem()),
            ],
            None,
        )?;
        Ok(TrustedLaunchSite {
            azure,
            publisher,
            dir,
        })
    }

    pub fn attestation_config_path(&self) -> std::path::PathBuf {
        self.dir.attestation_config_path()
    }

    /// Azure's setup on `swtpm`: the AK and the simulated Azure's certificate for VM `vm_id`,
    /// valid in `window`, naming the publisher's URL. Returns the certificate.
    pub fn boot(&self, swtpm: &Swtpm, vm_id: &str, window: Window) -> anyhow::Result<Vec<u8>> {
        crate::azure::boot_trustedlaunch(
            swtpm,
            &self.azure,
            vm_id,
            window,
            &[&self.publisher.url()],
        )
    }

    /// A new vTPM, booted as the harness's nodes are (its boot measurements), with Azure's setup
    /// for `vm_id` valid in `window`.
    pub fn vm(&self, vm_id: &str, window: Window) -> anyhow::Result<Swtpm> {
        let swtpm = measured_swtpm()?;
        self.boot(&swtpm, vm_id, window)?;
        Ok(swtpm)
    }
}

/// A swtpm with the harness's boot measurements extended.
pub fn measured_swtpm() -> anyhow::Result<Swtpm> {
    let swtpm = Swtpm::start()?;
    for (index, byte) in BOOT_MEASUREMENTS {
        swtpm.extend_pcr(index, &[byte; 32])?;
    }
    Ok(swtpm)
}

/// The azure-trustedlaunch issuer of the vTPM `swtpm`, fetching the CA over HTTP.
pub fn issuer(swtpm: &Swtpm) -> anyhow::Result<Arc<TrustedLaunchIssuer>> {
    let tpm = tpm_issuer::azure::open_tpm(&swtpm.tcti())?;
    Ok(Arc::new(TrustedLaunchIssuer::new(
        tpm,
        Box::new(HttpCaFetcher::new(Duration::from_secs(10))),
    )))
}

/// azure-trustedlaunch VMs for load, without a vTPM: each [`SoftVms::node`] gets an AK
/// certificate of its own (`<random prefix>-<n>.TrustedVM.Azure.windows.net`) from a simulated
/// CA and sends it with that CA as InstanceInfo, as [`TrustedLaunchIssuer`] does, quoting the
/// harness's boot measurements. Azure's AK is RSA and an RSA key is slow to make, so every VM
/// shares soft-issuer's one RSA key; each certificate still certifies it. The simulated CA's
/// keys are fixed ([`SimulatedAzureVtpmCa::new`]), so these certificates chain to the root of
/// any site made with `new` (a running `local-cluster --variant azure-trustedlaunch`'s too):
/// the chain is checked by name and key.
pub struct SoftVms {
    azure: SimulatedAzureVtpmCa,
    ak: soft_issuer::SoftIssuer,
    prefix: String,
    next: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for SoftVms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftVms")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl SoftVms {
    pub fn new() -> anyhow::Result<SoftVms> {
        Ok(SoftVms {
            azure: SimulatedAzureVtpmCa::new()?,
            ak: soft_issuer::SoftIssuer::rsa_2048()?.with_pcrs(crate::harness::boot_pcrs())?,
            prefix: format!(
                "tl{}",
                hex::encode(rand::Rng::random::<[u8; 4]>(&mut rand::rng()))
            ),
            next: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The next VM, its AK certificate issued.
    pub fn node(&self) -> anyhow::Result<soft_issuer::InstanceIssuer> {
        use attestation::variants::azure_trustedlaunch::InstanceInfo;
        let index = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ak_cert = self.azure.ak_cert(
            self.ak.ak_public(),
            &format!("{}-{index}", self.prefix),
            Window::current(),
            &[],
        )?;
        let info = InstanceInfo {
            ak_cert,
            ca: self.azure.ca_der().to_vec(),
        };
        Ok(soft_issuer::InstanceIssuer::new(
            self.ak.clone(),
            attestation::Variant::AzureTrustedLaunch,
            info.to_json(),
        ))
    }
}
