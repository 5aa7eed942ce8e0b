//! Linux's configfs-tsm report interface (`/sys/kernel/config/tsm/report`, Linux 6.7 and
//! later): the kernel's one way for a confidential guest to ask its TSM for attestation
//! evidence, whatever the TSM. The SEV-SNP issuer (`snp-issuer`, provider `sev_guest`) and the
//! TDX issuer (`tdx-issuer`, provider `tdx_guest`) both ask through [`Tsm`]; what the evidence
//! means, and how to check that it answers the request, is theirs.
//!
//! One request: make a directory (the kernel fills it with the attributes its provider shows),
//! read `provider` (must be the one the caller expects), write `inblob` (and `privlevel` where
//! asked), read `outblob` (and `auxblob` where asked), and remove the directory. Another process
//! may write the same entry meanwhile; every write bumps `generation`, so the generation is read
//! first and checked last, and a changed one means the blobs may answer someone else's input:
//! the request starts over in a new entry, [`ATTEMPTS`] times at most.
//!
//! The file operations go through [`TsmFs`] so that tests can stand in for the kernel (a test
//! double serves the same attribute semantics over a temporary directory, delegating the file
//! operations themselves to [`RealFs`]); production uses [`RealFs`], plain `std::fs` calls.

use std::io;
use std::path::{Path, PathBuf};

/// Where the kernel serves report entries.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/tsm/report";
/// How many entries a request tries before it gives up on a racing writer.
pub const ATTEMPTS: usize = 3;
/// The most `inblob` takes (`TSM_INBLOB_MAX`).
pub const INBLOB_MAX: usize = 64;

/// Why the interface gave no blobs.
#[derive(Debug, thiserror::Error)]
pub enum TsmError {
    #[error(
        "configfs-tsm is not available at {0} (no such directory: configfs not mounted, or a kernel before 6.7)"
    )]
    NoConfigfs(PathBuf),
    #[error("cannot {action} {path}")]
    Attribute {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("configfs-tsm's provider is {found:?}, not {expected:?}")]
    WrongProvider {
        expected: &'static str,
        found: String,
    },
    #[error("configfs-tsm's generation is {0:?}, not a number")]
    BadGeneration(String),
    #[error(
        "another writer kept changing the configfs-tsm report entry ({attempts} attempts; last: {last})"
    )]
    Raced { attempts: usize, last: String },
}

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

/// What one request writes and reads.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The TSM's input (REPORT_DATA for SNP and TDX), at most [`INBLOB_MAX`] bytes.
    pub inblob: &'a [u8],
    /// Written to `privlevel` when set (SNP's VMPL); TDX shows no such attribute.
    pub privlevel: Option<u32>,
    /// Read `auxblob` too (SNP's certificate table); its absence is not an error.
    pub auxblob: bool,
}

/// What the kernel answered one request with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blobs {
    pub outblob: Vec<u8>,
    /// `None` where it was not asked for or the provider shows none.
    pub auxblob: Option<Vec<u8>>,
}

/// The report interface under a root, for one provider.
#[derive(Debug)]
pub struct Tsm<F: TsmFs = RealFs> {
    fs: F,
    root: PathBuf,
    provider: &'static str,
}

impl Tsm<RealFs> {
    /// The kernel's interface under `root` (normally [`DEFAULT_ROOT`]), which must be served by
    /// `provider`.
    pub fn new(root: impl Into<PathBuf>, provider: &'static str) -> Self {
        Tsm::with_fs(RealFs, root, provider)
    }
}

/// One step of a request failed, or another writer got in between.
enum Attempt {
    Raced(String),
    Failed(TsmError),
}

impl From<TsmError> for Attempt {
    fn from(e: TsmError) -> Self {
        Attempt::Failed(e)
    }
}

/// The name of a new entry: the program's, so an operator can tell who left one behind, and
/// random, so concurrent requests never share one.
fn entry_name() -> String {
    let program = std::env::args_os()
        .next()
        .and_then(|arg0| {
            Path::new(&arg0)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .filter(|n| !n.is_empty() && !n.starts_with('.'))
        .unwrap_or_else(|| "tsm".to_owned());
    format!(
        "{program}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

impl<F: TsmFs> Tsm<F> {
    /// The interface under `root`, through `fs`, which must be served by `provider`.
    pub fn with_fs(fs: F, root: impl Into<PathBuf>, provider: &'static str) -> Self {
        Tsm {
            fs,
            root: root.into(),
            provider,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The interface, for messages.
    pub fn describe(&self) -> String {
        format!("configfs-tsm at {}", self.root.display())
    }

    fn read_attr(&self, entry: &Path, name: &'static str) -> Result<Vec<u8>, Attempt> {
        let path = entry.join(name);
        self.fs.read(&path).map_err(|e| {
            // EBUSY: a write landed while the kernel was producing the blob.
            if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) {
                Attempt::Raced(format!("reading {name} answered EBUSY"))
            } else {
                Attempt::Failed(TsmError::Attribute {
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
            Attempt::Failed(TsmError::Attribute {
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
            .map_err(|_| Attempt::Failed(TsmError::BadGeneration(text.trim().to_owned())))
    }

    fn attempt(&self, entry: &Path, request: &Request<'_>) -> Result<Blobs, Attempt> {
        let mut expected = self.generation(entry)?;
        let provider = self.read_attr(entry, "provider")?;
        let provider = String::from_utf8_lossy(&provider).trim().to_owned();
        if provider != self.provider {
            return Err(TsmError::WrongProvider {
                expected: self.provider,
                found: provider,
            }
            .into());
        }
        self.write_attr(entry, "inblob", request.inblob)?;
        expected += 1;
        if let Some(level) = request.privlevel {
            self.write_attr(entry, "privlevel", level.to_string().as_bytes())?;
            expected += 1;
        }
        let outblob = self.read_attr(entry, "outblob")?;
        let auxblob = if request.auxblob {
            match self.read_attr(entry, "auxblob") {
                Ok(aux) => Some(aux),
                // The attribute exists only where the provider emits one.
                Err(Attempt::Failed(TsmError::Attribute { source, .. }))
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let now = self.generation(entry)?;
        if now != expected {
            return Err(Attempt::Raced(format!(
                "generation is {now}, expected {expected}: another writer used the entry"
            )));
        }
        Ok(Blobs { outblob, auxblob })
    }

    /// Asks the TSM once for `request`, in a fresh entry, starting over in another entry when a
    /// racing writer changed the first. The blobs are the kernel's; whether they answer the
    /// request is for the caller to check.
    pub fn request(&self, request: &Request<'_>) -> Result<Blobs, TsmError> {
        let mut last_race = String::new();
        for _ in 0..ATTEMPTS {
            let entry = self.root.join(entry_name());
            self.fs.create_dir(&entry).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    TsmError::NoConfigfs(self.root.clone())
                } else {
                    TsmError::Attribute {
                        path: entry.clone(),
                        action: "create",
                        source: e,
                    }
                }
            })?;
            let result = self.attempt(&entry, request);
            if let Err(e) = self.fs.remove_dir(&entry) {
                // The entry holds no secret; a leftover only costs the kernel a little memory.
                tracing::warn!(entry = %entry.display(), error = %e, "cannot remove the configfs-tsm report entry");
            }
            match result {
                Ok(blobs) => return Ok(blobs),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Raced(why)) => {
                    tracing::debug!(entry = %entry.display(), %why, "configfs-tsm request raced; retrying");
                    last_race = why;
                }
            }
        }
        Err(TsmError::Raced {
            attempts: ATTEMPTS,
            last: last_race,
        })
    }
}
