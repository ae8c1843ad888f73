//! The fake NRI runtime: listens like containerd/CRI-O, registers, configures and synchronizes a
//! plugin, sends events and records what the plugin asks for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nri_proto::api::*;
use nri_proto::protobuf::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};

use crate::wire::{self, GoConnReader, Request, Response};

mod calls;
pub use calls::{encode_sync_chunks, nri_mask_for};

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
    adjustments: Vec<(String, ContainerAdjustment)>,
    sync_updates: Vec<ContainerUpdate>,
    sync_chunks: Vec<usize>,
    fail_updates: usize,
    errors: Vec<String>,
    syncs: usize,
    /// Largest frame the plugin sent on each conn.
    max_plugin_frame: usize,
}

struct PluginConn {
    info: Mutex<PluginInfo>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Response>>>,
    next_stream: AtomicU32,
    kill: watch::Sender<bool>,
}

struct Inner {
    config: RuntimeConfig,
    state: Mutex<State>,
    plugin: Mutex<Option<Arc<PluginConn>>>,
    /// Bumped after each completed registration + Synchronize.
    synced: watch::Sender<usize>,
    listener: Mutex<Option<(PathBuf, tokio::task::JoinHandle<()>)>>,
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

    /// The next `n` UpdateContainers requests report every update as failed.
    pub fn fail_next_updates(&self, n: usize) {
        self.state().fail_updates = n;
    }

    /// UpdateContainers requests received, in order.
    pub fn updates(&self) -> Vec<UpdateContainersRequest> {
        self.state().updates.clone()
    }

    /// CreateContainer adjustments received, by container id.
    pub fn adjustments(&self) -> Vec<(String, ContainerAdjustment)> {
        self.state().adjustments.clone()
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

    /// Serves one plugin connection.
    fn attach(&self, stream: UnixStream) {
        let (kill, _) = watch::channel(false);
        let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Arc::new(PluginConn {
            info: Mutex::new(PluginInfo::default()),
            out,
            pending: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            kill,
        });
        let (mut rd, mut wr) = stream.into_split();
        let (tx1, rx1) = mpsc::unbounded_channel();
        let (tx2, rx2) = mpsc::unbounded_channel();
        let rt = self.clone();
        let mut killed = conn.kill.subscribe();
        let c = conn.clone();
        tokio::spawn(async move {
            let writer = async {
                while let Some(b) = out_rx.recv().await {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
            };
            let reader = async {
                let mut h = [0u8; wire::FRAME_HEADER];
                loop {
                    if rd.read_exact(&mut h).await.is_err() {
                        return "plugin closed the connection".to_string();
                    }
                    let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
                    if len > wire::MAX_FRAME {
                        return format!("frame of {len} bytes over the limit");
                    }
                    let mut p = vec![0u8; len];
                    if rd.read_exact(&mut p).await.is_err() {
                        return "truncated frame".to_string();
                    }
                    {
                        let mut st = rt.state();
                        st.max_plugin_frame = st.max_plugin_frame.max(len);
                    }
                    let _ = match id {
                        1 => tx1.send(p),
                        2 => tx2.send(p),
                        _ => Ok(()),
                    };
                }
            };
            let why = tokio::select! {
                _ = writer => "write failed".to_string(),
                w = reader => w,
                _ = killed.wait_for(|k| *k) => "dropped by the runtime".to_string(),
            };
            rt.lost(&c, &why);
        });
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move { rt.read_responses(c, GoConnReader::new(rx1)).await });
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move { rt.serve_runtime(c, GoConnReader::new(rx2)).await });
        // A plugin that has not registered (and been configured) in time is cut off.
        let rt = self.clone();
        let deadline = self.inner.config.registration_timeout;
        tokio::spawn(async move {
            let mut killed = conn.kill.subscribe();
            tokio::select! {
                _ = tokio::time::sleep(deadline) => {
                    let current = rt.inner.plugin.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if !current.is_some_and(|p| Arc::ptr_eq(&p, &conn)) {
                        rt.fail(&conn, "plugin did not register in time".into());
                    }
                }
                _ = killed.wait_for(|k| *k) => {}
            }
        });
    }

    fn lost(&self, conn: &Arc<PluginConn>, why: &str) {
        conn.kill.send_replace(true);
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let mut cur = self.inner.plugin.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|p| Arc::ptr_eq(p, conn)) {
            *cur = None;
            drop(cur);
            self.state().errors.push(why.to_string());
        }
    }

    async fn read_responses(&self, conn: Arc<PluginConn>, mut rd: GoConnReader) {
        loop {
            let msg = rd.read_message().await;
            let (sid, kind, body) = match msg {
                Ok(m) => m,
                Err(e) => {
                    self.fail(&conn, format!("conn 1: {e}"));
                    return;
                }
            };
            if kind != wire::TYPE_RESPONSE {
                self.fail(&conn, format!("conn 1: unexpected message type {kind}"));
                return;
            }
            let resp = match Response::decode(&body) {
                Ok(r) => r,
                Err(e) => {
                    self.fail(&conn, format!("conn 1: {e}"));
                    return;
                }
            };
            let tx = conn
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&sid);
            if let Some(tx) = tx {
                let _ = tx.send(resp);
            }
        }
    }

    fn fail(&self, conn: &Arc<PluginConn>, why: String) {
        if why.ends_with("connection closed") {
            return;
        }
        self.state().errors.push(why.clone());
        self.lost(conn, &why);
    }

    async fn serve_runtime(&self, conn: Arc<PluginConn>, mut rd: GoConnReader) {
        let mut last_sid = 0u32;
        loop {
            let (sid, kind, body) = match rd.read_message().await {
                Ok(m) => m,
                Err(e) => return self.fail(&conn, format!("conn 2: {e}")),
            };
            if kind != wire::TYPE_REQUEST || sid % 2 == 0 || sid <= last_sid {
                return self.fail(&conn, format!("conn 2: bad stream id {sid} or type {kind}"));
            }
            last_sid = sid;
            let req = match Request::decode(&body) {
                Ok(r) => r,
                Err(e) => return self.fail(&conn, format!("conn 2: {e}")),
            };
            let rt = self.clone();
            let c = conn.clone();
            tokio::spawn(async move {
                let resp = rt.handle_runtime_call(&c, req).await;
                let _ = c.out.send(wire::frame_message(
                    2,
                    sid,
                    wire::TYPE_RESPONSE,
                    &resp.encode(),
                ));
            });
        }
    }

    async fn handle_runtime_call(&self, conn: &Arc<PluginConn>, req: Request) -> Response {
        let err = |code, message: String| Response {
            code,
            message,
            payload: Vec::new(),
        };
        if req.service != RUNTIME_SERVICE {
            return err(
                CODE_UNIMPLEMENTED,
                format!("unknown service {}", req.service),
            );
        }
        match req.method.as_str() {
            "RegisterPlugin" => {
                let Ok(r) = RegisterPluginRequest::parse_from_bytes(&req.payload) else {
                    return err(CODE_UNKNOWN, "bad RegisterPluginRequest".into());
                };
                match self.register(conn, r).await {
                    Ok(()) => Response {
                        payload: Vec::new(),
                        ..Default::default()
                    },
                    Err(e) => {
                        self.fail(conn, format!("registration failed: {e}"));
                        err(CODE_UNKNOWN, e.to_string())
                    }
                }
            }
            "UpdateContainers" => {
                let Ok(r) = UpdateContainersRequest::parse_from_bytes(&req.payload) else {
                    return err(CODE_UNKNOWN, "bad UpdateContainersRequest".into());
                };
                let mut resp = UpdateContainersResponse::new();
                {
                    let mut st = self.state();
                    if st.fail_updates > 0 {
                        st.fail_updates -= 1;
                        resp.failed = r.update.clone();
                    }
                    st.updates.push(r);
                }
                Response {
                    payload: resp.write_to_bytes().unwrap_or_default(),
                    ..Default::default()
                }
            }
            m => err(CODE_UNIMPLEMENTED, format!("unknown method {m}")),
        }
    }

    /// Registration as the Go runtime does it: Configure goes out before the RegisterPlugin reply,
    /// then Synchronize. The plugin becomes current once configured.
    async fn register(
        &self,
        conn: &Arc<PluginConn>,
        r: RegisterPluginRequest,
    ) -> Result<(), FakeError> {
        let idx_ok = r.plugin_idx.len() == 2 && r.plugin_idx.bytes().all(|b| b.is_ascii_digit());
        if !idx_ok || r.plugin_name.is_empty() {
            return Err(FakeError::Wire(format!(
                "invalid plugin name {:?} or index {:?}",
                r.plugin_name, r.plugin_idx
            )));
        }
        {
            let mut info = conn.info.lock().unwrap_or_else(|e| e.into_inner());
            info.name = r.plugin_name.clone();
            info.index = r.plugin_idx.clone();
            info.nri_version = r.NRI_version.clone();
        }
        let cfg = &self.inner.config;
        let mut creq = ConfigureRequest::new();
        creq.config = cfg.config.clone();
        creq.runtime_name = cfg.runtime_name.clone();
        creq.runtime_version = cfg.runtime_version.clone();
        creq.registration_timeout = cfg.registration_timeout.as_millis() as i64;
        creq.request_timeout = cfg.request_timeout.as_millis() as i64;
        creq.NRI_version = cfg.nri_version.clone();
        let resp: ConfigureResponse = self
            .call_on(conn, "Configure", &creq, cfg.request_timeout)
            .await?;
        let valid = nri_mask_for(&cfg.nri_version);
        let events = resp.events as u32;
        if events & !valid != 0 {
            return Err(FakeError::Wire(format!(
                "plugin subscribed to events {events:#x} outside the valid mask {valid:#x} of NRI {}",
                cfg.nri_version
            )));
        }
        conn.info.lock().unwrap_or_else(|e| e.into_inner()).events = events;
        *self.inner.plugin.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        // Synchronize after the RegisterPlugin reply has gone out, as the runtime does.
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            match rt.synchronize(&c).await {
                Ok(()) => rt.inner.synced.send_modify(|n| *n += 1),
                Err(e) => rt.fail(&c, format!("synchronize failed: {e}")),
            }
        });
        Ok(())
    }

    async fn synchronize(&self, conn: &Arc<PluginConn>) -> Result<(), FakeError> {
        let chunks = {
            let st = self.state();
            encode_sync_chunks(&st.pods, &st.containers)
        };
        let n = chunks.len();
        let budget = self.inner.config.request_timeout;
        let started = tokio::time::Instant::now();
        let mut final_updates = Vec::new();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let left = budget.saturating_sub(started.elapsed());
            let resp: SynchronizeResponse = self.call_raw(conn, "Synchronize", chunk, left).await?;
            let last = i + 1 == n;
            if !last && (!resp.more || !resp.update.is_empty()) {
                return Err(FakeError::Wire(
                    "plugin does not handle split sync requests".into(),
                ));
            }
            if last {
                final_updates = resp.update;
            }
        }
        let mut st = self.state();
        st.sync_chunks.push(n);
        st.sync_updates.extend(final_updates);
        st.syncs += 1;
        Ok(())
    }

    async fn call_on<Q: Message, A: Message>(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, FakeError> {
        let payload = req
            .write_to_bytes()
            .map_err(|e| FakeError::Wire(e.to_string()))?;
        self.call_raw(conn, method, payload, timeout).await
    }

    async fn call_raw<A: Message>(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<A, FakeError> {
        let body = Request {
            service: PLUGIN_SERVICE.into(),
            method: method.into(),
            payload,
            timeout_nano: timeout.as_nanos() as i64,
        }
        .encode();
        if body.len() > wire::MAX_BODY {
            return Err(FakeError::Wire(format!(
                "{method} request of {} bytes over 4 MiB",
                body.len()
            )));
        }
        let sid = conn.next_stream.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sid, tx);
        conn.out
            .send(wire::frame_message(1, sid, wire::TYPE_REQUEST, &body))
            .map_err(|_| FakeError::Wire("connection closed".into()))?;
        let resp = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => {
                return Err(FakeError::Wire(format!(
                    "connection closed during {method}"
                )));
            }
            Err(_) => {
                let why = format!("{method} timed out");
                self.lost(conn, &why);
                return Err(FakeError::Timeout(method.into()));
            }
        };
        if resp.code == CODE_DEADLINE_EXCEEDED {
            // The plugin's ttrpc server enforces the request's timeout_nano itself; a deadline
            // error is as fatal as a missed reply.
            self.lost(
                conn,
                &format!("{method} timed out (deadline exceeded in the plugin)"),
            );
            return Err(FakeError::Timeout(method.into()));
        }
        if resp.code != 0 {
            return Err(FakeError::Status {
                method: method.into(),
                code: resp.code,
                message: resp.message,
            });
        }
        A::parse_from_bytes(&resp.payload)
            .map_err(|e| FakeError::Wire(format!("bad {method} reply: {e}")))
    }
}
