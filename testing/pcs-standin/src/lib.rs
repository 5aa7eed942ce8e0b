//! A stand-in for Intel's Provisioning Certification Service (PCS), API v4, and a simulated
//! Intel ([`intel::SimulatedIntel`]) to fill it.
//!
//! It serves what its catalog holds at the paths the real service uses, with the real formats
//! and issuer-chain headers (PEM, URL-encoded), over TLS with a CA of its own:
//!
//! | path | body | header |
//! |---|---|---|
//! | `/tdx/certification/v4/tcb?fmspc=..` | `{"tcbInfo":..,"signature":..}` | `TCB-Info-Issuer-Chain` |
//! | `/tdx/certification/v4/qe/identity` | `{"enclaveIdentity":..,"signature":..}` | `SGX-Enclave-Identity-Issuer-Chain` |
//! | `/sgx/certification/v4/pckcrl?ca=platform\|processor[&encoding=der\|pem]` | the CRL, PEM unless `der` | `SGX-PCK-CRL-Issuer-Chain` |
//! | `/IntelSGXRootCA.der` | the root CA's CRL (Intel serves it on another host) | |
//!
//! Every answer carries a `Request-ID`. An FMSPC it holds nothing for is 404; a malformed
//! FMSPC, `ca` or `encoding` is 400 with `Error-Code` and `Error-Message` headers. It fails the
//! way the real one does, as the test sets: rate limiting (429 with `Retry-After`), server
//! errors, answers that never come, and going away altogether.

pub mod intel;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

pub use intel::{IssuerFlaw, PckCa, SimulatedIntel, SimulationError};

/// How the stand-in answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Serve the catalog.
    None,
    /// 429 Too Many Requests with `Retry-After: <seconds>`.
    RateLimited { retry_after: u64 },
    /// 503 Service Unavailable.
    ServerError,
    /// Accept the request and never answer.
    Hang,
}

/// What went wrong starting the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the PCS stand-in: {0}")]
    Bind(#[source] std::io::Error),
    #[error("the PCS stand-in's certificates: {0}")]
    Tls(#[source] standin_tls::Error),
}

/// A signed item and the PEM chain PCS sends in its header.
#[derive(Clone)]
struct Signed {
    body: Bytes,
    chain: String,
}

#[derive(Default)]
struct Catalog {
    /// By FMSPC in lower case.
    tcb: HashMap<String, Signed>,
    qe: Option<Signed>,
    /// By `ca=` value; the body is DER.
    pck_crl: HashMap<&'static str, Signed>,
    root_crl: Option<Bytes>,
}

#[derive(Default)]
struct State {
    catalog: Mutex<Catalog>,
    fault: Mutex<Option<Fault>>,
    requests: AtomicUsize,
    paths: Mutex<Vec<String>>,
}

/// The root CA CRL's path on the stand-in.
pub const ROOT_CRL_PATH: &str = "/IntelSGXRootCA.der";

/// A running stand-in; dropping it stops it.
pub struct PcsStandin {
    url: String,
    ca_pem: String,
    state: Arc<State>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for PcsStandin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcsStandin")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl PcsStandin {
    /// Serves on a free loopback port.
    pub async fn start() -> Result<PcsStandin, Error> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let (ca_pem, tls) = standin_tls::generate(addr.ip()).map_err(Error::Tls)?;
        let state = Arc::new(State::default());
        let task = tokio::spawn(serve(listener, TlsAcceptor::from(tls), state.clone()));
        Ok(PcsStandin {
            url: format!("https://{addr}"),
            ca_pem,
            state,
            task: Some(task),
        })
    }

    /// `https://127.0.0.1:<port>`: the PCS base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the root CA's CRL is served.
    pub fn root_crl_url(&self) -> String {
        format!("{}{ROOT_CRL_PATH}", self.url)
    }

    pub fn addr(&self) -> SocketAddr {
        self.url
            .trim_start_matches("https://")
            .parse()
            .unwrap_or_else(|_| unreachable!("the URL is built from the bound address"))
    }

    /// The CA of its serving certificate, PEM: a client's extra trust anchor.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Serves `body` (`{"tcbInfo":..,"signature":..}`) as the TCB info of `fmspc`, replacing
    /// what was there, with `chain` in `TCB-Info-Issuer-Chain`.
    pub fn put_tcb_info(&self, fmspc: &str, body: String, chain: &str) {
        self.catalog().tcb.insert(
            fmspc.to_ascii_lowercase(),
            Signed {
                body: Bytes::from(body),
                chain: chain.to_owned(),
            },
        );
    }

    /// Serves nothing for `fmspc` any more: 404, as for an FMSPC Intel does not know.
    pub fn remove_tcb_info(&self, fmspc: &str) {
        self.catalog().tcb.remove(&fmspc.to_ascii_lowercase());
    }

    /// Serves `body` (`{"enclaveIdentity":..,"signature":..}`) as the TD QE identity.
    pub fn put_qe_identity(&self, body: String, chain: &str) {
        self.catalog().qe = Some(Signed {
            body: Bytes::from(body),
            chain: chain.to_owned(),
        });
    }

    /// Serves `der` as the CRL of the PCK CA `ca`.
    pub fn put_pck_crl(&self, ca: PckCa, der: Vec<u8>, chain: &str) {
        self.catalog().pck_crl.insert(
            ca.as_str(),
            Signed {
                body: Bytes::from(der),
                chain: chain.to_owned(),
            },
        );
    }

    /// Serves `der` as the root CA's CRL at [`PcsStandin::root_crl_url`].
    pub fn put_root_crl(&self, der: Vec<u8>) {
        self.catalog().root_crl = Some(Bytes::from(der));
    }

    /// Serves everything `intel` signs, valid from `issued` to `next_update`: the TCB info of
    /// each of `fmspcs`, the QE identity, both PCK CRLs and the root CRL, none revoking anything.
    pub fn serve_intel(
        &self,
        intel: &SimulatedIntel,
        fmspcs: &[&str],
        issued: SystemTime,
        next_update: SystemTime,
    ) -> Result<(), SimulationError> {
        let chain = intel.tcb_issuer_chain_pem();
        for fmspc in fmspcs {
            let tcb = intel.signed_tcb_info(fmspc, issued, next_update)?;
            self.put_tcb_info(fmspc, tcb, &chain);
        }
        let qe = intel.sign_qe_identity(&intel.qe_identity_json(issued, next_update)?)?;
        self.put_qe_identity(qe, &chain);
        for ca in [PckCa::Platform, PckCa::Processor] {
            let crl = intel.pck_crl(ca, &[], issued, next_update)?;
            self.put_pck_crl(ca, crl, &intel.pck_issuer_chain_pem(ca));
        }
        self.put_root_crl(intel.root_crl(&[], issued, next_update)?);
        Ok(())
    }

    /// Serves collateral kept in dcap-qvl's JSON form (`tcb_info` and `qe_identity` the exact
    /// strings Intel signed, signatures and CRLs hex, issuer chains PEM), such as real
    /// collateral saved from Intel, as Intel's PCS serves it: the signed values wrapped in
    /// `{"tcbInfo": .., "signature": ..}` byte for byte, the PCK CRL as `ca`'s. Returns the
    /// FMSPC it serves the TCB info of.
    pub fn put_dcap_collateral(&self, json: &[u8], ca: PckCa) -> Result<String, String> {
        let stored: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
        let field = |name: &str| {
            stored[name]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no {name:?} string"))
        };
        let signed = |name: &str, inner: &str, sig: &str| {
            format!("{{\"{name}\":{inner},\"signature\":\"{sig}\"}}")
        };
        let unhex = |name: &str| hex::decode(field(name)?).map_err(|e| format!("{name}: {e}"));
        let tcb_info = field("tcb_info")?;
        let tcb: serde_json::Value =
            serde_json::from_str(&tcb_info).map_err(|e| format!("tcb_info: {e}"))?;
        let fmspc = tcb["fmspc"]
            .as_str()
            .ok_or("tcb_info has no fmspc")?
            .to_ascii_lowercase();
        self.put_tcb_info(
            &fmspc,
            signed("tcbInfo", &tcb_info, &field("tcb_info_signature")?),
            &field("tcb_info_issuer_chain")?,
        );
        self.put_qe_identity(
            signed(
                "enclaveIdentity",
                &field("qe_identity")?,
                &field("qe_identity_signature")?,
            ),
            &field("qe_identity_issuer_chain")?,
        );
        self.put_pck_crl(ca, unhex("pck_crl")?, &field("pck_crl_issuer_chain")?);
        self.put_root_crl(unhex("root_ca_crl")?);
        Ok(fmspc)
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.state.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The paths (with query) asked for so far, in order.
    pub fn paths(&self) -> Vec<String> {
        self.state
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Goes away: the listener closes and open connections are cut.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    fn catalog(&self) -> std::sync::MutexGuard<'_, Catalog> {
        self.state.catalog.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PcsStandin {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<State>) {
    let mut conns = JoinSet::new();
    // Dropping the JoinSet (when this task is aborted) aborts every connection.
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let acceptor = acceptor.clone();
                let state = state.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let svc = hyper::service::service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        }
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters, as PCS encodes its PEM headers.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3 / 2);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}

fn bad_request(message: &str) -> Response<Full<Bytes>> {
    let mut r = plain(StatusCode::BAD_REQUEST, "");
    r.headers_mut().insert(
        "Error-Code",
        http::HeaderValue::from_static("InvalidParameter"),
    );
    if let Ok(value) = http::HeaderValue::from_str(message) {
        r.headers_mut().insert("Error-Message", value);
    }
    r
}

fn signed(
    content_type: &'static str,
    body: Bytes,
    header: &'static str,
    chain: &str,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    if !header.is_empty() {
        if let Ok(value) = http::HeaderValue::from_str(&url_encode(chain)) {
            r.headers_mut().insert(header, value);
        }
    }
    r
}

async fn answer(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let n = state.requests.fetch_add(1, Ordering::SeqCst);
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    state
        .paths
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(path);
    let fault = state
        .fault
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or(Fault::None);
    let mut response = match fault {
        Fault::Hang => std::future::pending().await,
        Fault::ServerError => plain(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable"),
        Fault::RateLimited { retry_after } => {
            let mut r = plain(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests");
            if let Ok(value) = http::HeaderValue::from_str(&retry_after.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, value);
            }
            r
        }
        Fault::None if req.method() != http::Method::GET => {
            plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        Fault::None => route(&state, &req),
    };
    if let Ok(value) = http::HeaderValue::from_str(&format!("{n:032x}")) {
        response.headers_mut().insert("Request-ID", value);
    }
    Ok(response)
}

fn route(state: &State, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let catalog = state.catalog.lock().unwrap_or_else(|e| e.into_inner());
    let query = query(req);
    let not_found = || plain(StatusCode::NOT_FOUND, "");
    match req.uri().path() {
        "/tdx/certification/v4/tcb" => {
            let Some(fmspc) = query.get("fmspc") else {
                return bad_request("fmspc is required");
            };
            if fmspc.len() != 12 || !fmspc.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad_request("fmspc must be 12 hex digits");
            }
            match catalog.tcb.get(&fmspc.to_ascii_lowercase()) {
                Some(item) => signed(
                    "application/json",
                    item.body.clone(),
                    "TCB-Info-Issuer-Chain",
                    &item.chain,
                ),
                None => not_found(),
            }
        }
        "/tdx/certification/v4/qe/identity" => match &catalog.qe {
            Some(item) => signed(
                "application/json",
                item.body.clone(),
                "SGX-Enclave-Identity-Issuer-Chain",
                &item.chain,
            ),
            None => not_found(),
        },
        "/sgx/certification/v4/pckcrl" => {
            let ca = match query.get("ca").map(|c| c.to_ascii_lowercase()).as_deref() {
                Some("platform") => "platform",
                Some("processor") => "processor",
                _ => return bad_request("ca must be platform or processor"),
            };
            let der = match query.get("encoding").map(String::as_str) {
                Some("der") => true,
                None | Some("pem") => false,
                Some(_) => return bad_request("encoding must be der or pem"),
            };
            match catalog.pck_crl.get(ca) {
                Some(item) if der => signed(
                    "application/pkix-crl",
                    item.body.clone(),
                    "SGX-PCK-CRL-Issuer-Chain",
                    &item.chain,
                ),
                Some(item) => signed(
                    "application/x-pem-file",
                    Bytes::from(intel::pem("X509 CRL", &item.body)),
                    "SGX-PCK-CRL-Issuer-Chain",
                    &item.chain,
                ),
                None => not_found(),
            }
        }
        ROOT_CRL_PATH => match &catalog.root_crl {
            Some(der) => signed("application/pkix-crl", der.clone(), "", ""),
            None => not_found(),
        },
        _ => not_found(),
    }
}
