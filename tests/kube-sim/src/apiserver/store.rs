//! The objects the server holds, as JSON, with resourceVersions, UIDs and write counters.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::claim_status;
use super::events::{Event, Events};
use super::gates::{Gates, default_slice_fields, drop_disabled_slice_fields};
use super::resources::{RESOURCE_CLAIMS, RESOURCE_SLICES, Resource};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::validate;

/// Where an object lives: resource plural, namespace (`""` when cluster scoped), name.
pub type Key = (&'static str, String, String);

/// Writes that reached one object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    /// Successful creates.
    pub creates: u64,
    /// Successful updates (PUT).
    pub updates: u64,
    /// Successful deletes.
    pub deletes: u64,
}

impl Writes {
    /// All writes together.
    pub fn total(&self) -> u64 {
        self.creates + self.updates + self.deletes
    }
}

/// The server's state.
#[derive(Debug, Default)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    resource_version: u64,
    uids: u64,
    names: u64,
    /// Writes per object, kept after the object is deleted.
    pub writes: BTreeMap<Key, Writes>,
    /// The feature gates in force.
    pub gates: Gates,
    /// Every change, for watches.
    pub events: Events,
    /// The `status.devices` entries each field manager applied, per claim.
    applied: BTreeMap<(Key, String), std::collections::BTreeSet<claim_status::DeviceKey>>,
}

const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn meta(obj: &Value, field: &str) -> Option<String> {
    obj["metadata"][field]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl Store {
    fn next_rv(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// Records a change to `obj` (stored at the current resourceVersion) for watches.
    fn record(&mut self, plural: &'static str, kind: &'static str, object: &Value) {
        let rv = self.resource_version;
        self.events.push(Event {
            rv,
            plural,
            kind,
            object: object.clone(),
        });
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    fn generated(&mut self, prefix: &str) -> String {
        self.names += 1;
        let mut n = self.names * 7919;
        let suffix: String = (0..5)
            .map(|_| {
                let c = NAME_CHARS[(n % NAME_CHARS.len() as u64) as usize] as char;
                n /= NAME_CHARS.len() as u64;
                c
            })
            .collect();
        format!("{prefix}{suffix}")
    }

    /// An empty store with these gates.
    pub fn new(gates: Gates) -> Store {
        Store {
            gates,
            ..Store::default()
        }
    }

    /// The resourceVersion of the latest change.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// The object at `key`.
    pub fn get_key(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Every object of a resource, in key order.
    pub fn all(&self, resource: &Resource) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.0 == resource.plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stores `obj` as given (a test seeding the server), filling in apiVersion, kind, uid,
    /// resourceVersion and creationTimestamp when absent. Replaces an object of the same name.
    pub fn insert(&mut self, resource: &'static Resource, mut obj: Value) -> Value {
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        if meta(&obj, "uid").is_none() {
            obj["metadata"]["uid"] = json!(self.next_uid());
        }
        if meta(&obj, "creationTimestamp").is_none() {
            obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        let ns = meta(&obj, "namespace").unwrap_or_default();
        let name = meta(&obj, "name").unwrap_or_default();
        let kind = match self
            .objects
            .insert((resource.plural, ns, name), obj.clone())
        {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.record(resource.plural, kind, &obj);
        obj
    }

    /// Removes an object without a request (a test deleting it behind the client's back);
    /// watches see it deleted.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let old = self.objects.remove(key)?;
        self.next_rv();
        self.record(key.0, "DELETED", &old);
        Some(old)
    }

    fn checks(
        &self,
        resource: &'static Resource,
        name: &str,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let invalid = |(field, why): validate::Violation| ApiError::Invalid {
            resource,
            name: name.to_string(),
            field,
            why,
        };
        validate::name(name).map_err(invalid)?;
        if std::ptr::eq(resource, &RESOURCE_SLICES) {
            validate::resource_slice(&obj["spec"]).map_err(invalid)?;
            if let Some(old) = old {
                validate::resource_slice_update(old, obj).map_err(invalid)?;
            }
        }
        Ok(())
    }

    fn type_meta(resource: &Resource, obj: &Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::BadRequest("the body is not a JSON object".into()));
        }
        if let Some(v) = obj["apiVersion"].as_str()
            && v != resource.api_version()
        {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                resource.api_version()
            )));
        }
        if let Some(k) = obj["kind"].as_str()
            && k != resource.kind
        {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                resource.kind
            )));
        }
        Ok(())
    }

    /// POST: creates the object (generateName honoured); `dry_run` stores nothing.
    pub fn create(
        &mut self,
        resource: &'static Resource,
        namespace: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Self::type_meta(resource, &obj)?;
        if let Some(ns) = meta(&obj, "namespace")
            && ns != namespace
        {
            return Err(ApiError::BadRequest(format!(
                "the namespace of the object ({ns}) does not match the namespace on the request ({namespace})"
            )));
        }
        if meta(&obj, "resourceVersion").is_some() {
            return Err(ApiError::BadRequest(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        let name = match (meta(&obj, "name"), meta(&obj, "generateName")) {
            (Some(n), _) => n,
            (None, Some(prefix)) => self.generated(&prefix),
            (None, None) => {
                return Err(ApiError::Invalid {
                    resource,
                    name: String::new(),
                    field: "metadata.name".into(),
                    why: "name or generateName is required".into(),
                });
            }
        };
        let key = (resource.plural, namespace.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::AlreadyExists { resource, name });
        }
        if std::ptr::eq(resource, &RESOURCE_SLICES) {
            drop_disabled_slice_fields(self.gates, &mut obj, None);
            default_slice_fields(&mut obj);
        }
        self.checks(resource, &name, &obj, None)?;
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        let m = &mut obj["metadata"];
        m["name"] = json!(name);
        if resource.namespaced {
            m["namespace"] = json!(namespace);
        }
        m["uid"] = json!(format!("dry-run-{}", self.uids + 1));
        m["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        m["generation"] = json!(1);
        if dry_run {
            return Ok(obj);
        }
        obj["metadata"]["uid"] = json!(self.next_uid());
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        self.objects.insert(key.clone(), obj.clone());
        self.record(resource.plural, "ADDED", &obj);
        self.writes.entry(key).or_default().creates += 1;
        Ok(obj)
    }

    /// PUT: replaces the object; a resourceVersion in the body must be the stored one.
    pub fn replace(
        &mut self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Self::type_meta(resource, &obj)?;
        if meta(&obj, "name").as_deref() != Some(name) {
            return Err(ApiError::BadRequest(
                "the name of the object does not match the name on the URL".into(),
            ));
        }
        let key = (resource.plural, namespace.to_string(), name.to_string());
        let Some(old) = self.objects.get(&key).cloned() else {
            return Err(ApiError::NotFound {
                resource,
                name: name.to_string(),
            });
        };
        let conflict = |why: String| ApiError::Conflict {
            resource,
            name: name.to_string(),
            why,
        };
        if let Some(rv) = meta(&obj, "resourceVersion")
            && Some(&rv) != meta(&old, "resourceVersion").as_ref()
        {
            return Err(conflict(
                "the object has been modified; please apply your changes to the latest version and try again".into(),
            ));
        }
        if let Some(uid) = meta(&obj, "uid")
            && Some(&uid) != meta(&old, "uid").as_ref()
        {
            return Err(conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta(&old, "uid").unwrap_or_default()
            )));
        }
        if std::ptr::eq(resource, &RESOURCE_SLICES) {
            drop_disabled_slice_fields(self.gates, &mut obj, Some(&old));
            default_slice_fields(&mut obj);
        }
        self.checks(resource, name, &obj, Some(&old))?;
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        for field in ["uid", "creationTimestamp", "namespace"] {
            if !old["metadata"][field].is_null() {
                obj["metadata"][field] = old["metadata"][field].clone();
            }
        }
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = obj["spec"] != old["spec"];
        obj["metadata"]["generation"] = json!(generation + i64::from(changed));
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if obj == old {
            // A no-op update stores nothing and keeps the resourceVersion, as etcd is not written.
            return Ok(old);
        }
        if dry_run {
            return Ok(obj);
        }
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        self.objects.insert(key.clone(), obj.clone());
        self.record(resource.plural, "MODIFIED", &obj);
        self.writes.entry(key).or_default().updates += 1;
        Ok(obj)
    }

    /// PATCH of a ResourceClaim's `status` subresource with a server-side apply by `manager`:
    /// only `status.devices` is applied (docs of [`claim_status`]). A `metadata.uid` in the body
    /// must be the stored one (409 otherwise); an apply that changes nothing stores nothing.
    pub fn apply_claim_status(
        &mut self,
        namespace: &str,
        name: &str,
        manager: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let resource = &RESOURCE_CLAIMS;
        Self::type_meta(resource, body)?;
        let key = (resource.plural, namespace.to_string(), name.to_string());
        let Some(old) = self.objects.get(&key).cloned() else {
            return Err(ApiError::NotFound {
                resource,
                name: name.to_string(),
            });
        };
        if let Some(uid) = meta(body, "uid")
            && Some(&uid) != meta(&old, "uid").as_ref()
        {
            return Err(ApiError::Conflict {
                resource,
                name: name.to_string(),
                why: format!(
                    "uid mismatch: the provided object specified uid {uid}, and the existing object has uid {}",
                    meta(&old, "uid").unwrap_or_default()
                ),
            });
        }
        let entries: Vec<Value> = body["status"]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        claim_status::validate(&old, &entries).map_err(|(field, why)| ApiError::Invalid {
            resource,
            name: name.to_string(),
            field,
            why,
        })?;
        let owner = (key.clone(), manager.to_string());
        let owned = self.applied.get(&owner).cloned().unwrap_or_default();
        let current = old["status"]["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let merged = claim_status::merge(&current, &owned, &entries);
        self.applied
            .insert(owner, entries.iter().map(claim_status::key).collect());
        if merged == current {
            return Ok(old);
        }
        let mut obj = old;
        if merged.is_empty() {
            if let Some(status) = obj["status"].as_object_mut() {
                status.remove("devices");
            }
        } else {
            obj["status"]["devices"] = Value::Array(merged);
        }
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        self.objects.insert(key.clone(), obj.clone());
        self.record(resource.plural, "MODIFIED", &obj);
        self.writes.entry(key).or_default().updates += 1;
        Ok(obj)
    }

    /// DELETE, with the preconditions of a DeleteOptions body.
    pub fn delete(
        &mut self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
        options: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let key = (resource.plural, namespace.to_string(), name.to_string());
        let Some(old) = self.objects.get(&key) else {
            return Err(ApiError::NotFound {
                resource,
                name: name.to_string(),
            });
        };
        let pre = &options["preconditions"];
        for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(want) = pre[field].as_str()
                && Some(want) != old["metadata"][field].as_str()
            {
                return Err(ApiError::Conflict {
                    resource,
                    name: name.to_string(),
                    why: format!(
                        "Precondition failed: {what} in precondition: {want}, {what} in object meta: {}",
                        old["metadata"][field].as_str().unwrap_or("")
                    ),
                });
            }
        }
        let uid = old["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if !dry_run && let Some(old) = self.objects.remove(&key) {
            self.next_rv();
            self.record(resource.plural, "DELETED", &old);
            self.writes.entry(key).or_default().deletes += 1;
        }
        Ok(super::status::deleted(resource, name, &uid))
    }

    /// DELETE of a collection (deletecollection), filtered by the selectors: what the kubelet
    /// does to the node's ResourceSlices when it starts. Answers the deleted objects as a list.
    pub fn delete_collection(
        &mut self,
        resource: &'static Resource,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        dry_run: bool,
    ) -> Value {
        let list = self.list(resource, namespace, labels, fields);
        if !dry_run {
            for item in list["items"].as_array().into_iter().flatten() {
                let ns = meta(item, "namespace").unwrap_or_default();
                let name = meta(item, "name").unwrap_or_default();
                let key = (resource.plural, ns, name);
                if let Some(old) = self.objects.remove(&key) {
                    self.next_rv();
                    self.record(resource.plural, "DELETED", &old);
                    self.writes.entry(key).or_default().deletes += 1;
                }
            }
        }
        list
    }

    /// GET of one object.
    pub fn get(
        &self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.objects
            .get(&(resource.plural, namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::NotFound {
                resource,
                name: name.to_string(),
            })
    }

    /// GET of a collection (`namespace` None: all namespaces), filtered by the selectors.
    pub fn list(
        &self,
        resource: &'static Resource,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Value {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((plural, ns, _), _)| {
                *plural == resource.plural && namespace.is_none_or(|want| want == ns)
            })
            .map(|(_, v)| v)
            .filter(|v| labels.matches(v) && fields.matches(v))
            .map(|v| {
                // List items carry no apiVersion or kind on the wire.
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("apiVersion");
                    o.remove("kind");
                }
                v
            })
            .collect();
        json!({
            "apiVersion": resource.api_version(),
            "kind": format!("{}List", resource.kind),
            "metadata": {"resourceVersion": self.resource_version.to_string()},
            "items": items,
        })
    }
}
