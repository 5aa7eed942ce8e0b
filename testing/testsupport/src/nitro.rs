//! aws-nitro-tpm's simulated AWS for `local-cluster` and the tests: the EC2 stand-in (IMDSv2
//! and `DescribeImages`), serving one region with a NitroTPM image and an identity document
//! naming it, and the files ec2-identity needs to reach it; and [`SoftInstances`], nodes for
//! load without a TPM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ec2_standin::Ec2Standin;

use crate::harness::Ec2Endpoints;

/// The region the simulated instances run in.
pub const REGION: &str = "eu-central-1";
/// The image they boot, which EC2 reports as supporting TPM 2.0.
pub const IMAGE: &str = "ami-0c0ffee0c0ffee000";

/// The instance identity document IMDS serves for an instance of `image` in [`REGION`], in the
/// shape and field order IMDS uses.
pub fn identity_document(image: &str, instance_id: &str) -> String {
    format!(
        r#"{{
  "accountId" : "123456789012",
  "architecture" : "x86_64",
  "availabilityZone" : "{REGION}a",
  "billingProducts" : null,
  "devpayProductCodes" : null,
  "marketplaceProductCodes" : null,
  "imageId" : "{image}",
  "instanceId" : "{instance_id}",
  "instanceType" : "m6a.xlarge",
  "kernelId" : null,
  "pendingTime" : "2026-11-28T10:00:00Z",
  "privateIp" : "10.0.1.7",
  "ramdiskId" : null,
  "region" : "{REGION}",
  "version" : "2017-09-30"
}}"#
    )
}

/// The EC2 stand-in and its CA file.
pub struct NitroSite {
    pub ec2: Ec2Standin,
    ca_file: PathBuf,
}

impl std::fmt::Debug for NitroSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NitroSite")
            .field("ec2", &self.ec2)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl NitroSite {
    /// Starts the stand-in with [`IMAGE`] registered and IMDS serving an instance of it, and
    /// writes its CA to `dir` readable by every uid (ec2-identity runs as its own).
    pub async fn start(dir: &Path) -> anyhow::Result<NitroSite> {
        use std::os::unix::fs::PermissionsExt as _;
        let ec2 = Ec2Standin::start().await?;
        ec2.put_image(REGION, IMAGE, Some("v2.0"));
        ec2.set_identity_document(&identity_document(IMAGE, "i-0c0ffee0c0ffee001"));
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        let ca_file = dir.join("ec2-ca.pem");
        std::fs::write(&ca_file, ec2.ca_pem())?;
        std::fs::set_permissions(&ca_file, std::fs::Permissions::from_mode(0o644))?;
        Ok(NitroSite { ec2, ca_file })
    }

    /// Where ec2-identity finds IMDS and EC2, with `proxy_args` for attest-proxy's cache.
    pub fn endpoints(&self, proxy_args: Vec<String>) -> Ec2Endpoints {
        Ec2Endpoints {
            imds_url: self.ec2.imds_url(),
            ec2_url: self.ec2.ec2_url(),
            ec2_ca_file: self.ca_file.clone(),
            proxy_args,
        }
    }

    /// A node on the swtpm at `tcti` whose identity document comes from the stand-in's IMDS,
    /// as join-client's `--variant aws-nitro-tpm` makes it.
    pub fn node(&self, tcti: &str) -> anyhow::Result<Arc<dyn attestation::Issuer>> {
        use tpm_issuer::aws_nitro_tpm::{AwsNitroTpmIssuer, DEFAULT_IMDS_TIMEOUT, ImdsClient};
        let tpm = tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(tcti))?;
        Ok(Arc::new(AwsNitroTpmIssuer::new(
            tpm,
            Box::new(ImdsClient::new(&self.ec2.imds_url(), DEFAULT_IMDS_TIMEOUT)?),
        )))
    }
}

/// aws-nitro-tpm instances for load, without a NitroTPM: each [`SoftInstances::node`] has a new
/// ECDSA P-256 software AK quoting the harness's boot measurements and an identity document of
/// its own instance (`i-<random prefix><n>`) of [`IMAGE`] in [`REGION`], as InstanceInfo. Such
/// keys are trusted only under `trustAnyAk` (`local-cluster --trust-any-ak`), and every node
/// names the one image, as a cluster's nodes do.
#[derive(Debug)]
pub struct SoftInstances {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl Default for SoftInstances {
    fn default() -> Self {
        SoftInstances {
            prefix: hex::encode(rand::Rng::random::<[u8; 4]>(&mut rand::rng())),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl SoftInstances {
    /// The next instance.
    pub fn node(&self) -> anyhow::Result<soft_issuer::InstanceIssuer> {
        let index = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ak = soft_issuer::SoftIssuer::ecdsa_p256()?.with_pcrs(crate::harness::boot_pcrs())?;
        let document = identity_document(IMAGE, &format!("i-{}{index:09x}", self.prefix));
        Ok(soft_issuer::InstanceIssuer::new(
            ak,
            attestation::Variant::AwsNitroTpm,
            document.into_bytes(),
        ))
    }
}
