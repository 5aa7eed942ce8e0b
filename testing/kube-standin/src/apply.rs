//! PATCH: server-side apply (`application/apply-patch+yaml`) and JSON merge patch.
//!
//! Server-side apply is modelled at the granularity of leaf fields (lists are atomic): every leaf
//! an apply sets is owned by its `fieldManager`. Changing a leaf another manager owns is a 409
//! `Conflict` naming the manager and field, unless `force=true`, which takes ownership. Leaves a
//! manager applied before and leaves out now are removed, as the real merge does. Applying to a
//! missing object creates it (authorized as `patch`, as on a real server).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::resources::{self, Target};
use crate::status::{self, Cause, Failure};
use crate::store::{FieldPath, Store};

/// What the query string says about a PATCH.
#[derive(Clone, Debug, Default)]
pub(crate) struct PatchOptions {
    pub field_manager: Option<String>,
    pub force: bool,
}

impl PatchOptions {
    pub(crate) fn from_query(query: Option<&str>) -> Self {
        let mut o = Self::default();
        for kv in query.unwrap_or("").split('&') {
            match kv.split_once('=') {
                Some(("fieldManager", v)) if !v.is_empty() => o.field_manager = Some(v.to_owned()),
                Some(("force", v)) => o.force = v == "true" || v == "1",
                _ => {}
            }
        }
        o
    }
}

/// Metadata fields the server owns; never part of field ownership.
const SERVER_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "generateName",
];

/// The leaf fields of an applied object that a manager would own.
fn leaves(obj: &Map<String, Value>) -> BTreeMap<FieldPath, Value> {
    fn walk(path: &mut FieldPath, v: &Value, out: &mut BTreeMap<FieldPath, Value>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, v) in m {
                    path.push(k.clone());
                    walk(path, v, out);
                    path.pop();
                }
            }
            other => {
                out.insert(path.clone(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        if k == "kind" || k == "apiVersion" || k == "status" {
            continue;
        }
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for (mk, mv) in meta {
                    if !SERVER_META.contains(&mk.as_str()) {
                        walk(&mut vec!["metadata".into(), mk.clone()], mv, &mut out);
                    }
                }
            }
            continue;
        }
        walk(&mut vec![k.clone()], v, &mut out);
    }
    out
}

fn dotted(path: &FieldPath) -> String {
    format!(".{}", path.join("."))
}

fn lookup<'a>(obj: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(k))
}

fn set(obj: &mut Value, path: &FieldPath, value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for k in parents {
        if !cur.get(k).is_some_and(Value::is_object) {
            if let Some(m) = cur.as_object_mut() {
                m.insert(k.clone(), json!({}));
            }
        }
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.insert(last.clone(), value);
    }
}

fn unset(obj: &mut Value, path: &FieldPath) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn parse_body(body: &[u8]) -> Result<Map<String, Value>, Failure> {
    // YAML is a superset of JSON: kubectl sends YAML, kube-rs and client-go send JSON. JSON
    // goes through the JSON parser first, which is several times cheaper than the YAML one
    // (this runs under the store's lock, once per join in a storm); whatever it refuses is
    // parsed as YAML. Valid JSON means the same to both, except a duplicate key: the JSON
    // parser keeps the last, as the API server does at its default field validation (Warn).
    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(_) => serde_yaml::from_slice(body)
            .map_err(|e| status::bad_request(format!("error decoding YAML: {e}")))?,
    };
    match value {
        Value::Object(m) => Ok(m),
        _ => Err(status::bad_request(
            "error decoding patch: expected an object".into(),
        )),
    }
}

fn bump(store: &mut Store, object: &mut Value, spec_changed: bool, custom: bool) {
    let revision = store.next_revision();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), json!(revision));
        if custom && spec_changed {
            let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
            meta.insert("generation".into(), json!(generation + 1));
        }
    }
}

/// Server-side apply. Returns the HTTP code (201 created, 200 updated) and the object.
pub(crate) fn apply(
    store: &mut Store,
    t: &Target<'_>,
    body: &[u8],
    opts: &PatchOptions,
) -> Result<(u16, Value), Failure> {
    let r = t.resource;
    let Some(manager) = opts.field_manager.clone() else {
        return Err(status::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            vec![Cause {
                reason: "FieldValueRequired",
                message: "Required value: is required for apply patch".into(),
                field: "fieldManager".into(),
            }],
        ));
    };
    let applied = parse_body(body)?;
    resources::check_type(&applied, r)?;
    for field in ["kind", "apiVersion"] {
        if !applied.get(field).is_some_and(Value::is_string) {
            return Err(status::bad_request(format!(
                "{field} must be set in an apply patch"
            )));
        }
    }
    let meta = applied.get("metadata").and_then(Value::as_object);
    let body_name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if !body_name.is_empty() && body_name != t.name {
        return Err(status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            t.name
        )));
    }
    let applied_rv = meta
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let ns = resources::ns_key(t);
    let new_leaves = leaves(&applied);

    let Some(current) = store.get(r.plural, ns, t.name).cloned() else {
        if let Some(ns) = t.namespace {
            if !store.namespace_exists(ns) {
                return Err(status::not_found("", "namespaces", ns));
            }
        }
        if applied_rv.is_some() {
            // An apply that pins a version of an object that does not exist.
            return Err(status::not_found(r.group, r.plural, t.name));
        }
        resources::validate_name(r, t.name)?;
        let mut object = json!({"kind": r.kind, "apiVersion": r.api_version(),
                                "metadata": {"name": t.name}});
        if let Some(ns) = t.namespace {
            set(
                &mut object,
                &vec!["metadata".into(), "namespace".into()],
                json!(ns),
            );
        }
        let mut owners = BTreeMap::new();
        for (path, value) in new_leaves {
            set(&mut object, &path, value);
            owners.insert(path, manager.clone());
        }
        let revision = store.next_revision();
        if let Value::Object(map) = &mut object {
            resources::stamp_new(r, map, revision);
        }
        store.insert(r.plural, ns, t.name, object.clone());
        store.set_owners(r.plural, ns, t.name, owners);
        return Ok((201, object));
    };

    if let Some(rv) = applied_rv {
        let have = current
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if rv != have {
            return Err(status::conflict(
                r.group,
                r.plural,
                t.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
    }
    let mut owners = store.owners(r.plural, ns, t.name);
    let conflicts: Vec<(String, String)> = new_leaves
        .iter()
        .filter_map(|(path, value)| {
            let owner = owners.get(path)?;
            (owner != &manager && lookup(&current, path) != Some(value))
                .then(|| (owner.clone(), dotted(path)))
        })
        .collect();
    if !conflicts.is_empty() && !opts.force {
        return Err(status::apply_conflict(&conflicts, &r.api_version()));
    }
    let mut object = current.clone();
    // Fields this manager applied before and has now dropped go away.
    let dropped: Vec<FieldPath> = owners
        .iter()
        .filter(|(path, owner)| **owner == manager && !new_leaves.contains_key(*path))
        .map(|(path, _)| path.clone())
        .collect();
    for path in dropped {
        unset(&mut object, &path);
        owners.remove(&path);
    }
    for (path, value) in new_leaves {
        set(&mut object, &path, value);
        owners.insert(path, manager.clone());
    }
    if object != current {
        let spec_changed = object.get("spec") != current.get("spec");
        bump(store, &mut object, spec_changed, !r.group.is_empty());
        store.insert(r.plural, ns, t.name, object.clone());
    }
    store.set_owners(r.plural, ns, t.name, owners);
    Ok((200, object))
}

fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// JSON merge patch (RFC 7386) of an existing object.
pub(crate) fn merge_patch(
    store: &mut Store,
    t: &Target<'_>,
    body: &[u8],
    opts: &PatchOptions,
) -> Result<Value, Failure> {
    let r = t.resource;
    let ns = resources::ns_key(t);
    let current = resources::get(store, t)?;
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| status::bad_request(format!("error decoding patch: {e}")))?;
    let mut object = current.clone();
    merge(&mut object, &patch);
    // Identity and server-set metadata cannot be patched away.
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
    ] {
        let path = vec!["metadata".to_owned(), field.to_owned()];
        match lookup(&current, &path) {
            Some(v) => set(&mut object, &path, v.clone()),
            None => unset(&mut object, &path),
        }
    }
    object["kind"] = json!(r.kind);
    object["apiVersion"] = json!(r.api_version());
    if object != current {
        let mut owners = store.owners(r.plural, ns, t.name);
        let manager = opts
            .field_manager
            .clone()
            .unwrap_or_else(|| "unknown".into());
        for path in leaves(object.as_object().unwrap_or(&Map::new())).into_keys() {
            if lookup(&current, &path) != lookup(&object, &path) {
                owners.insert(path, manager.clone());
            }
        }
        let spec_changed = object.get("spec") != current.get("spec");
        bump(store, &mut object, spec_changed, !r.group.is_empty());
        store.insert(r.plural, ns, t.name, object.clone());
        store.set_owners(r.plural, ns, t.name, owners);
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_skip_server_metadata_and_keep_lists_whole() {
        let obj = json!({"apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "labels": {"l": "1"}},
            "spec": {"a": [1, 2], "b": {"c": true}}});
        let l = leaves(obj.as_object().unwrap());
        let keys: Vec<String> = l.keys().map(dotted).collect();
        assert_eq!(keys, [".metadata.labels.l", ".spec.a", ".spec.b.c"]);
    }

    #[test]
    fn merge_patch_removes_nulls() {
        let mut t = json!({"a": {"b": 1, "c": 2}});
        merge(&mut t, &json!({"a": {"b": null, "d": 3}}));
        assert_eq!(t, json!({"a": {"c": 2, "d": 3}}));
    }
}
