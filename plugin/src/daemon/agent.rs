//! The node agent's reactions to container events, independent of the NRI wire
//! types: map containers to claims, run the annotation path, adopt devices held
//! without a record, and compute the adjustments and updates to answer with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use policies::{ContainerUpdate, CpuSet, DeviceNode};

use super::annotations;
use super::containers::{ContainerMap, ContainerView, claim_of_cdi_name};
use crate::engine::{Engine, Origin};

/// How the grant of an annotation claim reaches the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// CDI device names in the adjustment (containerd 2.1+/1.7.30+, CRI-O 1.34+).
    Cdi,
    /// Device nodes, device cgroup rules, env and mounts in the adjustment.
    DeviceNodes,
}

/// What a container is given when it is created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerGrant {
    /// CDI device names to inject (when injecting through CDI).
    pub cdi_devices: Vec<String>,
    /// Device nodes to create and allow (when injecting directly).
    pub device_nodes: Vec<DeviceNode>,
    /// Environment to set.
    pub env: Vec<(String, String)>,
    /// Mounts to add: (host path, container path, options).
    pub mounts: Vec<(String, String, Vec<String>)>,
    /// CPUs the container should run on.
    pub cpus: Option<CpuSet>,
    /// Memory nodes it should use.
    pub mems: Option<CpuSet>,
}

impl ContainerGrant {
    /// Whether the grant changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == ContainerGrant::default()
    }
}

/// Settings the agent needs from the config.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// Our CDI kind, `vendor/class`.
    pub cdi_kind: String,
    /// Prefix of the annotation path's keys.
    pub annotation_prefix: String,
    /// Whether any pool gives accelerator-local CPUs: only then are the cpusets of
    /// containers without claims managed (otherwise they are left as the runtime set them).
    pub manage_shared_cpus: bool,
}

/// A part of the status document a service adds (the device plugins' resources), computed
/// when the document is asked for.
pub type StatusSection = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Reacts to container events on behalf of the engine.
pub struct Agent {
    engine: Arc<Engine>,
    settings: AgentSettings,
    containers: Mutex<ContainerMap>,
    sections: Mutex<Vec<(String, StatusSection)>>,
}

/// The claim UID of a container's annotation claim.
pub fn annotation_claim_uid(container_id: &str) -> String {
    let id: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(100)
        .collect();
    format!("ctr-{id}")
}

impl Agent {
    /// An agent over `engine`.
    pub fn new(engine: Arc<Engine>, settings: AgentSettings) -> Self {
        Agent {
            engine,
            settings,
            containers: Mutex::new(ContainerMap::default()),
            sections: Mutex::new(Vec::new()),
        }
    }

    /// The engine the agent drives.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    fn containers(&self) -> MutexGuard<'_, ContainerMap> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims a container holds by its CDI names and device nodes; devices of
    /// ours it holds without any claim are returned separately.
    fn claims_of(&self, c: &ContainerView) -> (BTreeSet<String>, Vec<String>) {
        let mut claims: BTreeSet<String> = c
            .cdi_devices
            .iter()
            .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
            .collect();
        let mut unheld = Vec::new();
        self.engine.with_node(|node| {
            for (major, minor) in &c.device_nodes {
                if let Some(dev) = node.device_by_node(*major, *minor) {
                    let holders = node.holder_of(&dev.id);
                    if holders.is_empty() {
                        unheld.push(dev.id.clone());
                    } else if c.cdi_devices.is_empty() {
                        claims.extend(holders);
                    }
                }
            }
        });
        let own = annotation_claim_uid(&c.id);
        if self.engine.with_node(|n| n.allocation(&own).is_some()) {
            claims.insert(own);
        }
        (claims, unheld)
    }

    /// The runtime's view of every running container: map them to claims, adopt
    /// devices held without a record, and answer the updates that bring each
    /// container's cpuset to what the policy wants.
    pub async fn synchronize(&self, views: &[ContainerView]) -> Vec<ContainerUpdate> {
        let live: BTreeSet<String> = views.iter().map(|c| c.id.clone()).collect();
        self.containers().retain(&live);
        let mut updates = Vec::new();
        for c in views {
            let (mut claims, unheld) = self.claims_of(c);
            for device in unheld {
                match self.engine.adopt(&c.id, &device).await {
                    Ok(p) => {
                        claims.insert(p.uid);
                    }
                    Err(e) => {
                        tracing::error!(container = %c.id, device = %device, error = %e,
                            "could not adopt a device held by a running container");
                    }
                }
            }
            let claim_list: Vec<String> = claims.iter().cloned().collect();
            let (adjustment, _) = self.engine.container_started(&c.id, &claim_list);
            self.device_plugin_used(c, &claim_list).await;
            let managed = self.settings.manage_shared_cpus || !claims.is_empty();
            self.containers().set(&c.id, claims);
            if let Some(cpus) = adjustment.cpus.filter(|_| managed) {
                let current: Option<CpuSet> = c.cpus.as_deref().and_then(|s| s.parse().ok());
                if current.as_ref() != Some(&cpus) {
                    updates.push(ContainerUpdate {
                        container_id: c.id.clone(),
                        cpus,
                        mems: adjustment.mems.unwrap_or_default(),
                    });
                }
            }
        }
        // Synchronize recomputed every cpuset: older pending updates are superseded.
        self.engine.forget_containers_except(&BTreeSet::new()).await;
        // Containers that are gone no longer need their annotation or adopted claims.
        let orphaned: Vec<String> = self
            .engine
            .claims()
            .into_iter()
            .filter_map(|(_, o)| o.container().map(str::to_string))
            .filter(|c| !live.contains(c))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for c in orphaned {
            if let Err(e) = self.engine.container_removed(&c).await {
                tracing::error!(container = %c, error = %e, "could not release the claims of a container that is gone");
            }
        }
        updates
    }

    /// A container is being created: run the annotation path if the pod asks for
    /// accelerators for it, and answer its grant and the updates other containers need.
    /// An error is one sentence that fails the container's creation.
    pub async fn create_container(
        &self,
        c: &ContainerView,
        injection: Injection,
    ) -> Result<(ContainerGrant, Vec<ContainerUpdate>), String> {
        let pod = format!("{}/{}", c.pod_namespace, c.pod_name);
        let ask = annotations::container_ask(
            &self.settings.annotation_prefix,
            &pod,
            &c.pod_annotations,
            &c.name,
        )
        .map_err(|e| e.to_string())?;
        let mut grant = ContainerGrant::default();
        let mut updates = Vec::new();
        if let Some(ask) = ask {
            let uid = annotation_claim_uid(&c.id);
            let claim = ask.to_claim(
                uid.clone(),
                &c.pod_namespace,
                &format!("{}/{}", c.pod_name, c.name),
            );
            let prepared = self
                .engine
                .prepare_as(
                    claim,
                    Origin::Annotation {
                        container_id: c.id.clone(),
                    },
                )
                .await
                .map_err(|e| format!("container {} of pod {pod}: {e}", c.name))?;
            updates.extend(prepared.updates.iter().cloned());
            match injection {
                Injection::Cdi => {
                    grant.cdi_devices = prepared.devices.iter().map(|d| d.cdi_id.clone()).collect();
                }
                Injection::DeviceNodes => {
                    let edits = self.engine.with_node(|n| n.edits(&uid)).unwrap_or_default();
                    let mut seen = BTreeSet::new();
                    for e in edits {
                        for node in e.device_nodes {
                            if seen.insert(node.path.clone()) {
                                grant.device_nodes.push(node);
                            }
                        }
                        grant.env.extend(e.env);
                        grant.mounts.extend(
                            e.mounts
                                .into_iter()
                                .map(|m| (m.host_path, m.container_path, m.options)),
                        );
                    }
                }
            }
        }
        let (claims, _) = self.claims_of(c);
        let claim_list: Vec<String> = claims.iter().cloned().collect();
        let (adjustment, more) = self.engine.container_started(&c.id, &claim_list);
        updates.extend(more);
        self.device_plugin_used(c, &claim_list).await;
        let managed = self.settings.manage_shared_cpus || !claims.is_empty();
        self.containers().set(&c.id, claims);
        for (k, v) in adjustment.env {
            match grant.env.iter_mut().find(|(key, _)| *key == k) {
                Some(existing) => existing.1 = v,
                None => grant.env.push((k, v)),
            }
        }
        if managed {
            grant.cpus = adjustment.cpus;
            grant.mems = adjustment.mems;
        }
        Ok((grant, updates))
    }

    /// Records `c` as the first user of the device plugin claims among `claims` (it was
    /// created with their CDI names). A failure is logged: the container still runs, and a
    /// restart then keeps the claim until the kubelet hands its devices out again.
    async fn device_plugin_used(&self, c: &ContainerView, claims: &[String]) {
        let pod = format!("{}/{}", c.pod_namespace, c.pod_name);
        if let Err(e) = self
            .engine
            .device_plugin_used(&c.id, &c.pod_uid, &pod, claims)
            .await
        {
            tracing::warn!(container = %c.id, pod = %pod, error = %e,
                "could not record the container as the user of its device plugin allocation");
        }
    }

    /// The runtime's pods at Synchronize: device plugin claims whose pod is gone (its
    /// containers were removed while nri-accel was not listening) are released.
    pub async fn pods_present(&self, pod_uids: &BTreeSet<String>) {
        if let Err(e) = self
            .engine
            .release_device_plugin_claims_of_gone_pods(pod_uids)
            .await
        {
            tracing::error!(error = %e, "could not release the device plugin allocations of pods that are gone");
        }
    }

    /// A container stopped: it no longer takes part in CPU pool updates.
    pub fn stop_container(&self, id: &str) {
        self.containers().remove(id);
    }

    /// A container was removed: the claims scoped to it are released.
    pub async fn remove_container(&self, id: &str) -> Result<(), String> {
        self.containers().remove(id);
        self.engine
            .container_removed(id)
            .await
            .map_err(|e| format!("container {id}: {e}"))
    }

    /// Containers known and the claims they hold.
    pub fn container_claims(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.containers()
            .iter()
            .map(|(c, claims)| (c.clone(), claims.clone()))
            .collect()
    }

    /// Adds a top-level part named `name` to the status document.
    pub fn add_status_section(&self, name: &str, section: StatusSection) {
        self.sections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), section));
    }

    /// The `status` document as JSON text (see [`super::status`]), with the gate as given.
    pub fn status(&self, gate_open: bool) -> String {
        let sections: Vec<(String, StatusSection)> = self
            .sections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let parts = super::status::StatusParts {
            gate_open,
            policy: self.engine.snapshot(),
            containers: self.container_claims(),
            pending_updates: self.engine.pending_updates(),
            sections: sections.into_iter().map(|(k, f)| (k, f())).collect(),
        };
        self.engine
            .with_claims(|claims| super::status::render(&parts, claims))
    }
}
