//! aws-nitro-tpm end to end: a node quoting with a real swtpm (standing for its NitroTPM), its
//! identity document read from the EC2 stand-in's IMDSv2 as join-client reads it, joins through
//! attest-proxy, which asks ec2-identity (its own process, holding the stand-in's role
//! credential) whether the image supports TPM 2.0. Refusals come back by name; EC2 down is
//! `Unavailable` until it answers; after the first join of an image no join asks EC2 again.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use attestation::{IssueError, Issuer, Variant};
use ec2_standin::{Ec2Standin, Fault};
use soft_issuer::SoftIssuer;
use testsupport::harness::{Ec2Endpoints, Options, System, Uids, join_request, refusal};
use testsupport::nitro::{REGION, identity_document};
use tpm_issuer::aws_nitro_tpm::{AwsNitroTpmIssuer, DEFAULT_IMDS_TIMEOUT, ImdsClient};

const TPM_IMAGE: &str = "ami-0a1b2c3d4e5f60718";
const SECOND_TPM_IMAGE: &str = "ami-0b1b2c3d4e5f60718";
const LEGACY_IMAGE: &str = "ami-0c1b2c3d4e5f60718";

fn identity(image: &str) -> String {
    identity_document(image, "i-0fedcba9876543210")
}

/// A node whose AK is a software key the config does not list, with a well-formed identity
/// document: everything but the key is right.
#[derive(Debug)]
struct StrangerNode(SoftIssuer);

impl Issuer for StrangerNode {
    fn variant(&self) -> Variant {
        Variant::AwsNitroTpm
    }

    fn issue(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, IssueError> {
        let info = tpm_issuer::aws_nitro_tpm::instance_info(identity(TPM_IMAGE).as_bytes())
            .map_err(|e| IssueError::from_error(Variant::AwsNitroTpm, e))?;
        self.0
            .issue_document_with_instance_info(user_data, nonce, Some(&info))
            .map_err(|e| IssueError::from_error(Variant::AwsNitroTpm, e))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nitro_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let ec2 = Ec2Standin::start().await.unwrap();
    ec2.put_image(REGION, TPM_IMAGE, Some("v2.0"));
    ec2.put_image(REGION, SECOND_TPM_IMAGE, Some("v2.0"));
    ec2.put_image(REGION, LEGACY_IMAGE, None);
    ec2.set_identity_document(&identity(TPM_IMAGE));
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ec2-ca.pem");
    std::fs::write(&ca, ec2.ca_pem()).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // The harness writes qemu-vtpm's config shape, which is aws-nitro-tpm's too: the swtpm's
    // boot measurements and its AK in trustedAkDigests.
    let system = System::start(Options {
        variant: Some(Variant::AwsNitroTpm),
        ec2: Some(Ec2Endpoints {
            imds_url: ec2.imds_url(),
            ec2_url: ec2.ec2_url(),
            ec2_ca_file: ca,
            proxy_args: vec![
                "--ec2-identity-backoff".into(),
                "300ms".into(),
                "--ec2-identity-wait".into(),
                "4s".into(),
            ],
        }),
        ..Options::default()
    })
    .await
    .unwrap();
    // As root the harness runs every process as the pod's uids: ec2-identity under its own,
    // which attest-proxy checks on the socket, and the socket checks attest-proxy's.
    if system.uids.distinct() {
        let ec2_identity = system.ec2_identity.as_ref().unwrap();
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", ec2_identity.id())).unwrap();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap();
        assert_eq!(uid, Uids::POD.ec2_identity.to_string());
    }
    let tpm = tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(system.swtpm.tcti()))
        .unwrap();
    let node: Arc<dyn Issuer> = Arc::new(AwsNitroTpmIssuer::new(
        tpm,
        Box::new(ImdsClient::new(&ec2.imds_url(), DEFAULT_IMDS_TIMEOUT).unwrap()),
    ));
    let client = system.client(node.clone()).unwrap();

    // Join and rejoin; EC2 is asked once for the image.
    let disk = "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5a";
    system
        .join_and_rejoin(&client, "nitro-1", disk)
        .await
        .unwrap();
    let asked = ec2.describe_requests();
    assert_eq!(asked, 1, "{}", system.logs());
    // Warm: more joins of the same image cost no EC2 call.
    system
        .join_and_rejoin(&client, "nitro-2", "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5b")
        .await
        .unwrap();
    assert_eq!(ec2.describe_requests(), asked);
    assert!(
        system.proxy.log().contains("supports TPM v2.0"),
        "the audit line names EC2's verdict"
    );

    // An image without TPM support, and a key the config does not list: refused by name.
    ec2.set_identity_document(&identity(LEGACY_IMAGE));
    let refused = refusal(
        client
            .join(join_request("nitro-bad", "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5c").unwrap())
            .await,
    );
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains(&format!(
            "image {LEGACY_IMAGE} in {REGION} does not support NitroTPM"
        )),
        "{}",
        refused.message()
    );
    ec2.set_identity_document(&identity(TPM_IMAGE));
    let stranger: Arc<dyn Issuer> = Arc::new(StrangerNode(SoftIssuer::ecdsa_p256().unwrap()));
    system
        .assert_refused_by_name(
            "untrusted AK",
            "nitro-bad",
            "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5c",
            vec![(
                stranger,
                "is not in the attestation config's trustedAkDigests",
            )],
        )
        .await
        .unwrap();

    // EC2 throttles: a node of an image not cached yet is told to retry, and joins once EC2
    // answers again.
    ec2.set_identity_document(&identity(SECOND_TPM_IMAGE));
    ec2.set_fault(Fault::Throttled);
    let unavailable = refusal(
        client
            .join(join_request("nitro-3", "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5d").unwrap())
            .await,
    );
    assert_eq!(
        unavailable.code(),
        tonic::Code::Unavailable,
        "{unavailable:?}"
    );
    assert!(
        unavailable.message().contains("RequestLimitExceeded"),
        "{}",
        unavailable.message()
    );
    ec2.set_fault(Fault::None);
    // Past the backoff, the next join asks EC2 again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    system
        .join_and_rejoin(&client, "nitro-3", "6e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5d")
        .await
        .unwrap();
    assert!(
        !system.join_core.log().contains("nitro-bad"),
        "a refused request must not reach join-core"
    );
}
