//! The plugin stub: connects to the runtime, registers, serves the plugin service and reconnects.

use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::{broadcast, watch};
use ttrpc::r#async::transport::Socket;

use crate::api::{
    ContainerEviction, ContainerUpdate, RegisterPluginRequest, UpdateContainersRequest,
};
use crate::error::StubError;
use crate::generated::nri_ttrpc::RuntimeClient;
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::notify::{Notifier, StubEvent};
use crate::plugin::Plugin;
use crate::service::PluginService;

/// The NRI version this stub speaks, sent in RegisterPluginRequest.
pub const NRI_VERSION: &str = "v0.12.0";
/// The runtime's default socket.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// Timeout of the stub's own calls to the runtime.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds a [`Stub`].
#[derive(Default)]
pub struct StubBuilder {
    name: String,
    index: String,
    socket: Option<PathBuf>,
    stream: Option<StdUnixStream>,
    env_error: Option<StubError>,
    backoff: Option<(Duration, Duration)>,
    call_timeout: Option<Duration>,
}

impl StubBuilder {
    /// The plugin name (`[a-zA-Z0-9_.+-]`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The two-digit plugin index; plugins run in ascending index order.
    pub fn index(mut self, index: impl Into<String>) -> Self {
        self.index = index.into();
        self
    }

    /// Connect to the runtime's socket at `path` (and reconnect after runtime restarts).
    pub fn socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket = Some(path.into());
        self
    }

    /// Use an already connected socket (as a runtime-launched plugin does); no reconnect.
    pub fn stream(mut self, stream: StdUnixStream) -> Self {
        self.stream = Some(stream);
        self
    }

    /// Reads `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` and `NRI_PLUGIN_SOCKET` (a file descriptor number,
    /// set when the runtime launched the plugin); values already given are overridden.
    pub fn from_env(mut self) -> Self {
        if let Ok(name) = std::env::var("NRI_PLUGIN_NAME") {
            self.name = name;
        }
        if let Ok(idx) = std::env::var("NRI_PLUGIN_IDX") {
            self.index = idx;
        }
        if let Ok(sock) = std::env::var("NRI_PLUGIN_SOCKET") {
            match sock.parse::<i32>() {
                Ok(fd) => match crate::fd::take_socket_fd(fd) {
                    Ok(s) => self.stream = Some(s),
                    Err(e) => self.env_error = Some(StubError::Inherited(e)),
                },
                Err(_) => self.env_error = Some(StubError::BadSocketEnv(sock)),
            }
        }
        self
    }

    /// Reconnect backoff in socket mode: starts at `min`, doubles up to `max` (default 100 ms, 5 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = Some((min, max));
        self
    }

    /// How long RegisterPlugin may go unanswered before the attempt fails and is retried
    /// (default 5 s). A runtime that accepts the socket but never answers costs this much per
    /// attempt.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// Validates the name and index and builds the stub.
    pub fn build(self) -> Result<Stub, StubError> {
        if let Some(e) = self.env_error {
            return Err(e);
        }
        validate_name(&self.name)?;
        validate_index(&self.index)?;
        if self.socket.is_none() && self.stream.is_none() {
            return Err(StubError::NoSocket);
        }
        let (tx, _) = broadcast::channel(64);
        let (close_tx, _) = watch::channel(false);
        Ok(Stub {
            name: self.name,
            index: self.index,
            socket: self.socket,
            stream: Mutex::new(self.stream),
            backoff: self
                .backoff
                .unwrap_or((Duration::from_millis(100), Duration::from_secs(5))),
            call_timeout: self.call_timeout.unwrap_or(CALL_TIMEOUT),
            notify: Notifier::new(tx),
            updater: Updater {
                client: Arc::new(Mutex::new(None)),
            },
            close: close_tx,
        })
    }
}

/// Checks a plugin name: non-empty, only `[a-zA-Z0-9_.+-]`.
pub fn validate_name(name: &str) -> Result<(), StubError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'+' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StubError::InvalidName(name.to_string()))
    }
}

/// Checks a plugin index: exactly two ASCII digits.
pub fn validate_index(index: &str) -> Result<(), StubError> {
    if index.len() == 2 && index.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(StubError::InvalidIndex(index.to_string()))
    }
}

/// A handle for pushing unsolicited container updates to the runtime from outside event handlers.
/// Cheap to clone; works across reconnects.
#[derive(Clone)]
pub struct Updater {
    client: Arc<Mutex<Option<RuntimeClient>>>,
}

impl Updater {
    /// Asks the runtime to apply `update` and `evict`; returns the updates that failed.
    /// Do not call from inside an event handler: return in-handler updates in the reply instead.
    pub async fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
        evict: Vec<ContainerEviction>,
    ) -> Result<Vec<ContainerUpdate>, StubError> {
        let client = self
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let client = client.ok_or(StubError::NotConnected)?;
        let mut req = UpdateContainersRequest::new();
        req.update = update;
        req.evict = evict;
        let ctx = ttrpc::context::with_timeout(CALL_TIMEOUT.as_nanos() as i64);
        let resp = client
            .update_containers(ctx, &req)
            .await
            .map_err(|error| StubError::Call {
                call: "UpdateContainers",
                error,
            })?;
        Ok(resp.failed)
    }

    fn set(&self, c: Option<RuntimeClient>) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = c;
    }
}

/// An NRI plugin stub. Build with [`Stub::builder`], then [`Stub::run`] a [`Plugin`].
pub struct Stub {
    name: String,
    index: String,
    socket: Option<PathBuf>,
    stream: Mutex<Option<StdUnixStream>>,
    backoff: (Duration, Duration),
    call_timeout: Duration,
    notify: Notifier,
    updater: Updater,
    close: watch::Sender<bool>,
}

impl Stub {
    /// A builder: `Stub::builder().name("accel").index("10").socket(path).build()?`.
    pub fn builder() -> StubBuilder {
        StubBuilder::default()
    }

    /// The handle for unsolicited updates.
    pub fn updater(&self) -> Updater {
        self.updater.clone()
    }

    /// Connection events (connected, configured, synchronized, disconnected).
    pub fn subscribe(&self) -> broadcast::Receiver<StubEvent> {
        self.notify.subscribe()
    }

    /// Ends [`Stub::run`] / [`Stub::connect_once`]: closes the connection and stops reconnecting.
    pub fn close(&self) {
        self.close.send_replace(true);
    }

    /// Serves `plugin` until [`Stub::close`]. In socket mode a lost connection is retried with
    /// exponential backoff (the runtime restarted); with an inherited socket the first loss ends it.
    pub async fn run<P: Plugin>(&self, plugin: Arc<P>) -> Result<(), StubError> {
        let (min, max) = self.backoff;
        let mut delay = min;
        let mut closed = self.close.subscribe();
        // The failure last reported: the same failure again is not news, so a runtime that keeps
        // refusing (or never answering) gives one line per change, not one per attempt.
        let mut reported: Option<String> = None;
        loop {
            let inherited = self.socket.is_none();
            match self.connect_once(plugin.clone()).await {
                Ok(()) => {
                    delay = min;
                    reported = None;
                }
                Err(e) if inherited => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    if reported.as_deref() == Some(text.as_str()) {
                        tracing::debug!(error = %text, retry_in = ?delay, "NRI connection attempt failed again");
                    } else {
                        tracing::warn!(
                            "cannot register with the runtime: {text}; retrying every {max:?} at \
                             most, said again only if the failure changes"
                        );
                        reported = Some(text);
                    }
                }
            }
            if *closed.borrow() || inherited {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = closed.wait_for(|c| *c) => return Ok(()),
            }
            delay = (delay * 2).min(max);
        }
    }

    /// One connection: connect, serve, register, and serve until the connection closes or
    /// [`Stub::close`] is called. Returns `Ok` after a connection that was configured.
    pub async fn connect_once<P: Plugin>(&self, plugin: Arc<P>) -> Result<(), StubError> {
        let stream = self.open_stream().await?;
        let mux = Mux::new(stream).map_err(|e| StubError::Transport(e.to_string()))?;
        let conn1 = mux
            .open(PLUGIN_SERVICE_CONN)
            .map_err(|e| StubError::Transport(e.to_string()))?;
        let conn2 = mux
            .open(RUNTIME_SERVICE_CONN)
            .map_err(|e| StubError::Transport(e.to_string()))?;
        let mut events = self.subscribe();

        // Serve conn 1 before registering: the runtime may send Configure before it replies.
        let service = PluginService::new(plugin, self.notify.clone());
        let server = tokio::spawn(crate::server::serve(conn1, Arc::new(service)));
        let client = RuntimeClient::new(ttrpc::r#async::Client::new(Socket::new(conn2)));
        // Installed before registering, so it is in place by the time StubEvent::Synchronized is
        // seen (the runtime may synchronize before its RegisterPlugin reply is processed here).
        self.updater.set(Some(client.clone()));
        self.notify.send(StubEvent::Connected);

        let mut req = RegisterPluginRequest::new();
        req.plugin_name = self.name.clone();
        req.plugin_idx = self.index.clone();
        req.NRI_version = NRI_VERSION.to_string();
        let ctx = ttrpc::context::with_timeout(self.call_timeout.as_nanos() as i64);
        let mut closed = mux.closed();
        let mut close = self.close.subscribe();
        let result = tokio::select! {
            r = client.register_plugin(ctx, &req) => r.map_err(|error| StubError::Call { call: "RegisterPlugin", error }),
            r = closed.wait_for(|c| c.is_some()) => {
                let why = r.ok().and_then(|c| c.clone()).unwrap_or_default();
                Err(StubError::NotConfigured(format!("connection closed during registration: {why}")))
            }
            _ = close.wait_for(|c| *c) => Ok(Default::default()),
        };
        let mut configured = false;
        if result.is_ok() {
            tokio::select! {
                _ = closed.wait_for(|c| c.is_some()) => {}
                _ = close.wait_for(|c| *c) => {}
            }
        }
        self.updater.set(None);
        while let Ok(e) = events.try_recv() {
            configured |= matches!(e, StubEvent::Configured { .. });
        }
        let reason = closed
            .borrow()
            .clone()
            .unwrap_or_else(|| "closed by the plugin".into());
        mux.close();
        // The server ends with the connection, once its running handlers finish (bounded).
        let _ = server.await;
        self.notify.send(StubEvent::Disconnected {
            reason: reason.clone(),
            registered: result.is_ok(),
        });
        result?;
        if configured || *self.close.borrow() {
            Ok(())
        } else {
            Err(StubError::NotConfigured(reason))
        }
    }

    async fn open_stream(&self) -> Result<UnixStream, StubError> {
        if let Some(path) = &self.socket {
            return UnixStream::connect(path)
                .await
                .map_err(|source| StubError::Connect {
                    path: path.clone(),
                    source,
                });
        }
        let std = self.stream.lock().unwrap_or_else(|e| e.into_inner()).take();
        let std = std.ok_or(StubError::InheritedUsed)?;
        std.set_nonblocking(true).map_err(StubError::Inherited)?;
        UnixStream::from_std(std).map_err(StubError::Inherited)
    }
}
