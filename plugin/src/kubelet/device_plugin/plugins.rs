//! The device plugins of one daemon: their resources, their sockets in the kubelet's
//! device-plugins directory, their registration with the kubelet, and what their services share.
//!
//! A supervisor task serves every resource's socket once the gate is open (before that, the
//! containers already running have not reached the policy) and registers it through the
//! kubelet's `kubelet.sock`. It then checks every [`WATCH_EVERY`], and at once when a
//! ListAndWatch stream ends: a socket that vanished (the kubelet wipes the directory when it
//! restarts) is served again; a `kubelet.sock` that appeared or was replaced by another inode
//! gets every resource registered again; and a resource whose ListAndWatch streams all closed
//! after the kubelet had opened one since the registration is registered again. The last is what
//! a restarted kubelet cannot hide: the kubelet holds one stream open per registered plugin, its
//! death closes it, while its new `kubelet.sock` may well get the old inode back (ext4 reuses
//! them). A failed registration is retried at the next check and kept for `status`.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kubelet_proto::deviceplugin as pb;
use policies::{Ask, Candidate, ClaimRequest, PoolConfig, UnitResult};
use serde::Serialize;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use super::layout::{self, Resource};
use super::listing::{self, Listed};
use super::{DevicePluginError, claims};
use crate::config::DevicePluginConfig;
use crate::device_health::HealthMonitor;
use crate::engine::{DevicePluginOrigin, Engine, Origin};
use crate::gate::Gate;
use crate::kubelet::{ConnLimits, KubeletError, ServedSocket};

/// How often the supervisor checks the sockets and the kubelet's socket.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// How often a ListAndWatch stream re-checks its devices when nothing woke it (claims made
/// through other doors change what the kubelet may hand out).
pub const LISTING_RECHECK: Duration = Duration::from_secs(1);

/// The longest device ID the kubelet's API documents.
const MAX_ID_LEN: usize = 63;

/// How long a registration call may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where one resource's registration with the kubelet stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Registration {
    /// Waiting for the runtime's Synchronize (the gate) before serving.
    WaitingForGate,
    /// Served; the kubelet's `kubelet.sock` is not there.
    WaitingForKubelet,
    /// The kubelet accepted the registration.
    Registered {
        /// When, in seconds since the Unix epoch.
        since: u64,
    },
    /// Serving or registering failed; retried.
    Failed {
        /// Why, in one sentence.
        reason: String,
    },
}

/// The device plugins of the daemon.
pub struct DevicePlugins {
    pub(super) engine: Arc<Engine>,
    gate: Gate,
    health: HealthMonitor,
    pub(super) cfg: DevicePluginConfig,
    resources: Vec<Resource>,
    registrations: Vec<watch::Sender<Registration>>,
    /// The ListAndWatch streams of each resource.
    listeners: Vec<Listeners>,
    /// Woken when a ListAndWatch stream ends.
    stream_ended: Notify,
    /// Bumped after every allocation and release made here, to wake the ListAndWatch streams.
    changed: watch::Sender<u64>,
    /// Allocations are decided one at a time: each looks at the claims the previous one left.
    allocating: tokio::sync::Mutex<()>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// The ListAndWatch streams of one resource: how many are open, and how many were ever opened.
#[derive(Debug, Default)]
struct Listeners {
    open: AtomicUsize,
    opened: AtomicU64,
}

impl Listeners {
    /// (open now, opened ever).
    fn get(&self) -> (usize, u64) {
        (
            self.open.load(Ordering::SeqCst),
            self.opened.load(Ordering::SeqCst),
        )
    }
}

/// Counts one open ListAndWatch stream until dropped.
struct Listening<'a> {
    plugins: &'a DevicePlugins,
    i: usize,
}

impl<'a> Listening<'a> {
    fn new(plugins: &'a DevicePlugins, i: usize) -> Listening<'a> {
        let l = &plugins.listeners[i];
        l.open.fetch_add(1, Ordering::SeqCst);
        l.opened.fetch_add(1, Ordering::SeqCst);
        Listening { plugins, i }
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.plugins.listeners[self.i]
            .open
            .fetch_sub(1, Ordering::SeqCst);
        self.plugins.stream_ended.notify_one();
    }
}

/// Through which `kubelet.sock` a resource is registered, and how many ListAndWatch streams had
/// been opened for it when it registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registered {
    socket: (u64, u64),
    opened_before: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// (device, inode) of the file at `path`, if there is one.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl DevicePlugins {
    /// The device plugins `cfg` asks for over the pools and inventory the engine holds; serving
    /// and registering starts in a task once `gate` opens.
    pub fn start(
        cfg: &DevicePluginConfig,
        pools: &[PoolConfig],
        engine: Arc<Engine>,
        gate: Gate,
        health: HealthMonitor,
    ) -> Arc<DevicePlugins> {
        let resources = engine.with_node(|n| layout::plan(cfg, pools, n));
        for r in &resources {
            if let Some(long) = r.devices.iter().find(|a| a.id.len() > MAX_ID_LEN) {
                tracing::warn!(resource = %r.name, device = %long.id,
                    "device IDs longer than {MAX_ID_LEN} characters may be refused by the kubelet; give the device a shorter id");
            }
        }
        let registrations = resources
            .iter()
            .map(|_| watch::channel(Registration::WaitingForGate).0)
            .collect();
        let listeners = resources.iter().map(|_| Listeners::default()).collect();
        let plugins = Arc::new(DevicePlugins {
            engine,
            gate,
            health,
            cfg: cfg.clone(),
            resources,
            registrations,
            listeners,
            stream_ended: Notify::new(),
            changed: watch::channel(0).0,
            allocating: tokio::sync::Mutex::new(()),
            stop: watch::channel(false).0,
            task: Mutex::new(None),
        });
        let task = tokio::spawn(supervise(plugins.clone()));
        *plugins.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        plugins
    }

    /// The resources served, in config order.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.cfg.dir.join("kubelet.sock")
    }

    /// Where resource `i`'s registration stands now.
    pub fn registration(&self, i: usize) -> Registration {
        self.registrations[i].borrow().clone()
    }

    /// Follows resource `i`'s registration.
    pub fn subscribe_registration(&self, i: usize) -> watch::Receiver<Registration> {
        self.registrations[i].subscribe()
    }

    /// Stops serving: every ListAndWatch stream ends, also one whose task had not started yet
    /// when the stop came, and the sockets are unlinked.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut t) = task
            && tokio::time::timeout(Duration::from_secs(5), &mut t)
                .await
                .is_err()
        {
            // Left running, it would keep serving the sockets a restarted daemon needs.
            tracing::warn!("the device plugins did not stop within 5 s; stopping them");
            t.abort();
        }
    }

    /// What resource `i` lists now.
    pub fn listed(&self, i: usize) -> Vec<Listed> {
        let r = &self.resources[i];
        let holds = self.engine.with_claims(|claims| listing::holds(r, claims));
        listing::list(r, &holds, &self.health.current())
    }

    /// Sends resource `i`'s list to `tx` now and again whenever it changes, until the kubelet
    /// goes away or the plugins stop.
    ///
    /// The stream's task may first run after [`DevicePlugins::shutdown`] was called (the kubelet
    /// opened the stream just before, and a loaded machine started the task late): the stop is
    /// a state, checked whenever the task waits, not an event it could miss. A stream that
    /// missed it would keep its server, and so the shutdown, waiting until the kubelet hung up.
    pub(super) async fn watch_listing(
        &self,
        i: usize,
        tx: mpsc::Sender<Result<pb::ListAndWatchResponse, tonic::Status>>,
    ) {
        let _listening = Listening::new(self, i);
        let mut health = self.health.subscribe();
        let mut health_live = true;
        let mut changed = self.changed.subscribe();
        let mut stop = self.stop.subscribe();
        let mut tick = tokio::time::interval(LISTING_RECHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Vec<Listed>> = None;
        loop {
            if *stop.borrow_and_update() {
                return;
            }
            let listed = self.listed(i);
            if last.as_ref() != Some(&listed) {
                // A kubelet that stopped reading must not hold the stream open past a stop.
                tokio::select! {
                    sent = tx.send(Ok(listing::to_response(&listed))) => {
                        if sent.is_err() {
                            return;
                        }
                    }
                    _ = stop.wait_for(|s| *s) => return,
                }
                last = Some(listed);
            }
            tokio::select! {
                r = health.changed(), if health_live => health_live = r.is_ok(),
                _ = changed.changed() => {}
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
                _ = tx.closed() => return,
            }
        }
    }

    /// The kubelet's GetPreferredAllocation for one container of resource `i`: the IDs the
    /// policy would pick among `available`, including `must`.
    pub fn preferred(
        &self,
        i: usize,
        available: &[String],
        must: &[String],
        size: usize,
    ) -> Vec<String> {
        let r = &self.resources[i];
        let candidate = |id: &String| {
            r.get(id).map(|a| Candidate {
                device_id: a.device_id.clone(),
                unit: a.unit.clone(),
            })
        };
        let avail: Vec<Candidate> = available.iter().filter_map(candidate).collect();
        let must_known: Vec<Candidate> = must.iter().filter_map(candidate).collect();
        let picks = self
            .engine
            .with_node(|n| n.preferred(&r.pool, &avail, &must_known, size));
        // IDs the kubelet must include that we do not advertise stay in the answer as given.
        let mut out: Vec<String> = must
            .iter()
            .filter(|id| r.get(id).is_none())
            .cloned()
            .collect();
        out.extend(
            picks
                .iter()
                .filter_map(|c| r.id_of(&c.device_id, &c.unit))
                .map(str::to_string),
        );
        out
    }

    /// The kubelet's Allocate of `ids` for one container of resource `i`: a claim of exactly
    /// those units through the engine, answered with its CDI device names (and device nodes,
    /// env and mounts when `device_nodes` is set).
    pub async fn allocate(
        &self,
        i: usize,
        ids: &[String],
    ) -> Result<pb::ContainerAllocateResponse, DevicePluginError> {
        let r = &self.resources[i];
        let invalid = |why: String| DevicePluginError::Invalid {
            resource: r.name.clone(),
            why,
        };
        if !self.gate.is_open() {
            return Err(DevicePluginError::NotReady {
                resource: r.name.clone(),
            });
        }
        if ids.is_empty() {
            return Err(invalid("Allocate names no device".into()));
        }
        let set: BTreeSet<String> = ids.iter().cloned().collect();
        if set.len() != ids.len() {
            return Err(invalid("Allocate names a device twice".into()));
        }
        let mut units = Vec::with_capacity(set.len());
        for id in &set {
            let Some(a) = r.get(id) else {
                return Err(DevicePluginError::UnknownDevice {
                    resource: r.name.clone(),
                    id: id.clone(),
                });
            };
            units.push(UnitResult {
                request: id.clone(),
                pool: r.pool.clone(),
                device_id: a.device_id.clone(),
                unit: a.unit.clone(),
            });
        }
        let engine_err = |source| DevicePluginError::Engine {
            resource: r.name.clone(),
            source: Box::new(source),
        };
        let _one_at_a_time = self.allocating.lock().await;
        let now = now_secs();
        let plan = claims::plan(
            &r.name,
            &set,
            &self.engine.device_plugin_claims(),
            now,
            self.cfg.unused_grace_secs,
        )?;
        for old in &plan.release {
            if !self
                .engine
                .release_unused_device_plugin_claim(old, || self.gate.is_open())
                .await
                .map_err(engine_err)?
            {
                return Err(invalid(format!(
                    "claim {old} holding some of these devices was taken into use meanwhile; the kubelet retries"
                )));
            }
            tracing::info!(resource = %r.name, claim = %old,
                "released an earlier allocation of these devices: the kubelet handed them out again");
        }
        if !plan.release.is_empty() {
            self.changed.send_modify(|n| *n += 1);
        }
        let uid = claims::claim_uid(&r.name, &set);
        let request = ClaimRequest {
            uid: uid.clone(),
            namespace: String::new(),
            name: r.name.clone(),
            ask: Ask::Units(units),
        };
        let origin = Origin::DevicePlugin(Box::new(DevicePluginOrigin {
            resource: r.name.clone(),
            device_ids: set.iter().cloned().collect(),
            allocated_at: now,
            user: None,
        }));
        let prepared = self
            .engine
            .prepare_as_admitted(request, origin, || self.gate.is_open())
            .await
            .map_err(engine_err)?;
        self.changed.send_modify(|n| *n += 1);
        let shown: Vec<&str> = set.iter().map(String::as_str).collect();
        tracing::info!(resource = %r.name, claim = %uid, devices = %shown.join(","),
            already = prepared.already, "device plugin allocation");
        let mut answer = pb::ContainerAllocateResponse {
            // nri-accel's own device, then the vendor's where the pool composes (docs/gpus.md).
            cdi_devices: prepared
                .devices
                .iter()
                .flat_map(|d| d.cdi_ids())
                .map(|name| pb::CdiDevice { name })
                .collect(),
            ..Default::default()
        };
        if self.cfg.device_nodes {
            let edits = self.engine.with_node(|n| n.edits(&uid)).unwrap_or_default();
            let mut paths = BTreeSet::new();
            for e in edits {
                for n in e.device_nodes {
                    if paths.insert(n.path.clone()) {
                        answer.devices.push(pb::DeviceSpec {
                            host_path: n.host_path.clone().unwrap_or_else(|| n.path.clone()),
                            container_path: n.path,
                            permissions: n.permissions,
                        });
                    }
                }
                answer.envs.extend(e.env);
                answer
                    .mounts
                    .extend(e.mounts.into_iter().map(|m| pb::Mount {
                        read_only: m.options.iter().any(|o| o == "ro"),
                        container_path: m.container_path,
                        host_path: m.host_path,
                    }));
            }
        }
        Ok(answer)
    }
}

/// Serves and registers every resource until the plugins stop.
///
/// The stop wins over everything else: it is checked before each pass, a pass in progress (a
/// registration may wait for the kubelet up to [`REGISTER_TIMEOUT`]) is dropped when it comes,
/// and it is preferred when a stream ended at the same time. The stop itself ends every
/// ListAndWatch stream; a supervisor that took those ends for the kubelet dropping the plugin
/// registered again during the shutdown, and the kubelet's new streams then held the sockets'
/// shutdown for their whole grace period (the demo's 3 to 5 s stall under load).
async fn supervise(plugins: Arc<DevicePlugins>) {
    let mut stop = plugins.stop.subscribe();
    tokio::select! {
        _ = plugins.gate.wait_open() => {}
        _ = stop.wait_for(|s| *s) => return,
    }
    let n = plugins.resources.len();
    let mut served: Vec<Option<ServedSocket>> = (0..n).map(|_| None).collect();
    // The kubelet socket each resource is registered through.
    let mut registered: Vec<Option<Registered>> = vec![None; n];
    loop {
        if *stop.borrow_and_update() {
            break;
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            () = check(&plugins, &mut served, &mut registered) => {}
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            _ = plugins.stream_ended.notified() => {}
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
    }
    // Side by side: each socket's grace for calls in flight runs at the same time, not one
    // after another.
    futures::future::join_all(served.into_iter().flatten().map(ServedSocket::shutdown)).await;
}

/// One pass over the resources: serves the sockets that are missing, notices streams the
/// kubelet closed, and registers what is not registered through the kubelet's current socket.
async fn check(
    plugins: &Arc<DevicePlugins>,
    served: &mut [Option<ServedSocket>],
    registered: &mut [Option<Registered>],
) {
    let kubelet = plugins.kubelet_socket();
    let kubelet_id = identity(&kubelet);
    for i in 0..plugins.resources.len() {
        let r = &plugins.resources[i];
        if !served[i].as_ref().is_some_and(ServedSocket::is_present) {
            if served[i].take().is_some() {
                tracing::warn!(resource = %r.name, "the device plugin socket vanished (the kubelet restarted?); serving it again");
            }
            registered[i] = None;
            let path = plugins.cfg.dir.join(&r.socket);
            match serve(plugins, i, &path) {
                Ok(s) => served[i] = Some(s),
                Err(e) => {
                    set_state(
                        plugins,
                        i,
                        Registration::Failed {
                            reason: e.to_string(),
                        },
                    );
                    continue;
                }
            }
        }
        let (open, opened) = plugins.listeners[i].get();
        if let Some(reg) = registered[i]
            && open == 0
            && opened > reg.opened_before
        {
            tracing::warn!(resource = %r.name,
                "the kubelet closed this resource's ListAndWatch stream (it restarted or dropped the plugin); registering again");
            registered[i] = None;
            set_state(plugins, i, Registration::WaitingForKubelet);
        }
        match kubelet_id {
            None => {
                registered[i] = None;
                set_state(plugins, i, Registration::WaitingForKubelet);
            }
            Some(id) if registered[i].map(|r| r.socket) != Some(id) => {
                let opened_before = plugins.listeners[i].get().1;
                match register(plugins, i, &kubelet).await {
                    Ok(()) => {
                        registered[i] = Some(Registered {
                            socket: id,
                            opened_before,
                        });
                        tracing::info!(resource = %r.name, socket = %r.socket, "registered with the kubelet");
                        set_state(plugins, i, Registration::Registered { since: now_secs() });
                    }
                    Err(reason) => set_state(plugins, i, Registration::Failed { reason }),
                }
            }
            Some(_) => {}
        }
    }
}

/// Records resource `i`'s state, logging a failure once per distinct reason.
fn set_state(plugins: &DevicePlugins, i: usize, state: Registration) {
    plugins.registrations[i].send_if_modified(|old| {
        if *old == state {
            return false;
        }
        if let Registration::Failed { reason } = &state {
            tracing::error!(resource = %plugins.resources[i].name, %reason,
                "device plugin not registered with the kubelet; retrying");
        }
        *old = state;
        true
    });
}

fn serve(
    plugins: &Arc<DevicePlugins>,
    i: usize,
    path: &Path,
) -> Result<ServedSocket, KubeletError> {
    let service = super::service::DevicePluginService::new(plugins.clone(), i);
    let router = crate::kubelet::conn::server().add_service(service.into_server());
    let limits =
        ConnLimits::from_config(plugins.cfg.max_connections, plugins.cfg.idle_timeout_secs);
    ServedSocket::serve(path, router, limits)
}

/// Registers resource `i` through the kubelet's socket; the error is one sentence.
async fn register(plugins: &DevicePlugins, i: usize, kubelet: &Path) -> Result<(), String> {
    let r = &plugins.resources[i];
    let channel = crate::kubelet::dial(kubelet)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = pb::registration_client::RegistrationClient::new(channel);
    let request = pb::RegisterRequest {
        version: kubelet_proto::DEVICE_PLUGIN_VERSION.to_string(),
        endpoint: r.socket.clone(),
        resource_name: r.name.clone(),
        options: Some(super::service::options()),
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, client.register(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(format!(
            "the kubelet refused resource {}: {}",
            r.name,
            status.message()
        )),
        Err(_) => Err(format!(
            "the kubelet at {} did not answer the registration of {} within {} s",
            kubelet.display(),
            r.name,
            REGISTER_TIMEOUT.as_secs()
        )),
    }
}
