//! ec2-identity against the EC2 stand-in, over its real Unix socket: the image's tpmSupport
//! from a SigV4-signed DescribeImages, the role credential fetched once through IMDSv2 and
//! renewed when EC2 refuses it, and each way EC2 fails mapped to the status attest-proxy acts
//! on.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use ec2_identity::Config;
use ec2_standin::{Ec2Standin, Fault};
use proto::ec2identity::GetImageTpmSupportRequest;
use proto::ec2identity::ec2_identity_client::Ec2IdentityClient;
use tonic::Code;

const REGION: &str = "eu-central-1";
const TPM_IMAGE: &str = "ami-0a1b2c3d4e5f60718";
const LEGACY_IMAGE: &str = "ami-12345678";

fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn request(region: &str, image: &str) -> GetImageTpmSupportRequest {
    GetImageTpmSupportRequest {
        region: region.to_owned(),
        image_id: image.to_owned(),
    }
}

struct Running {
    standin: Ec2Standin,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _trigger: plumbing::shutdown::Trigger,
}

impl Running {
    fn client(&self) -> Ec2IdentityClient<tonic::transport::Channel> {
        Ec2IdentityClient::new(plumbing::unix::channel(&self.socket, own_uid()))
    }
}

async fn start(peer_uid: u32) -> Running {
    let standin = Ec2Standin::start().await.unwrap();
    standin.put_image(REGION, TPM_IMAGE, Some("v2.0"));
    standin.put_image(REGION, LEGACY_IMAGE, None);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, standin.ca_pem()).unwrap();
    let socket = dir.path().join("ec2-identity.sock");
    let config = Config {
        socket: socket.clone(),
        socket_mode: 0o600,
        peer_uid,
        imds_url: standin.imds_url(),
        ec2_url: standin.ec2_url(),
        ec2_ca_file: Some(ca),
        request_timeout: Duration::from_millis(800),
        admin_listen: None,
        grace_period: Duration::from_secs(1),
        log_format: Default::default(),
    };
    let (trigger, shutdown) = plumbing::shutdown::channel();
    tokio::spawn(ec2_identity::run(config, shutdown));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "ec2-identity never bound its socket"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Running {
        standin,
        socket,
        _dir: dir,
        _trigger: trigger,
    }
}

#[tokio::test]
async fn tpm_support_is_read_with_one_credential_renewed_when_refused() {
    let r = start(own_uid()).await;
    let mut client = r.client();
    for _ in 0..3 {
        let answer = client
            .get_image_tpm_support(request(REGION, TPM_IMAGE))
            .await
            .unwrap();
        assert_eq!(answer.into_inner().tpm_support.as_deref(), Some("v2.0"));
    }
    let legacy = client
        .get_image_tpm_support(request(REGION, LEGACY_IMAGE))
        .await
        .unwrap();
    assert_eq!(legacy.into_inner().tpm_support, None);
    assert_eq!(
        r.standin.credentials_issued(),
        1,
        "the credential is reused"
    );
    assert_eq!(r.standin.describe_requests(), 4);

    // A rotated credential: EC2 answers AuthFailure, the credential is fetched once more.
    r.standin.revoke_credentials();
    let answer = client
        .get_image_tpm_support(request(REGION, TPM_IMAGE))
        .await
        .unwrap();
    assert_eq!(answer.into_inner().tpm_support.as_deref(), Some("v2.0"));
    assert_eq!(r.standin.credentials_issued(), 2);
}

#[tokio::test]
async fn each_failure_maps_to_the_status_attest_proxy_acts_on() {
    let r = start(own_uid()).await;
    let mut client = r.client();

    // Unknown in this region (it exists in another one only): NOT_FOUND, by name.
    let status = client
        .get_image_tpm_support(request("us-east-1", TPM_IMAGE))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("InvalidAMIID.NotFound"),
        "{status:?}"
    );
    assert!(status.message().contains(TPM_IMAGE), "{status:?}");

    for (region, image) in [("eu-central-1.evil", TPM_IMAGE), (REGION, "ami-1&Action=x")] {
        let status = client
            .get_image_tpm_support(request(region, image))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }

    for (fault, needle) in [
        (
            Fault::Unauthorized,
            "HTTP 403 Forbidden UnauthorizedOperation",
        ),
        (
            Fault::Throttled,
            "HTTP 503 Service Unavailable RequestLimitExceeded",
        ),
        (
            Fault::ServerError,
            "HTTP 503 Service Unavailable Unavailable",
        ),
        (Fault::Hang, "no answer within"),
    ] {
        r.standin.set_fault(fault);
        let status = client
            .get_image_tpm_support(request(REGION, TPM_IMAGE))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{fault:?}: {status:?}");
        assert!(status.message().contains(needle), "{fault:?}: {status:?}");
        // EC2's message names the role and account: it stays in this process's log.
        assert!(!status.message().contains("arn:aws"), "{status:?}");
    }
    r.standin.set_fault(Fault::None);
    client
        .get_image_tpm_support(request(REGION, TPM_IMAGE))
        .await
        .unwrap();
}

#[tokio::test]
async fn another_uid_is_refused_at_the_socket() {
    let r = start(own_uid() + 1).await;
    let status = r
        .client()
        .get_image_tpm_support(request(REGION, TPM_IMAGE))
        .await
        .unwrap_err();
    assert_eq!(r.standin.describe_requests(), 0, "{status:?}");
}
