//! The stand-in answers as Google's endpoints do: tokens only with `Metadata-Flavor: Google`,
//! identities only with a token it issued, Google's error JSON for unknown instances, and the
//! faults a test sets.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use gce_standin::{Confidential, Fault, GceStandin, Instance, TOKEN_PATH};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<bytes::Bytes>,
>;

fn client(standin: &GceStandin) -> HttpsClient {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls23::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(standin.ca_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls23::ClientConfig::builder_with_provider(Arc::new(
        rustls23::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn get(
    client: &HttpsClient,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, serde_json::Value, String) {
    let mut request = http::Request::get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, headers, json, text)
}

fn instance() -> Instance {
    Instance {
        project: "my-project-1".into(),
        zone: "us-central1-a".into(),
        name: "worker-1".into(),
    }
}

fn identity_url(standin: &GceStandin, i: &Instance) -> String {
    format!(
        "{}/compute/v1/projects/{}/zones/{}/instances/{}/getShieldedInstanceIdentity",
        standin.compute_url(),
        i.project,
        i.zone,
        i.name
    )
}

async fn token(standin: &GceStandin, client: &HttpsClient) -> String {
    let url = format!("{}{TOKEN_PATH}", standin.metadata_url());
    let (status, headers, json, _) = get(client, &url, &[("Metadata-Flavor", "Google")]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["metadata-flavor"], "Google");
    assert_eq!(json["token_type"], "Bearer");
    assert!(json["expires_in"].is_u64(), "{json}");
    json["access_token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn tokens_need_the_metadata_flavor_header_and_no_proxy() {
    let standin = GceStandin::start().await.unwrap();
    let client = client(&standin);
    let url = format!("{}{TOKEN_PATH}", standin.metadata_url());
    let (status, _, _, body) = get(&client, &url, &[]).await;
    assert_eq!(status, 403);
    assert!(body.contains("Metadata-Flavor"), "{body}");
    let (status, _, _, _) = get(
        &client,
        &url,
        &[
            ("Metadata-Flavor", "Google"),
            ("X-Forwarded-For", "10.0.0.9"),
        ],
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _, _) = get(
        &client,
        &format!(
            "{}/computeMetadata/v1/instance/other",
            standin.metadata_url()
        ),
        &[("Metadata-Flavor", "Google")],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(standin.token_requests(), 0);
    let first = token(&standin, &client).await;
    let second = token(&standin, &client).await;
    assert_ne!(first, second);
    assert_eq!(standin.token_requests(), 2);
}

#[tokio::test]
async fn identities_need_an_issued_token_and_unknown_instances_are_404() {
    let standin = GceStandin::start().await.unwrap();
    let client = client(&standin);
    let signing = b"\x30\x03\x02\x01\x01".to_vec();
    let encryption = b"\x30\x03\x02\x01\x02".to_vec();
    standin.put_instance(instance(), &signing, Some(&encryption));
    let url = identity_url(&standin, &instance());

    for auth in [None, Some("Bearer ya29.made-up")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let (status, _, json, _) = get(&client, &url, &headers).await;
        assert_eq!(status, 401, "{auth:?}");
        assert_eq!(json["error"]["status"], "UNAUTHENTICATED");
    }

    let bearer = format!("Bearer {}", token(&standin, &client).await);
    let auth = [("Authorization", bearer.as_str())];
    let (status, _, json, _) = get(&client, &url, &auth).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["kind"], "compute#shieldedInstanceIdentity");
    assert_eq!(
        json["signingKey"]["ekPub"],
        gce_standin::public_key_pem(&signing)
    );
    assert_eq!(
        json["encryptionKey"]["ekPub"],
        gce_standin::public_key_pem(&encryption)
    );
    assert!(
        json["signingKey"]["ekPub"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----\n")
    );

    let other = Instance {
        name: "worker-2".into(),
        ..instance()
    };
    let (status, _, json, _) = get(&client, &identity_url(&standin, &other), &auth).await;
    assert_eq!(status, 404);
    assert_eq!(json["error"]["errors"][0]["reason"], "notFound");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("projects/my-project-1/zones/us-central1-a/instances/worker-2"),
        "{json}"
    );
    standin.remove_instance(&instance());
    assert_eq!(get(&client, &url, &auth).await.0, 404);

    // A revoked token, and one that expired, are refused.
    standin.revoke_tokens();
    assert_eq!(get(&client, &url, &auth).await.0, 401);
    standin.put_instance(instance(), &signing, None);
    standin.set_token_lifetime(Duration::from_secs(0));
    let bearer = format!("Bearer {}", token(&standin, &client).await);
    assert_eq!(
        get(&client, &url, &[("Authorization", bearer.as_str())])
            .await
            .0,
        401
    );
}

#[tokio::test]
async fn instances_get_answers_the_confidential_config_as_google_does() {
    let standin = GceStandin::start().await.unwrap();
    let client = client(&standin);
    standin.put_instance(instance(), b"\x30\x03\x02\x01\x01", None);
    let i = instance();
    let url = format!(
        "{}/compute/v1/projects/{}/zones/{}/instances/{}",
        standin.compute_url(),
        i.project,
        i.zone,
        i.name
    );
    assert_eq!(get(&client, &url, &[]).await.0, 401);
    let bearer = format!("Bearer {}", token(&standin, &client).await);
    let auth = [("Authorization", bearer.as_str())];

    let (status, _, json, _) = get(&client, &url, &auth).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["kind"], "compute#instance");
    assert_eq!(json["name"], "worker-1");
    assert_eq!(
        json["confidentialInstanceConfig"],
        serde_json::json!({"enableConfidentialCompute": true})
    );
    assert!(
        json["id"].as_str().unwrap().parse::<u64>().is_ok(),
        "{json}"
    );

    // A partial response holds the named fields only.
    let partial = format!("{url}?fields=confidentialInstanceConfig");
    let (_, _, json, _) = get(&client, &partial, &auth).await;
    assert_eq!(
        json,
        serde_json::json!({"confidentialInstanceConfig": {"enableConfidentialCompute": true}})
    );

    // Not confidential: the field is absent. An SEV-SNP instance names its type.
    assert!(standin.set_confidential(&i, None));
    let (_, _, json, _) = get(&client, &partial, &auth).await;
    assert_eq!(json, serde_json::json!({}));
    assert!(standin.set_confidential(
        &i,
        Some(Confidential {
            enable_confidential_compute: true,
            confidential_instance_type: Some("SEV_SNP".to_owned()),
        })
    ));
    let (_, _, json, _) = get(&client, &partial, &auth).await;
    assert_eq!(
        json["confidentialInstanceConfig"]["confidentialInstanceType"],
        "SEV_SNP"
    );

    let other = Instance {
        name: "worker-2".into(),
        ..instance()
    };
    assert!(!standin.set_confidential(&other, None));
    let other_url = url.replace("worker-1", "worker-2");
    let (status, _, json, _) = get(&client, &other_url, &auth).await;
    assert_eq!(status, 404);
    assert_eq!(json["error"]["errors"][0]["reason"], "notFound");
    let (status, _, _, _) = get(&client, &format!("{url}/start"), &auth).await;
    assert_eq!(status, 404);

    standin.set_compute_fault(Fault::RateLimited { retry_after: 3 });
    let (status, headers, _, _) = get(&client, &partial, &auth).await;
    assert_eq!(status, 429);
    assert_eq!(headers.get("retry-after").unwrap(), "3");
}

#[tokio::test]
async fn faults_answer_as_google_fails() {
    let standin = GceStandin::start().await.unwrap();
    let client = client(&standin);
    standin.put_instance(instance(), b"\x30\x00", None);
    let url = identity_url(&standin, &instance());
    let bearer = format!("Bearer {}", token(&standin, &client).await);
    let auth = [("Authorization", bearer.as_str())];

    standin.set_compute_fault(Fault::Forbidden);
    let (status, _, json, _) = get(&client, &url, &auth).await;
    assert_eq!(
        (status, &json["error"]["status"]),
        (403, &"PERMISSION_DENIED".into())
    );

    standin.set_compute_fault(Fault::RateLimited { retry_after: 7 });
    let (status, headers, json, _) = get(&client, &url, &auth).await;
    assert_eq!(status, 429);
    assert_eq!(headers[http::header::RETRY_AFTER], "7");
    assert_eq!(json["error"]["errors"][0]["reason"], "rateLimitExceeded");

    standin.set_compute_fault(Fault::ServerError);
    assert_eq!(get(&client, &url, &auth).await.0, 503);

    standin.set_compute_fault(Fault::Hang);
    let hung = tokio::time::timeout(Duration::from_millis(500), get(&client, &url, &auth)).await;
    assert!(hung.is_err(), "a hanging API answered");

    standin.set_compute_fault(Fault::None);
    assert_eq!(get(&client, &url, &auth).await.0, 200);

    standin.set_metadata_fault(Fault::ServerError);
    let (status, _, _, _) = get(
        &client,
        &format!("{}{TOKEN_PATH}", standin.metadata_url()),
        &[("Metadata-Flavor", "Google")],
    )
    .await;
    assert_eq!(status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_registers_instances_through_the_control_endpoint() {
    let standin = GceStandin::start().await.unwrap();
    let client = client(&standin);
    let signing = b"\x30\x03\x02\x01\x07".to_vec();
    let control = standin.control_addr();
    let registered = instance();
    tokio::task::spawn_blocking(move || {
        gce_standin::put_instance_at(control, &registered, &signing)
    })
    .await
    .unwrap()
    .unwrap();
    let bearer = format!("Bearer {}", token(&standin, &client).await);
    let auth = [("Authorization", bearer.as_str())];
    let (status, _, json, _) = get(&client, &identity_url(&standin, &instance()), &auth).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        json["signingKey"]["ekPub"],
        gce_standin::public_key_pem(b"\x30\x03\x02\x01\x07")
    );
    assert_eq!(json.get("encryptionKey"), None);

    // An empty key, or a path naming no instance, is refused, not registered.
    let refused = tokio::task::spawn_blocking(move || {
        let empty = gce_standin::put_instance_at(
            control,
            &Instance {
                name: "worker-9".into(),
                ..instance()
            },
            b"",
        );
        let unnamed = gce_standin::put_instance_at(
            control,
            &Instance {
                name: String::new(),
                ..instance()
            },
            b"\x30\x00",
        );
        [empty, unnamed]
    })
    .await
    .unwrap();
    for (result, status) in refused.iter().zip(["400", "404"]) {
        match result {
            Err(gce_standin::ControlError::Refused { status_line, .. }) => {
                assert!(status_line.contains(status), "{status_line}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    let nine = Instance {
        name: "worker-9".into(),
        ..instance()
    };
    assert_eq!(
        get(&client, &identity_url(&standin, &nine), &auth).await.0,
        404
    );
}
