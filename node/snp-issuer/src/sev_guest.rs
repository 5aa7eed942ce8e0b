//! `/dev/sev-guest`: the SEV guest driver's ioctls, for kernels without configfs-tsm.
//!
//! Layouts from `include/uapi/linux/sev-guest.h`: a request `snp_report_req {u8 user_data[64];
//! u32 vmpl; u8 rsvd[28]}`; `SNP_GET_EXT_REPORT` adds `{u64 certs_address; u32 certs_len}`; the
//! driver writes the firmware's `MSG_REPORT_RSP` into a 4000-byte `snp_report_resp`: `u32
//! status; u32 report_size; u8 reserved[24]; report`. Every call goes through
//! `snp_guest_request_ioctl {u8 msg_version; u64 req_data; u64 resp_data; u64 exitinfo2}`, whose
//! `exitinfo2` carries the firmware's error in its low 32 bits and the hypervisor's in its high
//! 32 bits.
//!
//! The marshalling and the error mapping are plain Rust over byte arrays ([`SevGuestIoctl`]);
//! only [`DevSevGuest`] turns them into the kernel's structures and calls `ioctl(2)`.

use std::path::{Path, PathBuf};

use crate::{REPORT_DATA_LEN, RawReport, ReportSource, SnpSourceError};

/// Where the driver lives.
pub const DEFAULT_DEVICE: &str = "/dev/sev-guest";
/// `sizeof(struct snp_report_req)`.
pub const REQUEST_LEN: usize = 96;
/// `sizeof(struct snp_report_resp)`.
pub const RESPONSE_LEN: usize = 4000;
/// The report's offset in `MSG_REPORT_RSP`.
const REPORT_OFFSET: usize = 32;
/// The first certificate buffer offered: four pages, the kernel's limit before Linux 6.x raised
/// it; a host needing more says so and the call is repeated once with what it asked for.
const FIRST_CERTS_LEN: usize = 4 * 4096;
/// The largest certificate buffer a host may ask for.
const MAX_CERTS_LEN: usize = 64 * 1024;
/// `SNP_GUEST_VMM_ERR_INVALID_LEN`: the certificate buffer is too small.
pub const VMM_ERR_INVALID_LEN: u32 = 1;
/// `SNP_GUEST_VMM_ERR_BUSY`: the host is throttling guest requests.
pub const VMM_ERR_BUSY: u32 = 2;

/// The result of one ioctl: `errno` (0 when it succeeded) and `exitinfo2` as the driver left
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoctlOutcome {
    pub errno: i32,
    pub exitinfo2: u64,
}

/// The two guest requests, over marshalled bytes.
pub trait SevGuestIoctl: Send + Sync + std::fmt::Debug {
    /// `SNP_GET_REPORT` with `request` (an `snp_report_req`); the driver fills `response`.
    fn get_report(
        &self,
        request: &[u8; REQUEST_LEN],
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome;

    /// `SNP_GET_EXT_REPORT`: also offers `certs` for the certificate table. `certs_len` goes in
    /// as `certs.len()` and comes back as the driver set it (the length it needs, when the
    /// buffer was too small).
    fn get_ext_report(
        &self,
        request: &[u8; REQUEST_LEN],
        certs: &mut [u8],
        certs_len: &mut u32,
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome;
}

impl<T: SevGuestIoctl + ?Sized> SevGuestIoctl for &T {
    fn get_report(
        &self,
        request: &[u8; REQUEST_LEN],
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        (**self).get_report(request, response)
    }

    fn get_ext_report(
        &self,
        request: &[u8; REQUEST_LEN],
        certs: &mut [u8],
        certs_len: &mut u32,
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        (**self).get_ext_report(request, certs, certs_len, response)
    }
}

/// Encodes `snp_report_req`.
pub fn encode_request(report_data: &[u8; REPORT_DATA_LEN], vmpl: u32) -> [u8; REQUEST_LEN] {
    let mut request = [0u8; REQUEST_LEN];
    request[..REPORT_DATA_LEN].copy_from_slice(report_data);
    request[REPORT_DATA_LEN..REPORT_DATA_LEN + 4].copy_from_slice(&vmpl.to_le_bytes());
    request
}

/// The name of a firmware status (SEV-SNP firmware ABI, "Status Codes"), for messages.
pub fn firmware_status_name(status: u32) -> &'static str {
    match status {
        0x04 => "INVALID_LEN",
        0x07 => "POLICY_FAILURE",
        0x15 => "UNSUPPORTED",
        0x16 => "INVALID_PARAM",
        0x17 => "RESOURCE_LIMIT",
        0x27 => "INVALID_KEY",
        _ => "unknown status",
    }
}

/// Maps a failed ioctl to its specific error: the firmware's, the host's, or the kernel's.
fn ioctl_error(device: &Path, outcome: IoctlOutcome) -> SnpSourceError {
    let firmware = (outcome.exitinfo2 & 0xffff_ffff) as u32;
    let vmm = (outcome.exitinfo2 >> 32) as u32;
    if vmm == VMM_ERR_BUSY {
        return SnpSourceError::HostBusy;
    }
    if vmm != 0 {
        return SnpSourceError::Host { code: vmm };
    }
    if firmware != 0 {
        return SnpSourceError::Firmware {
            status: firmware,
            name: firmware_status_name(firmware),
        };
    }
    SnpSourceError::Device {
        path: device.to_owned(),
        source: std::io::Error::from_raw_os_error(outcome.errno),
    }
}

/// Decodes `MSG_REPORT_RSP`: the report, or the firmware's status.
pub fn decode_response(response: &[u8; RESPONSE_LEN]) -> Result<Vec<u8>, SnpSourceError> {
    let word = |at: usize| {
        u32::from_le_bytes([
            response[at],
            response[at + 1],
            response[at + 2],
            response[at + 3],
        ])
    };
    let status = word(0);
    if status != 0 {
        return Err(SnpSourceError::ReportStatus {
            status,
            name: firmware_status_name(status),
        });
    }
    let size = word(4) as usize;
    response
        .get(REPORT_OFFSET..REPORT_OFFSET.saturating_add(size))
        .map(<[u8]>::to_vec)
        .ok_or(SnpSourceError::ReportSize(size))
}

/// Reports from the SEV guest driver, through `I`.
#[derive(Debug)]
pub struct SevGuest<I: SevGuestIoctl> {
    ioctl: I,
    device: PathBuf,
    vmpl: u32,
    extended: bool,
}

impl<I: SevGuestIoctl> SevGuest<I> {
    /// Extended reports (with the host's certificate table) at VMPL 0 through `ioctl`;
    /// `device` names it in errors.
    pub fn with_ioctl(ioctl: I, device: impl Into<PathBuf>) -> Self {
        SevGuest {
            ioctl,
            device: device.into(),
            vmpl: 0,
            extended: true,
        }
    }

    /// Asks for plain reports (`SNP_GET_REPORT`, no certificates) instead.
    pub fn without_certificates(mut self) -> Self {
        self.extended = false;
        self
    }

    fn ext_report(&self, request: &[u8; REQUEST_LEN]) -> Result<RawReport, SnpSourceError> {
        let mut certs = vec![0u8; FIRST_CERTS_LEN];
        for _ in 0..2 {
            let mut response = [0u8; RESPONSE_LEN];
            let mut certs_len = u32::try_from(certs.len()).unwrap_or(u32::MAX);
            let outcome =
                self.ioctl
                    .get_ext_report(request, &mut certs, &mut certs_len, &mut response);
            if outcome.errno == 0 {
                let report = decode_response(&response)?;
                certs.truncate(certs_len as usize);
                return Ok(RawReport {
                    report,
                    certs: Some(certs),
                });
            }
            if (outcome.exitinfo2 >> 32) as u32 != VMM_ERR_INVALID_LEN {
                return Err(ioctl_error(&self.device, outcome));
            }
            let needed = certs_len as usize;
            if needed <= certs.len() || needed > MAX_CERTS_LEN {
                return Err(SnpSourceError::CertBuffer {
                    offered: certs.len(),
                    needed,
                });
            }
            certs = vec![0u8; needed.next_multiple_of(4096)];
        }
        Err(SnpSourceError::CertBuffer {
            offered: certs.len(),
            needed: certs.len(),
        })
    }
}

impl<I: SevGuestIoctl> ReportSource for SevGuest<I> {
    fn get_report(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<RawReport, SnpSourceError> {
        let request = encode_request(report_data, self.vmpl);
        let raw = if self.extended {
            self.ext_report(&request)?
        } else {
            let mut response = [0u8; RESPONSE_LEN];
            let outcome = self.ioctl.get_report(&request, &mut response);
            if outcome.errno != 0 {
                return Err(ioctl_error(&self.device, outcome));
            }
            RawReport {
                report: decode_response(&response)?,
                certs: None,
            }
        };
        raw.check(report_data, Some(self.vmpl))?;
        Ok(raw)
    }

    fn describe(&self) -> String {
        format!("{} (SEV guest driver)", self.device.display())
    }
}

impl SevGuest<DevSevGuest> {
    /// The driver at `device` (normally [`DEFAULT_DEVICE`]).
    pub fn open(device: impl Into<PathBuf>) -> Result<Self, SnpSourceError> {
        let device = device.into();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)
            .map_err(|source| SnpSourceError::Device {
                path: device.clone(),
                source,
            })?;
        Ok(SevGuest::with_ioctl(DevSevGuest { file }, device))
    }
}

/// `struct snp_guest_request_ioctl`.
#[repr(C)]
struct GuestRequest {
    msg_version: u8,
    req_data: u64,
    resp_data: u64,
    exitinfo2: u64,
}

/// `struct snp_ext_report_req`.
#[repr(C)]
struct ExtReportRequest {
    data: [u8; REQUEST_LEN],
    certs_address: u64,
    certs_len: u32,
}

/// `SNP_GET_REPORT`: `_IOWR('S', 0x0, struct snp_guest_request_ioctl)`.
pub const SNP_GET_REPORT: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<GuestRequest>(b'S', 0x0);
/// `SNP_GET_EXT_REPORT`: `_IOWR('S', 0x2, struct snp_guest_request_ioctl)`.
pub const SNP_GET_EXT_REPORT: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<GuestRequest>(b'S', 0x2);

/// The open driver.
#[derive(Debug)]
pub struct DevSevGuest {
    file: std::fs::File,
}

impl DevSevGuest {
    #[allow(unsafe_code)]
    fn call<const OPCODE: rustix::ioctl::Opcode>(&self, request: &mut GuestRequest) -> i32 {
        // SAFETY: OPCODE is one of the two guest-request opcodes above, both of which take a
        // `struct snp_guest_request_ioctl`, whose layout `GuestRequest` reproduces. Its
        // `req_data` and `resp_data` point at buffers of the sizes the driver reads and writes
        // (`snp_report_req` or `snp_ext_report_req`, and `snp_report_resp`), borrowed mutably
        // by the caller for the whole call; an extended request's `certs_address` points at a
        // buffer of `certs_len` bytes, likewise borrowed. The driver writes nothing else.
        let result = unsafe {
            rustix::ioctl::ioctl(
                &self.file,
                rustix::ioctl::Updater::<OPCODE, GuestRequest>::new(request),
            )
        };
        match result {
            Ok(()) => 0,
            Err(errno) => errno.raw_os_error(),
        }
    }
}

impl SevGuestIoctl for DevSevGuest {
    fn get_report(
        &self,
        request: &[u8; REQUEST_LEN],
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        let mut request = *request;
        let mut call = GuestRequest {
            msg_version: 1,
            req_data: request.as_mut_ptr() as u64,
            resp_data: response.as_mut_ptr() as u64,
            exitinfo2: 0,
        };
        let errno = self.call::<SNP_GET_REPORT>(&mut call);
        IoctlOutcome {
            errno,
            exitinfo2: call.exitinfo2,
        }
    }

    fn get_ext_report(
        &self,
        request: &[u8; REQUEST_LEN],
        certs: &mut [u8],
        certs_len: &mut u32,
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        let mut ext = ExtReportRequest {
            data: *request,
            certs_address: certs.as_mut_ptr() as u64,
            certs_len: u32::try_from(certs.len()).unwrap_or(0),
        };
        let mut call = GuestRequest {
            msg_version: 1,
            req_data: (&raw mut ext) as u64,
            resp_data: response.as_mut_ptr() as u64,
            exitinfo2: 0,
        };
        let errno = self.call::<SNP_GET_EXT_REPORT>(&mut call);
        *certs_len = ext.certs_len;
        IoctlOutcome {
            errno,
            exitinfo2: call.exitinfo2,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn structures_and_opcodes_are_the_kernels() {
        assert_eq!(std::mem::size_of::<GuestRequest>(), 32);
        assert_eq!(std::mem::size_of::<ExtReportRequest>(), 112);
        assert_eq!(std::mem::offset_of!(ExtReportRequest, certs_address), 96);
        // _IOWR('S', n, 32 bytes): dir 3 << 30 | size 32 << 16 | 'S' << 8 | n.
        assert_eq!(SNP_GET_REPORT as u64, 0xC020_5300);
        assert_eq!(SNP_GET_EXT_REPORT as u64, 0xC020_5302);
    }

    #[test]
    fn a_request_is_user_data_then_vmpl_then_zeros() {
        let request = encode_request(&[0xab; 64], 2);
        assert_eq!(&request[..64], &[0xab; 64]);
        assert_eq!(&request[64..68], &[2, 0, 0, 0]);
        assert_eq!(&request[68..], &[0; 28]);
    }
}
