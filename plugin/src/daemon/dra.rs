//! The DRA driver's kubelet side as the daemon runs it (`dra.enabled`): the DRA and health
//! services over the engine, served on the kubelet's sockets, with the registration's verdict in
//! the `kubelet` member of `status`.

use std::sync::Arc;

use async_trait::async_trait;

use super::Agent;
use crate::claims_api::PreparedDevice;
use crate::claims_api::{ClaimRef, ClaimService};
use crate::config::Config;
use crate::device_health::HealthMonitor;
use crate::engine::Engine;
use crate::gate::Gate;
use crate::kube::{ClaimStatusWriter, PreparedStatus};
use crate::kubelet::{
    AllocatedClaim, ClaimSource, DraDriver, DraDriverConfig, DraService, DraSettings,
    HealthService, KubeletError, PrepareObserver, REFRESH, WATCH_EVERY,
};
use crate::metadata::{AttributeSource, MetadataStore, MetadataWriter};

/// Why the DRA driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DraStartError {
    /// No node name: the DRA pool is named after the node.
    #[error(
        "no node name for the DRA pool: set kubernetes.node_name or $NODE_NAME (a DaemonSet sets it from spec.nodeName)"
    )]
    NoNodeName,
    /// A kubelet socket could not be served.
    #[error("{0}")]
    Socket(#[from] KubeletError),
}

/// The claim source used when no API server client is given: every claim the node does not hold
/// yet is refused (repeats of held claims are still answered from the node's record).
pub struct NoApiServer;

#[async_trait]
impl ClaimSource for NoApiServer {
    async fn allocation(&self, c: &ClaimRef) -> Result<AllocatedClaim, String> {
        Err(format!(
            "claim {}/{}: this nri-accel has no Kubernetes API server client to read the claim's allocation from",
            c.namespace, c.name
        ))
    }
}

/// Feeds what the DRA service prepared and unprepared to the claims' per-device status writer,
/// with each device's NUMA node from the inventory.
pub struct ClaimStatusObserver {
    writer: Arc<ClaimStatusWriter>,
    /// Published device name -> its NUMA node.
    numa: std::collections::HashMap<String, u32>,
}

impl ClaimStatusObserver {
    /// Writes through `writer`, naming the NUMA nodes of `engine`'s devices.
    pub fn new(writer: Arc<ClaimStatusWriter>, engine: &Engine) -> ClaimStatusObserver {
        let numa = engine.with_node(|n| {
            let inventory = n.inventory();
            n.published()
                .into_iter()
                .filter_map(|p| {
                    let node = inventory
                        .devices
                        .iter()
                        .find(|d| d.id == p.device_id)?
                        .numa_node?;
                    Some((p.name, node))
                })
                .collect()
        });
        ClaimStatusObserver { writer, numa }
    }
}

impl PrepareObserver for ClaimStatusObserver {
    fn prepared(&self, c: &ClaimRef, devices: &[PreparedDevice]) {
        let devices: Vec<PreparedStatus> = devices
            .iter()
            .map(|d| PreparedStatus {
                pool: d.pool.clone(),
                device: d.device.clone(),
                share_id: d.share_id.clone(),
                cdi_device_ids: d.cdi_device_ids.clone(),
                numa_node: self.numa.get(&d.device).copied(),
            })
            .collect();
        self.writer
            .prepared(&c.namespace, &c.name, &c.uid, &devices);
    }

    fn unprepared(&self, c: &ClaimRef) {
        self.writer.unprepared(&c.namespace, &c.name, &c.uid);
    }
}

/// What the DRA driver is built from.
pub struct DraParts {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The claims API's view of the engine (its results path prepares the claims).
    pub claims: Arc<dyn ClaimService>,
    /// The NRI gate.
    pub gate: Gate,
    /// The devices' health.
    pub health: HealthMonitor,
    /// Where claims' allocations are read.
    pub source: Arc<dyn ClaimSource>,
    /// Told what was prepared and unprepared (the claims' per-device status), if anything.
    pub observer: Option<Arc<dyn PrepareObserver>>,
    /// The published devices' attributes, for the device metadata (none without an API
    /// server: no metadata is written).
    pub attributes: Option<Arc<dyn AttributeSource>>,
}

/// Where the device metadata files of `config`'s DRA driver go: the driver's directory under
/// the kubelet's plugins dir, `dra-device-metadata/`.
pub fn metadata_dir(config: &Config) -> std::path::PathBuf {
    config
        .dra
        .plugins_dir
        .join(&config.dra.driver_name)
        .join("dra-device-metadata")
}

/// Serves the kubelet's DRA plugin sockets as `config.dra` says and adds the registration's
/// state to `agent`'s status document.
pub fn start(config: &Config, agent: &Agent, parts: DraParts) -> Result<DraDriver, DraStartError> {
    let node = config
        .kubernetes
        .resolve_node_name()
        .ok_or(DraStartError::NoNodeName)?;
    let published = parts.engine.with_node(|n| n.published());
    let engine = parts.engine.clone();
    let dra = DraService::new(
        DraSettings {
            driver: config.dra.driver_name.clone(),
            pool: node.clone(),
        },
        parts.claims,
        parts.engine,
        parts.gate,
        parts.source,
    );
    if let Some(o) = parts.observer {
        dra.set_observer(o);
    }
    if let (true, Some(attributes)) = (config.dra.device_metadata, parts.attributes) {
        let writer = Arc::new(MetadataWriter::new(MetadataStore::new(metadata_dir(
            config,
        ))));
        engine.set_claim_files(writer.clone());
        dra.set_metadata(writer, attributes);
    }
    let health = HealthService::new(parts.health, &published, &node, REFRESH);
    let driver = DraDriver::start_with_limits(
        DraDriverConfig {
            driver: config.dra.driver_name.clone(),
            registry_dir: config.dra.plugins_registry_dir.clone(),
            plugins_dir: config.dra.plugins_dir.clone(),
            watch_every: WATCH_EVERY,
        },
        crate::kubelet::ConnLimits::of_dra(&config.dra),
        dra,
        health,
    )?;
    let status = driver.status_source();
    agent.add_status_section(
        "kubelet",
        Box::new(move || {
            let mut dra = serde_json::to_value(status()).unwrap_or_default();
            dra["pool"] = serde_json::Value::String(node.clone());
            serde_json::json!({ "dra": dra })
        }),
    );
    Ok(driver)
}
