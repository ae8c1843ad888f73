//! The ResourceSlice publisher: one task that keeps the node's pool on the API server equal to
//! what [`crate::kube::slices`] builds from the inventory, the pools and the device health.
//!
//! It republishes when its inputs change (inventory or config, a device's health), when the
//! kubelet registers the driver (again: a restarted kubelet deletes every driver's slices of its
//! node and expects them published anew), when what the API server holds differs from what was
//! published (a watch follows the node's slices: [`server`]), and every `resync` interval as a
//! backstop. A difference must last `settle` before it counts, and repeated repairs back off up
//! to `backoff_max`, so a writer fighting over the slices cannot make it loop. While the API
//! server is down, refuses or stalls, it retries with exponential backoff and reports the last
//! error in `status`; the daemon never waits for it. Every API call has a deadline.
//!
//! Before publishing it asks the server (dry run) which gated fields it keeps, and after each
//! write it compares what was stored with what was sent; see [`crate::kube::slices`] for what is
//! published when a gate is off. Unhealthy devices are withdrawn from the pool by default (a
//! withdrawn device cannot be allocated on any cluster), or tainted where their pool says so and
//! the server keeps taints (`DRADeviceTaints`; withdrawn where it does not). Claims already
//! prepared keep their devices.
//!
//! Devices held through another door than this node's DRA claims are withdrawn as far as they
//! are held ([`crate::kube::slices::doors`]). A new holder is withdrawn at once; a release is
//! published after `settle`, and releases close together back off as repairs do, so a device
//! granted and released in quick succession does not make the slices flap.

mod probe;
pub mod server;
mod sync;
mod waiting;
pub mod wire;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policies::{Inventory, PoolConfig, PublishedDevice};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::slices::layout::SliceSummary;
use super::slices::{Capabilities, HeldElsewhere, Tainted, UnhealthyDevice, Withdrawal};
use super::{KubeApi, KubeError};
use server::{ServerState, ServerStatus, ServerView};
pub use sync::{missing_gates, wants_taints};
use waiting::{Repairs, Waiting, Wake, wait};
use wire::PoolMeta;

/// Where and how the publisher publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// DRA driver name.
    pub driver: String,
    /// This node's name (also the pool's name).
    pub node: String,
    /// Deadline of one API call.
    pub call_timeout: Duration,
    /// First retry delay after a failure.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Republish this often even without a change (a backstop: the watch repairs slices
    /// changed or deleted by others sooner).
    pub resync: Duration,
    /// How long the server's copy must differ from what was published before it is repaired
    /// (the watch's events of our own writes arrive a little after the writes' answers).
    pub settle: Duration,
}

impl PublisherConfig {
    /// Defaults for `driver` on `node`: 20 s per call, retries from 0.5 s to 30 s, resync every
    /// 10 minutes, a difference on the server repaired after 1 s.
    pub fn new(driver: &str, node: &str) -> PublisherConfig {
        PublisherConfig {
            driver: driver.to_string(),
            node: node.to_string(),
            call_timeout: super::DEFAULT_CALL_TIMEOUT,
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            resync: Duration::from_secs(600),
            settle: Duration::from_secs(1),
        }
    }
}

/// What the pool is published from; a new value republishes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishSource {
    /// The node's devices.
    pub inventory: Inventory,
    /// The configured pools.
    pub pools: Vec<PoolConfig>,
    /// The names the policies publish.
    pub published: Vec<PublishedDevice>,
    /// Device id -> PCIe root.
    pub pcie_roots: BTreeMap<String, String>,
}

/// Where the publisher stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishState {
    /// Nothing published yet.
    #[default]
    Starting,
    /// The pool on the server matches the inventory.
    Published,
    /// The server's copy differs from what was published (or the kubelet registered the
    /// driver again): publishing anew.
    Republishing,
    /// The last round failed; retrying.
    Retrying,
}

/// Why a round republishes what was already published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Republish {
    /// The kubelet registered the driver (again).
    Registration,
    /// The server's copy differed from what was published.
    ServerDiffers,
}

impl Republish {
    /// The label value (metrics, status).
    pub fn as_str(self) -> &'static str {
        match self {
            Republish::Registration => "kubelet_registration",
            Republish::ServerDiffers => "server_differs",
        }
    }
}

/// What `status` shows about the published pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PublisherStatus {
    /// DRA driver name.
    pub driver: String,
    /// Node (and pool) name.
    pub node: String,
    /// Where the publisher stands.
    pub state: PublishState,
    /// The pool generation last written.
    pub generation: i64,
    /// The pool's slices.
    pub slices: Vec<SliceSummary>,
    /// DRA devices published.
    pub devices: usize,
    /// Counter sets published.
    pub counter_sets: usize,
    /// What is not published and why.
    pub withdrawn: Vec<Withdrawal>,
    /// Unhealthy devices published with a taint.
    pub tainted: Vec<Tainted>,
    /// What the API server keeps, once probed.
    pub api_server: Option<Capabilities>,
    /// Feature gates the API server lacks (what is published without them: docs/dra.md).
    pub missing_gates: Vec<&'static str>,
    /// How the standard `resource.kubernetes.io/numaNode` is published, as the API server
    /// answered the probe: `list` (KEP-6072's list, `DRAListTypeAttributes` on) or `scalar`.
    pub numa_node_attribute: Option<&'static str>,
    /// Rounds completed.
    pub rounds: u64,
    /// Writes made since start.
    pub writes: u64,
    /// When the pool was last in sync (Unix seconds).
    pub last_sync_unix: Option<u64>,
    /// The last failure, if the latest round failed.
    pub last_error: Option<String>,
    /// When it failed (Unix seconds).
    pub last_error_unix: Option<u64>,
    /// Consecutive failed rounds.
    pub failures: u64,
    /// What the API server holds of the pool (followed by a watch), against what was published.
    pub server: ServerStatus,
    /// Rounds made because the kubelet registered the driver.
    pub registrations: u64,
    /// Rounds made because the server's copy differed from what was published.
    pub repairs: u64,
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs `f` with a deadline; running past it is [`KubeError::Unavailable`].
pub(crate) async fn call<T>(
    timeout: Duration,
    what: &str,
    f: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeError> {
    tokio::time::timeout(timeout, f).await.unwrap_or_else(|_| {
        Err(KubeError::Unavailable {
            what: what.to_string(),
            message: format!("no answer within {} ms", timeout.as_millis()),
        })
    })
}

/// Starts publishers.
pub struct Publisher;

/// The running publisher: its status, and its tasks (stopped when the handle is dropped).
pub struct PublisherHandle {
    status: watch::Receiver<PublisherStatus>,
    task: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

/// Tells the publisher that the kubelet registered the driver (again). Clones signal the same
/// publisher.
#[derive(Debug, Clone)]
pub struct RegistrationSignal(Arc<watch::Sender<u64>>);

impl RegistrationSignal {
    /// A signal and the receiver to put in [`Inputs::registrations`].
    pub fn new() -> (RegistrationSignal, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (RegistrationSignal(Arc::new(tx)), rx)
    }

    /// The kubelet registered the driver: the node's slices are published again.
    pub fn registered(&self) {
        self.0.send_modify(|n| *n += 1);
    }
}

/// The devices' state a round publishes besides the source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// The unhealthy devices (withdrawn, or tainted where their pool says so).
    pub unhealthy: BTreeMap<String, UnhealthyDevice>,
    /// The units held through another door than this node's DRA claims.
    pub held: HeldElsewhere,
}

/// What a publisher publishes from and what makes it publish again.
pub struct Inputs {
    /// The inventory and pools; every new value republishes.
    pub source: watch::Receiver<Arc<PublishSource>>,
    /// The unhealthy devices.
    pub unhealthy: watch::Receiver<BTreeMap<String, UnhealthyDevice>>,
    /// The units held through another door than this node's DRA claims (new holders are
    /// withdrawn at once, releases published after `settle`).
    pub held: watch::Receiver<HeldElsewhere>,
    /// Bumped each time the kubelet registers the driver: the kubelet wipes the node's slices
    /// when it starts and expects them published again.
    pub registrations: watch::Receiver<u64>,
}

impl Publisher {
    /// Spawns the publisher of `config.node`'s pool: publishes `inputs.source` (and every later
    /// value) without (or with a taint on) the devices `inputs.unhealthy` names and without what
    /// `inputs.held` holds, through `api`, and a watcher of what the server holds of it.
    pub fn spawn(
        api: Arc<dyn KubeApi>,
        config: PublisherConfig,
        inputs: Inputs,
    ) -> PublisherHandle {
        let (tx, rx) = watch::channel(PublisherStatus {
            driver: config.driver.clone(),
            node: config.node.clone(),
            ..PublisherStatus::default()
        });
        let (view_tx, view_rx) = watch::channel(ServerView::default());
        let watcher = tokio::spawn(server::follow(
            api.clone(),
            config.driver.clone(),
            config.node.clone(),
            server::Timing {
                call_timeout: config.call_timeout,
                backoff_min: config.backoff_min,
                backoff_max: config.backoff_max,
            },
            view_tx,
        ));
        let task = tokio::spawn(run(api, config, inputs, view_rx, tx));
        PublisherHandle {
            status: rx,
            task,
            watcher,
        }
    }
}

impl PublisherHandle {
    /// The status now.
    pub fn status(&self) -> PublisherStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every status change.
    pub fn subscribe(&self) -> watch::Receiver<PublisherStatus> {
        self.status.clone()
    }

    /// Waits until the status satisfies `ready` and returns it (tests, benchmarks).
    pub async fn wait_for(&self, ready: impl FnMut(&PublisherStatus) -> bool) -> PublisherStatus {
        let mut rx = self.status.clone();
        match rx.wait_for(ready).await {
            Ok(s) => s.clone(),
            Err(_) => self.status(),
        }
    }

    /// Stops the publisher; what is published stays (`nri-accel cleanup` removes it).
    pub fn stop(&self) {
        self.task.abort();
        self.watcher.abort();
    }
}

impl Drop for PublisherHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn run(
    api: Arc<dyn KubeApi>,
    config: PublisherConfig,
    inputs: Inputs,
    mut view: watch::Receiver<ServerView>,
    status: watch::Sender<PublisherStatus>,
) {
    let Inputs {
        mut source,
        mut unhealthy,
        mut held,
        mut registrations,
    } = inputs;
    let mut meta = PoolMeta {
        driver: config.driver.clone(),
        node: config.node.clone(),
        pool: config.node.clone(),
        node_uid: None,
    };
    let mut session = None;
    // Whether the operator was told that the pools asking for taints get withdrawal instead.
    let mut taints_warned = false;
    let mut backoff = config.backoff_min;
    let mut repairs = Repairs {
        streak: 0,
        last: None,
    };
    // Releases by other doors published close together back off as repairs do.
    let mut returns = Repairs {
        streak: 0,
        last: None,
    };
    // What the last round left on the server: slice name -> resourceVersion.
    let mut published: Option<BTreeMap<String, String>> = None;
    registrations.borrow_and_update();
    loop {
        let src = source.borrow_and_update().clone();
        let health = Health {
            unhealthy: unhealthy.borrow_and_update().clone(),
            held: held.borrow_and_update().clone(),
        };
        let result = async {
            let s = match session.as_mut() {
                Some(s) => s,
                None => {
                    let s = sync::open(api.as_ref(), &meta, config.call_timeout).await?;
                    meta.node_uid = Some(s.node_uid.clone()).filter(|u| !u.is_empty());
                    session.insert(s)
                }
            };
            sync::round(api.as_ref(), &meta, s, &src, &health, config.call_timeout).await
        }
        .await;
        match result {
            Ok(round) if round.again => {
                // What was just written may be double-bookable: republish before reporting.
                status.send_modify(|st| st.writes += round.writes);
                continue;
            }
            Ok(round) => {
                backoff = config.backoff_min;
                let caps = session.as_ref().map(|s| s.caps);
                published = session
                    .as_ref()
                    .and_then(|s| s.known.as_ref())
                    .map(|known| {
                        known
                            .iter()
                            .map(|e| (e.name.clone(), e.resource_version.clone()))
                            .collect()
                    });
                status.send_modify(|st| {
                    st.state = PublishState::Published;
                    st.generation = round.plan.generation;
                    st.slices = round.summary;
                    st.devices = round.content.devices.len();
                    st.counter_sets = round.content.counter_sets.len();
                    st.withdrawn = round.content.withdrawn.clone();
                    st.tainted = round.content.tainted.clone();
                    st.api_server = caps;
                    st.missing_gates = caps
                        .map(|c| missing_gates(c, wants_taints(&src)))
                        .unwrap_or_default();
                    st.numa_node_attribute = caps.map(|c| c.numa_node_attribute());
                    st.rounds += 1;
                    st.writes += round.writes;
                    st.last_sync_unix = Some(now());
                    st.last_error = None;
                    st.failures = 0;
                });
                let taints_dropped = caps.is_some_and(|c| !c.taints) && wants_taints(&src);
                if taints_dropped && !taints_warned {
                    tracing::warn!(
                        gate = "DRADeviceTaints",
                        "a pool asks for its unhealthy devices to be tainted, but the API server \
                         does not keep device taints: they are withdrawn instead; turn the gate on \
                         in the apiserver, scheduler and controller-manager, or set the pool's \
                         unhealthy to withdraw"
                    );
                }
                taints_warned = taints_dropped;
                if round.writes > 0 {
                    tracing::info!(
                        generation = round.plan.generation,
                        slices = round.plan.count,
                        devices = round.content.devices.len(),
                        writes = round.writes,
                        rebuilt = round.plan.rebuilt,
                        "ResourceSlices published"
                    );
                }
                let why = wait(
                    &config,
                    Waiting {
                        source: &mut source,
                        unhealthy: &mut unhealthy,
                        held: &mut held,
                        registrations: &mut registrations,
                        view: &mut view,
                    },
                    &health.held,
                    published.as_ref(),
                    (&mut repairs, &mut returns),
                    &status,
                )
                .await;
                match why {
                    Wake::Inputs => {
                        // Writes conditional on versions the server no longer has would fail:
                        // list first when its copy is known to differ.
                        let seen = server::divergence(&view.borrow(), published.as_ref());
                        if matches!(seen.state, ServerState::Missing | ServerState::Differs)
                            && let Some(s) = session.as_mut()
                        {
                            s.known = None;
                        }
                    }
                    Wake::Resync => {
                        // Probe again: gates turned on since are picked up here.
                        session = None;
                    }
                    Wake::Republish(reason) => {
                        // The server changed behind our back: list it again.
                        if let Some(s) = session.as_mut() {
                            s.known = None;
                        }
                        status.send_modify(|st| {
                            st.state = PublishState::Republishing;
                            match reason {
                                Republish::Registration => st.registrations += 1,
                                Republish::ServerDiffers => st.repairs += 1,
                            }
                        });
                    }
                }
            }
            Err(e) => {
                // The server may come back with other flags (or be another one): probe again.
                session = None;
                let failures = status.borrow().failures + 1;
                if failures == 1 {
                    tracing::warn!(error = %e, "publishing ResourceSlices failed; retrying with backoff");
                } else {
                    tracing::debug!(error = %e, failures, "publishing ResourceSlices failed again");
                }
                // What the server holds still shows while the rounds fail.
                let seen = server::divergence(&view.borrow_and_update(), published.as_ref());
                status.send_modify(|st| {
                    st.server = seen;
                    st.state = PublishState::Retrying;
                    st.last_error = Some(e.to_string());
                    st.last_error_unix = Some(now());
                    st.failures = failures;
                });
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(config.backoff_max);
            }
        }
    }
}
