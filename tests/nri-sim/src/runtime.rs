//! The fake NRI runtime: listens like containerd/CRI-O, registers, configures and synchronizes a
//! plugin, sends events and records what the plugin asks for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nri_proto::api::*;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};

use crate::wire::Response;

mod calls;
mod conn;
mod socket;
pub use calls::{EncodedCreate, encode_sync_chunks, nri_mask_for};

const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// ttrpc status code Unimplemented.
pub const CODE_UNIMPLEMENTED: i32 = 12;
const CODE_UNKNOWN: i32 = 2;
const CODE_DEADLINE_EXCEEDED: i32 = 4;

/// How the fake runtime presents itself and what it enforces.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// `ConfigureRequest.NRI_version`, e.g. `v0.12.0`, `v0.8.0` or empty.
    pub nri_version: String,
    /// `ConfigureRequest.runtime_name`.
    pub runtime_name: String,
    /// `ConfigureRequest.runtime_version`.
    pub runtime_version: String,
    /// Per-request timeout; a plugin that misses it is dropped (default 2 s).
    pub request_timeout: Duration,
    /// Time from connect to the end of registration (default 5 s).
    pub registration_timeout: Duration,
    /// `ConfigureRequest.config`.
    pub config: String,
    /// Behave as NRI before v0.12.1 (containerd up to 2.3.0): every event holds a lock that an
    /// UpdateContainers call from the plugin also takes, so the call waits until every event
    /// request outstanding when it arrived has been answered (containerd#13733, nri#301). A
    /// plugin that waits for its own update inside a handler misses the deadline and is
    /// dropped. On by default, as the default `nri_version` (v0.12.0) behaves.
    pub updates_wait_for_events: bool,
    /// Model the hang of real runtimes before NRI v0.12.1 (containerd 1.7 to 2.3, every CRI-O
    /// release): there a plugin's UpdateContainers that meets any event in progress, even one
    /// sent milliseconds after the plugin answered, deadlocks the runtime for good, and nothing
    /// tells a plugin when no event is in progress. With this on and `nri_version` before
    /// v0.12.1, every UpdateContainers call is recorded in [`FakeRuntime::errors`] as the hang it
    /// would have caused. On by default; ignored from v0.12.1 on.
    pub pushes_hang: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            nri_version: "v0.12.0".into(),
            runtime_name: "fake-runtime".into(),
            runtime_version: "1.0.0".into(),
            request_timeout: Duration::from_secs(2),
            registration_timeout: Duration::from_secs(5),
            config: String::new(),
            updates_wait_for_events: true,
            pushes_hang: true,
        }
    }
}

/// Errors the fake runtime reports to tests.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FakeError {
    /// No plugin is registered.
    #[error("no plugin connected")]
    NoPlugin,
    /// The plugin did not subscribe to the event.
    #[error("plugin is not subscribed to {0}")]
    NotSubscribed(&'static str),
    /// The plugin missed the request timeout and was dropped.
    #[error("plugin timed out on {0} and was dropped")]
    Timeout(String),
    /// The plugin answered an error status.
    #[error("plugin answered {method} with code {code}: {message}")]
    Status {
        /// Method.
        method: String,
        /// ttrpc code.
        code: i32,
        /// Message.
        message: String,
    },
    /// The connection failed; the plugin was dropped.
    #[error("connection to the plugin failed: {0}")]
    Wire(String),
    /// Waiting for the plugin took too long.
    #[error("timed out waiting for the plugin: {0}")]
    Wait(String),
}

/// What the runtime learned about the registered plugin.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginInfo {
    /// Registered name.
    pub name: String,
    /// Registered index.
    pub index: String,
    /// NRI version the plugin announced.
    pub nri_version: String,
    /// Event mask from Configure (0 = all).
    pub events: u32,
}

/// Everything recorded for assertions.
#[derive(Default)]
struct State {
    pods: Vec<PodSandbox>,
    containers: Vec<Container>,
    updates: Vec<UpdateContainersRequest>,
    /// CreateContainer answers with an adjustment, as received (decoded when asked for).
    adjustments: Vec<(String, Vec<u8>)>,
    sync_updates: Vec<ContainerUpdate>,
    /// Updates carried in CreateContainer and StopContainer replies, in order.
    reply_updates: Vec<ContainerUpdate>,
    sync_chunks: Vec<usize>,
    fail_updates: usize,
    errors: Vec<String>,
    syncs: usize,
    /// UpdateContainers calls that waited for an event to be answered first.
    updates_held: usize,
}

struct PluginConn {
    info: Mutex<PluginInfo>,
    out: Arc<socket::PluginSocket>,
    /// Calls waiting for their answer: `None` is sent when the deadline passes first.
    pending: Mutex<HashMap<u32, Waiting>>,
    next_stream: AtomicU32,
    kill: watch::Sender<bool>,
    /// Event requests to the plugin not answered yet, by the order they were sent in.
    events: Mutex<std::collections::BTreeSet<u64>>,
    /// The order number the next event request gets.
    next_event: std::sync::atomic::AtomicU64,
    /// Bumped whenever an event request ends (answered, failed or timed out).
    event_ended: watch::Sender<u64>,
}

/// A call waiting for its answer until `deadline`.
struct Waiting {
    tx: oneshot::Sender<Option<Response>>,
    deadline: tokio::time::Instant,
}

struct Inner {
    config: RuntimeConfig,
    state: Mutex<State>,
    plugin: Mutex<Option<Arc<PluginConn>>>,
    /// Bumped after each completed registration + Synchronize.
    synced: watch::Sender<usize>,
    listener: Mutex<Option<(PathBuf, tokio::task::JoinHandle<()>)>>,
    /// While true, a newly registered plugin's Synchronize is not sent yet.
    hold_sync: watch::Sender<bool>,
}

/// A fake NRI runtime. Cheap to clone (shared state).
#[derive(Clone)]
pub struct FakeRuntime {
    inner: Arc<Inner>,
}

impl FakeRuntime {
    /// A runtime that is not listening yet; use [`FakeRuntime::listen`] or [`FakeRuntime::socketpair`].
    pub fn new(config: RuntimeConfig) -> FakeRuntime {
        FakeRuntime {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(State::default()),
                plugin: Mutex::new(None),
                synced: watch::channel(0).0,
                listener: Mutex::new(None),
                hold_sync: watch::channel(false).0,
            }),
        }
    }

    /// Listens on `socket_path` with the default config (NRI v0.12.0, 2 s timeout).
    pub async fn start(socket_path: impl AsRef<Path>) -> std::io::Result<FakeRuntime> {
        Self::start_with(socket_path, RuntimeConfig::default()).await
    }

    /// Listens on `socket_path` with `config`.
    pub async fn start_with(
        socket_path: impl AsRef<Path>,
        config: RuntimeConfig,
    ) -> std::io::Result<FakeRuntime> {
        let rt = FakeRuntime::new(config);
        rt.listen(socket_path.as_ref())?;
        Ok(rt)
    }

    /// Starts accepting plugin connections on `path` (socket mode).
    pub fn listen(&self, path: &Path) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let rt = self.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                rt.attach(stream);
            }
        });
        *self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((path.to_path_buf(), task));
        Ok(())
    }

    /// fd mode: a connected socket pair; the runtime serves one end, the returned end goes to the
    /// plugin (e.g. as fd 3 of a child process with `NRI_PLUGIN_SOCKET=3`).
    pub fn socketpair(&self) -> std::io::Result<std::os::unix::net::UnixStream> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        self.attach(UnixStream::from_std(ours)?);
        Ok(theirs)
    }

    /// Simulates the runtime going away: stops listening, removes the socket, drops the plugin.
    pub async fn stop(&self) {
        let l = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((path, task)) = l {
            task.abort();
            let _ = task.await;
            let _ = std::fs::remove_file(&path);
            *self
                .inner
                .listener
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some((path, tokio::spawn(async {})));
        }
        self.drop_plugin("runtime stopped");
    }

    /// Simulates a runtime restart: [`FakeRuntime::stop`], then listens again on the same path.
    pub async fn restart(&self) -> std::io::Result<()> {
        self.stop().await;
        let path = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(p, _)| p.clone());
        match path {
            Some(p) => self.listen(&p),
            None => Ok(()),
        }
    }

    /// Waits until `n` Synchronizes in total have completed (registration included).
    pub async fn wait_synchronized(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<PluginInfo, FakeError> {
        let mut rx = self.inner.synced.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c >= n))
            .await
            .map_err(|_| FakeError::Wait(format!("{n} synchronizes; errors: {:?}", self.errors())))?
            .map_err(|_| FakeError::NoPlugin)?;
        self.plugin().ok_or(FakeError::NoPlugin)
    }

    /// The registered plugin, if any.
    pub fn plugin(&self) -> Option<PluginInfo> {
        let p = self
            .inner
            .plugin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        p.map(|p| p.info.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Adds a running pod (sent in the next Synchronize).
    pub fn add_pod(&self, pod: PodSandbox) {
        self.state().pods.push(pod);
    }

    /// Adds a container (sent in the next Synchronize).
    pub fn add_container(&self, c: Container) {
        self.state().containers.push(c);
    }

    /// Removes container `id` from the runtime's state (not sent in later Synchronizes).
    pub fn forget_container(&self, id: &str) {
        self.state().containers.retain(|c| c.id != id);
    }

    /// Removes pod `id` and its containers from the runtime's state.
    pub fn forget_pod(&self, id: &str) {
        let mut st = self.state();
        st.pods.retain(|p| p.id != id);
        st.containers.retain(|c| c.pod_sandbox_id != id);
    }

    /// Applies container updates to the containers the runtime reports, as a runtime does once
    /// it has written them to the cgroups: a non-empty cpuset or memory-node list replaces the
    /// container's, an empty one leaves it as is. Containers it does not know are skipped.
    pub fn apply_updates(&self, updates: &[ContainerUpdate]) {
        let mut st = self.state();
        let index: HashMap<String, usize> = st
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        for u in updates {
            let Some(&i) = index.get(&u.container_id) else {
                continue;
            };
            let Some(cpu) = u.linux.as_ref().and_then(|l| l.resources.cpu.as_ref()) else {
                continue;
            };
            let c = &mut st.containers[i];
            let has = c
                .linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default()
                .cpu
                .mut_or_insert_default();
            if !cpu.cpus.is_empty() {
                has.cpus = cpu.cpus.clone();
            }
            if !cpu.mems.is_empty() {
                has.mems = cpu.mems.clone();
            }
        }
    }

    /// The containers the next Synchronize will send.
    pub fn containers(&self) -> Vec<Container> {
        self.state().containers.clone()
    }

    /// While `hold` is true, a plugin that registers gets no Synchronize: the runtime waits
    /// (its registration is done), as a runtime busy with other work does. Setting it back to
    /// false sends the held Synchronize.
    pub fn hold_synchronize(&self, hold: bool) {
        self.inner.hold_sync.send_replace(hold);
    }

    /// How many UpdateContainers calls had to wait for an event request to be answered first
    /// (see [`RuntimeConfig::updates_wait_for_events`]).
    pub fn updates_held(&self) -> usize {
        self.state().updates_held
    }

    /// The next `n` UpdateContainers requests report every update as failed.
    pub fn fail_next_updates(&self, n: usize) {
        self.state().fail_updates = n;
    }

    /// The updates CreateContainer and StopContainer replies carried, in order (applied to the
    /// containers, as a runtime applies them).
    pub fn reply_updates(&self) -> Vec<ContainerUpdate> {
        self.state().reply_updates.clone()
    }

    /// UpdateContainers requests received, in order.
    pub fn updates(&self) -> Vec<UpdateContainersRequest> {
        self.state().updates.clone()
    }

    /// CreateContainer adjustments received, by container id.
    pub fn adjustments(&self) -> Vec<(String, ContainerAdjustment)> {
        self.state()
            .adjustments
            .iter()
            .map(|(id, answer)| {
                // Recorded only after it decoded once.
                let resp = nri_proto::protobuf::Message::parse_from_bytes(answer);
                let resp: CreateContainerResponse = resp.unwrap_or_default();
                (id.clone(), resp.adjust.unwrap_or_default())
            })
            .collect()
    }

    /// Updates returned in Synchronize replies (last chunk).
    pub fn sync_updates(&self) -> Vec<ContainerUpdate> {
        self.state().sync_updates.clone()
    }

    /// Number of chunks each Synchronize used (1 = not paged).
    pub fn sync_chunks(&self) -> Vec<usize> {
        self.state().sync_chunks.clone()
    }

    /// Why plugins were dropped or refused.
    pub fn errors(&self) -> Vec<String> {
        self.state().errors.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Result<Arc<PluginConn>, FakeError> {
        self.inner
            .plugin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(FakeError::NoPlugin)
    }

    fn drop_plugin(&self, why: &str) {
        let p = self
            .inner
            .plugin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(p) = p {
            self.state().errors.push(why.to_string());
            p.kill.send_replace(true);
        }
    }
}
