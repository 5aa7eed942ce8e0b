//! Linux's configfs-tsm report interface (`/sys/kernel/config/tsm/report`, Linux 6.7 and
//! later): the kernel's one way for a confidential guest to ask its TSM for a report.
//!
//! One request: make a directory (the kernel fills it with attributes), read `provider` (must be
//! `sev_guest`), write the 64 bytes of REPORT_DATA to `inblob` and the VMPL to `privlevel`, read
//! `outblob` (the report) and `auxblob` (the certificate table), and remove the directory.
//! Another process may write the same entry meanwhile; every write bumps `generation`, so the
//! generation is read first and checked last, and a changed one means the blobs may answer
//! someone else's input: the request starts over in a new entry.
//!
//! The file operations go through [`TsmFs`] so that tests can stand in for the kernel (a test
//! double serves the same attribute semantics over a temporary directory, delegating the file
//! operations themselves to [`RealFs`]); production uses [`RealFs`], plain `std::fs` calls.

use std::io;
use std::path::{Path, PathBuf};

use crate::{REPORT_DATA_LEN, RawReport, ReportSource, SnpSourceError};

/// Where the kernel serves report entries.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/tsm/report";
/// The `provider` of AMD SEV-SNP guests.
pub const SEV_GUEST_PROVIDER: &str = "sev_guest";
/// How many entries a request tries before it gives up on a racing writer.
pub const ATTEMPTS: usize = 3;
/// The length of an SNP attestation report.
pub const REPORT_LEN: usize = 0x4A0;

/// The file operations configfs-tsm is driven by.
pub trait TsmFs: Send + Sync + std::fmt::Debug {
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// One write of `data` to an existing attribute (configfs commits a binary attribute when
    /// the file is closed).
    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()>;
}

impl<T: TsmFs + ?Sized> TsmFs for &T {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        (**self).create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        (**self).remove_dir(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        (**self).read(path)
    }

    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        (**self).write(path, data)
    }
}

impl<T: TsmFs + ?Sized> TsmFs for std::sync::Arc<T> {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        (**self).create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        (**self).remove_dir(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        (**self).read(path)
    }

    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        (**self).write(path, data)
    }
}

/// The kernel's configfs, through `std::fs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

impl TsmFs for RealFs {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        use std::io::Write as _;
        // Never create: an attribute that is not there is the kernel's answer.
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.write_all(data)
    }
}

/// Reports from configfs-tsm.
#[derive(Debug)]
pub struct ConfigfsTsm<F: TsmFs = RealFs> {
    fs: F,
    root: PathBuf,
    privlevel: Option<u32>,
}

impl ConfigfsTsm<RealFs> {
    /// The kernel's interface under `root` (normally [`DEFAULT_ROOT`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ConfigfsTsm::with_fs(RealFs, root)
    }
}

/// One step of a request failed, or another writer got in between.
enum Attempt {
    Raced(String),
    Failed(SnpSourceError),
}

impl From<SnpSourceError> for Attempt {
    fn from(e: SnpSourceError) -> Self {
        Attempt::Failed(e)
    }
}

impl<F: TsmFs> ConfigfsTsm<F> {
    /// The interface under `root`, through `fs`. Reports are asked for at VMPL 0.
    pub fn with_fs(fs: F, root: impl Into<PathBuf>) -> Self {
        ConfigfsTsm {
            fs,
            root: root.into(),
            privlevel: Some(0),
        }
    }

    /// Asks for reports at `privlevel` (the VMPL), or leaves the kernel's default with `None`.
    pub fn privlevel(mut self, privlevel: Option<u32>) -> Self {
        self.privlevel = privlevel;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read_attr(&self, entry: &Path, name: &'static str) -> Result<Vec<u8>, Attempt> {
        let path = entry.join(name);
        self.fs.read(&path).map_err(|e| {
            // EBUSY: a write landed while the kernel was producing the blob.
            if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) {
                Attempt::Raced(format!("reading {name} answered EBUSY"))
            } else {
                Attempt::Failed(SnpSourceError::Attribute {
                    path,
                    action: "read",
                    source: e,
                })
            }
        })
    }

    fn write_attr(&self, entry: &Path, name: &'static str, data: &[u8]) -> Result<(), Attempt> {
        let path = entry.join(name);
        self.fs.write(&path, data).map_err(|e| {
            Attempt::Failed(SnpSourceError::Attribute {
                path,
                action: "write",
                source: e,
            })
        })
    }

    fn generation(&self, entry: &Path) -> Result<u64, Attempt> {
        let raw = self.read_attr(entry, "generation")?;
        let text = String::from_utf8_lossy(&raw);
        text.trim()
            .parse()
            .map_err(|_| Attempt::Failed(SnpSourceError::BadGeneration(text.trim().to_owned())))
    }

    fn attempt(
        &self,
        entry: &Path,
        report_data: &[u8; REPORT_DATA_LEN],
    ) -> Result<RawReport, Attempt> {
        let mut expected = self.generation(entry)?;
        let provider = self.read_attr(entry, "provider")?;
        let provider = String::from_utf8_lossy(&provider).trim().to_owned();
        if provider != SEV_GUEST_PROVIDER {
            return Err(SnpSourceError::WrongProvider(provider).into());
        }
        self.write_attr(entry, "inblob", report_data)?;
        expected += 1;
        if let Some(level) = self.privlevel {
            self.write_attr(entry, "privlevel", level.to_string().as_bytes())?;
            expected += 1;
        }
        let report = self.read_attr(entry, "outblob")?;
        let certs = match self.read_attr(entry, "auxblob") {
            Ok(certs) => Some(certs),
            // The attribute exists only where the provider emits one.
            Err(Attempt::Failed(SnpSourceError::Attribute { source, .. }))
                if source.kind() == io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let now = self.generation(entry)?;
        if now != expected {
            return Err(Attempt::Raced(format!(
                "generation is {now}, expected {expected}: another writer used the entry"
            )));
        }
        let raw = RawReport { report, certs };
        raw.check(report_data, self.privlevel)?;
        Ok(raw)
    }
}

impl<F: TsmFs> ReportSource for ConfigfsTsm<F> {
    fn get_report(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<RawReport, SnpSourceError> {
        let mut last_race = String::new();
        for _ in 0..ATTEMPTS {
            let entry = self.root.join(format!(
                "join-client-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            ));
            self.fs.create_dir(&entry).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    SnpSourceError::NoConfigfs(self.root.clone())
                } else {
                    SnpSourceError::Attribute {
                        path: entry.clone(),
                        action: "create",
                        source: e,
                    }
                }
            })?;
            let result = self.attempt(&entry, report_data);
            if let Err(e) = self.fs.remove_dir(&entry) {
                // The entry holds no secret; a leftover only costs the kernel a little memory.
                tracing::warn!(entry = %entry.display(), error = %e, "cannot remove the configfs-tsm report entry");
            }
            match result {
                Ok(raw) => return Ok(raw),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Raced(why)) => {
                    tracing::debug!(entry = %entry.display(), %why, "configfs-tsm request raced; retrying");
                    last_race = why;
                }
            }
        }
        Err(SnpSourceError::Raced {
            attempts: ATTEMPTS,
            last: last_race,
        })
    }

    fn describe(&self) -> String {
        format!("configfs-tsm at {}", self.root.display())
    }
}
