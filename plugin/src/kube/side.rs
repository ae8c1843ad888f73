//! The Kubernetes side as the daemon runs it: the API client, the node's identity and the
//! ResourceSlice publisher, started when `dra.enabled`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::watch;

use super::claim_status::{Backoff, ClaimStatusWriter};
use super::publisher::{
    Inputs, PublishSource, Publisher, PublisherConfig, PublisherHandle, RegistrationSignal,
};
use super::slices::{HeldElsewhere, UnhealthyDevice};
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
    unhealthy: Arc<watch::Sender<BTreeMap<String, UnhealthyDevice>>>,
    held: Arc<watch::Sender<HeldElsewhere>>,
    registrations: RegistrationSignal,
    claim_status: Option<Arc<ClaimStatusWriter>>,
}

/// Replaces the value in `tx` when it differs.
fn send_changed<T: PartialEq>(tx: &watch::Sender<T>, value: T) {
    tx.send_if_modified(|now| {
        let changed = *now != value;
        *now = value;
        changed
    });
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The unhealthy devices of `report`, each seen unhealthy since its time in `before` (when it
/// already was) or `now`.
fn unhealthy_of(
    report: &HealthReport,
    before: &BTreeMap<String, UnhealthyDevice>,
    now: i64,
) -> BTreeMap<String, UnhealthyDevice> {
    report
        .devices
        .iter()
        .filter(|(_, h)| !h.healthy)
        .map(|(id, h)| {
            let since_unix = before.get(id).map_or(now, |u| u.since_unix);
            (
                id.clone(),
                UnhealthyDevice {
                    since_unix,
                    reason: h.cause().to_string(),
                },
            )
        })
        .collect()
}

/// The units held through a door the scheduler does not know (every claim but the DRA
/// allocation results a driver forwarded), from the engine's claims.
pub fn held_elsewhere(engine: &Engine) -> HeldElsewhere {
    engine.with_unscheduled_claims(|claims| {
        let mut held = HeldElsewhere::new();
        for a in claims {
            for g in &a.results {
                held.entry(g.device_id.clone())
                    .or_default()
                    .insert((a.claim_uid.clone(), g.unit.clone()));
            }
        }
        held
    })
}

/// What the pool is published from, as the engine's node and the config have it now.
pub fn source_of(config: &Config, engine: &Engine) -> PublishSource {
    let (inventory, published) = engine.with_node(|n| (n.inventory().clone(), n.published()));
    let pcie_roots = topology::pcie_roots(&RootFs::new(&config.discovery.root), &inventory);
    PublishSource {
        inventory,
        pools: config
            .pools
            .iter()
            .filter(|p| config.dra.pools.is_empty() || config.dra.pools.contains(&p.name))
            .cloned()
            .collect(),
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
        let side = KubeSide::with_api_holding(
            Arc::new(client),
            PublisherConfig::new(&config.dra.driver_name, &node),
            source_of(config, engine),
            held_elsewhere(engine),
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
        Self::with_api_holding(api, publisher, source, HeldElsewhere::new())
    }

    /// Starts publishing `source` without what `held` holds through other doors than this
    /// node's DRA claims, through `api`.
    pub fn with_api_holding(
        api: Arc<dyn KubeApi>,
        publisher: PublisherConfig,
        source: PublishSource,
        held: HeldElsewhere,
    ) -> KubeSide {
        let (source_tx, source_rx) = watch::channel(Arc::new(source));
        let (unhealthy_tx, unhealthy_rx) = watch::channel(BTreeMap::new());
        let (held_tx, held_rx) = watch::channel(held);
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
                held: held_rx,
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
            held: Arc::new(held_tx),
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

    /// The devices that are unhealthy now (withdrawn from the pool, or tainted, until they
    /// recover), unhealthy since now unless they already were (tests, benchmarks).
    pub fn set_unhealthy(&self, ids: BTreeSet<String>) {
        let before = self.unhealthy.borrow().clone();
        let now = unix_now();
        let bad = ids
            .into_iter()
            .map(|id| {
                let since_unix = before.get(&id).map_or(now, |u| u.since_unix);
                let u = UnhealthyDevice {
                    since_unix,
                    reason: "unhealthy".into(),
                };
                (id, u)
            })
            .collect();
        send_changed(&self.unhealthy, bad);
    }

    /// The units held through another door than this node's DRA claims (tests; the daemon
    /// follows the engine with [`KubeSide::follow_claims`]).
    pub fn set_held(&self, held: HeldElsewhere) {
        send_changed(&self.held, held);
    }

    /// Follows the device health monitor: every report's unhealthy devices are withdrawn (or
    /// tainted) until they recover. The task ends when the monitor does.
    pub fn follow_health(
        &self,
        mut health: watch::Receiver<Arc<HealthReport>>,
    ) -> tokio::task::JoinHandle<()> {
        let tx = self.unhealthy.clone();
        tokio::spawn(async move {
            loop {
                let bad = unhealthy_of(&health.borrow_and_update(), &tx.borrow(), unix_now());
                send_changed(&tx, bad);
                if health.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// Follows the engine's claims: what is held through another door than this node's DRA
    /// claims is withdrawn from the pool until released. The first value is the engine's
    /// records as startup restored them (so a hold survives a restart). The task ends when the
    /// engine does.
    pub fn follow_claims(&self, engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
        let tx = self.held.clone();
        let mut changes = engine.subscribe_claims();
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                send_changed(&tx, held_elsewhere(&engine));
                if changes.changed().await.is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_health::DeviceHealth;

    fn report(bad: &[(&str, &str)]) -> HealthReport {
        let mut devices: BTreeMap<String, DeviceHealth> = ["a", "b", "c"]
            .iter()
            .map(|id| (id.to_string(), DeviceHealth::healthy()))
            .collect();
        for (id, reason) in bad {
            devices.insert(
                id.to_string(),
                DeviceHealth {
                    healthy: false,
                    reason: reason.to_string(),
                },
            );
        }
        HealthReport {
            devices,
            checked_at: SystemTime::now(),
        }
    }

    #[test]
    fn a_device_stays_unhealthy_since_it_was_first_seen_so() {
        let gone = "device node /dev/x of device a is gone";
        let first = unhealthy_of(&report(&[("a", gone)]), &BTreeMap::new(), 100);
        assert_eq!(
            first,
            BTreeMap::from([(
                "a".to_string(),
                UnhealthyDevice {
                    since_unix: 100,
                    reason: "device-node-gone".into(),
                }
            )])
        );
        // Still unhealthy at the next report: the time it was first seen stays (the taint's
        // timeAdded does not move); a newly unhealthy one gets the time now.
        let b = "device b (PCI 0000:01:00.0) is gone from sysfs";
        let next = unhealthy_of(&report(&[("a", gone), ("b", b)]), &first, 200);
        assert_eq!(next["a"].since_unix, 100);
        assert_eq!(next["b"].since_unix, 200);
        assert_eq!(next["b"].reason, "gone-from-sysfs");
        // Healthy again: gone from the map, and a later relapse starts anew.
        let healed = unhealthy_of(&report(&[("b", b)]), &next, 300);
        assert!(!healed.contains_key("a"));
        let again = unhealthy_of(&report(&[("a", gone), ("b", b)]), &healed, 400);
        assert_eq!(again["a"].since_unix, 400);
    }
}
