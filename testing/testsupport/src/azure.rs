//! Azure's paravisor (the HCL), played on a swtpm: what it does to an Azure CVM's vTPM at boot.
//! It persists an RSA attestation key at 0x81000003 and leaves in NV index 0x01400001 an HCL
//! report whose hardware report (from soft-issuer's simulated AMD or Intel) binds runtime data
//! naming that key. `tpm-issuer`'s Azure issuers then read them as on Azure.
//!
//! For azure-tdx, [`QuoteServiceStandin`] stands in for Azure's quote service
//! (`POST /acc/tdquote` on the instance metadata service): it turns the TD report of an HCL
//! report into a quote from a simulated TDX machine, or fails as IMDS does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use soft_issuer::snp::{ReportFields, SimulatedSigner, azure_runtime_data_for_public};
use soft_issuer::tdx::{QuoteVersion, TdFields, TdxMachine};
use tss_esapi::Context;
use tss_esapi::handles::{ObjectHandle, PersistentTpmHandle};
use tss_esapi::interface_types::dynamic_handles::Persistent;
use tss_esapi::interface_types::resource_handles::{Hierarchy, Provision};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::Marshall;

use crate::swtpm::Swtpm;

/// Where the paravisor persists its attestation key.
pub const HCL_AK_HANDLE: u32 = 0x8100_0003;
/// Where the paravisor leaves its report.
pub const HCL_REPORT_NV_INDEX: u32 = 0x0140_0001;

fn context(swtpm: &Swtpm) -> anyhow::Result<Context> {
    let tcti: TctiNameConf = swtpm.tcti().parse().context("swtpm TCTI")?;
    Context::new(tcti).context("opening the swtpm")
}

/// Persists an RSA-2048 restricted signing key (RSASSA-SHA256) at [`HCL_AK_HANDLE`] and returns
/// its `TPMT_PUBLIC`.
pub fn persist_hcl_ak(swtpm: &Swtpm) -> anyhow::Result<Vec<u8>> {
    let mut ctx = context(swtpm)?;
    let template = tpm_issuer::ak_template(tpm_issuer::AkSpec::RSA_DEFAULT)?;
    let created = ctx.execute_with_nullauth_session(|ctx| {
        ctx.create_primary(Hierarchy::Owner, template, None, None, None, None)
    })?;
    let persistent = Persistent::Persistent(PersistentTpmHandle::new(HCL_AK_HANDLE)?);
    let mut handle = ctx.execute_with_nullauth_session(|ctx| {
        ctx.evict_control(Provision::Owner, created.key_handle.into(), persistent)
    })?;
    ctx.tr_close(&mut handle)?;
    ctx.flush_context(ObjectHandle::from(created.key_handle))?;
    Ok(created.out_public.marshall()?)
}

/// Defines NV index [`HCL_REPORT_NV_INDEX`] (owner read and write, as Azure's readers use it)
/// holding `blob`.
pub fn write_hcl_report(swtpm: &Swtpm, blob: &[u8]) -> anyhow::Result<()> {
    swtpm
        .write_owner_nv(HCL_REPORT_NV_INDEX, blob)
        .context("writing the HCL report")
}

/// Persists the AK and returns the runtime data the HCL report is to bind: `runtime_data`, or
/// runtime data naming the persisted AK when `None`.
fn persist_ak_for(swtpm: &Swtpm, runtime_data: Option<Vec<u8>>) -> anyhow::Result<Vec<u8>> {
    let ak = persist_hcl_ak(swtpm)?;
    match runtime_data {
        Some(runtime) => Ok(runtime),
        None => Ok(azure_runtime_data_for_public(&ak)?),
    }
}

/// An azure-sev-snp CVM's boot on `swtpm`: the AK persisted, and an HCL report whose SEV-SNP
/// report (signed by `vcek`, with `fields` but REPORT_DATA) binds `runtime_data`, or runtime
/// data naming the persisted AK when `None`. Returns the HCL report.
pub fn boot_snp(
    swtpm: &Swtpm,
    vcek: &SimulatedSigner,
    mut fields: ReportFields,
    runtime_data: Option<Vec<u8>>,
) -> anyhow::Result<Vec<u8>> {
    let runtime = persist_ak_for(swtpm, runtime_data)?;
    fields.report_data = soft_issuer::azure::report_data_for(&runtime);
    let report = vcek.report(&fields)?;
    let blob =
        soft_issuer::azure::hcl_report(soft_issuer::azure::REPORT_TYPE_SNP, &report, &runtime);
    write_hcl_report(swtpm, &blob)?;
    Ok(blob)
}

/// An azure-tdx TD's boot on `swtpm`: the AK persisted, and an HCL report whose TD report (of a
/// TD with `td`) binds `runtime_data`, or runtime data naming the persisted AK when `None`.
/// Returns the HCL report.
pub fn boot_tdx(
    swtpm: &Swtpm,
    td: &TdFields,
    runtime_data: Option<Vec<u8>>,
) -> anyhow::Result<Vec<u8>> {
    let runtime = persist_ak_for(swtpm, runtime_data)?;
    let report = soft_issuer::tdx::td_report(td, &soft_issuer::azure::report_data_for(&runtime));
    let blob =
        soft_issuer::azure::hcl_report(soft_issuer::azure::REPORT_TYPE_TDX, &report, &runtime);
    write_hcl_report(swtpm, &blob)?;
    Ok(blob)
}

/// How the quote service stand-in answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuoteFault {
    /// A quote of the report it was sent.
    None,
    /// This HTTP status, with a short text body.
    Status(u16),
    /// Nothing: the request is held until the stand-in stops.
    Hang,
    /// 200 with a body that is not the quote JSON.
    Garbage,
}

struct QuoteState {
    machine: Arc<TdxMachine>,
    version: QuoteVersion,
    fault: Mutex<QuoteFault>,
    requests: AtomicUsize,
}

/// Azure's quote service on loopback, plain HTTP as IMDS is, on its own thread and runtime so
/// that synchronous tests can use it too. Stops when dropped.
pub struct QuoteServiceStandin {
    addr: SocketAddr,
    state: Arc<QuoteState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for QuoteServiceStandin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuoteServiceStandin")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl QuoteServiceStandin {
    /// Quotes with `machine`'s quoting enclave in `version`.
    pub fn start(machine: Arc<TdxMachine>, version: QuoteVersion) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(QuoteState {
            machine,
            version,
            fault: Mutex::new(QuoteFault::None),
            requests: AtomicUsize::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = state.clone();
        let thread = std::thread::Builder::new()
            .name("quote-standin".to_owned())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(serve(listener, serving, stopped));
            })?;
        Ok(QuoteServiceStandin {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The URL a client posts to, as `http://169.254.169.254/acc/tdquote` on Azure.
    pub fn url(&self) -> String {
        format!("http://{}/acc/tdquote", self.addr)
    }

    pub fn set_fault(&self, fault: QuoteFault) {
        *self.state.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// How many requests reached it.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }
}

impl Drop for QuoteServiceStandin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<QuoteState>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                connections.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }
    }
    connections.abort_all();
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

async fn answer(
    state: Arc<QuoteState>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let fault = *state.fault.lock().unwrap_or_else(|e| e.into_inner());
    match fault {
        QuoteFault::None => {}
        QuoteFault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Ok(reply(status, format!("simulated IMDS failure {code}")));
        }
        QuoteFault::Hang => std::future::pending::<()>().await,
        QuoteFault::Garbage => return Ok(reply(StatusCode::OK, "<html>not json</html>")),
    }
    if req.method() != hyper::Method::POST || req.uri().path() != "/acc/tdquote" {
        return Ok(reply(StatusCode::NOT_FOUND, "no such path"));
    }
    let Ok(body) = Limited::new(req.into_body(), 16 * 1024).collect().await else {
        return Ok(reply(StatusCode::BAD_REQUEST, "unreadable body"));
    };
    Ok(match quote_for(&state, &body.to_bytes()) {
        Ok(quote) => reply(
            StatusCode::OK,
            serde_json::json!({ "quote": quote }).to_string(),
        ),
        Err(reason) => reply(StatusCode::BAD_REQUEST, reason),
    })
}

/// The quote (base64url, unpadded) of the TD report in a `{"report"}` request.
fn quote_for(state: &QuoteState, body: &[u8]) -> Result<String, String> {
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let request: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let report = request["report"].as_str().ok_or("no \"report\" string")?;
    let report = b64url
        .decode(report)
        .map_err(|e| format!("report is not base64url: {e}"))?;
    let (td, report_data) =
        soft_issuer::tdx::parse_td_report(&report, state.version).map_err(|e| e.to_string())?;
    let quote = state
        .machine
        .quote(&td, &report_data)
        .map_err(|e| e.to_string())?;
    Ok(b64url.encode(quote))
}
