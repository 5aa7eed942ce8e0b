//! A stand-in for AMD's key distribution service (KDS).
//!
//! It serves whatever its catalog holds at the paths the real service uses
//! (`/vcek/v1/{product}/cert_chain`, `/vlek/v1/{product}/cert_chain`, `/vcek/v1/{product}/crl`,
//! `/vlek/v1/{product}/crl`, `/vcek/v1/{product}/{hwid}?blSPL=..`), with the real content types, over TLS with a CA of its
//! own; a test fills the catalog from simulated AMD hardware. It fails the way the real one does,
//! as the test sets: rate limiting (429 with `Retry-After`), server errors, answers that never
//! come, and going away altogether.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// How the stand-in answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Serve the catalog.
    None,
    /// 429 Too Many Requests with `Retry-After: <seconds>`, as KDS rate-limits.
    RateLimited { retry_after: u64 },
    /// 503 Service Unavailable.
    ServerError,
    /// Accept the request and never answer.
    Hang,
}

/// What went wrong starting the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the KDS stand-in: {0}")]
    Bind(#[source] std::io::Error),
    #[error("the KDS stand-in's certificates: {0}")]
    Tls(#[source] standin_tls::Error),
}

#[derive(Default)]
struct State {
    /// Path (with query) → (content type, body).
    catalog: Mutex<HashMap<String, (&'static str, Bytes)>>,
    fault: Mutex<Option<Fault>>,
    requests: AtomicUsize,
    paths: Mutex<Vec<String>>,
}

/// A running stand-in; dropping it stops it.
pub struct KdsStandin {
    url: String,
    ca_pem: String,
    state: Arc<State>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for KdsStandin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KdsStandin")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl KdsStandin {
    /// Serves on a free loopback port.
    pub async fn start() -> Result<KdsStandin, Error> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let (ca_pem, tls) = standin_tls::generate(addr.ip()).map_err(Error::Tls)?;
        let state = Arc::new(State::default());
        let task = tokio::spawn(serve(listener, TlsAcceptor::from(tls), state.clone()));
        Ok(KdsStandin {
            url: format!("https://{addr}"),
            ca_pem,
            state,
            task: Some(task),
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
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

    /// Serves `body` at `path` (with its query, exactly as clients ask).
    pub fn put(&self, path: &str, content_type: &'static str, body: Vec<u8>) {
        self.lock_catalog()
            .insert(path.to_owned(), (content_type, Bytes::from(body)));
    }

    /// A product's VCEK cert chain (ASK, ARK; PEM).
    pub fn put_vcek_chain(&self, product: &str, pem: &str) {
        self.put(
            &format!("/vcek/v1/{product}/cert_chain"),
            "application/x-pem-file",
            pem.as_bytes().to_vec(),
        );
    }

    /// A product's VLEK cert chain (ASVK, ARK; PEM).
    pub fn put_vlek_chain(&self, product: &str, pem: &str) {
        self.put(
            &format!("/vlek/v1/{product}/cert_chain"),
            "application/x-pem-file",
            pem.as_bytes().to_vec(),
        );
    }

    /// A product's CRL for VCEK chains (DER; the ASK's CRL distribution point).
    pub fn put_vcek_crl(&self, product: &str, der: Vec<u8>) {
        self.put(
            &format!("/vcek/v1/{product}/crl"),
            "application/pkix-crl",
            der,
        );
    }

    /// A product's CRL for VLEK chains (DER; the ASVK's CRL distribution point).
    pub fn put_vlek_crl(&self, product: &str, der: Vec<u8>) {
        self.put(
            &format!("/vlek/v1/{product}/crl"),
            "application/pkix-crl",
            der,
        );
    }

    /// A VCEK (DER) at its full path with query (`/vcek/v1/{product}/{hwid}?blSPL=..`).
    pub fn put_vcek(&self, path_and_query: &str, der: Vec<u8>) {
        self.put(path_and_query, "application/x-x509-ca-cert", der);
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.state.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The paths asked for so far, in order.
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

    fn lock_catalog(&self) -> std::sync::MutexGuard<'_, HashMap<String, (&'static str, Bytes)>> {
        self.state.catalog.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for KdsStandin {
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

async fn answer(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    state
        .paths
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(path.clone());
    let fault = state
        .fault
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or(Fault::None);
    let response = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r
    };
    match fault {
        Fault::Hang => std::future::pending().await,
        Fault::ServerError => {
            return Ok(response(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable",
            ));
        }
        Fault::RateLimited { retry_after } => {
            let mut r = response(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests");
            if let Ok(value) = http::HeaderValue::from_str(&retry_after.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, value);
            }
            return Ok(r);
        }
        Fault::None => {}
    }
    if req.method() != http::Method::GET {
        return Ok(response(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed",
        ));
    }
    let entry = state
        .catalog
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&path)
        .cloned();
    Ok(match entry {
        Some((content_type, body)) => {
            let mut r = Response::new(Full::new(body));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(content_type),
            );
            r
        }
        None => response(StatusCode::NOT_FOUND, "Not Found"),
    })
}
