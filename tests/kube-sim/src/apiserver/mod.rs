//! An in-process Kubernetes API server for tests and benchmarks: plain HTTP on 127.0.0.1, the
//! real REST paths and JSON bodies for what nri-accel uses.
//!
//! Served: `resource.k8s.io/v1` ResourceSlices (list with `labelSelector` and `fieldSelector`,
//! watch with the same selectors from a list's `resourceVersion`, get, create with
//! `generateName` and `dryRun=All`, replace, delete with preconditions, deletecollection),
//! ResourceClaims and DeviceClasses (the same verbs; a server-side apply of a claim's
//! `status.devices` on its `status` subresource), and core/v1 Nodes. Objects are stored as
//! JSON, independently of the plugin's types. Like a real server it:
//!
//! - gives every write a new `resourceVersion` and answers `409 Conflict` to a replace carrying a
//!   stale one (and to delete preconditions that do not hold);
//! - validates ResourceSlices against the resource.k8s.io/v1 limits (128 devices, 64 with
//!   counters, 8 counter sets of 32 counters, 32 attributes + capacities, 64-byte strings,
//!   immutable driver, node and pool) and answers `422 Invalid`;
//! - drops the fields of feature gates that are off ([`Gates`]) without an error;
//! - answers errors with a `Status` object;
//! - streams every change to a watch (`ADDED`, `MODIFIED`, `DELETED`; a deletion behind the
//!   clients' backs too), and answers a watch from a version older than its history with an
//!   `ERROR` event `410 Expired`.
//!
//! Tests make it misbehave: fail requests with a code ([`ApiServer::fail_next`],
//! [`ApiServer::fail_always`]), hold every request ([`ApiServer::stall`]), stop listening and
//! come back on the same port ([`ApiServer::go_down`], [`ApiServer::come_back`]). It counts
//! requests and the writes that reached each object ([`ApiServer::writes`]).
//!
//! Differences from a real server, on purpose: a create keeps the `status` it is given (so a
//! test seeds an allocated claim in one call), there is no authentication (any bearer token is
//! accepted), and a watch gets no bookmarks.

mod claim_status;
mod events;
mod faults;
mod gates;
mod http;
mod resources;
mod routes;
mod selectors;
mod status;
mod store;
pub mod validate;

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use gates::Gates;
pub use resources::{
    DEVICE_CLASSES, NODES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource,
};
pub use status::ApiError;
pub use store::Writes;

use faults::Faults;
use store::Store;

/// State shared by the connections.
struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    stall: tokio::sync::watch::Sender<bool>,
    requests: AtomicU64,
}

/// A running simulated API server. Dropping it stops it.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    serving: Mutex<Option<JoinHandle<()>>>,
}

impl ApiServer {
    /// Starts a server on a free port of 127.0.0.1 with every DRA feature gate on.
    pub async fn start() -> io::Result<ApiServer> {
        ApiServer::start_with(Gates::ALL).await
    }

    /// Starts a server with these feature gates.
    pub async fn start_with(gates: Gates) -> io::Result<ApiServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(gates)),
            faults: Mutex::new(Faults::default()),
            stall: tokio::sync::watch::channel(false).0,
            requests: AtomicU64::new(0),
        });
        let task = tokio::spawn(http::serve(listener, shared.clone()));
        Ok(ApiServer {
            shared,
            addr,
            serving: Mutex::new(Some(task)),
        })
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.shared
            .store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) whose current context points at this server with a bearer token.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n\
             users:\n- name: sim\n  user:\n    token: sim-token\ncontexts:\n- name: sim\n  context:\n    \
             cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\n",
            self.url()
        )
    }

    /// Writes [`ApiServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Stores a Node named `name` and returns its UID.
    pub fn add_node(&self, name: &str) -> String {
        let node = self.insert(
            &NODES,
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
        );
        node["metadata"]["uid"].as_str().unwrap_or("").to_string()
    }

    /// Stores `object` as given (apiVersion, kind, uid, resourceVersion filled in), replacing one
    /// of the same name, and returns what was stored. Not counted as a write.
    pub fn insert(&self, resource: &'static Resource, object: Value) -> Value {
        self.store().insert(resource, object)
    }

    /// Removes an object behind the clients' backs (not counted as a write).
    pub fn remove(
        &self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        self.store()
            .remove(&(resource.plural, namespace.to_string(), name.to_string()))
    }

    /// Deletes every object of `resource` that `field_selector` selects, as a client's
    /// deletecollection does (counted as deletes); returns how many. The kubelet does this to
    /// its node's ResourceSlices (`spec.nodeName=<node>`) when it starts.
    pub fn delete_collection(&self, resource: &'static Resource, field_selector: &str) -> usize {
        let Ok(fields) = selectors::FieldSelector::parse(field_selector, resource) else {
            return 0;
        };
        let deleted = self.store().delete_collection(
            resource,
            None,
            &selectors::LabelSelector::default(),
            &fields,
            false,
        );
        deleted["items"].as_array().map_or(0, Vec::len)
    }

    /// The stored object, if any.
    pub fn get(&self, resource: &'static Resource, namespace: &str, name: &str) -> Option<Value> {
        self.store()
            .get_key(&(resource.plural, namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every stored object of a resource, in name order.
    pub fn all(&self, resource: &'static Resource) -> Vec<Value> {
        self.store().all(resource)
    }

    /// Every stored ResourceSlice, in name order.
    pub fn resource_slices(&self) -> Vec<Value> {
        self.all(&RESOURCE_SLICES)
    }

    /// The feature gates in force.
    pub fn gates(&self) -> Gates {
        self.store().gates
    }

    /// Changes the feature gates (as an API server restarted with other flags would).
    pub fn set_gates(&self, gates: Gates) {
        self.store().gates = gates;
    }

    /// Requests answered (or being answered) so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Writes (creates, updates, deletes) of every object of `resource` together.
    pub fn writes(&self, resource: &'static Resource) -> Writes {
        let store = self.store();
        let mut all = Writes::default();
        for ((plural, _, _), w) in &store.writes {
            if *plural == resource.plural {
                all.creates += w.creates;
                all.updates += w.updates;
                all.deletes += w.deletes;
            }
        }
        all
    }

    /// Writes that reached one object.
    pub fn writes_to(&self, resource: &'static Resource, namespace: &str, name: &str) -> Writes {
        self.store()
            .writes
            .get(&(resource.plural, namespace.to_string(), name.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// Forgets the write counters.
    pub fn reset_writes(&self) {
        self.store().writes.clear();
    }

    /// Answers the next `n` requests with `code` (a 5xx or 429) and a Status body.
    pub fn fail_next(&self, n: u64, code: u16) {
        self.faults().fail_next(n, code, false);
    }

    /// Answers the next `n` writes (POST, PUT, DELETE) with `code`; reads are served.
    pub fn fail_next_writes(&self, n: u64, code: u16) {
        self.faults().fail_next(n, code, true);
    }

    /// Answers every request with `code` until [`ApiServer::heal`].
    pub fn fail_always(&self, code: u16) {
        self.faults().fail_always(code);
    }

    /// Stops injecting failures.
    pub fn heal(&self) {
        self.faults().heal();
    }

    /// Holds every request (connections stay open, nothing is answered) while `on`.
    pub fn stall(&self, on: bool) {
        self.shared.stall.send_replace(on);
    }

    /// Stops listening and drops every open connection: clients get connection refused.
    pub async fn go_down(&self) {
        let task = self
            .serving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens again on the same address, with the same objects.
    pub async fn come_back(&self) -> io::Result<()> {
        let listener = TcpListener::bind(self.addr).await?;
        let task = tokio::spawn(http::serve(listener, self.shared.clone()));
        let old = self
            .serving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(task);
        if let Some(old) = old {
            old.abort();
        }
        Ok(())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.stall.send_replace(false);
        if let Some(task) = self
            .serving
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            task.abort();
        }
    }
}
