//! A simulated configfs-tsm: the kernel's report interface over a temporary directory, with
//! simulated SNP firmware or a simulated TDX machine behind it, for the node's SNP and TDX
//! issuers to run against where no confidential guest kernel is.
//!
//! It implements `configfs_tsm::TsmFs` with the kernel's semantics (Linux
//! `drivers/virt/coco/tsm.c`, `drivers/virt/coco/tdx-guest`, `Documentation/ABI/testing/
//! configfs-tsm`): `mkdir` makes an entry holding the attributes its provider shows. An SEV-SNP
//! guest's (`sev_guest`) are `provider`, `generation`, `privlevel_floor`, `inblob`, `privlevel`,
//! `outblob` and `auxblob`; `inblob` takes at most 64 bytes (zero-padded) and `privlevel` a
//! number from the floor to 3. A TDX guest's (`tdx_guest`) are only `provider`, `generation`,
//! `inblob` and `outblob`, and its quote needs exactly 64 bytes of `inblob` (`EINVAL` at the
//! read otherwise). Each write bumps `generation`; `inblob` is write-only and the blobs
//! read-only; an attribute the provider does not show is not there (`ENOENT`); reading
//! `outblob` or `auxblob` asks the firmware for a report (TDX: a quote, made by the host's
//! quoting enclave) over the current inputs once per generation. Every file operation itself is
//! done on real files by `configfs_tsm::RealFs`, so the production path is exercised too; only
//! the kernel's side effects are simulated.
//!
//! Faults: another provider, a writer racing on the same entry, and whatever the firmware
//! closure returns (a short report, a certificate table without a VLEK, a quote over other
//! data, something that is no quote).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use configfs_tsm::{RealFs, TsmFs};
use snp_issuer::certtable::{CertTable, Guid};

use crate::snp::{ReportFields, SimulatedAmd, SimulatedSigner};
use crate::tdx::{TdFields, TdxMachine};

/// The firmware behind the interface: a report (the outblob) and the host's certificate table
/// (the auxblob; `None`: the provider shows none) for REPORT_DATA at a VMPL.
pub type Firmware =
    Box<dyn Fn(&[u8; 64], u32) -> io::Result<(Vec<u8>, Option<Vec<u8>>)> + Send + Sync>;

/// The TDX module and the host's quoting enclave behind a TDX guest: a quote (the outblob)
/// over REPORT_DATA.
pub type TdxFirmware = Box<dyn Fn(&[u8; 64]) -> io::Result<Vec<u8>> + Send + Sync>;

const SEV_ATTRIBUTES: &[&str] = &[
    "provider",
    "generation",
    "privlevel_floor",
    "inblob",
    "privlevel",
    "outblob",
    "auxblob",
];

/// `tdx_report_attr_visible` and `tdx_report_bin_attr_visible`.
const TDX_ATTRIBUTES: &[&str] = &["provider", "generation", "inblob", "outblob"];

/// Which guest driver serves the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guest {
    Sev,
    Tdx,
}

#[derive(Default)]
struct Entry {
    generation: u64,
    inblob: Vec<u8>,
    privlevel: u32,
    /// The generation the blobs on disk answer.
    blobs_for: Option<u64>,
}

/// The simulated kernel interface; [`FakeConfigfsTsm::root`] is its `tsm/report` directory.
pub struct FakeConfigfsTsm {
    dir: tempfile::TempDir,
    guest: Guest,
    provider: String,
    privlevel_floor: u32,
    firmware: Firmware,
    racing_writes: AtomicUsize,
    requests: AtomicUsize,
    entries: Mutex<HashMap<PathBuf, Entry>>,
}

impl std::fmt::Debug for FakeConfigfsTsm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeConfigfsTsm")
            .field("root", &self.dir.path())
            .field("guest", &self.guest)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

impl FakeConfigfsTsm {
    /// An SEV-SNP guest's interface whose firmware is `firmware`.
    pub fn new(firmware: Firmware) -> io::Result<Self> {
        Ok(FakeConfigfsTsm {
            dir: tempfile::tempdir()?,
            guest: Guest::Sev,
            provider: "sev_guest".to_owned(),
            privlevel_floor: 0,
            firmware,
            racing_writes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            entries: Mutex::new(HashMap::new()),
        })
    }

    /// An AWS guest: reports signed by `vlek` with `fields` (REPORT_DATA and VMPL as asked),
    /// and a certificate table of the VLEK, the ASVK and the ARK of `amd`.
    pub fn aws(
        amd: &SimulatedAmd,
        vlek: SimulatedSigner,
        fields: ReportFields,
    ) -> io::Result<Self> {
        let table = CertTable::encode(&[
            (Guid::VLEK, vlek.cert_der()),
            (Guid::ASK, amd.asvk_der()),
            (Guid::ARK, amd.ark_der()),
        ]);
        Self::new(Box::new(move |report_data, vmpl| {
            let fields = ReportFields {
                report_data: *report_data,
                vmpl,
                ..fields.clone()
            };
            let report = vlek.report(&fields).map_err(io::Error::other)?;
            Ok((report, Some(table.clone())))
        }))
    }

    /// A TDX guest's interface (provider `tdx_guest`) whose quotes `firmware` makes.
    pub fn new_tdx(firmware: TdxFirmware) -> io::Result<Self> {
        let mut tsm = Self::new(Box::new(move |report_data, _| {
            Ok((firmware(report_data)?, None))
        }))?;
        tsm.guest = Guest::Tdx;
        tsm.provider = "tdx_guest".to_owned();
        Ok(tsm)
    }

    /// A TD on `machine` with `td`'s report body: each quote is the machine's, over the
    /// REPORT_DATA written to `inblob`.
    pub fn tdx(machine: Arc<TdxMachine>, td: TdFields) -> io::Result<Self> {
        Self::new_tdx(Box::new(move |report_data| {
            machine.quote(&td, report_data).map_err(io::Error::other)
        }))
    }

    /// Another TSM (`tdx_guest` on an SEV-SNP guest's interface, say): only the name changes.
    pub fn with_provider(mut self, provider: &str) -> Self {
        self.provider = provider.to_owned();
        self
    }

    /// The lowest privilege level the guest may ask for (an SVSM runs the guest above VMPL 0).
    pub fn with_privlevel_floor(mut self, floor: u32) -> Self {
        self.privlevel_floor = floor;
        self
    }

    /// Another process writes `inblob` of the entry being read just before each of the next
    /// `times` reads of `outblob` or `auxblob`.
    pub fn with_racing_writer(self, times: usize) -> Self {
        self.racing_writes.store(times, Ordering::SeqCst);
        self
    }

    /// The `tsm/report` directory.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// How many reports the firmware made.
    pub fn reports_made(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The entries present now (each request should remove its own).
    pub fn entries_present(&self) -> io::Result<usize> {
        Ok(std::fs::read_dir(self.dir.path())?.count())
    }

    fn split<'p>(&self, path: &'p Path) -> io::Result<(PathBuf, &'p str)> {
        let entry = path
            .parent()
            .ok_or_else(|| errno(rustix::io::Errno::NOENT))?;
        let attr = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| errno(rustix::io::Errno::NOENT))?;
        Ok((entry.to_owned(), attr))
    }

    fn attributes(&self) -> &'static [&'static str] {
        match self.guest {
            Guest::Sev => SEV_ATTRIBUTES,
            Guest::Tdx => TDX_ATTRIBUTES,
        }
    }

    fn set_generation(entry_dir: &Path, entry: &mut Entry) -> io::Result<()> {
        entry.generation += 1;
        std::fs::write(
            entry_dir.join("generation"),
            format!("{}\n", entry.generation),
        )
    }

    fn produce(&self, entry_dir: &Path, entry: &mut Entry) -> io::Result<()> {
        if self.racing_writes.load(Ordering::SeqCst) > 0 {
            self.racing_writes.fetch_sub(1, Ordering::SeqCst);
            entry.inblob = vec![0xEE; 64];
            Self::set_generation(entry_dir, entry)?;
        }
        if entry.blobs_for == Some(entry.generation) {
            return Ok(());
        }
        let mut report_data = [0u8; 64];
        // sev-guest zero-pads a short inblob; tdx-guest refuses one (`tdx_report_new`).
        if self.guest == Guest::Tdx && entry.inblob.len() != report_data.len() {
            return Err(errno(rustix::io::Errno::INVAL));
        }
        report_data[..entry.inblob.len()].copy_from_slice(&entry.inblob);
        self.requests.fetch_add(1, Ordering::SeqCst);
        let (outblob, auxblob) = (self.firmware)(&report_data, entry.privlevel)?;
        std::fs::write(entry_dir.join("outblob"), outblob)?;
        match auxblob {
            Some(aux) => std::fs::write(entry_dir.join("auxblob"), aux)?,
            None => match std::fs::remove_file(entry_dir.join("auxblob")) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
        entry.blobs_for = Some(entry.generation);
        Ok(())
    }
}

impl TsmFs for FakeConfigfsTsm {
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        // configfs makes entries only directly under tsm/report.
        if path.parent() != Some(self.dir.path()) {
            return Err(errno(rustix::io::Errno::NOENT));
        }
        RealFs.create_dir(path)?;
        for &attr in self.attributes() {
            let initial = match attr {
                "provider" => format!("{}\n", self.provider),
                "generation" => "0\n".to_owned(),
                "privlevel_floor" => format!("{}\n", self.privlevel_floor),
                "privlevel" => format!("{}\n", self.privlevel_floor),
                _ => String::new(),
            };
            std::fs::write(path.join(attr), initial)?;
        }
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        entries.insert(
            path.to_owned(),
            Entry {
                privlevel: self.privlevel_floor,
                ..Entry::default()
            },
        );
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        if entries.remove(path).is_none() {
            return Err(errno(rustix::io::Errno::NOENT));
        }
        // configfs drops an entry's attributes with it; a plain directory needs them gone first.
        for attr in self.attributes() {
            match std::fs::remove_file(path.join(attr)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        RealFs.remove_dir(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let (entry_dir, attr) = self.split(path)?;
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        let entry = entries
            .get_mut(&entry_dir)
            .ok_or_else(|| errno(rustix::io::Errno::NOENT))?;
        if !self.attributes().contains(&attr) {
            return Err(errno(rustix::io::Errno::NOENT));
        }
        match attr {
            "inblob" => return Err(errno(rustix::io::Errno::ACCESS)),
            "outblob" | "auxblob" => self.produce(&entry_dir, entry)?,
            _ => {}
        }
        RealFs.read(path)
    }

    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let (entry_dir, attr) = self.split(path)?;
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        let entry = entries
            .get_mut(&entry_dir)
            .ok_or_else(|| errno(rustix::io::Errno::NOENT))?;
        if !self.attributes().contains(&attr) {
            return Err(errno(rustix::io::Errno::NOENT));
        }
        match attr {
            "inblob" => {
                if data.len() > 64 {
                    return Err(errno(rustix::io::Errno::INVAL));
                }
                entry.inblob = data.to_vec();
            }
            "privlevel" => {
                let level: u32 = std::str::from_utf8(data)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| errno(rustix::io::Errno::INVAL))?;
                if level > 3 || level < self.privlevel_floor {
                    return Err(errno(rustix::io::Errno::INVAL));
                }
                entry.privlevel = level;
            }
            _ => return Err(errno(rustix::io::Errno::ACCESS)),
        }
        // Real files: clear the attribute, then the production write (which never creates or
        // truncates) puts the bytes in.
        std::fs::write(path, b"")?;
        RealFs.write(path, data)?;
        Self::set_generation(&entry_dir, entry)
    }
}
