//! The ResourceSlice publisher: one task that keeps the node's pool on the API server equal to
//! what [`crate::kube::slices`] builds from the inventory, the pools and the device health.
//!
//! It republishes when its inputs change (inventory or config, a device's health) and every
//! `resync` interval (to repair slices someone else changed or deleted). While the API server is
//! down, refuses or stalls, it retries with exponential backoff and reports the last error in
//! `status`; the daemon never waits for it. Every API call has a deadline.
//!
//! Before publishing it asks the server (dry run) which gated fields it keeps, and after each
//! write it compares what was stored with what was sent; see [`crate::kube::slices`] for what is
//! published when a gate is off. Unhealthy devices are withdrawn from the pool rather than
//! tainted: taints need the `DRADeviceTaints` gate and halve the devices a slice may hold, while a
//! withdrawn device cannot be allocated on any cluster. Claims already prepared keep their devices.

mod probe;
mod sync;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policies::{Inventory, PoolConfig, PublishedDevice};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::slices::layout::SliceSummary;
use super::slices::{Capabilities, Withdrawal};
use super::{KubeApi, KubeError};
pub use sync::missing_gates;
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
    /// Republish this often even without a change (repairs slices changed by others).
    pub resync: Duration,
}

impl PublisherConfig {
    /// Defaults for `driver` on `node`: 20 s per call, retries from 0.5 s to 30 s, resync every
    /// 10 minutes.
    pub fn new(driver: &str, node: &str) -> PublisherConfig {
        PublisherConfig {
            driver: driver.to_string(),
            node: node.to_string(),
            call_timeout: super::DEFAULT_CALL_TIMEOUT,
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            resync: Duration::from_secs(600),
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
    /// The last round failed; retrying.
    Retrying,
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
    /// What the API server keeps, once probed.
    pub api_server: Option<Capabilities>,
    /// Feature gates the API server lacks (what is published without them: docs/dra.md).
    pub missing_gates: Vec<&'static str>,
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
}

fn now() -> u64 {
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

/// The running publisher: its status, and the task (stopped when the handle is dropped).
pub struct PublisherHandle {
    status: watch::Receiver<PublisherStatus>,
    task: JoinHandle<()>,
}

impl Publisher {
    /// Spawns the publisher of `config.node`'s pool: publishes `source` (and every later value)
    /// without the devices `unhealthy` names, through `api`.
    pub fn spawn(
        api: Arc<dyn KubeApi>,
        config: PublisherConfig,
        source: watch::Receiver<Arc<PublishSource>>,
        unhealthy: watch::Receiver<BTreeSet<String>>,
    ) -> PublisherHandle {
        let (tx, rx) = watch::channel(PublisherStatus {
            driver: config.driver.clone(),
            node: config.node.clone(),
            ..PublisherStatus::default()
        });
        let task = tokio::spawn(run(api, config, source, unhealthy, tx));
        PublisherHandle { status: rx, task }
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
    }
}

impl Drop for PublisherHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Resolves when `rx` changes; never when its sender is gone.
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn run(
    api: Arc<dyn KubeApi>,
    config: PublisherConfig,
    mut source: watch::Receiver<Arc<PublishSource>>,
    mut unhealthy: watch::Receiver<BTreeSet<String>>,
    status: watch::Sender<PublisherStatus>,
) {
    let mut meta = PoolMeta {
        driver: config.driver.clone(),
        node: config.node.clone(),
        pool: config.node.clone(),
        node_uid: None,
    };
    let mut session = None;
    let mut backoff = config.backoff_min;
    loop {
        let src = source.borrow_and_update().clone();
        let bad = unhealthy.borrow_and_update().clone();
        let result = async {
            let s = match session.as_mut() {
                Some(s) => s,
                None => {
                    let s = sync::open(api.as_ref(), &meta, config.call_timeout).await?;
                    meta.node_uid = Some(s.node_uid.clone()).filter(|u| !u.is_empty());
                    session.insert(s)
                }
            };
            sync::round(api.as_ref(), &meta, s, &src, &bad, config.call_timeout).await
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
                status.send_modify(|st| {
                    st.state = PublishState::Published;
                    st.generation = round.plan.generation;
                    st.slices = round.summary;
                    st.devices = round.content.devices.len();
                    st.counter_sets = round.content.counter_sets.len();
                    st.withdrawn = round.content.withdrawn.clone();
                    st.api_server = caps;
                    st.missing_gates = caps.map(missing_gates).unwrap_or_default();
                    st.rounds += 1;
                    st.writes += round.writes;
                    st.last_sync_unix = Some(now());
                    st.last_error = None;
                    st.failures = 0;
                });
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
                tokio::select! {
                    _ = changed(&mut source) => {}
                    _ = changed(&mut unhealthy) => {}
                    _ = tokio::time::sleep(config.resync) => {
                        // Probe again: gates turned on since are picked up here.
                        session = None;
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
                status.send_modify(|st| {
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
