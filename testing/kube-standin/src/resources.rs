//! The resources the stand-in serves, how their URLs parse, and the verbs on them.
//!
//! One table ([`RESOURCES`]) says what exists: the core Secrets, ConfigMaps, Events and Nodes
//! (lists filtered by `labelSelector`, see [`crate::selector`]), and the two
//! Constellation custom resources token-issuer uses (`NodeVersion`, `JoiningNode` in
//! `update.edgeless.systems/v1alpha1`, cluster-scoped). Every resource gets the same verbs with
//! the real server's semantics: get, list, create (409 `AlreadyExists`), delete (with
//! `uid`/`resourceVersion` preconditions, 409 `Conflict` when stale), and patch (server-side apply
//! and JSON merge patch, see [`crate::apply`]). Server-set metadata (`uid`, `resourceVersion`,
//! `creationTimestamp`, `generation` for custom resources) is filled in as the apiserver does.

use serde_json::{Map, Value, json};

use crate::secrets::{self, is_dns1123_subdomain};
use crate::selector::Selector;
use crate::status::{self, Cause, Failure};
use crate::store::Store;

/// One served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural (the URL segment and the RBAC resource).
    pub plural: &'static str,
    /// Singular name, for discovery.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl Resource {
    /// `group/version`, or just `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn custom(&self) -> bool {
        !self.group.is_empty()
    }

    fn discovery(&self) -> Value {
        json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        })
    }
}

/// Constellation's API group for node lifecycle objects.
pub const EDGELESS_GROUP: &str = "update.edgeless.systems";

/// Core Secrets.
pub(crate) const SECRETS: Resource = Resource {
    group: "",
    version: "v1",
    plural: "secrets",
    singular: "secret",
    kind: "Secret",
    namespaced: true,
};

/// Everything the stand-in serves.
pub(crate) const RESOURCES: &[Resource] = &[
    SECRETS,
    Resource {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
    },
    Resource {
        group: EDGELESS_GROUP,
        version: "v1alpha1",
        plural: "nodeversions",
        singular: "nodeversion",
        kind: "NodeVersion",
        namespaced: false,
    },
    Resource {
        group: EDGELESS_GROUP,
        version: "v1alpha1",
        plural: "joiningnodes",
        singular: "joiningnode",
        kind: "JoiningNode",
        namespaced: false,
    },
];

/// `/api/v1` or `/apis/{group}/{version}` discovery document, if the group/version is served.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(Resource::discovery)
        .collect();
    if served.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": served}),
    )
}

/// `/apis`: the non-core groups.
pub(crate) fn group_list() -> Value {
    let mut groups: Vec<Value> = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.custom()) {
        let gv = r.api_version();
        if !groups.iter().any(|g| g["name"] == r.group) {
            groups.push(json!({"name": r.group,
                "versions": [{"groupVersion": gv, "version": r.version}],
                "preferredVersion": {"groupVersion": gv, "version": r.version}}));
        }
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// A parsed resource URL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    pub resource: &'static Resource,
    /// `None`: cluster-scoped, or a namespaced resource across all namespaces.
    pub namespace: Option<&'a str>,
    /// `""` for collection requests.
    pub name: &'a str,
}

/// Parses `/api/v1/...` and `/apis/{group}/{version}/...` resource paths. `None` means no such
/// resource (the real server's 404 "the server could not find the requested resource").
pub(crate) fn parse(path: &str) -> Option<Target<'_>> {
    let (group, version, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        ("", "v1", rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let (g, v, rest) = (parts.next()?, parts.next()?, parts.next()?);
        (g, v, rest)
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let (namespace, plural, name) = match segments.as_slice() {
        ["namespaces", ns, res] if !ns.is_empty() => (Some(*ns), *res, ""),
        ["namespaces", ns, res, name] if !ns.is_empty() && !name.is_empty() => {
            (Some(*ns), *res, *name)
        }
        [res] => (None, *res, ""),
        [res, name] if !name.is_empty() => (None, *res, *name),
        _ => return None,
    };
    let resource = RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)?;
    // A cluster-scoped resource has no namespaced URL; a namespaced one has no cluster-scoped
    // named URL (only the all-namespaces collection).
    if (namespace.is_some() && !resource.namespaced)
        || (namespace.is_none() && resource.namespaced && !name.is_empty())
    {
        return None;
    }
    Some(Target {
        resource,
        namespace,
        name,
    })
}

/// The store's namespace key for a target (`""` for cluster-scoped objects).
pub(crate) fn ns_key<'a>(t: &Target<'a>) -> &'a str {
    t.namespace.unwrap_or("")
}

/// GET of one object.
pub(crate) fn get(store: &Store, t: &Target<'_>) -> Result<Value, Failure> {
    store
        .get(t.resource.plural, ns_key(t), t.name)
        .cloned()
        .ok_or_else(|| status::not_found(t.resource.group, t.resource.plural, t.name))
}

/// GET of a collection, of the objects `selector` matches.
pub(crate) fn list(store: &Store, t: &Target<'_>, selector: &Selector) -> Value {
    let items: Vec<Value> = store
        .list(t.resource.plural, t.namespace)
        .into_iter()
        .filter(|v| selector.matches(v))
        .map(|mut v| {
            // List items carry no kind/apiVersion on the wire.
            if let Some(o) = v.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            v
        })
        .collect();
    json!({"kind": format!("{}List", t.resource.kind), "apiVersion": t.resource.api_version(),
           "metadata": {"resourceVersion": store.revision()}, "items": items})
}

/// Checks a decoded body's `kind`/`apiVersion` against the URL's resource.
pub(crate) fn check_type(obj: &Map<String, Value>, r: &Resource) -> Result<(), Failure> {
    let api_version = r.api_version();
    for (field, want) in [("kind", r.kind), ("apiVersion", api_version.as_str())] {
        match obj.get(field) {
            None => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return Err(status::bad_request(format!(
                    "the {field} in the data ({other}) does not match the expected {field} ({want})"
                )));
            }
        }
    }
    Ok(())
}

/// Decodes a request body as a JSON object of the URL's resource type.
pub(crate) fn decode_object(r: &Resource, body: &[u8]) -> Result<Map<String, Value>, Failure> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        status::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let Value::Object(obj) = value else {
        return Err(status::bad_request(
            "couldn't get version/kind; json parse error: expected a JSON object".into(),
        ));
    };
    check_type(&obj, r)?;
    Ok(obj)
}

/// Takes `metadata` out of a new object: checks its namespace against the URL's (cleared for
/// cluster-scoped kinds) and resolves the name, from `generateName` plus `suffix()` if unset.
pub(crate) fn take_metadata(
    r: &Resource,
    obj: &mut Map<String, Value>,
    ns: Option<&str>,
    suffix: impl FnOnce() -> String,
) -> Result<(Map<String, Value>, String), Failure> {
    let mut meta = match obj.remove("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(status::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: json: cannot unmarshal into Go struct field {kind}.metadata of type v1.ObjectMeta",
                kind = r.kind,
                version = r.version,
            )));
        }
    };
    let given_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    match ns {
        Some(ns) if !given_ns.is_empty() && given_ns != ns => {
            return Err(status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        // The apiserver clears a namespace sent for a cluster-scoped object.
        None => {
            meta.remove("namespace");
        }
        Some(_) => {}
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if name.is_empty() {
        if let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
        {
            name = format!("{prefix}{}", suffix());
        }
    }
    Ok((meta, name))
}

/// Decodes a create body for a resource other than Secrets.
fn decode_create(
    r: &Resource,
    body: &[u8],
    ns: Option<&str>,
    suffix: impl FnOnce() -> String,
) -> Result<(String, Map<String, Value>), Failure> {
    let mut obj = decode_object(r, body)?;
    let (mut meta, name) = take_metadata(r, &mut obj, ns, suffix)?;
    validate_name(r, &name)?;
    if r.plural == "configmaps" {
        for field in ["data", "binaryData"] {
            if let Some(data) = obj.get(field) {
                let ok = data.is_null()
                    || data
                        .as_object()
                        .is_some_and(|m| m.values().all(Value::is_string));
                if !ok {
                    return Err(status::bad_request(format!(
                        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal into Go struct field ConfigMap.{field} of type map[string]string"
                    )));
                }
            }
        }
    }
    if r.plural == "events" {
        validate_event(&obj, ns.unwrap_or(""), &name)?;
    }
    // Custom resources with a status subresource ignore status on create.
    if r.custom() {
        obj.remove("status");
    }
    meta.insert("name".into(), json!(name));
    if let Some(ns) = ns {
        meta.insert("namespace".into(), json!(ns));
    }
    let mut object = Map::new();
    object.insert("kind".into(), json!(r.kind));
    object.insert("apiVersion".into(), json!(r.api_version()));
    object.insert("metadata".into(), Value::Object(meta));
    for (k, v) in obj {
        if k != "kind" && k != "apiVersion" {
            object.insert(k, v);
        }
    }
    Ok((name, object))
}

/// The API server's create-time validation of a core/v1 Event (`ValidateEventCreate`): a
/// cluster-scoped involved object (no namespace) fits only events in `default`, or, for events
/// with an `eventTime` (the new-style events), also in `kube-system`; an involved object's
/// namespace must otherwise be the event's own. New-style events also need their reporting
/// component and instance, an action and a reason.
fn validate_event(obj: &Map<String, Value>, ns: &str, name: &str) -> Result<(), Failure> {
    let text = |path: &str| {
        obj.get(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let involved_ns = obj
        .get("involvedObject")
        .and_then(|o| o.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let new_style = obj.get("eventTime").is_some_and(|t| !t.is_null());
    let mut causes = Vec::new();
    let namespace_ok = match (involved_ns.is_empty(), new_style) {
        (true, false) => ns.is_empty() || ns == "default",
        (true, true) => ns == "default" || ns == "kube-system",
        (false, _) => involved_ns == ns,
    };
    if !namespace_ok {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: \"{involved_ns}\": does not match event.namespace"),
            field: "involvedObject.namespace".into(),
        });
    }
    if new_style {
        for (field, path) in [
            ("reportingComponent", "reportingComponent"),
            ("reportingInstance", "reportingInstance"),
            ("action", "action"),
            ("reason", "reason"),
        ] {
            if text(path).is_empty() {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    message: "Required value".into(),
                    field: field.into(),
                });
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(status::invalid("", "Event", name, causes))
    }
}

/// Object names of every served resource are DNS-1123 subdomains.
pub(crate) fn validate_name(r: &Resource, name: &str) -> Result<(), Failure> {
    let cause = if name.is_empty() {
        Cause {
            reason: "FieldValueRequired",
            message: "Required value: name or generateName is required".into(),
            field: "metadata.name".into(),
        }
    } else if !is_dns1123_subdomain(name) {
        Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
            field: "metadata.name".into(),
        }
    } else {
        return Ok(());
    };
    Err(status::invalid(r.group, r.kind, name, vec![cause]))
}

/// Fills the metadata the server sets on every new object.
pub(crate) fn stamp_new(r: &Resource, object: &mut Map<String, Value>, revision: String) {
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        meta.insert("uid".into(), json!(crate::server::uuid()));
        meta.insert("resourceVersion".into(), json!(revision));
        meta.insert(
            "creationTimestamp".into(),
            json!(crate::server::now_rfc3339()),
        );
        if r.custom() {
            meta.insert("generation".into(), json!(1));
        }
    }
}

/// POST of a new object.
pub(crate) fn create(
    store: &mut Store,
    t: &Target<'_>,
    body: &[u8],
    suffix: impl FnOnce() -> String,
) -> Result<Value, Failure> {
    let r = t.resource;
    let ns = t.namespace;
    if let Some(ns) = ns {
        if !store.namespace_exists(ns) {
            return Err(status::not_found("", "namespaces", ns));
        }
    }
    let (name, mut object) = if r.plural == "secrets" {
        let secret = secrets::decode_create(body, ns.unwrap_or(""), suffix)?;
        (secret.name, secret.object)
    } else {
        decode_create(r, body, ns, suffix)?
    };
    let ns_key = ns.unwrap_or("");
    if store.get(r.plural, ns_key, &name).is_some() {
        return Err(status::already_exists(r.group, r.plural, &name));
    }
    let revision = store.next_revision();
    stamp_new(r, &mut object, revision);
    let object = Value::Object(object);
    store.insert(r.plural, ns_key, &name, object.clone());
    Ok(object)
}

/// `metav1.DeleteOptions.preconditions`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<Preconditions>,
}

/// DELETE of one object, honouring `uid` and `resourceVersion` preconditions in the body.
pub(crate) fn delete(store: &mut Store, t: &Target<'_>, body: &[u8]) -> Result<Value, Failure> {
    let r = t.resource;
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            status::bad_request(format!(
                "couldn't decode DeleteOptions: json parse error: {e}"
            ))
        })?
    };
    let current = get(store, t)?;
    if let Some(p) = options.preconditions {
        let meta = |field: &str| {
            current
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        if let Some(uid) = p.uid.filter(|u| *u != meta("uid")) {
            return Err(status::conflict(
                r.group,
                r.plural,
                t.name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta("uid")
                ),
            ));
        }
        if let Some(rv) = p.resource_version.filter(|v| *v != meta("resourceVersion")) {
            return Err(status::conflict(
                r.group,
                r.plural,
                t.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta("resourceVersion")
                ),
            ));
        }
    }
    store.remove(r.plural, ns_key(t), t.name);
    store.next_revision();
    let uid = current
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // Custom resources answer with the deleted object, core ones with a Success Status.
    if r.custom() {
        Ok(current)
    } else {
        serde_json::to_value(status::deleted(r.group, r.plural, t.name, uid))
            .map_err(|e| status::for_code(500, &e.to_string()))
    }
}

/// Stores `object` as if created through the API, for test seeding. Returns the stored object.
pub(crate) fn seed(
    store: &mut Store,
    r: &'static Resource,
    mut object: Value,
) -> Result<Value, Failure> {
    let Some(map) = object.as_object_mut() else {
        return Err(status::bad_request("expected a JSON object".into()));
    };
    let ns = map
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let body = serde_json::to_vec(map).map_err(|e| status::bad_request(e.to_string()))?;
    if r.namespaced && ns.is_none() {
        return Err(status::bad_request(format!(
            "{} objects need metadata.namespace",
            r.kind
        )));
    }
    let status = map.get("status").cloned();
    let t = Target {
        resource: r,
        namespace: if r.namespaced { ns.as_deref() } else { None },
        name: "",
    };
    // Seeding writes as etcd would: it stands for objects others created.
    let mut stored = create(store, &t, &body, || "seed0".to_owned())?;
    // A create drops a custom resource's status; a seeded object stands for one whose
    // controller has written its status as well.
    if let (Some(status), Some(map)) = (status, stored.as_object_mut()) {
        map.insert("status".into(), status);
        let name = map
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let ns_key = if r.namespaced { ns.as_deref() } else { None };
        store.insert(r.plural, ns_key.unwrap_or(""), &name, stored.clone());
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_about_nodes_are_validated_like_the_apiserver() {
        let event = |extra: Value| {
            let mut e = json!({"involvedObject": {"kind": "Node", "name": "cp-1"}, "reason": "R"});
            if let (Some(e), Value::Object(extra)) = (e.as_object_mut(), extra) {
                e.extend(extra);
            }
            e.as_object().cloned().unwrap_or_default()
        };
        let new_style = json!({"eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingComponent": "a/b", "reportingInstance": "pod", "action": "A"});
        // An old-style event about a cluster-scoped object belongs in default only.
        let old = validate_event(&event(json!({})), "kube-system", "e").unwrap_err();
        assert_eq!(old.status.code, 422);
        assert!(
            old.status.message.contains(
                "involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
            ),
            "{}",
            old.status.message
        );
        validate_event(&event(json!({})), "default", "e").unwrap();
        // A new-style one may live in kube-system, and needs its reporting fields.
        validate_event(&event(new_style.clone()), "kube-system", "e").unwrap();
        let missing = validate_event(
            &event(json!({"eventTime": "2026-01-01T00:00:00.000000Z"})),
            "kube-system",
            "e",
        )
        .unwrap_err();
        assert!(
            missing
                .status
                .message
                .contains("reportingComponent: Required value"),
            "{}",
            missing.status.message
        );
        assert!(validate_event(&event(new_style), "other", "e").is_err());
    }

    #[test]
    fn paths_parse_like_the_apiserver_routes() {
        let t = parse("/apis/update.edgeless.systems/v1alpha1/joiningnodes/control-plane").unwrap();
        assert_eq!(
            (t.resource.kind, t.namespace, t.name),
            ("JoiningNode", None, "control-plane")
        );
        let t = parse("/api/v1/namespaces/kube-system/configmaps/c").unwrap();
        assert_eq!(
            (t.resource.kind, t.namespace, t.name),
            ("ConfigMap", Some("kube-system"), "c")
        );
        assert!(parse("/api/v1/secrets").is_some());
        assert!(parse("/api/v1/secrets/x").is_none());
        assert!(
            parse("/apis/update.edgeless.systems/v1alpha1/namespaces/a/joiningnodes").is_none()
        );
        assert!(parse("/apis/update.edgeless.systems/v1/joiningnodes").is_none());
        assert!(parse("/api/v1/namespaces/a/pods").is_none());
    }
}
