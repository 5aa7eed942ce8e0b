//! The certifier's configuration: flags with environment fallbacks.

use std::path::PathBuf;
use std::time::Duration;

use attestation::Variant;
use plumbing::telemetry::LogFormat;

/// How to run the certifier. Tests build this directly.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "certifier",
    version,
    about = "Certifies attest-proxy's aTLS server key with the node's attestation device"
)]
pub struct Config {
    /// Unix socket to serve the Certifier API on, in a directory only the certifier can write.
    #[arg(
        long,
        env = "CERTIFIER_SOCKET",
        default_value = "/run/joinservice/certifier/certifier.sock"
    )]
    pub socket: PathBuf,
    /// Permission bits of the socket file, octal; the peer uid check is the real fence.
    #[arg(long, env = "CERTIFIER_SOCKET_MODE", default_value = "660", value_parser = plumbing::unix::parse_mode)]
    pub socket_mode: u32,
    /// The only uid allowed to connect (attest-proxy's): whoever can ask can impersonate the
    /// service.
    #[arg(long, env = "CERTIFIER_PEER_UID")]
    pub peer_uid: u32,
    /// The variant to attest as: `qemu-vtpm` (the TPM alone), `aws-sev-snp` (the TPM, and an
    /// SEV-SNP report vouching for its key), `azure-sev-snp` or `azure-tdx` (the vTPM with the
    /// key of Azure's paravisor, and the hardware report of its HCL report) or `qemu-tdx` (the
    /// TD's quote alone, through configfs-tsm), the documents join-client issues.
    #[arg(long, env = "CERTIFIER_VARIANT", default_value = "qemu-vtpm")]
    pub variant: Variant,
    /// The TPM, as a TSS TCTI string.
    #[arg(long, env = "CERTIFIER_TCTI", default_value = "device:/dev/tpmrm0")]
    pub tcti: String,
    /// aws-sev-snp and qemu-tdx: Linux's configfs-tsm report directory; for aws-sev-snp, when it
    /// does not exist, the SEV guest device is used instead.
    #[arg(long, env = "CERTIFIER_TSM_REPORT_DIR", default_value = snp_issuer::configfs::DEFAULT_ROOT)]
    pub tsm_report_dir: PathBuf,
    /// aws-sev-snp: the SEV guest device, for kernels without configfs-tsm.
    #[arg(long, env = "CERTIFIER_SEV_GUEST_DEVICE", default_value = snp_issuer::sev_guest::DEFAULT_DEVICE)]
    pub sev_guest_device: PathBuf,
    /// azure-tdx: Azure's quote service, which turns the HCL's TD report into a TD quote.
    #[arg(long, env = "CERTIFIER_AZURE_QUOTE_URL", default_value = tpm_issuer::azure::tdx::IMDS_QUOTE_URL)]
    pub azure_quote_url: String,
    /// The firmware event log to send with the quote.
    #[arg(long, env = "CERTIFIER_EVENT_LOG")]
    pub event_log: Option<PathBuf>,
    /// How long a call in flight may finish after SIGTERM.
    #[arg(long, env = "CERTIFIER_GRACE_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,
    /// Log format.
    #[arg(long, env = "CERTIFIER_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_are_the_pod_socket_and_the_tpm_device() {
        let c = Config::try_parse_from(["certifier", "--peer-uid", "10001"]).unwrap();
        assert_eq!(c.peer_uid, 10001);
        assert_eq!(
            c.socket,
            PathBuf::from("/run/joinservice/certifier/certifier.sock")
        );
        assert_eq!(c.tcti, "device:/dev/tpmrm0");
        assert_eq!(c.variant, Variant::QemuVtpm);
        assert_eq!(
            c.tsm_report_dir,
            PathBuf::from(snp_issuer::configfs::DEFAULT_ROOT)
        );
        assert_eq!(
            c.sev_guest_device,
            PathBuf::from(snp_issuer::sev_guest::DEFAULT_DEVICE)
        );
        assert_eq!(c.azure_quote_url, "http://169.254.169.254/acc/tdquote");
        assert!(
            Config::try_parse_from(["certifier"]).is_err(),
            "the peer uid has no default"
        );
    }
}
