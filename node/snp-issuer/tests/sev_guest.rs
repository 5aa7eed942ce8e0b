//! The /dev/sev-guest report source over a simulated driver (no SEV guest device exists here):
//! requests are marshalled as the kernel's structures, responses decoded from the firmware's
//! MSG_REPORT_RSP, the certificate buffer grown when the host asks for more, and each failure
//! mapped to its own error.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use attestation::snp::{Product, Tcb};
use snp_issuer::certtable::{CertTable, Guid};
use snp_issuer::sev_guest::{
    IoctlOutcome, REQUEST_LEN, RESPONSE_LEN, SevGuest, SevGuestIoctl, VMM_ERR_BUSY,
    VMM_ERR_INVALID_LEN,
};
use snp_issuer::{ReportSource, SnpSourceError, aws_instance_info};
use soft_issuer::snp::{ReportFields, SimulatedAmd, SimulatedSigner};

const TCB: Tcb = Tcb {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};
const EIO: i32 = 5;

/// What the simulated driver does with each call.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Sign a report; the certificate table needs `certs_needed` bytes of buffer.
    Report { certs_needed: usize },
    /// Fail with `errno` and `exitinfo2`.
    Fail { errno: i32, exitinfo2: u64 },
    /// Answer with a MSG_REPORT_RSP of this status and size.
    Response { status: u32, size: u32 },
}

#[derive(Debug)]
struct Driver {
    signer: SimulatedSigner,
    table: Vec<u8>,
    behaviour: Behaviour,
    /// Every request seen: (request bytes, certificate buffer length offered).
    seen: Mutex<Vec<([u8; REQUEST_LEN], Option<usize>)>>,
}

impl Driver {
    fn new(amd: &SimulatedAmd, behaviour: Behaviour) -> Driver {
        let signer = amd.vlek("CN=cc-us-east-1.amazonaws.com", TCB).unwrap();
        let table =
            CertTable::encode(&[(Guid::VLEK, signer.cert_der()), (Guid::ASK, amd.asvk_der())]);
        Driver {
            signer,
            table,
            behaviour,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn respond(&self, request: &[u8; REQUEST_LEN], response: &mut [u8; RESPONSE_LEN]) {
        let mut report_data = [0u8; 64];
        report_data.copy_from_slice(&request[..64]);
        let vmpl = u32::from_le_bytes(request[64..68].try_into().unwrap());
        let report = self
            .signer
            .report(&ReportFields {
                report_data,
                vmpl,
                ..ReportFields::default()
            })
            .unwrap();
        let (status, size) = match self.behaviour {
            Behaviour::Response { status, size } => (status, size),
            _ => (0, report.len() as u32),
        };
        response[..4].copy_from_slice(&status.to_le_bytes());
        response[4..8].copy_from_slice(&size.to_le_bytes());
        response[32..32 + report.len()].copy_from_slice(&report);
    }
}

impl SevGuestIoctl for Driver {
    fn get_report(
        &self,
        request: &[u8; REQUEST_LEN],
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        self.seen.lock().unwrap().push((*request, None));
        if let Behaviour::Fail { errno, exitinfo2 } = self.behaviour {
            return IoctlOutcome { errno, exitinfo2 };
        }
        self.respond(request, response);
        IoctlOutcome::default()
    }

    fn get_ext_report(
        &self,
        request: &[u8; REQUEST_LEN],
        certs: &mut [u8],
        certs_len: &mut u32,
        response: &mut [u8; RESPONSE_LEN],
    ) -> IoctlOutcome {
        self.seen
            .lock()
            .unwrap()
            .push((*request, Some(*certs_len as usize)));
        assert_eq!(*certs_len as usize, certs.len());
        match self.behaviour {
            Behaviour::Fail { errno, exitinfo2 } => IoctlOutcome { errno, exitinfo2 },
            Behaviour::Report { certs_needed } if certs.len() < certs_needed => {
                // The kernel's answer to a short buffer: EIO, the length needed, and the
                // hypervisor's INVALID_LEN in exitinfo2's high half.
                *certs_len = certs_needed as u32;
                IoctlOutcome {
                    errno: EIO,
                    exitinfo2: u64::from(VMM_ERR_INVALID_LEN) << 32,
                }
            }
            _ => {
                certs[..self.table.len()].copy_from_slice(&self.table);
                certs[self.table.len()..].fill(0);
                self.respond(request, response);
                IoctlOutcome::default()
            }
        }
    }
}

#[test]
fn an_extended_report_carries_the_vlek_and_binds_the_key() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let driver = Driver::new(&amd, Behaviour::Report { certs_needed: 4096 });
    let source = SevGuest::with_ioctl(driver, "/dev/sev-guest");
    let info = aws_instance_info(&source, b"spki").unwrap();
    let parsed = attestation::snp::InstanceInfo::parse(&info).unwrap();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, b"spki");
    assert_eq!(parsed.report.report_data().as_slice(), digest.as_ref());
    assert_eq!(parsed.signer.unwrap().common_name(), "SEV-VLEK");
    assert_eq!(parsed.intermediate.unwrap().common_name(), "SEV-VLEK-Milan");
}

#[test]
fn a_host_needing_a_larger_certificate_buffer_gets_one() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let driver = Driver::new(
        &amd,
        Behaviour::Report {
            certs_needed: 5 * 4096,
        },
    );
    let source = SevGuest::with_ioctl(driver, "/dev/sev-guest");
    let raw = source.get_report(&[3; 64]).unwrap();
    assert_eq!(raw.certs.as_ref().unwrap().len(), 5 * 4096);
    let table = CertTable::parse(raw.certs.as_ref().unwrap()).unwrap();
    assert!(table.get(Guid::VLEK).is_some());
}

#[test]
fn a_host_asking_for_too_much_is_refused() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let driver = Driver::new(
        &amd,
        Behaviour::Report {
            certs_needed: 1 << 20,
        },
    );
    let err = SevGuest::with_ioctl(driver, "/dev/sev-guest")
        .get_report(&[3; 64])
        .unwrap_err();
    assert!(
        matches!(
            err,
            SnpSourceError::CertBuffer {
                offered: 16384,
                needed: 1_048_576
            }
        ),
        "{err}"
    );
}

#[test]
fn plain_reports_send_the_same_request_without_certificates() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let driver = Driver::new(&amd, Behaviour::Report { certs_needed: 0 });
    let source = SevGuest::with_ioctl(driver, "/dev/sev-guest").without_certificates();
    let raw = source.get_report(&[9; 64]).unwrap();
    assert!(raw.certs.is_none());
    assert_eq!(&raw.report[0x50..0x90], &[9; 64]);
}

#[test]
fn requests_are_user_data_vmpl_zero_and_reserved_zeros_with_page_sized_buffers() {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    let driver = Driver::new(
        &amd,
        Behaviour::Report {
            certs_needed: 5 * 4096,
        },
    );
    SevGuest::with_ioctl(&driver, "/dev/sev-guest")
        .get_report(&[0x5a; 64])
        .unwrap();
    let seen = driver.seen.lock().unwrap();
    // The first offer was too small; the second is what the host asked for.
    assert_eq!(seen.len(), 2);
    for (request, _) in seen.iter() {
        assert_eq!(&request[..64], &[0x5a; 64]);
        assert_eq!(&request[64..], &[0; 32]);
    }
    assert_eq!(seen[0].1, Some(4 * 4096));
    assert_eq!(seen[1].1, Some(5 * 4096));
}

fn failure(behaviour: Behaviour) -> SnpSourceError {
    let amd = SimulatedAmd::new(Product::Milan).unwrap();
    SevGuest::with_ioctl(Driver::new(&amd, behaviour), "/dev/sev-guest")
        .get_report(&[1; 64])
        .unwrap_err()
}

#[test]
fn each_failure_is_named() {
    // The firmware's status in exitinfo2's low half.
    let err = failure(Behaviour::Fail {
        errno: EIO,
        exitinfo2: 0x16,
    });
    assert!(
        matches!(
            err,
            SnpSourceError::Firmware {
                status: 0x16,
                name: "INVALID_PARAM"
            }
        ),
        "{err}"
    );
    // The hypervisor's in the high half.
    let err = failure(Behaviour::Fail {
        errno: EIO,
        exitinfo2: u64::from(VMM_ERR_BUSY) << 32,
    });
    assert!(matches!(err, SnpSourceError::HostBusy), "{err}");
    let err = failure(Behaviour::Fail {
        errno: EIO,
        exitinfo2: 0xffff_ffff_0000_0000,
    });
    assert!(
        matches!(err, SnpSourceError::Host { code: 0xffff_ffff }),
        "{err}"
    );
    // Neither: the kernel's own errno.
    let err = failure(Behaviour::Fail {
        errno: 22,
        exitinfo2: 0,
    });
    match err {
        SnpSourceError::Device { path, source } => {
            assert_eq!(path, std::path::Path::new("/dev/sev-guest"));
            assert_eq!(source.raw_os_error(), Some(22));
        }
        other => panic!("{other}"),
    }
    // The report response's own status, and a size beyond the response.
    let err = failure(Behaviour::Response {
        status: 0x27,
        size: 0x4A0,
    });
    assert!(
        matches!(
            err,
            SnpSourceError::ReportStatus {
                status: 0x27,
                name: "INVALID_KEY"
            }
        ),
        "{err}"
    );
    let err = failure(Behaviour::Response {
        status: 0,
        size: 5000,
    });
    assert!(matches!(err, SnpSourceError::ReportSize(5000)), "{err}");
    let err = failure(Behaviour::Response {
        status: 0,
        size: 1000,
    });
    assert!(matches!(err, SnpSourceError::ReportLength(1000)), "{err}");
}

#[test]
fn a_missing_device_is_named() {
    let err = SevGuest::open("/nonexistent/sev-guest").unwrap_err();
    assert!(
        matches!(&err, SnpSourceError::Device { path, .. } if path.ends_with("sev-guest")),
        "{err}"
    );
}
