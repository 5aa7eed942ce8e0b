//! SEV-SNP reports from Linux's configfs-tsm (`/sys/kernel/config/tsm/report`, Linux 6.7 and
//! later), through the `configfs-tsm` crate: the provider must be `sev_guest`, the inblob is
//! REPORT_DATA, the privlevel the VMPL, the outblob the report and the auxblob the host's
//! certificate table. The report is checked to be one, over the REPORT_DATA and at the VMPL
//! asked for.

use std::path::{Path, PathBuf};

pub use configfs_tsm::{ATTEMPTS, DEFAULT_ROOT, RealFs, TsmFs};
use configfs_tsm::{Request, Tsm, TsmError};

use crate::{REPORT_DATA_LEN, RawReport, ReportSource, SnpSourceError};

/// The `provider` of AMD SEV-SNP guests.
pub const SEV_GUEST_PROVIDER: &str = "sev_guest";
/// The length of an SNP attestation report.
pub const REPORT_LEN: usize = 0x4A0;

impl From<TsmError> for SnpSourceError {
    fn from(e: TsmError) -> Self {
        match e {
            TsmError::NoConfigfs(root) => SnpSourceError::NoConfigfs(root),
            TsmError::Attribute {
                path,
                action,
                source,
            } => SnpSourceError::Attribute {
                path,
                action,
                source,
            },
            TsmError::WrongProvider { found, .. } => SnpSourceError::WrongProvider(found),
            TsmError::BadGeneration(text) => SnpSourceError::BadGeneration(text),
            TsmError::Raced { attempts, last } => SnpSourceError::Raced { attempts, last },
        }
    }
}

/// Reports from configfs-tsm.
#[derive(Debug)]
pub struct ConfigfsTsm<F: TsmFs = RealFs> {
    tsm: Tsm<F>,
    privlevel: Option<u32>,
}

impl ConfigfsTsm<RealFs> {
    /// The kernel's interface under `root` (normally [`DEFAULT_ROOT`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ConfigfsTsm::with_fs(RealFs, root)
    }
}

impl<F: TsmFs> ConfigfsTsm<F> {
    /// The interface under `root`, through `fs`. Reports are asked for at VMPL 0.
    pub fn with_fs(fs: F, root: impl Into<PathBuf>) -> Self {
        ConfigfsTsm {
            tsm: Tsm::with_fs(fs, root, SEV_GUEST_PROVIDER),
            privlevel: Some(0),
        }
    }

    /// Asks for reports at `privlevel` (the VMPL), or leaves the kernel's default with `None`.
    pub fn privlevel(mut self, privlevel: Option<u32>) -> Self {
        self.privlevel = privlevel;
        self
    }

    pub fn root(&self) -> &Path {
        self.tsm.root()
    }
}

impl<F: TsmFs> ReportSource for ConfigfsTsm<F> {
    fn get_report(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<RawReport, SnpSourceError> {
        let blobs = self.tsm.request(&Request {
            inblob: report_data,
            privlevel: self.privlevel,
            auxblob: true,
        })?;
        let raw = RawReport {
            report: blobs.outblob,
            certs: blobs.auxblob,
        };
        raw.check(report_data, self.privlevel)?;
        Ok(raw)
    }

    fn describe(&self) -> String {
        self.tsm.describe()
    }
}
