//! The certifier through its socket: it certifies a key for a current window with evidence the
//! real qemu-vtpm validator accepts for that key and window, refuses other windows and malformed
//! keys by name without touching the device, and serves only its peer uid. As qemu-tdx, with the
//! real TDX issuer on a simulated configfs-tsm, its evidence passes the real qemu-tdx validator.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use atls::server_evidence::{Window, server_evidence_nonce};
use attestation::{
    AkTrust, IssueError, Issuer, Measurement, Policy, QemuVtpmValidator, Validator, Variant,
};
use certifier::Config;
use pcs_standin::SimulatedIntel;
use plumbing::shutdown::{self, Trigger};
use proto::certifier::CertifyRequest;
use proto::certifier::certifier_client::CertifierClient;
use soft_issuer::SoftIssuer;
use soft_issuer::tdx::{TdFields, TdxMachine, qemu_validator};
use soft_issuer::tsm::FakeConfigfsTsm;
use tdx_issuer::{ConfigfsTdx, QemuTdxIssuer};
use tonic::Code;

/// The device, counting how often it was asked.
#[derive(Debug)]
struct Device {
    tpm: SoftIssuer,
    quotes: AtomicUsize,
}

impl Issuer for Device {
    fn variant(&self) -> Variant {
        self.tpm.variant()
    }
    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        self.quotes.fetch_add(1, Ordering::SeqCst);
        self.tpm.issue(user_data, nonce)
    }
}

fn own_uid(dir: &Path) -> u32 {
    std::fs::metadata(dir).unwrap().uid()
}

async fn start(dir: &Path, peer_uid: u32) -> (Arc<Device>, Trigger, std::path::PathBuf) {
    let device = Arc::new(Device {
        tpm: SoftIssuer::ecdsa_p256()
            .unwrap()
            .with_pcrs([(4, [0x44; 32])])
            .unwrap(),
        quotes: AtomicUsize::new(0),
    });
    let (trigger, socket) = serve(dir, peer_uid, device.clone()).await;
    (device, trigger, socket)
}

/// Serves the certifier on a socket in `dir` with documents from `issuer`.
async fn serve(
    dir: &Path,
    peer_uid: u32,
    issuer: Arc<dyn Issuer>,
) -> (Trigger, std::path::PathBuf) {
    let socket = dir.join("certifier/certifier.sock");
    let config = Config {
        socket: socket.clone(),
        socket_mode: 0o660,
        peer_uid,
        variant: issuer.variant(),
        tcti: String::new(),
        sev_guest_device: std::path::PathBuf::new(),
        azure_quote_url: String::new(),
        event_log: None,
        tsm_report_dir: dir.join("tsm/report"),
        grace_period: Duration::from_secs(1),
        log_format: Default::default(),
    };
    let (trigger, shutdown) = shutdown::channel();
    tokio::spawn(certifier::run(config, issuer, shutdown));
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (trigger, socket)
}

fn request(spki: &[u8], window: Window) -> CertifyRequest {
    CertifyRequest {
        spki: spki.to_vec(),
        not_before: window.not_before,
        not_after: window.not_after,
    }
}

fn server_key() -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    rcgen::PublicKeyData::subject_public_key_info(&key)
}

/// What one certification of a new key for the current rotation window returned, with the
/// client that asked (for more requests).
struct Certified {
    client: CertifierClient<tonic::transport::Channel>,
    spki: Vec<u8>,
    window: Window,
    answer: proto::certifier::CertifyResponse,
}

/// Asks the certifier on `socket` (run as `uid`) to certify a new key for the current window.
async fn certify_current(socket: &Path, uid: u32) -> Certified {
    let mut client = CertifierClient::new(plumbing::unix::channel(socket, uid));
    let spki = server_key();
    let window = Window::for_rotation_at(SystemTime::now());
    let answer = client
        .certify(request(&spki, window))
        .await
        .unwrap()
        .into_inner();
    Certified {
        client,
        spki,
        window,
        answer,
    }
}

impl Certified {
    /// `validator` accepts the document for this key's window, and its user data names the key.
    fn assert_accepted_by(&self, validator: &dyn Validator) {
        let verified = validator
            .validate(
                &self.answer.document,
                &server_evidence_nonce(&self.spki, self.window),
            )
            .unwrap();
        assert_eq!(
            verified.user_data,
            atls::extension::user_data_for_spki(&self.spki).to_vec(),
            "the evidence names the key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certifies_a_current_window_and_refuses_the_rest_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let uid = own_uid(dir.path());
    let (device, _trigger, socket) = start(dir.path(), uid).await;
    let certified = certify_current(&socket, uid).await;
    assert_eq!(certified.answer.variant, "qemu-vtpm");
    let validator = QemuVtpmValidator::new(
        Policy::new(
            [(
                4,
                Measurement {
                    expected: vec![0x44; 32],
                    warn_only: false,
                },
            )]
            .into_iter()
            .collect(),
        )
        .unwrap(),
        AkTrust::keys([device.tpm.ak_public()]),
    );
    certified.assert_accepted_by(&validator);
    assert_eq!(device.quotes.load(Ordering::SeqCst), 1);
    let Certified {
        mut client,
        spki,
        window,
        ..
    } = certified;

    let too_long = Window {
        not_after: window.not_before + 6 * 3600,
        ..window
    };
    let stale = Window {
        not_before: window.not_before - 3600,
        not_after: window.not_after - 3600,
    };
    for (req, code, words) in [
        (
            request(&spki, too_long),
            Code::InvalidArgument,
            "longer than",
        ),
        (
            request(b"not a key", window),
            Code::InvalidArgument,
            "SubjectPublicKeyInfo",
        ),
        (
            request(&spki, stale),
            Code::FailedPrecondition,
            "does not start now",
        ),
    ] {
        let status = client.certify(req).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(words), "{status:?}");
    }
    assert_eq!(
        device.quotes.load(Ordering::SeqCst),
        1,
        "refusals never reach the device"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_only_its_peer_uid() {
    let dir = tempfile::tempdir().unwrap();
    let uid = own_uid(dir.path());
    // The certifier admits only another uid (attest-proxy's); this test runs as someone else.
    let (device, _trigger, socket) = start(dir.path(), uid.wrapping_add(4242)).await;
    let mut client = CertifierClient::new(plumbing::unix::channel(&socket, uid));
    let window = Window::for_rotation_at(SystemTime::now());
    let status = client
        .certify(request(&server_key(), window))
        .await
        .unwrap_err();
    // The certifier's peer check closes the connection unread: a transport failure (its code
    // depends on when hyper notices), never one of the certifier's own answers.
    assert!(
        !matches!(
            status.code(),
            Code::Ok | Code::InvalidArgument | Code::FailedPrecondition
        ),
        "{status:?}"
    );
    assert_eq!(
        device.quotes.load(Ordering::SeqCst),
        0,
        "the device was not asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certifies_as_qemu_tdx_with_a_quote_from_configfs_tsm() {
    let intel = SimulatedIntel::new().unwrap();
    let machine = Arc::new(TdxMachine::new(&intel, Default::default()).unwrap());
    let guest = Arc::new(FakeConfigfsTsm::tdx(machine.clone(), TdFields::default()).unwrap());
    let issuer =
        QemuTdxIssuer::with_source(ConfigfsTdx::with_fs(guest.clone(), guest.root().to_owned()));
    let dir = tempfile::tempdir().unwrap();
    let uid = own_uid(dir.path());
    let (_trigger, socket) = serve(dir.path(), uid, Arc::new(issuer)).await;
    let certified = certify_current(&socket, uid).await;
    assert_eq!(certified.answer.variant, "qemu-tdx");
    let validator = qemu_validator(&intel, &machine).unwrap();
    certified.assert_accepted_by(&validator);
    let Certified {
        mut client,
        spki,
        window,
        answer,
    } = certified;
    // Made for this window: the nonce of another one is refused.
    let later = Window::for_rotation_at(SystemTime::now() + Duration::from_secs(3600));
    let err = validator
        .validate(&answer.document, &server_evidence_nonce(&spki, later))
        .unwrap_err();
    assert!(err.to_string().contains("REPORT_DATA"), "{err}");
    assert_eq!(guest.reports_made(), 1);
    assert_eq!(guest.entries_present().unwrap(), 0);

    // A refused window never reaches the TSM.
    let too_long = Window {
        not_after: window.not_before + 6 * 3600,
        ..window
    };
    let status = client.certify(request(&spki, too_long)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(guest.reports_made(), 1);
}

/// The binary opens the device of its variant at start and says what is missing there, before it
/// serves anyone; a variant it cannot issue is refused by name.
#[test]
fn the_binary_refuses_to_start_without_its_device() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tsm/report");
    let run = |variant: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_certifier"))
            .args(["--peer-uid", "10001", "--variant", variant, "--socket"])
            .arg(dir.path().join("certifier.sock"))
            .arg("--tsm-report-dir")
            .arg(&missing)
            .args(["--tcti", "device:/nonexistent/tpmrm0"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{variant}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("qemu-tdx");
    assert!(
        err.contains(&format!(
            "configfs-tsm is not available at {}",
            missing.display()
        )),
        "{err}"
    );
    for azure in ["azure-sev-snp", "azure-tdx"] {
        let err = run(azure);
        assert!(
            err.contains("opening the TPM at device:/nonexistent/tpmrm0"),
            "{azure}: {err}"
        );
    }
    let err = run("gcp-sev-snp");
    assert!(
        err.contains(
            "issues qemu-vtpm, aws-sev-snp, azure-sev-snp, qemu-tdx and azure-tdx documents only, not gcp-sev-snp"
        ),
        "{err}"
    );
    assert!(!dir.path().join("certifier.sock").exists());
}
