//! The stand-in answers like kube-apiserver: through a kube-rs client and raw HTTP (h1 and h2).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns; a panic is the failure report.

mod common;

use std::sync::Arc;

use common::{api_error, client};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube_standin::{Fault, Grant, KubeStandin, PolicyRule, Running, StandinConfig, User};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token";
const ISSUER: &str = "issuer-token";
const ISSUER_USER: &str = "system:serviceaccount:kube-system:join-token-issuer";

async fn standin() -> Running {
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    let issuer = User::service_account(
        ISSUER,
        "kube-system",
        "join-token-issuer",
        vec![
            Grant::namespaced(
                "kube-system",
                PolicyRule::new(&["create"], &[""], &["secrets"]),
            ),
            Grant::namespaced(
                "kube-system",
                PolicyRule::new(&["get", "delete"], &[""], &["secrets"]).with_names(&["allowed"]),
            ),
        ],
    );
    let mut config = StandinConfig::new(vec![User::admin(ADMIN), issuer]);
    config.admin_api = true;
    KubeStandin::start(config).await.unwrap()
}

fn secret(name: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": "abcdef"},
    }))
    .unwrap()
}

/// One raw HTTPS request with ALPN `alpn`; returns status, content-type and body.
async fn raw(
    s: &Running,
    alpn: &[u8],
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut roots = rustls23::RootCertStore::empty();
    let ca = rustls_pemfile_cert(&s.ca_pem);
    roots.add(ca).unwrap();
    let mut cfg = rustls23::ClientConfig::builder_with_provider(Arc::new(
        rustls23::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("https://{}{path}", s.addr))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = if alpn == b"h2" {
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let code = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, ct, String::from_utf8(body.to_vec()).unwrap())
}

fn rustls_pemfile_cert(pem: &str) -> rustls23::pki_types::CertificateDer<'static> {
    use rustls23::pki_types::pem::PemObject;
    rustls23::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

#[tokio::test]
async fn secret_lifecycle_through_kube_rs() {
    let s = standin().await;
    let api: Api<Secret> = Api::namespaced(client(&s, ADMIN).await, "kube-system");

    let created = api
        .create(&PostParams::default(), &secret("bootstrap-token-abcdef"))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("kube-system"));
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.resource_version.is_some());
    assert!(meta.creation_timestamp.is_some());
    assert!(
        created.string_data.is_none(),
        "stringData is merged into data"
    );
    assert_eq!(created.data.unwrap()["token-id"].0, b"abcdef");

    let got = api.get("bootstrap-token-abcdef").await.unwrap();
    assert_eq!(got.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let all: Api<Secret> = Api::all(client(&s, ADMIN).await);
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    // 409 AlreadyExists.
    let e = api_error(
        api.create(&PostParams::default(), &secret("bootstrap-token-abcdef"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        e.message,
        r#"secrets "bootstrap-token-abcdef" already exists"#
    );

    // 422 Invalid.
    let e = api_error(
        api.create(&PostParams::default(), &secret("Bad_Name"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.starts_with(r#"Secret "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain"#), "{}", e.message);

    // Delete, then 404 on get and delete.
    let deleted = api
        .delete("bootstrap-token-abcdef", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        deleted.is_right(),
        "secrets are deleted with a Success Status"
    );
    let e = api_error(api.get("bootstrap-token-abcdef").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, r#"secrets "bootstrap-token-abcdef" not found"#);
    let e = api_error(
        api.delete("bootstrap-token-abcdef", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // A namespace that does not exist.
    let nope: Api<Secret> = Api::namespaced(client(&s, ADMIN).await, "nope");
    let e = api_error(
        nope.create(&PostParams::default(), &secret("x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, r#"namespaces "nope" not found"#)
    );
    assert!(s.objects().is_empty());
}

#[tokio::test]
async fn authentication_and_authorization_fail_like_the_real_server() {
    let s = standin().await;

    let api: Api<Secret> = Api::namespaced(client(&s, "wrong").await, "kube-system");
    let e = api_error(api.get("x").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (401, "Unauthorized"));

    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (code, ct, body) = raw(
            &s,
            alpn,
            "GET",
            "/api/v1/namespaces/kube-system/secrets/x",
            None,
            "",
        )
        .await;
        assert_eq!(code, 401);
        assert_eq!(ct, "application/json");
        assert_eq!(
            body,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
    }

    // The issuer may create only in kube-system, and get only the named secret.
    let issuer = client(&s, ISSUER).await;
    let other: Api<Secret> = Api::namespaced(issuer.clone(), "default");
    let e = api_error(
        other
            .create(&PostParams::default(), &secret("x"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        format!(
            r#"secrets is forbidden: User "{ISSUER_USER}" cannot create resource "secrets" in API group "" in the namespace "default""#
        )
    );
    let details = e.details.unwrap();
    assert_eq!(details.kind, "secrets");

    let ks: Api<Secret> = Api::namespaced(issuer, "kube-system");
    ks.create(&PostParams::default(), &secret("x"))
        .await
        .unwrap();
    let e = api_error(ks.get("x").await.unwrap_err());
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        format!(
            r#"secrets "x" is forbidden: User "{ISSUER_USER}" cannot get resource "secrets" in API group "" in the namespace "kube-system""#
        )
    );
    let e = api_error(ks.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(e.message.contains("cannot list resource"));
    let e = api_error(ks.get("allowed").await.unwrap_err());
    assert_eq!(e.code, 404, "authorized, then not found");

    // Raw 403 body, byte for byte.
    let (code, _, body) = raw(
        &s,
        b"h2",
        "POST",
        "/api/v1/namespaces/default/secrets",
        Some(ISSUER),
        "{}",
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        body,
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"secrets is forbidden: User \"{ISSUER_USER}\" cannot create resource \"secrets\" in API group \"\" in the namespace \"default\"","reason":"Forbidden","details":{{"kind":"secrets"}},"code":403}}"#
        )
    );
}

#[tokio::test]
async fn raw_http_bodies_and_discovery() {
    let s = standin().await;
    let post = |body: &'static str| {
        let s = &s;
        async move {
            raw(
                s,
                b"http/1.1",
                "POST",
                "/api/v1/namespaces/kube-system/secrets",
                Some(ADMIN),
                body,
            )
            .await
        }
    };
    let (code, _, body) = post("{not json").await;
    assert_eq!(code, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["reason"], "BadRequest");

    let (code, _, body) = post(r#"{"metadata":{"name":"s","namespace":"default"}}"#).await;
    assert_eq!(code, 400);
    assert!(body.contains("does not match the namespace sent on the request"));

    let (code, _, body) = post(r#"{"metadata":{}}"#).await;
    assert_eq!(code, 422);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["details"]["causes"][0]["reason"], "FieldValueRequired");
    assert_eq!(v["details"]["causes"][0]["field"], "metadata.name");

    let (code, _, body) = post(r#"{"metadata":{"generateName":"gen-"},"data":{"k":"dg=="}}"#).await;
    assert_eq!(code, 201);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["metadata"]["name"].as_str().unwrap().starts_with("gen-"));
    assert_eq!(v["type"], "Opaque");

    let (code, _, body) = raw(
        &s,
        b"h2",
        "DELETE",
        &format!(
            "/api/v1/namespaces/kube-system/secrets/{}",
            v["metadata"]["name"].as_str().unwrap()
        ),
        Some(ADMIN),
        "",
    )
    .await;
    assert_eq!(code, 200);
    let d: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(d["status"], "Success");
    assert_eq!(d["details"]["uid"], v["metadata"]["uid"]);

    let (code, _, body) = raw(&s, b"h2", "GET", "/version", Some(ADMIN), "").await;
    assert_eq!(code, 200);
    assert!(body.contains("gitVersion"));
    let (code, _, body) = raw(&s, b"h2", "GET", "/api", Some(ADMIN), "").await;
    assert_eq!(code, 200);
    assert!(body.contains("APIVersions"));
    let (code, _, _) = raw(
        &s,
        b"h2",
        "GET",
        "/api/v1/namespaces/kube-system/widgets",
        Some(ADMIN),
        "",
    )
    .await;
    assert_eq!(code, 404);
    let (code, _, body) = raw(&s, b"http/1.1", "GET", "/readyz", None, "").await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _, _) = raw(&s, b"http/1.1", "GET", "/version", None, "").await;
    assert_eq!(code, 401);

    // Admin API (test-only): objects and faults over HTTP.
    let (code, _, body) = raw(&s, b"http/1.1", "GET", "/__standin/objects", None, "").await;
    assert_eq!((code, body.as_str()), (200, "[]"));
    let (code, _, _) = raw(
        &s,
        b"http/1.1",
        "POST",
        "/__standin/faults",
        None,
        r#"{"code":503,"times":1}"#,
    )
    .await;
    assert_eq!(code, 200);
    let (code, _, body) = raw(&s, b"http/1.1", "GET", "/version", Some(ADMIN), "").await;
    assert_eq!(code, 503);
    assert!(body.contains("ServiceUnavailable"));
}

#[tokio::test]
async fn injected_faults() {
    let s = standin().await;
    let api: Api<Secret> = Api::namespaced(client(&s, ADMIN).await, "kube-system");

    s.inject(Fault::once(500).on("POST"));
    let e = api_error(
        api.create(&PostParams::default(), &secret("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert!(
        s.objects().is_empty(),
        "a fault before commit stores nothing"
    );

    // kube-rs retries 429 (honouring Retry-After); two throttled answers, then success.
    s.inject(Fault::once(429).times(2));
    api.create(&PostParams::default(), &secret("b"))
        .await
        .unwrap();
    let codes: Vec<u16> = s
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.code)
        .collect();
    assert_eq!(codes, [500, 429, 429, 201]);

    // Committed, then the answer is lost: the client sees 500 but the object exists.
    s.inject(Fault::once(500).on("POST").after_commit());
    let e = api_error(
        api.create(&PostParams::default(), &secret("c"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 500);
    assert!(api.get("c").await.is_ok());

    // Delay applies to every API request.
    s.set_delay(std::time::Duration::from_millis(300));
    let t = std::time::Instant::now();
    api.get("c").await.unwrap();
    assert!(t.elapsed() >= std::time::Duration::from_millis(300));
}
