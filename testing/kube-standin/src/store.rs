//! The object store: what the apiserver would keep in etcd.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stored object, as tests and the admin endpoint see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredObject {
    /// Resource (plural), e.g. `secrets`.
    pub resource: String,
    /// Namespace (`None` for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
    /// The full object as the server returns it on GET.
    pub object: Value,
}

impl StoredObject {
    /// A Secret's `type`.
    pub fn secret_type(&self) -> Option<&str> {
        self.object.get("type").and_then(Value::as_str)
    }

    /// A Secret's decoded `data[key]`.
    pub fn secret_data(&self, key: &str) -> Option<Vec<u8>> {
        let encoded = self.object.get("data")?.get(key)?.as_str()?;
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
    }

    /// A Secret's `data[key]` as UTF-8.
    pub fn secret_string(&self, key: &str) -> Option<String> {
        String::from_utf8(self.secret_data(key)?).ok()
    }

    /// The keys of a Secret's `data`.
    pub fn secret_keys(&self) -> Vec<String> {
        self.object
            .get("data")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

type Key = (String, String, String);

/// A field path inside an object, e.g. `["spec", "deadline"]`.
pub(crate) type FieldPath = Vec<String>;

/// Objects by (resource, namespace, name), existing namespaces and the resourceVersion clock.
/// Cluster-scoped objects live under the namespace `""`.
#[derive(Debug)]
pub(crate) struct Store {
    objects: BTreeMap<Key, Value>,
    /// Server-side apply's field ownership: which manager owns each leaf field of an object.
    owners: BTreeMap<Key, BTreeMap<FieldPath, String>>,
    namespaces: BTreeSet<String>,
    revision: u64,
}

impl Store {
    pub(crate) fn new(namespaces: impl IntoIterator<Item = String>) -> Self {
        Self {
            objects: BTreeMap::new(),
            owners: BTreeMap::new(),
            namespaces: namespaces.into_iter().collect(),
            revision: 1,
        }
    }

    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces.contains(ns)
    }

    pub(crate) fn next_revision(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    pub(crate) fn revision(&self) -> String {
        self.revision.to_string()
    }

    fn key(resource: &str, ns: &str, name: &str) -> Key {
        (resource.to_owned(), ns.to_owned(), name.to_owned())
    }

    pub(crate) fn get(&self, resource: &str, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&Self::key(resource, ns, name))
    }

    pub(crate) fn insert(&mut self, resource: &str, ns: &str, name: &str, object: Value) {
        self.objects.insert(Self::key(resource, ns, name), object);
    }

    pub(crate) fn remove(&mut self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let key = Self::key(resource, ns, name);
        self.owners.remove(&key);
        self.objects.remove(&key)
    }

    /// The field owners of an object (empty if none recorded).
    pub(crate) fn owners(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
    ) -> BTreeMap<FieldPath, String> {
        self.owners
            .get(&Self::key(resource, ns, name))
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn set_owners(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        owners: BTreeMap<FieldPath, String>,
    ) {
        self.owners.insert(Self::key(resource, ns, name), owners);
    }

    /// Objects of `resource`, in one namespace or (with `None`) all of them.
    pub(crate) fn list(&self, resource: &str, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, n, _), _)| r == resource && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub(crate) fn snapshot(&self) -> Vec<StoredObject> {
        self.objects
            .iter()
            .map(|((resource, ns, name), object)| StoredObject {
                resource: resource.clone(),
                namespace: (!ns.is_empty()).then(|| ns.clone()),
                name: name.clone(),
                object: object.clone(),
            })
            .collect()
    }
}
