//! gce-identity against the GCE stand-in, over its real Unix socket: the key the API vouches
//! for and the instance's confidential computing, the token fetched once and renewed when
//! refused, and each way Google fails mapped to the status attest-proxy acts on.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use gce_identity::Config;
use gce_standin::{Confidential, Fault, GceStandin, Instance};
use proto::gceidentity::gce_identity_client::GceIdentityClient;
use proto::gceidentity::{GetConfidentialComputeRequest, GetSigningKeyRequest};
use tonic::Code;

const SIGNING: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04, 0x6b, 0x17, 0xd1, 0xf2, 0xe1,
    0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6, 0xe5, 0x63, 0xa4, 0x40, 0xf2, 0x77, 0x03, 0x7d, 0x81, 0x2d,
    0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98, 0xc2, 0x96, 0x4f, 0xe3, 0x42, 0xe2, 0xfe,
    0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a, 0x7c, 0x0f, 0x9e, 0x16, 0x2b, 0xce, 0x33, 0x57, 0x6b,
    0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5,
];

fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn instance() -> Instance {
    Instance {
        project: "my-project-1".into(),
        zone: "us-central1-a".into(),
        name: "worker-1".into(),
    }
}

fn request(i: &Instance) -> GetSigningKeyRequest {
    GetSigningKeyRequest {
        project: i.project.clone(),
        zone: i.zone.clone(),
        instance: i.name.clone(),
    }
}

struct Running {
    standin: GceStandin,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _trigger: plumbing::shutdown::Trigger,
}

impl Running {
    fn client(&self) -> GceIdentityClient<tonic::transport::Channel> {
        GceIdentityClient::new(plumbing::unix::channel(&self.socket, own_uid()))
    }
}

async fn start(peer_uid: u32) -> Running {
    let standin = GceStandin::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, standin.ca_pem()).unwrap();
    let socket = dir.path().join("gce-identity.sock");
    let config = Config {
        socket: socket.clone(),
        socket_mode: 0o600,
        peer_uid,
        metadata_url: standin.metadata_url(),
        compute_url: standin.compute_url(),
        compute_ca_file: Some(ca),
        request_timeout: Duration::from_millis(800),
        admin_listen: None,
        grace_period: Duration::from_secs(1),
        log_format: Default::default(),
    };
    let (trigger, shutdown) = plumbing::shutdown::channel();
    tokio::spawn(gce_identity::run(config, shutdown));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "gce-identity never bound its socket"
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
async fn the_signing_key_gce_vouches_for_is_returned_with_one_token() {
    let r = start(own_uid()).await;
    // The endorsement key differs: only signingKey is the AK.
    r.standin
        .put_instance(instance(), SIGNING, Some(&[0x30, 0x03, 0x02, 0x01, 0x07]));
    let mut client = r.client();
    for _ in 0..3 {
        let answer = client.get_signing_key(request(&instance())).await.unwrap();
        assert_eq!(answer.into_inner().signing_key_spki, SIGNING);
    }
    assert_eq!(r.standin.token_requests(), 1, "the token is reused");

    // A revoked token is replaced once, transparently.
    r.standin.revoke_tokens();
    let answer = client.get_signing_key(request(&instance())).await.unwrap();
    assert_eq!(answer.into_inner().signing_key_spki, SIGNING);
    assert_eq!(r.standin.token_requests(), 2);
}

#[tokio::test]
async fn each_failure_maps_to_the_status_attest_proxy_acts_on() {
    let r = start(own_uid()).await;
    r.standin.put_instance(instance(), SIGNING, None);
    let mut client = r.client();

    let unknown = Instance {
        name: "worker-9".into(),
        ..instance()
    };
    let status = client.get_signing_key(request(&unknown)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("instances/worker-9"),
        "{status:?}"
    );

    let bad = Instance {
        name: "../x".into(),
        ..instance()
    };
    let status = client.get_signing_key(request(&bad)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    r.standin
        .set_compute_fault(Fault::RateLimited { retry_after: 7 });
    let status = client
        .get_signing_key(request(&instance()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("429"), "{status:?}");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "7");

    for (fault, needle) in [(Fault::Forbidden, "403"), (Fault::ServerError, "503")] {
        r.standin.set_compute_fault(fault);
        let status = client
            .get_signing_key(request(&instance()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains(needle), "{needle}: {status:?}");
    }

    r.standin.set_compute_fault(Fault::Hang);
    let started = Instant::now();
    let status = client
        .get_signing_key(request(&instance()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no answer within"), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(3));

    r.standin.set_compute_fault(Fault::None);
    r.standin.revoke_tokens();
    r.standin.set_metadata_fault(Fault::ServerError);
    let status = client
        .get_signing_key(request(&instance()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("metadata server"), "{status:?}");

    r.standin.set_metadata_fault(Fault::None);
    client.get_signing_key(request(&instance())).await.unwrap();
}

#[tokio::test]
async fn a_caller_of_another_uid_gets_nothing() {
    let r = start(own_uid().wrapping_add(4242)).await;
    r.standin.put_instance(instance(), SIGNING, None);
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        r.client().get_signing_key(request(&instance())),
    )
    .await
    .unwrap();
    assert!(result.is_err(), "a refused peer got an answer");
    assert_eq!(r.standin.compute_requests(), 0);
}

fn confidential_request(i: &Instance) -> GetConfidentialComputeRequest {
    GetConfidentialComputeRequest {
        project: i.project.clone(),
        zone: i.zone.clone(),
        instance: i.name.clone(),
    }
}

#[tokio::test]
async fn the_confidential_config_comes_from_instances_get() {
    let r = start(own_uid()).await;
    r.standin.put_instance(instance(), SIGNING, None);
    let mut client = r.client();

    let answer = client
        .get_confidential_compute(confidential_request(&instance()))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.enable_confidential_compute);
    assert_eq!(answer.confidential_instance_type, "");

    r.standin.set_confidential(&instance(), None);
    let answer = client
        .get_confidential_compute(confidential_request(&instance()))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.enable_confidential_compute);

    r.standin.set_confidential(
        &instance(),
        Some(Confidential {
            enable_confidential_compute: true,
            confidential_instance_type: Some("SEV".to_owned()),
        }),
    );
    let answer = client
        .get_confidential_compute(confidential_request(&instance()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            answer.enable_confidential_compute,
            answer.confidential_instance_type.as_str()
        ),
        (true, "SEV")
    );
    assert_eq!(r.standin.token_requests(), 1, "one token for both calls");

    let unknown = Instance {
        name: "worker-9".into(),
        ..instance()
    };
    let status = client
        .get_confidential_compute(confidential_request(&unknown))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let bad = Instance {
        project: "x".into(),
        ..instance()
    };
    let status = client
        .get_confidential_compute(confidential_request(&bad))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    r.standin.set_compute_fault(Fault::Forbidden);
    let status = client
        .get_confidential_compute(confidential_request(&instance()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("instances.get") && status.message().contains("403"),
        "{status:?}"
    );
    assert!(
        !status.message().contains("permission"),
        "Google's message stays in gce-identity's log: {status:?}"
    );
}
