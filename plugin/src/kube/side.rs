//! The Kubernetes side as the daemon runs it: the API client, the node's identity and the
//! ResourceSlice publisher, started when `dra.enabled`.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::claim_status::{Backoff, ClaimStatusWriter};
use super::publisher::{
    Inputs, PublishSource, Publisher, PublisherConfig, PublisherHandle, RegistrationSignal,
};
use super::{DEFAULT_CALL_TIMEOUT, KubeApi, KubeClient, KubeError, topology};
use crate::config::Config;
use crate::device_health::HealthReport;
use crate::discovery::RootFs;
use crate::engine::Engine;
use crate::names::is_dns_subdomain;

/// The running Kubernetes side.
pub struct KubeSide {
    api: Arc<dyn KubeApi>,
    driver: String,
    node: String,
    publisher: PublisherHandle,
    source: watch::Sender<Arc<PublishSource>>,
    unhealthy: Arc<watch::Sender<BTreeSet<String>>>,
    registrations: RegistrationSignal,
    claim_status: Option<Arc<ClaimStatusWriter>>,
}

/// Replaces the set in `tx` when it differs.
fn send_unhealthy(tx: &watch::Sender<BTreeSet<String>>, ids: BTreeSet<String>) {
    tx.send_if_modified(|now| {
        let changed = *now != ids;
        *now = ids;
        changed
    });
}

/// What the pool is published from, as the engine's node and the config have it now.
pub fn source_of(config: &Config, engine: &Engine) -> PublishSource {
    let (inventory, published) = engine.with_node(|n| (n.inventory().clone(), n.published()));
    let pcie_roots = topology::pcie_roots(&RootFs::new(&config.discovery.root), &inventory);
    PublishSource {
        inventory,
        pools: config.pools.clone(),
        published,
        pcie_roots,
    }
}

impl KubeSide {
    /// Builds the API client from `kubernetes` and starts publishing. Fails only on a missing
    /// or bad node name or credentials; the API server itself is never waited for.
    pub async fn start(config: &Config, engine: &Engine) -> Result<KubeSide, KubeError> {
        let node = config.kubernetes.resolve_node_name().ok_or_else(|| {
            KubeError::Config(
                "no node name: set kubernetes.node_name or $NODE_NAME (the DaemonSet sets it from spec.nodeName)".into(),
            )
        })?;
        if !is_dns_subdomain(&node) {
            return Err(KubeError::Config(format!(
                "the node name {node:?} is not a DNS subdomain; set kubernetes.node_name to the node's Kubernetes name"
            )));
        }
        let client = KubeClient::from_kubeconfig(
            config.kubernetes.kubeconfig.as_deref(),
            DEFAULT_CALL_TIMEOUT,
        )
        .await?;
        let side = KubeSide::with_api(
            Arc::new(client),
            PublisherConfig::new(&config.dra.driver_name, &node),
            source_of(config, engine),
        );
        Ok(if config.dra.claim_status {
            side.with_claim_status(Backoff::default())
        } else {
            side
        })
    }

    /// Also writes the per-device status of the claims prepared (KEP-4817), retrying with
    /// `backoff` while the API server fails.
    pub fn with_claim_status(mut self, backoff: Backoff) -> KubeSide {
        self.claim_status = Some(Arc::new(ClaimStatusWriter::spawn(
            self.api.clone(),
            &self.driver,
            &self.node,
            backoff,
        )));
        self
    }

    /// The writer of the claims' per-device status, unless `dra.claim_status` is off.
    pub fn claim_status(&self) -> Option<Arc<ClaimStatusWriter>> {
        self.claim_status.clone()
    }

    /// Starts publishing `source` through `api` (tests and benchmarks pass their own).
    pub fn with_api(
        api: Arc<dyn KubeApi>,
        publisher: PublisherConfig,
        source: PublishSource,
    ) -> KubeSide {
        let (source_tx, source_rx) = watch::channel(Arc::new(source));
        let (unhealthy_tx, unhealthy_rx) = watch::channel(BTreeSet::new());
        let (registrations, registrations_rx) = RegistrationSignal::new();
        let driver = publisher.driver.clone();
        let node = publisher.node.clone();
        tracing::info!(%driver, %node, "publishing the node's devices as ResourceSlices");
        let publisher = Publisher::spawn(
            api.clone(),
            publisher,
            Inputs {
                source: source_rx,
                unhealthy: unhealthy_rx,
                registrations: registrations_rx,
            },
        );
        KubeSide {
            api,
            driver,
            node,
            publisher,
            source: source_tx,
            unhealthy: Arc::new(unhealthy_tx),
            registrations,
            claim_status: None,
        }
    }

    /// What to call each time the kubelet registers the DRA driver: a starting kubelet deletes
    /// every driver's slices of its node and expects the drivers to publish them again.
    pub fn registration_signal(&self) -> RegistrationSignal {
        self.registrations.clone()
    }

    /// The API server client (the kubelet-facing DRA service reads claims through it).
    pub fn api(&self) -> Arc<dyn KubeApi> {
        self.api.clone()
    }

    /// The DRA driver name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The node's DRA pool (named after the node).
    pub fn pool(&self) -> &str {
        &self.node
    }

    /// The publisher.
    pub fn publisher(&self) -> &PublisherHandle {
        &self.publisher
    }

    /// Publishes from a new source (inventory or pools changed).
    pub fn republish(&self, source: PublishSource) {
        self.source.send_replace(Arc::new(source));
    }

    /// The devices that are unhealthy now (withdrawn from the pool until they recover).
    pub fn set_unhealthy(&self, ids: BTreeSet<String>) {
        send_unhealthy(&self.unhealthy, ids);
    }

    /// Follows the device health monitor: every report's unhealthy devices are withdrawn until
    /// they recover. The task ends when the monitor does.
    pub fn follow_health(
        &self,
        mut health: watch::Receiver<Arc<HealthReport>>,
    ) -> tokio::task::JoinHandle<()> {
        let tx = self.unhealthy.clone();
        tokio::spawn(async move {
            loop {
                let bad = health
                    .borrow_and_update()
                    .unhealthy()
                    .map(str::to_string)
                    .collect();
                send_unhealthy(&tx, bad);
                if health.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// The `kubernetes` member of the `status` document.
    pub fn status_source(&self) -> impl Fn() -> Value + Send + Sync + 'static {
        let rx = self.publisher.subscribe();
        let status_rx = self.claim_status.as_ref().map(|w| w.subscribe());
        let (driver, node) = (self.driver.clone(), self.node.clone());
        move || {
            let slices = serde_json::to_value(&*rx.borrow()).unwrap_or(Value::Null);
            let claim_status = match &status_rx {
                Some(rx) => {
                    let mut v = serde_json::to_value(&*rx.borrow()).unwrap_or(Value::Null);
                    v["enabled"] = json!(true);
                    v
                }
                None => json!({ "enabled": false }),
            };
            json!({
                "driver": driver,
                "node": node,
                "pool": node,
                "resource_slices": slices,
                "claim_status": claim_status,
            })
        }
    }
}
