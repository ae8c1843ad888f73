//! The kubelet's side of device plugins: its `v1beta1.Registration` server on
//! `<dir>/kubelet.sock` (a tonic server written by hand over `tonic::server::Grpc`, no generated
//! code), the ListAndWatch stream it keeps to every registered plugin, a device manager that
//! admits containers the way the kubelet does (GetPreferredAllocation, then Allocate), and a
//! plain client of the `v1beta1.DevicePlugin` service.
//!
//! [`DevicePluginKubelet::restart`] does what a restarting kubelet does to the directory: every
//! file in it is removed, a new `kubelet.sock` is served, and every plugin must register again.
//! The device manager's allocations survive the restart, as the kubelet's checkpoint does.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::{Body, BoxFuture, StdError, http};

use super::deviceplugin_wire as pb;
use super::{GrpcCaller, SimError};

/// One device as the plugin listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedDevice {
    /// The device ID.
    pub id: String,
    /// Whether the plugin said `Healthy`.
    pub healthy: bool,
    /// The NUMA nodes of its topology.
    pub numa: Vec<i64>,
}

/// A registered plugin and what its ListAndWatch said last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredDevicePlugin {
    /// The resource name.
    pub resource: String,
    /// The plugin's socket.
    pub endpoint: PathBuf,
    /// Whether it asked to be asked GetPreferredAllocation.
    pub preferred_allocation: bool,
    /// Whether it asked for PreStartContainer.
    pub pre_start_required: bool,
    /// The devices of the last ListAndWatch message.
    pub devices: Vec<ListedDevice>,
    /// ListAndWatch messages received since it registered.
    pub updates: u64,
    /// Whether the ListAndWatch stream is open.
    pub streaming: bool,
}

impl RegisteredDevicePlugin {
    /// IDs of the devices the last list said are unhealthy, in list order.
    pub fn unhealthy(&self) -> Vec<&str> {
        self.devices
            .iter()
            .filter(|d| !d.healthy)
            .map(|d| d.id.as_str())
            .collect()
    }
}

#[derive(Default)]
struct State {
    plugins: BTreeMap<String, RegisteredDevicePlugin>,
    streams: Vec<JoinHandle<()>>,
    /// Register calls per resource, over every restart.
    registrations: BTreeMap<String, u64>,
    /// The device manager's allocations: container key -> (resource, device IDs).
    allocated: BTreeMap<String, (String, Vec<String>)>,
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

/// A simulated kubelet's device manager over a device-plugins directory.
pub struct DevicePluginKubelet {
    shared: Arc<Shared>,
    server: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl DevicePluginKubelet {
    /// Serves `<dir>/kubelet.sock` (creating `dir`; a stale socket is replaced).
    pub fn start(dir: &Path) -> std::io::Result<DevicePluginKubelet> {
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        });
        let mut kubelet = DevicePluginKubelet {
            shared,
            server: None,
        };
        kubelet.serve()?;
        Ok(kubelet)
    }

    /// The device-plugins directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The kubelet's registration socket.
    pub fn socket(&self) -> PathBuf {
        self.shared.dir.join("kubelet.sock")
    }

    fn serve(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.shared.dir)?;
        let path = self.socket();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = tokio::net::UnixListener::bind(&path)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = RegistrationService(self.shared.clone());
        let task = tokio::spawn(async move {
            let incoming = UnixListenerStream::new(listener);
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = result {
                tracing::warn!(error = %e, "simulated kubelet's registration server failed");
            }
        });
        self.server = Some((stop, task));
        Ok(())
    }

    async fn stop_server(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let mut st = self.shared.state();
        for t in st.streams.drain(..) {
            t.abort();
        }
        st.plugins.clear();
    }

    /// Restarts as a kubelet does: forgets every plugin, removes every file in the directory
    /// (the plugins' sockets included), and serves a new `kubelet.sock`. Allocations are kept.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.stop_server().await;
        if let Ok(entries) = std::fs::read_dir(&self.shared.dir) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        self.shared.bump();
        self.serve()
    }

    /// Restarts without a gap and without touching the plugins' sockets: forgets every plugin
    /// (their ListAndWatch streams close), then removes `kubelet.sock` and binds a new one at
    /// once, so the new socket may get the old one's inode back (ext4 reuses them). Allocations
    /// are kept.
    pub async fn restart_in_place(&mut self) -> std::io::Result<()> {
        self.stop_server().await;
        self.shared.bump();
        self.serve()
    }

    /// Stops serving; the socket file is left as a dead kubelet leaves it.
    pub async fn stop(mut self) {
        self.stop_server().await;
    }

    /// The plugin registered for `resource`, if any.
    pub fn plugin(&self, resource: &str) -> Option<RegisteredDevicePlugin> {
        self.shared.state().plugins.get(resource).cloned()
    }

    /// How many times a plugin registered `resource`, over every restart.
    pub fn registrations(&self, resource: &str) -> u64 {
        self.shared
            .state()
            .registrations
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `ready` holds for the plugin of `resource` (registered, with its last list).
    pub async fn wait_plugin(
        &self,
        resource: &str,
        timeout: Duration,
        ready: impl Fn(&RegisteredDevicePlugin) -> bool,
    ) -> Result<RegisteredDevicePlugin, SimError> {
        let mut changed = self.shared.changed.subscribe();
        let wait = async {
            loop {
                if let Some(p) = self.plugin(resource).filter(|p| ready(p)) {
                    return p;
                }
                // A closed channel cannot happen while `self` lives; poll then.
                if changed.changed().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| SimError::Timeout(format!("the device plugin of {resource}")))
    }

    /// Waits until `resource` is registered and has listed its devices.
    pub async fn wait_registered(
        &self,
        resource: &str,
        timeout: Duration,
    ) -> Result<RegisteredDevicePlugin, SimError> {
        self.wait_plugin(resource, timeout, |p| p.updates > 0).await
    }

    /// A client of the plugin registered for `resource`.
    pub async fn client(&self, resource: &str) -> Result<DevicePluginClient, SimError> {
        let p = self
            .plugin(resource)
            .ok_or_else(|| SimError::Timeout(format!("no plugin registered for {resource}")))?;
        DevicePluginClient::connect(&p.endpoint).await
    }

    /// Device IDs of `resource` the device manager has allocated, over every container.
    pub fn allocated(&self, resource: &str) -> BTreeSet<String> {
        self.shared
            .state()
            .allocated
            .values()
            .filter(|(r, _)| r == resource)
            .flat_map(|(_, ids)| ids.iter().cloned())
            .collect()
    }

    /// The device IDs allocated to container `key`.
    pub fn allocation(&self, key: &str) -> Option<Vec<String>> {
        self.shared
            .state()
            .allocated
            .get(key)
            .map(|(_, ids)| ids.clone())
    }

    /// Admits container `key` asking `count` devices of `resource`, as the kubelet's device
    /// manager does: the healthy devices no container holds are offered to
    /// GetPreferredAllocation (when the plugin asked for it), the answer (or the first `count`)
    /// is allocated, and kept for the container until [`DevicePluginKubelet::forget`].
    pub async fn admit(
        &self,
        key: &str,
        resource: &str,
        count: usize,
    ) -> Result<(Vec<String>, pb::ContainerAllocateResponse), SimError> {
        let plugin = self
            .plugin(resource)
            .ok_or_else(|| SimError::Timeout(format!("no plugin registered for {resource}")))?;
        let held = self.allocated(resource);
        let available: Vec<String> = plugin
            .devices
            .iter()
            .filter(|d| d.healthy && !held.contains(&d.id))
            .map(|d| d.id.clone())
            .collect();
        if available.len() < count {
            return Err(SimError::Refused {
                socket: plugin.endpoint.display().to_string(),
                reason: format!(
                    "{count} devices of {resource} asked, {} available",
                    available.len()
                ),
            });
        }
        let client = DevicePluginClient::connect(&plugin.endpoint).await?;
        let mut chosen = if plugin.preferred_allocation {
            client.preferred(&available, &[], count).await?
        } else {
            Vec::new()
        };
        chosen.retain(|id| available.contains(id));
        chosen.dedup();
        for id in &available {
            if chosen.len() >= count {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        chosen.truncate(count);
        let answer = client.allocate(&chosen).await?;
        self.shared
            .state()
            .allocated
            .insert(key.to_string(), (resource.to_string(), chosen.clone()));
        Ok((chosen, answer))
    }

    /// Forgets container `key`'s allocation (its pod is gone, as far as the kubelet knows).
    pub fn forget(&self, key: &str) {
        self.shared.state().allocated.remove(key);
    }
}

impl Drop for DevicePluginKubelet {
    fn drop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(());
            task.abort();
        }
        for t in self.shared.state().streams.drain(..) {
            t.abort();
        }
    }
}

/// What the kubelet checks in a registration before it takes it; the error is the reason sent.
fn judge(req: &pb::RegisterRequest) -> Result<(), String> {
    if req.version != pb::VERSION {
        return Err(format!(
            "version {:?} is not supported, this kubelet speaks {}",
            req.version,
            pb::VERSION
        ));
    }
    let Some((prefix, name)) = req.resource_name.split_once('/') else {
        return Err(format!(
            "resource name {:?} is not an extended resource name",
            req.resource_name
        ));
    };
    if prefix.is_empty() || name.is_empty() || prefix == "kubernetes.io" {
        return Err(format!(
            "resource name {:?} is not an extended resource name",
            req.resource_name
        ));
    }
    if req.endpoint.is_empty() || req.endpoint.contains('/') {
        return Err(format!(
            "endpoint {:?} must be a file name in the device-plugins directory",
            req.endpoint
        ));
    }
    Ok(())
}

/// Follows a plugin's ListAndWatch stream, recording every list.
async fn follow(shared: Arc<Shared>, resource: String, endpoint: PathBuf) {
    let stream = match DevicePluginClient::connect(&endpoint).await {
        Ok(c) => c.list_and_watch().await,
        Err(e) => Err(e),
    };
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%resource, error = %e, "simulated kubelet could not open ListAndWatch");
            return;
        }
    };
    loop {
        let next = stream.message().await;
        let mut st = shared.state();
        let Some(p) = st.plugins.get_mut(&resource) else {
            return;
        };
        match next {
            Ok(Some(msg)) => {
                p.devices = msg
                    .devices
                    .into_iter()
                    .map(|d| ListedDevice {
                        healthy: d.health == pb::HEALTHY,
                        numa: d
                            .topology
                            .map(|t| t.nodes.into_iter().map(|n| n.id).collect())
                            .unwrap_or_default(),
                        id: d.id,
                    })
                    .collect();
                p.updates += 1;
                p.streaming = true;
                drop(st);
                shared.bump();
            }
            Ok(None) | Err(_) => {
                p.streaming = false;
                drop(st);
                shared.bump();
                return;
            }
        }
    }
}

async fn register(
    shared: Arc<Shared>,
    req: pb::RegisterRequest,
) -> Result<pb::Empty, tonic::Status> {
    judge(&req).map_err(tonic::Status::invalid_argument)?;
    let endpoint = shared.dir.join(&req.endpoint);
    let options = req.options.unwrap_or_default();
    let resource = req.resource_name;
    {
        let mut st = shared.state();
        *st.registrations.entry(resource.clone()).or_default() += 1;
        st.plugins.insert(
            resource.clone(),
            RegisteredDevicePlugin {
                resource: resource.clone(),
                endpoint: endpoint.clone(),
                preferred_allocation: options.get_preferred_allocation_available,
                pre_start_required: options.pre_start_required,
                devices: Vec::new(),
                updates: 0,
                streaming: false,
            },
        );
        let task = tokio::spawn(follow(shared.clone(), resource.clone(), endpoint));
        st.streams.push(task);
    }
    shared.bump();
    Ok(pb::Empty {})
}

/// The kubelet's `v1beta1.Registration` service, routed by method path by hand.
#[derive(Clone)]
struct RegistrationService(Arc<Shared>);

impl tonic::server::NamedService for RegistrationService {
    const NAME: &'static str = "v1beta1.Registration";
}

/// The Register method as a unary gRPC service.
struct RegisterMethod(Arc<Shared>);

impl tonic::server::UnaryService<pb::RegisterRequest> for RegisterMethod {
    type Response = pb::Empty;
    type Future = BoxFuture<tonic::Response<pb::Empty>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<pb::RegisterRequest>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            register(shared, request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> tower::Service<http::Request<B>> for RegistrationService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let shared = self.0.clone();
        if req.uri().path() == pb::REGISTER {
            return Box::pin(async move {
                let codec: tonic_prost::ProstCodec<pb::Empty, pb::RegisterRequest> =
                    tonic_prost::ProstCodec::default();
                let mut grpc = tonic::server::Grpc::new(codec);
                Ok(grpc.unary(RegisterMethod(shared), req).await)
            });
        }
        Box::pin(async move {
            Ok(tonic::Status::unimplemented("this kubelet serves only Register").into_http())
        })
    }
}

/// Calls a device plugin's `v1beta1.DevicePlugin` service as the kubelet does.
#[derive(Clone, Debug)]
pub struct DevicePluginClient {
    caller: GrpcCaller,
}

impl DevicePluginClient {
    /// Connects to the plugin on `socket`.
    pub async fn connect(socket: &Path) -> Result<DevicePluginClient, SimError> {
        Ok(DevicePluginClient {
            caller: GrpcCaller::connect(socket).await?,
        })
    }

    /// GetDevicePluginOptions.
    pub async fn options(&self) -> Result<pb::DevicePluginOptions, SimError> {
        self.caller.unary(pb::OPTIONS, pb::Empty {}).await
    }

    /// ListAndWatch: the stream of device lists.
    pub async fn list_and_watch(
        &self,
    ) -> Result<tonic::Streaming<pb::ListAndWatchResponse>, SimError> {
        self.caller
            .server_streaming(pb::LIST_AND_WATCH, pb::Empty {})
            .await
    }

    /// GetPreferredAllocation for one container.
    pub async fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, SimError> {
        let req = pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_ids: available.to_vec(),
                must_include_device_ids: must_include.to_vec(),
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let resp: pb::PreferredAllocationResponse = self.caller.unary(pb::PREFERRED, req).await?;
        Ok(resp
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_ids)
            .unwrap_or_default())
    }

    /// Allocate for one container.
    pub async fn allocate(
        &self,
        ids: &[String],
    ) -> Result<pb::ContainerAllocateResponse, SimError> {
        let mut all = self.allocate_many(&[ids.to_vec()]).await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// Allocate for several containers in one call.
    pub async fn allocate_many(
        &self,
        containers: &[Vec<String>],
    ) -> Result<Vec<pb::ContainerAllocateResponse>, SimError> {
        let req = pb::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| pb::ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                })
                .collect(),
        };
        let resp: pb::AllocateResponse = self.caller.unary(pb::ALLOCATE, req).await?;
        Ok(resp.container_responses)
    }

    /// PreStartContainer.
    pub async fn pre_start(&self, ids: &[String]) -> Result<(), SimError> {
        let req = pb::PreStartContainerRequest {
            devices_ids: ids.to_vec(),
        };
        let _: pb::PreStartContainerResponse = self.caller.unary(pb::PRE_START, req).await?;
        Ok(())
    }
}
