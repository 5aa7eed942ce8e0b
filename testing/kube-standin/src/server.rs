//! The HTTP side: authentication, fault injection, routing to resource handlers.
//!
//! The order follows kube-apiserver's filter chain: authentication (401), then (like API
//! Priority and Fairness) injected faults and delay, then authorization (403), then the handler.
//! `/livez`, `/readyz` and `/healthz` are open as with kubeadm's anonymous-auth endpoint
//! allow-list; every other request needs a known bearer token (anonymous auth off).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::faults::{Fault, Faults};
use crate::rbac::{Attributes, User};
use crate::selector::Selector;
use crate::status::{self, Failure};
use crate::store::{Store, StoredObject};
use crate::{ADMIN_PREFIX, apply, resources};

/// The apiserver's request body limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// One request as the stand-in answered it, for tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without query.
    pub path: String,
    /// Authenticated user name, if any.
    pub user: Option<String>,
    /// HTTP status code sent.
    pub code: u16,
}

/// Shared state of one running stand-in.
#[derive(Debug)]
pub(crate) struct State {
    pub users: Vec<User>,
    pub admin_api: bool,
    pub server_address: String,
    pub store: Mutex<Store>,
    pub faults: Mutex<Faults>,
    pub log: Mutex<Vec<RequestRecord>>,
}

/// Locks a mutex; a panic elsewhere while holding it does not make the data unusable here.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Resp = Response<Full<Bytes>>;

fn json_response(code: u16, body: &impl Serialize, extra: &[(&'static str, String)]) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache, private"),
    );
    for (name, value) in extra {
        if let Ok(v) = header::HeaderValue::from_str(value) {
            h.insert(*name, v);
        }
    }
    resp
}

fn fail(f: Failure) -> Resp {
    json_response(f.code(), &f.status, &f.headers)
}

fn text(code: StatusCode, body: &'static str) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// hyper service entry point.
pub(crate) async fn service(state: Arc<State>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let (user, resp) = handle(&state, req).await;
    lock(&state.log).push(RequestRecord {
        method,
        path,
        user,
        code: resp.status().as_u16(),
    });
    Ok(resp)
}

async fn handle(state: &State, req: Request<Incoming>) -> (Option<String>, Resp) {
    let path = req.uri().path().to_owned();
    if matches!(path.as_str(), "/livez" | "/readyz" | "/healthz") && req.method() == Method::GET {
        return (None, text(StatusCode::OK, "ok"));
    }
    if state.admin_api && path.starts_with(ADMIN_PREFIX) {
        return (None, admin(state, req).await);
    }
    let Some(user) = authenticate(&state.users, req.headers()) else {
        return (None, fail(status::unauthorized()));
    };
    let name = Some(user.name.clone());

    let (delay, fault) = {
        let mut faults = lock(&state.faults);
        (faults.delay, faults.take(req.method().as_str(), &path))
    };
    let delay = delay
        + fault
            .as_ref()
            .map_or(Duration::ZERO, |f| Duration::from_millis(f.delay_millis));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let fault = fault.filter(|f| f.code != 0);
    if let Some(f) = fault.as_ref().filter(|f| !f.after_commit) {
        return (name, fail(status::for_code(f.code, "injected fault")));
    }
    let resp = dispatch(state, user, req).await;
    if let Some(f) = fault {
        return (
            name,
            fail(status::for_code(f.code, "injected fault after commit")),
        );
    }
    (name, resp)
}

fn authenticate<'a>(users: &'a [User], headers: &HeaderMap) -> Option<&'a User> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    users
        .iter()
        .find(|u| !u.token.is_empty() && u.token == token)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Failure> {
    Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|_| status::too_large())
}

async fn dispatch(state: &State, user: &User, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    match path.as_str() {
        "/version" => return json_response(200, &version(), &[]),
        "/api" => {
            return json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.server_address}]}),
                &[],
            );
        }
        "/apis" => return json_response(200, &resources::group_list(), &[]),
        _ => {}
    }
    if let Some(list) = discovery_path(&path).and_then(|(g, v)| resources::resource_list(g, v)) {
        return json_response(200, &list, &[]);
    }
    if !path.starts_with("/api/") && !path.starts_with("/apis/") {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    let Some(target) = resources::parse(&path) else {
        return fail(status::no_such_resource());
    };
    let method = req.method().clone();
    let named = !target.name.is_empty();
    let query = req.uri().query().map(str::to_owned);
    let verb = match (&method, named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) => {
            let watch = query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch { "watch" } else { "list" }
        }
        (&Method::POST, false) => "create",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        _ => return fail(status::method_not_allowed()),
    };
    let resource = target.resource;
    let attrs = Attributes {
        verb,
        api_group: resource.group,
        resource: resource.plural,
        namespace: target.namespace,
        name: target.name,
    };
    if let Err(reason) = user.authorize(&attrs) {
        return fail(status::forbidden(
            resource.group,
            resource.plural,
            target.name,
            &reason,
        ));
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    // Namespaced objects are created and changed only through their namespace's URL.
    if resource.namespaced && target.namespace.is_none() && !matches!(verb, "list" | "watch") {
        return fail(status::method_not_allowed());
    }
    let body = match verb {
        "create" | "delete" | "patch" => match read_body(req).await {
            Ok(b) => b,
            Err(f) => return fail(f),
        },
        _ => Bytes::new(),
    };
    let result = match verb {
        "get" => resources::get(&lock(&state.store), &target).map(|o| (200, o)),
        "list" => match Selector::from_query(query.as_deref()) {
            Ok(selector) => Ok((
                200,
                resources::list(&lock(&state.store), &target, &selector),
            )),
            Err(why) => Err(status::bad_request(why)),
        },
        "create" => resources::create(&mut lock(&state.store), &target, &body, random_suffix)
            .map(|o| (201, o)),
        "delete" => resources::delete(&mut lock(&state.store), &target, &body).map(|o| (200, o)),
        "patch" => {
            let opts = apply::PatchOptions::from_query(query.as_deref());
            match content_type.as_str() {
                "application/apply-patch+yaml" => {
                    apply::apply(&mut lock(&state.store), &target, &body, &opts)
                }
                "application/merge-patch+json" => {
                    apply::merge_patch(&mut lock(&state.store), &target, &body, &opts)
                        .map(|o| (200, o))
                }
                // JSON patch and strategic merge patch are not needed by anything this
                // stand-in serves; saying so beats pretending.
                _ => Err(status::unsupported_media_type()),
            }
        }
        // watch, update and deletecollection: not used by the join service.
        _ => Err(status::method_not_allowed()),
    };
    match result {
        Ok((code, object)) => json_response(code, &object, &[]),
        Err(f) => fail(f),
    }
}

/// `(group, version)` of a discovery path: `/api/v1` or `/apis/{group}/{version}`.
fn discovery_path(path: &str) -> Option<(&str, &str)> {
    if path == "/api/v1" {
        return Some(("", "v1"));
    }
    let rest = path.strip_prefix("/apis/")?;
    let (group, version) = rest.split_once('/')?;
    (!version.contains('/') && !version.is_empty()).then_some((group, version))
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "31", "gitVersion": "v1.31.0",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
        "compiler": "gc", "platform": "linux/amd64"
    })
}

pub(crate) fn uuid() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The five characters the apiserver appends to `generateName`.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| {
            let i = (rng.next_u32() as usize) % ALPHABET.len();
            char::from(ALPHABET.get(i).copied().unwrap_or(b'x'))
        })
        .collect()
}

pub(crate) fn now_rfc3339() -> String {
    let f = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::now_utc()
        .format(&f)
        .unwrap_or_default()
}

/// Test-only control endpoints under [`ADMIN_PREFIX`], served only when enabled.
async fn admin(state: &State, req: Request<Incoming>) -> Resp {
    #[derive(Deserialize)]
    struct Delay {
        millis: u64,
    }
    let path = req.uri().path().to_owned();
    let sub = path.strip_prefix(ADMIN_PREFIX).unwrap_or_default();
    match (req.method().clone(), sub) {
        (Method::GET, "objects") => {
            let objects: Vec<StoredObject> = lock(&state.store).snapshot();
            json_response(200, &objects, &[])
        }
        (Method::POST, "objects") => match read_body(req)
            .await
            .map(|b| serde_json::from_slice::<Value>(&b))
        {
            Ok(Ok(object)) => match seed(state, object) {
                Ok(stored) => json_response(201, &stored, &[]),
                Err(f) => fail(f),
            },
            _ => fail(status::bad_request(
                "expected an object with apiVersion and kind".into(),
            )),
        },
        (Method::GET, "requests") => {
            let log = lock(&state.log).clone();
            json_response(200, &log, &[])
        }
        (Method::POST, "faults") => match read_body(req)
            .await
            .map(|b| serde_json::from_slice::<Fault>(&b))
        {
            Ok(Ok(fault)) => {
                lock(&state.faults).push(fault);
                json_response(200, &json!({}), &[])
            }
            _ => fail(status::bad_request("expected a Fault object".into())),
        },
        (Method::PUT, "delay") => match read_body(req)
            .await
            .map(|b| serde_json::from_slice::<Delay>(&b))
        {
            Ok(Ok(d)) => {
                lock(&state.faults).delay = Duration::from_millis(d.millis);
                json_response(200, &json!({}), &[])
            }
            _ => fail(status::bad_request("expected {\"millis\": N}".into())),
        },
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Stores a test fixture object as if a cluster admin had created it; its `kind` picks the
/// resource.
pub(crate) fn seed(state: &State, object: Value) -> Result<Value, Failure> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let resource = resources::RESOURCES
        .iter()
        .find(|r| r.kind == kind)
        .ok_or_else(|| status::bad_request(format!("the stand-in serves no kind {kind:?}")))?;
    resources::seed(&mut lock(&state.store), resource, object)
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_has_v4_shape() {
        let u = super::uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
