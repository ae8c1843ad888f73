//! What the nodes publish: the devices in the ResourceSlices of nri-accel's DRA driver, read
//! through the API server, kept in memory and refreshed.
//!
//! This is how the webhook learns the cluster's capacity: every node running nri-accel with
//! `dra.enabled` publishes each device with its pool, family, vendor, model and PCI id. A
//! cluster whose nodes publish nothing (DRA off, the annotation path alone), or an API server
//! the webhook cannot read, leaves the capacity unknown: the webhook then admits what the
//! config and the parser allow, with a warning that says so (docs/webhook.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use policies::Device;

use super::dra::DraView;

/// One published device, as the check matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The device as a selector sees it (id, vendor, model, PCI id).
    pub device: Device,
    /// Its pool.
    pub pool: String,
    /// Its pool's family (`exclusive`, `shared`, `sliced` or a custom policy's name).
    pub family: String,
}

/// The devices each node publishes: node -> its whole devices (a sliced device once, not
/// once per partition).
pub type Nodes = BTreeMap<String, Vec<Published>>;

/// What the webhook knows of the nodes' devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capacity {
    /// Not known; the reason, for the warning.
    Unknown(String),
    /// What the nodes published at the last successful read.
    Known(Nodes),
}

/// The devices of `slices` (all of one driver) by node. Attributes are read from the driver's
/// domain (unqualified names, as nri-accel publishes them); a device missing its pool, family
/// or id is skipped (it was not published by nri-accel).
pub fn nodes_of(slices: &[ResourceSlice]) -> Nodes {
    let mut seen: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut nodes = Nodes::new();
    for slice in slices {
        let Some(node) = slice.spec.node_name.clone().filter(|n| !n.is_empty()) else {
            continue;
        };
        for d in slice.spec.devices.iter().flatten() {
            let Some(attrs) = &d.attributes else { continue };
            let text = |k: &str| attrs.get(k).and_then(|a| a.string.clone());
            let (Some(id), Some(pool), Some(family)) =
                (text("deviceId"), text("pool"), text("family"))
            else {
                continue;
            };
            if !seen
                .entry(node.clone())
                .or_default()
                .insert((pool.clone(), id.clone()))
            {
                continue;
            }
            nodes.entry(node.clone()).or_default().push(Published {
                device: Device {
                    id,
                    vendor: text("vendor").unwrap_or_default(),
                    model: text("model").unwrap_or_default(),
                    pci_address: text("pciAddress"),
                    pci_id: text("pciId"),
                    numa_node: None,
                    local_cpus: Default::default(),
                    memory_mib: 0,
                    compute_units: 0,
                    driver: text("driver"),
                    nodes: Vec::new(),
                    control_nodes: Vec::new(),
                    uuid: None,
                },
                pool,
                family,
            });
        }
    }
    nodes
}

/// Where the slices come from: the API server in the webhook, a list in tests.
#[async_trait::async_trait]
pub trait SliceSource: Send + Sync + 'static {
    /// Every ResourceSlice of `driver`, on all nodes; an error says why they cannot be read.
    async fn slices(&self, driver: &str) -> Result<Vec<ResourceSlice>, String>;

    /// Every DeviceClass (what DRA requests select with); none by default.
    async fn classes(&self) -> Result<Vec<DeviceClass>, String> {
        Ok(Vec::new())
    }
}

#[async_trait::async_trait]
impl SliceSource for crate::kube::KubeClient {
    async fn slices(&self, driver: &str) -> Result<Vec<ResourceSlice>, String> {
        self.list_driver_slices(driver)
            .await
            .map_err(|e| e.to_string())
    }

    async fn classes(&self) -> Result<Vec<DeviceClass>, String> {
        self.list_device_classes().await.map_err(|e| e.to_string())
    }
}

/// The capacity the check reads, shared with the task that refreshes it.
#[derive(Debug, Clone)]
pub struct Fleet {
    capacity: Arc<RwLock<Capacity>>,
    dra: Arc<RwLock<DraView>>,
}

impl Fleet {
    /// A fleet whose capacity is `capacity` for good (no refresh): tests, and `--capacity none`.
    pub fn fixed(capacity: Capacity) -> Fleet {
        Fleet {
            capacity: Arc::new(RwLock::new(capacity)),
            dra: Arc::new(RwLock::new(DraView::default())),
        }
    }

    /// What DRA asks are judged against now: every slice device by node, and the classes.
    pub fn dra(&self) -> DraView {
        self.dra.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What is known now.
    pub fn capacity(&self) -> Capacity {
        self.capacity
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the slices of `driver` once; a failure keeps what an earlier read knew, else
    /// leaves the capacity unknown, and is logged.
    pub async fn refresh(&self, source: &dyn SliceSource, driver: &str) {
        let next = match source.slices(driver).await {
            Ok(slices) => {
                let view = match source.classes().await {
                    Ok(classes) => DraView::new(driver, &slices, &classes),
                    Err(why) => {
                        tracing::warn!(error = %why, "webhook: cannot list the DeviceClasses; DRA claims are judged with the classes known before");
                        let mut view = DraView::new(driver, &slices, &[]);
                        view.classes = self.dra().classes;
                        view
                    }
                };
                *self.dra.write().unwrap_or_else(|e| e.into_inner()) = view;
                let nodes = nodes_of(&slices);
                if nodes.is_empty() {
                    Capacity::Unknown(format!(
                        "no node publishes ResourceSlices of driver {driver} (dra.enabled is off on the nodes, or none runs yet)"
                    ))
                } else {
                    Capacity::Known(nodes)
                }
            }
            Err(why) => {
                tracing::warn!(error = %why, "webhook: cannot list the ResourceSlices of driver {driver}; keeping what was known");
                let mut current = self.capacity.write().unwrap_or_else(|e| e.into_inner());
                if let Capacity::Unknown(_) = *current {
                    *current = Capacity::Unknown(format!(
                        "the ResourceSlices of driver {driver} cannot be listed: {why}"
                    ));
                }
                return;
            }
        };
        *self.capacity.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// Refreshes from `source` now and every `every`, until the task is aborted.
    pub fn keep_fresh(
        &self,
        source: Arc<dyn SliceSource>,
        driver: String,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.refresh(source.as_ref(), &driver).await;
            }
        })
    }
}
