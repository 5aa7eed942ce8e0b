//! The stand-in over real TLS, asked as a client asks Intel: its paths, headers and formats,
//! its errors and faults; and the simulated Intel's signatures, checked against its own
//! certificates.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Empty};
use pcs_standin::{Fault, PckCa, PcsStandin, SimulatedIntel, url_encode};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

const FMSPC: &str = "00806f050000";

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// One GET over a fresh TLS connection that trusts only the stand-in's CA.
async fn get(pcs: &PcsStandin, path: &str) -> Got {
    use rustls23::pki_types::pem::PemObject;
    let mut roots = rustls23::RootCertStore::empty();
    roots
        .add(rustls23::pki_types::CertificateDer::from_pem_slice(pcs.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls23::ClientConfig::builder_with_provider(Arc::new(
        rustls23::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(pcs.addr()).await.unwrap();
    let name = rustls23::pki_types::ServerName::from(pcs.addr().ip());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .header(http::header::HOST, "pcs")
        .body(Empty::new())
        .unwrap();
    let response = send.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Got {
        status,
        headers,
        body,
    }
}

fn header(got: &Got, name: &str) -> String {
    got.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_owned()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn window() -> (SystemTime, SystemTime) {
    let now = SystemTime::now();
    (
        now - Duration::from_secs(3600),
        now + Duration::from_secs(30 * 86_400),
    )
}

async fn serving() -> (PcsStandin, SimulatedIntel) {
    let pcs = PcsStandin::start().await.unwrap();
    let intel = SimulatedIntel::new().unwrap();
    let (issued, next) = window();
    pcs.serve_intel(&intel, &[FMSPC], issued, next).unwrap();
    (pcs, intel)
}

/// The public key of the first certificate in a PEM chain.
fn first_cert_der(chain: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain.as_bytes()).unwrap();
    pem.contents
}

/// `{"<field>":<inner>,"signature":<hex>}` verified with the key of `signer_der`.
fn verify_signed_json(body: &[u8], field: &str, signer_der: &[u8]) -> String {
    let text = std::str::from_utf8(body).unwrap();
    let prefix = format!("{{\"{field}\":");
    let inner_and_sig = text.strip_prefix(&prefix).unwrap();
    let split = inner_and_sig.rfind(",\"signature\":\"").unwrap();
    let inner = &inner_and_sig[..split];
    let value: serde_json::Value = serde_json::from_slice(body).unwrap();
    let sig = hex::decode(value["signature"].as_str().unwrap()).unwrap();
    let (_, cert) = X509Certificate::from_der(signer_der).unwrap();
    aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
        cert.public_key().subject_public_key.data.as_ref(),
    )
    .verify(inner.as_bytes(), &sig)
    .unwrap();
    inner.to_owned()
}

#[tokio::test]
async fn tcb_info_and_qe_identity_are_served_signed_with_their_url_encoded_chains() {
    let (pcs, intel) = serving().await;

    // Either case of FMSPC names the same item.
    let got = get(&pcs, "/tdx/certification/v4/tcb?fmspc=00806F050000").await;
    assert_eq!(got.status, 200);
    assert_eq!(header(&got, "content-type"), "application/json");
    assert!(!header(&got, "Request-ID").is_empty());
    let encoded = header(&got, "TCB-Info-Issuer-Chain");
    assert!(!encoded.contains('\n') && encoded.starts_with("-----BEGIN%20CERTIFICATE"));
    let chain = percent_decode(&encoded);
    assert_eq!(chain, intel.tcb_issuer_chain_pem());
    let inner = verify_signed_json(&got.body, "tcbInfo", &first_cert_der(&chain));
    let tcb: serde_json::Value = serde_json::from_str(&inner).unwrap();
    assert_eq!(tcb["fmspc"], FMSPC);
    assert_eq!(tcb["id"], "TDX");

    let got = get(&pcs, "/tdx/certification/v4/qe/identity").await;
    assert_eq!(got.status, 200);
    let chain = percent_decode(&header(&got, "SGX-Enclave-Identity-Issuer-Chain"));
    let inner = verify_signed_json(&got.body, "enclaveIdentity", &first_cert_der(&chain));
    assert!(inner.contains("\"id\":\"TD_QE\""), "{inner}");
}

#[tokio::test]
async fn the_simulated_chains_and_crls_are_signed_by_the_simulated_root() {
    let intel = SimulatedIntel::new().unwrap();
    let (_, root) = X509Certificate::from_der(intel.root_der()).unwrap();
    root.verify_signature(None).unwrap();
    assert_eq!(
        root.subject().to_string(),
        "CN=Intel SGX Root CA, O=Intel Corporation, L=Santa Clara, ST=CA, C=US"
    );
    for (der, cn) in [
        (intel.tcb_signing_der(), "Intel SGX TCB Signing"),
        (
            intel.pck_ca_der(PckCa::Platform),
            "Intel SGX PCK Platform CA",
        ),
        (
            intel.pck_ca_der(PckCa::Processor),
            "Intel SGX PCK Processor CA",
        ),
    ] {
        let (_, cert) = X509Certificate::from_der(der).unwrap();
        cert.verify_signature(Some(root.public_key())).unwrap();
        assert!(
            cert.subject()
                .to_string()
                .starts_with(&format!("CN={cn}, "))
        );
        assert_eq!(cert.is_ca(), cn != "Intel SGX TCB Signing", "{cn}");
    }

    // A PCK certificate from the Platform CA, revoked on its CRL.
    let pck_key = aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &aws_lc_rs::rand::SystemRandom::new(),
    )
    .unwrap();
    let pck_key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pck_key.as_ref(),
    )
    .unwrap();
    use aws_lc_rs::signature::KeyPair as _;
    let pck = intel
        .pck_certificate(
            PckCa::Platform,
            pck_key.public_key().as_ref(),
            0xfeed_beef,
            vec![],
        )
        .unwrap();
    let (_, pck) = X509Certificate::from_der(&pck).unwrap();
    let (_, platform) = X509Certificate::from_der(intel.pck_ca_der(PckCa::Platform)).unwrap();
    pck.verify_signature(Some(platform.public_key())).unwrap();
    // A leading zero keeps the serial positive.
    assert_eq!(pck.raw_serial(), [0x00, 0xfe, 0xed, 0xbe, 0xef]);

    let (issued, next) = window();
    let crl = intel
        .pck_crl(PckCa::Platform, &[0xfeed_beef, 0x7f], issued, next)
        .unwrap();
    let (_, crl) = CertificateRevocationList::from_der(&crl).unwrap();
    crl.verify_signature(platform.public_key()).unwrap();
    let revoked: Vec<Vec<u8>> = crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial().to_vec())
        .collect();
    assert_eq!(revoked, [vec![0x00, 0xfe, 0xed, 0xbe, 0xef], vec![0x7f]]);

    let root_crl = intel.root_crl(&[3], issued, next).unwrap();
    let (_, root_crl) = CertificateRevocationList::from_der(&root_crl).unwrap();
    root_crl.verify_signature(root.public_key()).unwrap();
    assert_eq!(root_crl.iter_revoked_certificates().count(), 1);
}

#[tokio::test]
async fn pck_crls_come_as_der_or_pem_as_asked_and_the_root_crl_at_its_own_path() {
    let (pcs, intel) = serving().await;
    let der = get(
        &pcs,
        "/sgx/certification/v4/pckcrl?ca=processor&encoding=der",
    )
    .await;
    assert_eq!(der.status, 200);
    assert_eq!(header(&der, "content-type"), "application/pkix-crl");
    assert_eq!(
        percent_decode(&header(&der, "SGX-PCK-CRL-Issuer-Chain")),
        intel.pck_issuer_chain_pem(PckCa::Processor)
    );
    let (_, crl) = CertificateRevocationList::from_der(&der.body).unwrap();
    assert_eq!(
        crl.issuer().to_string(),
        "CN=Intel SGX PCK Processor CA, O=Intel Corporation, L=Santa Clara, ST=CA, C=US"
    );

    // PEM is the default encoding.
    let pem = get(&pcs, "/sgx/certification/v4/pckcrl?ca=processor").await;
    assert_eq!(pem.status, 200);
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem.body).unwrap();
    assert_eq!(block.label, "X509 CRL");
    assert_eq!(block.contents, der.body);

    let root = get(&pcs, pcs_standin::ROOT_CRL_PATH).await;
    assert_eq!(root.status, 200);
    assert!(root.headers.get("SGX-PCK-CRL-Issuer-Chain").is_none());
    let (_, crl) = CertificateRevocationList::from_der(&root.body).unwrap();
    assert!(crl.issuer().to_string().starts_with("CN=Intel SGX Root CA"));
    assert!(pcs.root_crl_url().ends_with(pcs_standin::ROOT_CRL_PATH));
}

#[tokio::test]
async fn unknown_fmspcs_are_404_and_malformed_queries_400_with_intels_error_headers() {
    let (pcs, _intel) = serving().await;
    let got = get(&pcs, "/tdx/certification/v4/tcb?fmspc=b0c06f000000").await;
    assert_eq!(got.status, 404);
    assert!(!header(&got, "Request-ID").is_empty());

    for (path, message) in [
        ("/tdx/certification/v4/tcb", "fmspc is required"),
        (
            "/tdx/certification/v4/tcb?fmspc=00806f05",
            "fmspc must be 12 hex digits",
        ),
        (
            "/sgx/certification/v4/pckcrl?ca=other",
            "ca must be platform or processor",
        ),
        (
            "/sgx/certification/v4/pckcrl?ca=platform&encoding=asn1",
            "encoding must be der or pem",
        ),
    ] {
        let got = get(&pcs, path).await;
        assert_eq!(got.status, 400, "{path}");
        assert_eq!(header(&got, "Error-Code"), "InvalidParameter");
        assert_eq!(header(&got, "Error-Message"), message);
    }
    assert_eq!(get(&pcs, "/sgx/certification/v4/pckcert").await.status, 404);
    assert_eq!(
        pcs.paths()[0],
        "/tdx/certification/v4/tcb?fmspc=b0c06f000000"
    );
    assert_eq!(pcs.requests(), 6);
}

#[tokio::test]
async fn items_are_replaced_and_removed() {
    let (pcs, intel) = serving().await;
    let (issued, _) = window();
    let later = issued + Duration::from_secs(90 * 86_400);
    let newer = intel.signed_tcb_info(FMSPC, issued, later).unwrap();
    pcs.put_tcb_info(FMSPC, newer.clone(), &intel.tcb_issuer_chain_pem());
    let got = get(&pcs, &format!("/tdx/certification/v4/tcb?fmspc={FMSPC}")).await;
    assert_eq!(got.body, newer.as_bytes());

    pcs.remove_tcb_info(FMSPC);
    let got = get(&pcs, &format!("/tdx/certification/v4/tcb?fmspc={FMSPC}")).await;
    assert_eq!(got.status, 404);
}

#[tokio::test]
async fn faults_answer_as_set() {
    let (pcs, _intel) = serving().await;
    let path = "/tdx/certification/v4/qe/identity";
    pcs.set_fault(Fault::RateLimited { retry_after: 7 });
    let got = get(&pcs, path).await;
    assert_eq!(got.status, 429);
    assert_eq!(header(&got, "retry-after"), "7");
    pcs.set_fault(Fault::ServerError);
    assert_eq!(get(&pcs, path).await.status, 503);
    pcs.set_fault(Fault::Hang);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), get(&pcs, path))
            .await
            .is_err(),
        "a hanging stand-in answers nothing"
    );
    pcs.set_fault(Fault::None);
    assert_eq!(get(&pcs, path).await.status, 200);
}

#[tokio::test]
async fn a_stopped_stand_in_refuses_connections() {
    let (mut pcs, _intel) = serving().await;
    let addr = pcs.addr();
    pcs.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn url_encoding_keeps_only_unreserved_characters() {
    assert_eq!(
        url_encode("-----BEGIN CERTIFICATE-----\nMI+a/b=_~."),
        "-----BEGIN%20CERTIFICATE-----%0AMI%2Ba%2Fb%3D_~."
    );
}
