//! aws-nitro-tpm end to end: a node quoting with a real swtpm (standing for its NitroTPM), its
//! identity document read from the EC2 stand-in's IMDSv2 as join-client reads it, joins through
//! attest-proxy, which asks ec2-identity (its own process, holding the stand-in's role
//! credential) whether the image supports TPM 2.0. Refusals come back by name; EC2 down is
//! `Unavailable` until it answers; after the first join of an image no join asks EC2 again.
//!
//! Then nodes that carry AWS's NitroTPM attestation document (from a simulated Nitro PKI, as
//! `nitro-tpm-attest` would return it) join with a config that lists no key and requires the
//! document; each way the document can fail is refused by name.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attestation::{IssueError, Issuer, Variant};
use ec2_standin::{Ec2Standin, Fault};
use soft_issuer::SoftIssuer;
use soft_issuer::nitro::{NitroPki, NitroRequest};
use testsupport::harness::{Ec2Endpoints, Options, System, Uids, join_request, refusal};
use testsupport::nitro::{REGION, identity_document};
use tpm_issuer::aws_nitro_tpm::{
    AwsNitroTpmIssuer, DEFAULT_IMDS_TIMEOUT, ImdsClient, NitroDocumentSource,
};

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

/// Writes `text` to `name` in `dir`, both readable by the services' uids when run as root.
fn readable(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nitro_nodes_join_and_rejoin_and_bad_ones_are_refused_by_name() {
    let ec2 = Ec2Standin::start().await.unwrap();
    ec2.put_image(REGION, TPM_IMAGE, Some("v2.0"));
    ec2.put_image(REGION, SECOND_TPM_IMAGE, Some("v2.0"));
    ec2.put_image(REGION, LEGACY_IMAGE, None);
    ec2.set_identity_document(&identity(TPM_IMAGE));
    let dir = tempfile::tempdir().unwrap();
    let ca = readable(&dir, "ec2-ca.pem", ec2.ca_pem());
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

/// What the simulated NitroTPM's document says, as a test sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AwsDocument {
    /// What AWS signs for this connection.
    Genuine,
    /// Made for another connection.
    OtherNonce,
    /// Signed under another Nitro PKI than the config trusts.
    ForeignRoot,
    /// PCR 4 other than the NitroTPM's.
    OtherPcr4,
    /// Binding another attestation key.
    OtherAk,
}

/// `nitro-tpm-attest` on a simulated instance: documents over the swtpm's SHA-384 PCRs.
struct SimulatedNitro {
    pki: NitroPki,
    foreign: NitroPki,
    pcrs: BTreeMap<u32, Vec<u8>>,
    says: Mutex<AwsDocument>,
}

impl std::fmt::Debug for SimulatedNitro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedNitro").finish_non_exhaustive()
    }
}

/// The node's handle on the simulated instance, which the test keeps too.
#[derive(Debug)]
struct NitroSource(Arc<SimulatedNitro>);

impl NitroDocumentSource for NitroSource {
    fn document(&self, user_data: &[u8], nonce: &[u8]) -> Result<Vec<u8>, String> {
        let nitro = &self.0;
        let says = *nitro.says.lock().unwrap();
        let mut request = NitroRequest {
            pcrs: nitro.pcrs.clone(),
            user_data: Some(user_data.to_vec()),
            nonce: Some(nonce.to_vec()),
            ..NitroRequest::default()
        };
        match says {
            AwsDocument::OtherNonce => request.nonce = Some(vec![0x5a; 32]),
            AwsDocument::OtherPcr4 => {
                request.pcrs.insert(4, vec![0xee; 48]);
            }
            AwsDocument::OtherAk => request.user_data = Some(vec![0xa5; 32]),
            AwsDocument::Genuine | AwsDocument::ForeignRoot => {}
        }
        let pki = if says == AwsDocument::ForeignRoot {
            &nitro.foreign
        } else {
            &nitro.pki
        };
        pki.document(&request).map_err(|e| e.to_string())
    }
}

/// SHA-384 of `value` (the PCR before) followed by `digest`: one TPM extend of a SHA-384 bank.
fn extend_sha384(value: &[u8], digest: &[u8]) -> Vec<u8> {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA384);
    ctx.update(value);
    ctx.update(digest);
    ctx.finish().as_ref().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nitro_nodes_with_aws_documents_join_without_a_listed_key_and_bad_documents_are_refused_by_name()
 {
    let ec2 = Ec2Standin::start().await.unwrap();
    ec2.put_image(REGION, TPM_IMAGE, Some("v2.0"));
    ec2.set_identity_document(&identity(TPM_IMAGE));
    let dir = tempfile::tempdir().unwrap();
    let ca = readable(&dir, "ec2-ca.pem", ec2.ca_pem());

    // The NitroTPM's SHA-384 bank measures the image; the policy is written in it, trusts the
    // simulated Nitro root instead of AWS's, lists no key and requires AWS's document.
    let measured: [(u32, [u8; 48]); 2] = [(4, [0x44; 48]), (9, [0x99; 48])];
    let mut pcrs: BTreeMap<u32, Vec<u8>> = (0..24).map(|i| (i, vec![0u8; 48])).collect();
    for (index, digest) in measured {
        pcrs.insert(index, extend_sha384(&[0u8; 48], &digest));
    }
    let nitro = Arc::new(SimulatedNitro {
        pki: NitroPki::new("aws").unwrap(),
        foreign: NitroPki::new("aws").unwrap(),
        pcrs: pcrs.clone(),
        says: Mutex::new(AwsDocument::Genuine),
    });
    let config = serde_json::json!({
        "measurements": {
            "4": {"expected": hex::encode(&pcrs[&4]), "warnOnly": false},
            "9": {"expected": hex::encode(&pcrs[&9]), "warnOnly": false},
        },
        "requireNitroTpmAttestation": true,
        "nitroTpmRoots": nitro.pki.root_pem(),
    });
    let config = readable(&dir, "attestationConfig", &config.to_string());
    let system = System::start(Options {
        variant: Some(Variant::AwsNitroTpm),
        attestation_config: Some(config),
        ec2: Some(Ec2Endpoints {
            imds_url: ec2.imds_url(),
            ec2_url: ec2.ec2_url(),
            ec2_ca_file: ca,
            proxy_args: Vec::new(),
        }),
        ..Options::default()
    })
    .await
    .unwrap();
    for (index, digest) in measured {
        system
            .swtpm
            .extend_pcr_banks(index, &[("sha384", &digest)])
            .unwrap();
    }
    let tpm = tpm_issuer::TpmIssuer::open(&tpm_issuer::TpmIssuerConfig::new(system.swtpm.tcti()))
        .unwrap();
    let node: Arc<dyn Issuer> = Arc::new(
        AwsNitroTpmIssuer::new(
            tpm,
            Box::new(ImdsClient::new(&ec2.imds_url(), DEFAULT_IMDS_TIMEOUT).unwrap()),
        )
        .with_nitro_document(Box::new(NitroSource(nitro.clone()))),
    );
    let client = system.client(node.clone()).unwrap();
    let disk = "7e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5a";
    system
        .join_and_rejoin(&client, "nitro-aws-1", disk)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", system.logs()));

    for (says, needle) in [
        (
            AwsDocument::OtherNonce,
            "nonce is not this connection's extraData",
        ),
        (
            AwsDocument::ForeignRoot,
            "does not chain to a trusted Nitro root",
        ),
        (
            AwsDocument::OtherPcr4,
            "PCR 4 differs from the quote's SHA-384 PCR 4",
        ),
        (AwsDocument::OtherAk, "does not bind the attestation key"),
    ] {
        *nitro.says.lock().unwrap() = says;
        system
            .assert_refused_by_name(
                &format!("{says:?}"),
                "nitro-aws-bad",
                "7e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5b",
                vec![(node.clone(), needle)],
            )
            .await
            .unwrap();
    }
    // A node without the document (Constellation's): the config requires one.
    let constellation: Arc<dyn Issuer> = Arc::new(StrangerNode(SoftIssuer::ecdsa_p256().unwrap()));
    system
        .assert_refused_by_name(
            "no AWS document",
            "nitro-aws-bad",
            "7e2d3c4b-1f5a-4d7e-9c8b-0f9e8d7c6b5b",
            vec![(constellation, "requires one (requireNitroTpmAttestation)")],
        )
        .await
        .unwrap();
    assert!(
        !system.join_core.log().contains("nitro-aws-bad"),
        "a refused request must not reach join-core"
    );
}
