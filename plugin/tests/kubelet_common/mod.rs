//! A node with the DRA driver's kubelet sockets served in-process over the real engine, a claim
//! source standing in for the API server, a simulated scheduler that allocates from the names the
//! node publishes, and the simulated kubelet (kube-sim) that registers the plugin and calls it.
#![allow(dead_code, missing_docs)]

pub mod raw_h2;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use kube_sim::kubelet::wire::dra::Claim;
use kube_sim::kubelet::{DraClient, PluginWatcher, RegisteredPlugin};
use nri_accel::checkpoint::Checkpoint;
use nri_accel::claims_api::{ClaimRef, DraResult};
use nri_accel::daemon::{Agent, AgentSettings, ClaimsFacade};
use nri_accel::device_health::{DeviceHealth, HealthMonitor, HealthReport};
use nri_accel::engine::{Engine, RequestEnv};
use nri_accel::gate::Gate;
use nri_accel::kubelet::{
    AllocatedClaim, ClaimSource, DraDriver, DraDriverConfig, DraService, DraSettings, HealthService,
};
use nri_accel::metrics::Metrics;
use policies::{Node, PublishedDevice, PublishedKind, Registry};
use tokio::sync::{Semaphore, watch};

pub const DRIVER: &str = "accel.nri.io";
pub const POOL: &str = "node-1";
pub const CDI_KIND: &str = "accel.nri.io/device";
/// Guards against a hang only; nothing asserts on how long anything takes.
pub const WAIT: Duration = Duration::from_secs(60);

/// What the API server would say about one claim.
#[derive(Clone, Debug)]
pub struct StoredClaim {
    pub uid: String,
    /// `None`: not allocated yet.
    pub results: Option<Vec<DraResult>>,
    /// What the claim's opaque configuration sets, per request.
    pub env: RequestEnv,
    /// The pod's name for a claim made from a template (its annotation).
    pub pod_claim_name: Option<String>,
}

/// The API server's ResourceClaims as the DRA service reads them: keyed by namespace/name,
/// checked against the UID the kubelet asks for, able to be down and to stall.
#[derive(Default)]
pub struct FakeClaims {
    claims: Mutex<HashMap<(String, String), StoredClaim>>,
    down: Mutex<bool>,
    /// When set, every read waits for a permit.
    stall: Mutex<Option<Arc<Semaphore>>>,
    pub reads: AtomicUsize,
}

impl FakeClaims {
    pub fn put(&self, namespace: &str, name: &str, claim: StoredClaim) {
        self.claims
            .lock()
            .unwrap()
            .insert((namespace.into(), name.into()), claim);
    }

    pub fn delete(&self, namespace: &str, name: &str) {
        self.claims
            .lock()
            .unwrap()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn set_down(&self, down: bool) {
        *self.down.lock().unwrap() = down;
    }

    /// From now on every read waits for a permit of the returned semaphore.
    pub fn stall(&self) -> Arc<Semaphore> {
        let s = Arc::new(Semaphore::new(0));
        *self.stall.lock().unwrap() = Some(s.clone());
        s
    }

    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ClaimSource for FakeClaims {
    async fn allocation(&self, c: &ClaimRef) -> Result<AllocatedClaim, String> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let stall = self.stall.lock().unwrap().clone();
        if let Some(s) = stall {
            s.acquire().await.expect("stall semaphore").forget();
        }
        if *self.down.lock().unwrap() {
            return Err(format!(
                "claim {}/{}: the API server cannot be reached: connection refused",
                c.namespace, c.name
            ));
        }
        let stored = self
            .claims
            .lock()
            .unwrap()
            .get(&(c.namespace.clone(), c.name.clone()))
            .cloned();
        let Some(stored) = stored else {
            return Err(format!("claim {}/{} does not exist", c.namespace, c.name));
        };
        if stored.uid != c.uid {
            return Err(format!(
                "claim {}/{} has UID {}, not {}",
                c.namespace, c.name, stored.uid, c.uid
            ));
        }
        let results = stored
            .results
            .ok_or_else(|| format!("claim {}/{} is not allocated", c.namespace, c.name))?;
        Ok(AllocatedClaim {
            results,
            env: stored.env,
            pod_claim_name: stored.pod_claim_name,
        })
    }
}

/// A simulated node of four GPUs (demo layout: `whole` gpu0-1 exclusive, `shared` gpu2 four
/// ways, `mig` gpu3 sliced) with the DRA driver's sockets served in temp dirs.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub registry: PathBuf,
    pub plugins: PathBuf,
    pub engine: Arc<Engine>,
    pub gate: Gate,
    pub claims: Arc<FakeClaims>,
    pub health: watch::Sender<Arc<HealthReport>>,
    pub published: Vec<PublishedDevice>,
    pub driver: Option<DraDriver>,
    /// Where the device metadata goes, for a rig that writes it.
    pub metadata: Option<PathBuf>,
}

/// The published attributes of the rig's node, as the daemon's publisher builds them.
pub struct RigAttributes(BTreeMap<String, BTreeMap<String, serde_json::Value>>);

impl nri_accel::metadata::AttributeSource for RigAttributes {
    fn attributes(&self, name: &str) -> Option<BTreeMap<String, serde_json::Value>> {
        self.0.get(name).cloned()
    }
}

impl Rig {
    /// The node with the gate open.
    pub async fn start() -> Rig {
        let rig = Rig::closed().await;
        rig.gate.open();
        rig
    }

    /// The node with the gate open, writing each prepared request's device metadata.
    pub async fn with_metadata() -> Rig {
        let rig = Rig::closed_with(true).await;
        rig.gate.open();
        rig
    }

    /// The node with the gate still closed.
    pub async fn closed() -> Rig {
        Rig::closed_with(false).await
    }

    async fn closed_with(metadata: bool) -> Rig {
        let dir = tempfile::Builder::new().prefix("dra-").tempdir().unwrap();
        let config = nri_accel::fixtures::config(dir.path());
        let found = nri_accel::discovery::discover_root(&config.discovery).unwrap();
        let inventory = found.inventory.clone();
        let node = Node::new(found.inventory, &config.pools, &Registry::with_builtins()).unwrap();
        let published = node.published();
        std::fs::create_dir_all(&config.state_dir).unwrap();
        let journal = Checkpoint::load(&config.state_dir.join("checkpoint"), "boot-1").unwrap();
        let specs =
            cdi::SpecStore::open(nri_accel::daemon::run::store_config(&config.cdi)).unwrap();
        let (engine, _) = Engine::start(node, journal, specs, None).unwrap();
        let engine = Arc::new(engine);
        let agent = Arc::new(Agent::new(
            engine.clone(),
            AgentSettings {
                cdi_kind: CDI_KIND.into(),
                annotation_prefix: "accel.nri.io".into(),
            },
        ));
        let gate = Gate::new();
        let claims = Arc::new(FakeClaims::default());
        let facade = Arc::new(ClaimsFacade::new(agent, Arc::new(Metrics::new())));
        let dra = DraService::new(
            DraSettings {
                driver: DRIVER.into(),
                pool: POOL.into(),
            },
            facade,
            engine.clone(),
            gate.clone(),
            claims.clone(),
        );
        let metadata_dir = metadata.then(|| dir.path().join("dra-device-metadata"));
        if let Some(md) = &metadata_dir {
            let writer = Arc::new(nri_accel::metadata::MetadataWriter::new(
                nri_accel::metadata::MetadataStore::new(md),
            ));
            engine.set_claim_files(writer.clone());
            let source = nri_accel::kube::publisher::PublishSource {
                inventory: inventory.clone(),
                pools: config.pools.clone(),
                published: published.clone(),
                pcie_roots: BTreeMap::new(),
            };
            let attributes = nri_accel::kube::published_attributes(&source, DRIVER, false);
            dra.set_metadata(writer, Arc::new(RigAttributes(attributes)));
        }
        let (monitor, health) = HealthMonitor::fixed(HealthReport::all_healthy(&inventory));
        let health_service =
            HealthService::new(monitor, &published, POOL, Duration::from_secs(3600));
        let registry = dir.path().join("plugins_registry");
        let plugins = dir.path().join("plugins");
        let driver = DraDriver::start(
            DraDriverConfig {
                driver: DRIVER.into(),
                registry_dir: registry.clone(),
                plugins_dir: plugins.clone(),
                watch_every: Duration::from_millis(50),
            },
            dra,
            health_service,
        )
        .unwrap();
        Rig {
            cdi_dir: config.cdi.dir.clone(),
            state_dir: config.state_dir.clone(),
            registry,
            plugins,
            dir,
            engine,
            gate,
            claims,
            health,
            published,
            driver: Some(driver),
            metadata: metadata_dir,
        }
    }

    pub fn driver(&self) -> &DraDriver {
        self.driver.as_ref().unwrap()
    }

    pub fn endpoint(&self) -> PathBuf {
        self.plugins.join(DRIVER).join("dra.sock")
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry.join(format!("{DRIVER}-reg.sock"))
    }

    /// A kubelet of 1.34+ that has registered the plugin, and its DRA client.
    pub async fn kubelet(&self) -> (PluginWatcher, RegisteredPlugin, DraClient) {
        let mut kubelet = PluginWatcher::new(&self.registry);
        let plugin = kubelet.wait_for(DRIVER, WAIT).await.expect("registered");
        let client = DraClient::for_plugin(&plugin).await.expect("DRA client");
        (kubelet, plugin, client)
    }

    /// Published names of `device_id`, whole first.
    pub fn names_of(&self, device_id: &str) -> Vec<&PublishedDevice> {
        let mut v: Vec<&PublishedDevice> = self
            .published
            .iter()
            .filter(|p| p.device_id == device_id)
            .collect();
        v.sort_by_key(|p| p.kind != PublishedKind::Whole);
        v
    }

    /// The simulated scheduler: allocates `devices` (published names) to claim `name` in
    /// namespace `default` with UID `uid`, as the API server then stores it.
    pub fn allocate(&self, uid: &str, name: &str, devices: &[&str]) -> Claim {
        let results = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let p = self
                    .published
                    .iter()
                    .find(|p| p.name == *d)
                    .unwrap_or_else(|| panic!("{d} is not published"));
                DraResult {
                    request: format!("req-{i}"),
                    driver: DRIVER.into(),
                    pool: POOL.into(),
                    device: p.name.clone(),
                    share_id: (p.kind == PublishedKind::Shareable)
                        .then(|| format!("share-{uid}-{i}")),
                }
            })
            .collect();
        self.store(uid, name, Some(results))
    }

    /// Stores a claim with exactly these results (or none: not allocated).
    pub fn store(&self, uid: &str, name: &str, results: Option<Vec<DraResult>>) -> Claim {
        self.claims.put(
            "default",
            name,
            StoredClaim {
                uid: uid.into(),
                results,
                env: RequestEnv::new(),
                pod_claim_name: None,
            },
        );
        claim(uid, name)
    }

    /// Gives stored claim `name` the env its opaque configuration sets for `request`.
    pub fn configure(&self, name: &str, request: &str, env: &[(&str, &str)]) {
        let mut claims = self.claims.claims.lock().unwrap();
        let stored = claims
            .get_mut(&("default".to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("claim {name} is not stored"));
        stored.env.insert(
            request.into(),
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }

    /// Makes a device unhealthy (or healthy again) in the health monitor's report.
    pub fn set_health(&self, device_id: &str, healthy: bool, reason: &str) {
        self.health.send_modify(|r| {
            let mut next = (**r).clone();
            next.devices.insert(
                device_id.into(),
                DeviceHealth {
                    healthy,
                    reason: reason.into(),
                },
            );
            next.checked_at = SystemTime::now();
            *r = Arc::new(next);
        });
    }

    fn spec_store(&self) -> cdi::SpecStore {
        cdi::SpecStore::open(cdi::StoreConfig {
            dir: self.cdi_dir.clone(),
            vendor: "accel.nri.io".into(),
            class: "device".into(),
            format: cdi::SpecFormat::Yaml,
        })
        .unwrap()
    }

    /// Claim UIDs with a spec file.
    pub fn spec_uids(&self) -> Vec<String> {
        let mut v = self.spec_store().list().unwrap();
        v.sort();
        v
    }

    /// Where claim `uid`'s spec file is.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.spec_store().spec_path(uid).unwrap()
    }

    /// The env of each device of claim `uid`'s spec, as the official CDI crate reads the file.
    pub fn spec_env(&self, uid: &str) -> Vec<Vec<String>> {
        let spec = container_device_interface::spec::read_spec(&self.spec_path(uid), 10)
            .unwrap_or_else(|e| panic!("the official parser refuses the spec of {uid}: {e:#}"));
        let json = serde_json::to_value(&spec.cdi_spec).unwrap();
        json["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["containerEdits"]["env"]
                    .as_array()
                    .map(|env| {
                        env.iter()
                            .map(|e| e.as_str().unwrap().to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Claim UIDs the engine holds.
    pub fn held(&self) -> Vec<String> {
        self.engine
            .claims()
            .into_iter()
            .map(|(a, _)| a.claim_uid)
            .collect()
    }

    pub async fn shutdown(mut self) -> tempfile::TempDir {
        if let Some(d) = self.driver.take() {
            d.shutdown().await;
        }
        self.dir
    }
}

/// The kubelet's identity of a claim in namespace `default`.
pub fn claim(uid: &str, name: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The CDI IDs of a prepared claim's answer, by device.
pub fn cdi_ids(
    answer: &BTreeMap<String, kube_sim::kubelet::PreparedClaim>,
    uid: &str,
) -> Vec<String> {
    match answer.get(uid) {
        Some(Ok(devices)) => devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect(),
        other => panic!("claim {uid} not prepared: {other:?}"),
    }
}

/// The error answered for a claim.
pub fn error_of(answer: &BTreeMap<String, kube_sim::kubelet::PreparedClaim>, uid: &str) -> String {
    match answer.get(uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid} should have failed: {other:?}"),
    }
}

pub fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}
