//! The stand-in refuses what EC2 and IMDSv2 refuse: IMDS reads without a session token, a
//! session token request without its TTL, EC2 calls without a signature, with a signature the
//! credential did not make, or with a credential it never issued.

#![allow(clippy::unwrap_used)]

use std::time::SystemTime;

use ec2_identity::sigv4::{self, Credential};
use ec2_standin::{Ec2Standin, ROLE};
use http_body_util::{BodyExt, Empty};

type Client = plumbing::https::HttpsClient;

async fn call(
    client: &Client,
    method: http::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut request = http::Request::builder().method(method).uri(url);
    for (n, v) in headers {
        request = request.header(*n, *v);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn it_refuses_what_aws_refuses() {
    let standin = Ec2Standin::start().await.unwrap();
    standin.put_image("us-east-1", "ami-12345678", Some("v2.0"));
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, standin.ca_pem()).unwrap();
    let client = plumbing::https::client(Some(&ca)).unwrap();
    let imds = standin.imds_url();

    // IMDSv2: no token, no reads; no TTL, no token.
    let creds = format!("{imds}/latest/meta-data/iam/security-credentials/{ROLE}");
    assert_eq!(call(&client, http::Method::GET, &creds, &[]).await.0, 401);
    let token_url = format!("{imds}/latest/api/token");
    assert_eq!(
        call(&client, http::Method::PUT, &token_url, &[]).await.0,
        400
    );
    let (status, token) = call(
        &client,
        http::Method::PUT,
        &token_url,
        &[("x-aws-ec2-metadata-token-ttl-seconds", "60")],
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = call(
        &client,
        http::Method::GET,
        &creds,
        &[("x-aws-ec2-metadata-token", &token)],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let issued: serde_json::Value = serde_json::from_str(&body).unwrap();
    let credential = Credential {
        access_key_id: issued["AccessKeyId"].as_str().unwrap().to_owned(),
        secret_access_key: issued["SecretAccessKey"].as_str().unwrap().to_owned(),
        session_token: issued["Token"].as_str().map(str::to_owned),
    };

    let ec2 = standin.ec2_url();
    let host = ec2.trim_start_matches("https://").to_owned();
    let query = [
        ("Action", "DescribeImages"),
        ("ImageId.1", "ami-12345678"),
        ("Version", "2016-11-15"),
    ];
    let url = format!("{ec2}/?{}", sigv4::canonical_query(&query));
    // A DescribeImages call signed with `credential`, as ec2-identity signs it.
    let signed_call = async |credential: &Credential| {
        let date = sigv4::amz_date(SystemTime::now());
        let token = credential.session_token.clone().unwrap_or_default();
        let headers = [
            ("host", host.as_str()),
            ("x-amz-date", date.as_str()),
            ("x-amz-security-token", token.as_str()),
        ];
        let auth = sigv4::authorization(
            credential,
            &sigv4::Request {
                method: "GET",
                path: "/",
                query: &query,
                headers: &headers,
                payload: b"",
            },
            &date,
            "us-east-1",
            "ec2",
        );
        call(
            &client,
            http::Method::GET,
            &url,
            &[
                ("x-amz-date", date.as_str()),
                ("x-amz-security-token", token.as_str()),
                ("authorization", auth.as_str()),
            ],
        )
        .await
    };

    // Unsigned: AuthFailure.
    let (status, body) = call(&client, http::Method::GET, &url, &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("<Code>AuthFailure</Code>"), "{body}");

    // Signed right: the image, with its tpmSupport.
    let (status, body) = signed_call(&credential).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<tpmSupport>v2.0</tpmSupport>"), "{body}");

    // Signed with another secret: SignatureDoesNotMatch.
    let wrong = Credential {
        secret_access_key: "not-the-secret".to_owned(),
        ..credential.clone()
    };
    let (status, body) = signed_call(&wrong).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("<Code>SignatureDoesNotMatch</Code>"),
        "{body}"
    );

    // A revoked credential: AuthFailure.
    standin.revoke_credentials();
    let (status, body) = signed_call(&credential).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("<Code>AuthFailure</Code>"), "{body}");
}
