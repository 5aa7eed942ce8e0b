//! A real TPM 2.0 emulator (swtpm) per test, on free ports.
//!
//! Tests of the issuer and validator talk to a real TPM rather than a mock, so that the quotes,
//! signatures and PCR banks they check are what a TPM actually produces. Each [`Swtpm`] owns its
//! process and state directory; dropping it kills the process and removes the state, and the
//! process ends with the one that started it ([`crate::process::spawn_tied`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Streams, spawn_tied};

/// The swtpm binary (Debian package `swtpm`).
pub const SWTPM_BIN: &str = "swtpm";
/// tpm2-tools' PCR extend command (Debian package `tpm2-tools`).
pub const PCREXTEND_BIN: &str = "tpm2_pcrextend";

const START_ATTEMPTS: usize = 10;
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a swtpm could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum SwtpmError {
    #[error("cannot create the swtpm state directory")]
    StateDir(#[source] io::Error),
    #[error("cannot find free loopback ports")]
    Ports(#[source] io::Error),
    #[error("cannot run {0}")]
    Spawn(&'static str, #[source] io::Error),
    #[error("swtpm did not start after {START_ATTEMPTS} attempts: {0}")]
    NotStarted(String),
    #[error("PCR index {0} is out of range (0..=23)")]
    BadIndex(u32),
    #[error("tpm2_pcrextend failed: {0}")]
    Extend(String),
}

/// A running `swtpm socket --tpm2`, already started up (TPM2_Startup done).
#[derive(Debug)]
pub struct Swtpm {
    child: Child,
    port: u16,
    state: tempfile::TempDir,
}

impl Swtpm {
    /// Starts a fresh TPM with its state in a temporary directory. The server port P and the
    /// control port P+1 (the layout the swtpm TCTI expects) are picked free; if another process
    /// takes one of them between the pick and swtpm's bind, it starts over on new ports.
    pub fn start() -> Result<Swtpm, SwtpmError> {
        let state = tempfile::tempdir().map_err(SwtpmError::StateDir)?;
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port_pair().map_err(SwtpmError::Ports)?;
            let mut command = Command::new(SWTPM_BIN);
            command
                .arg("socket")
                .arg("--tpm2")
                .arg("--tpmstate")
                .arg(format!("dir={}", state.path().display()))
                .arg("--server")
                .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
                .arg("--ctrl")
                .arg(format!(
                    "type=tcp,port={},bindaddr=127.0.0.1",
                    port.saturating_add(1)
                ))
                // Power on and run TPM2_Startup(CLEAR) ourselves, so clients can use it at once.
                .arg("--flags")
                .arg("not-need-init,startup-clear");
            let streams = Streams {
                stdin: Stdio::null(),
                stdout: Stdio::null(),
                stderr: Stdio::piped(),
            };
            let mut child =
                spawn_tied(&command, None, streams).map_err(|e| SwtpmError::Spawn(SWTPM_BIN, e))?;
            match wait_ready(&mut child, port) {
                Ok(()) => {
                    return Ok(Swtpm { child, port, state });
                }
                Err(failure) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_failure = failure;
                }
            }
        }
        Err(SwtpmError::NotStarted(last_failure))
    }

    /// Defines NV index `index` with owner read and write and writes `blob` into it, in chunks the
    /// TPM accepts.
    pub fn write_owner_nv(&self, index: u32, blob: &[u8]) -> anyhow::Result<()> {
        use anyhow::Context as _;
        use tss_esapi::attributes::NvIndexAttributesBuilder;
        use tss_esapi::constants::nv_index_type::NvIndexType;
        use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle};
        use tss_esapi::interface_types::algorithm::HashingAlgorithm;
        use tss_esapi::interface_types::resource_handles::{NvAuth, Provision};
        use tss_esapi::structures::{MaxNvBuffer, NvPublicBuilder};
        let tcti: tss_esapi::tcti_ldr::TctiNameConf = self.tcti().parse().context("swtpm TCTI")?;
        let mut ctx = tss_esapi::Context::new(tcti).context("opening the swtpm")?;
        let attributes = NvIndexAttributesBuilder::new()
            .with_owner_read(true)
            .with_owner_write(true)
            .with_nv_index_type(NvIndexType::Ordinary)
            .build()?;
        let public = NvPublicBuilder::new()
            .with_nv_index(NvIndexTpmHandle::new(index)?)
            .with_index_name_algorithm(HashingAlgorithm::Sha256)
            .with_index_attributes(attributes)
            .with_data_area_size(blob.len())
            .build()?;
        let nv: NvIndexHandle = ctx
            .execute_with_nullauth_session(|ctx| {
                ctx.nv_define_space(Provision::Owner, None, public)
            })
            .with_context(|| format!("defining NV index {index:#010x}"))?;
        for (i, chunk) in blob.chunks(1024).enumerate() {
            let offset = u16::try_from(i * 1024)?;
            let data = MaxNvBuffer::try_from(chunk.to_vec())?;
            ctx.execute_with_nullauth_session(|ctx| ctx.nv_write(NvAuth::Owner, nv, data, offset))
                .with_context(|| format!("writing NV index {index:#010x}"))?;
        }
        Ok(())
    }

    /// The TCTI configuration string for tss-esapi and tpm2-tools.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// The server port (the control port is one above).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Extends SHA-256 PCR `index` with `digest`, as firmware measuring a component would.
    pub fn extend_pcr(&self, index: u32, sha256_digest: &[u8; 32]) -> Result<(), SwtpmError> {
        self.extend_pcr_banks(index, &[("sha256", sha256_digest)])
    }

    /// Extends PCR `index` in several banks at once, e.g. `[("sha256", d1), ("sha384", d2)]`
    /// (bank names as tpm2-tools spells them), as firmware writing a crypto-agile log does.
    pub fn extend_pcr_banks(
        &self,
        index: u32,
        digests: &[(&str, &[u8])],
    ) -> Result<(), SwtpmError> {
        if index > 23 {
            return Err(SwtpmError::BadIndex(index));
        }
        let values: Vec<String> = digests
            .iter()
            .map(|(bank, digest)| {
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                format!("{bank}={hex}")
            })
            .collect();
        let out = Command::new(PCREXTEND_BIN)
            .arg("-T")
            .arg(self.tcti())
            .arg(format!("{index}:{}", values.join(",")))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| SwtpmError::Spawn(PCREXTEND_BIN, e))?;
        if !out.status.success() {
            return Err(SwtpmError::Extend(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(())
    }

    /// The state directory (for tests that inspect or preserve it).
    pub fn state_dir(&self) -> PathBuf {
        self.state.path().to_path_buf()
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port P such that P and P+1 were both free on loopback a moment ago.
fn free_port_pair() -> io::Result<u16> {
    for _ in 0..100 {
        let first = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = first.local_addr()?.port();
        let Some(next) = port.checked_add(1) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, next)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no two adjacent free ports found",
    ))
}

/// Waits until swtpm accepts connections on its server port, or reports why it did not.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return Err(format!("swtpm exited with {status}: {}", stderr.trim()));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            && TcpStream::connect_timeout(
                &SocketAddr::from((Ipv4Addr::LOCALHOST, port.saturating_add(1))),
                Duration::from_millis(200),
            )
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "swtpm did not listen on port {port} within {READY_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_extends_and_stops() {
        let a = Swtpm::start().unwrap();
        let b = Swtpm::start().unwrap();
        assert_ne!(a.port(), b.port());
        assert!(a.tcti().starts_with("swtpm:host=127.0.0.1,port="));
        a.extend_pcr(16, &[7; 32]).unwrap();
        assert!(matches!(
            a.extend_pcr(24, &[0; 32]),
            Err(SwtpmError::BadIndex(24))
        ));
        let dir = a.state_dir();
        drop(a);
        assert!(!dir.exists());
    }
}
