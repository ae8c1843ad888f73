//! The node agent's reactions to container events, independent of the NRI wire
//! types: map containers to claims, run the annotation path, adopt devices held
//! without a record, and compute the adjustments and updates to answer with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use policies::{ContainerUpdate, CpuSet, DeviceNode, FamilyKind};
use tokio::sync::watch;

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

impl Injection {
    /// The name the config gives this way (`nri.cdi_injection`): `cdi` or `device-nodes`.
    pub fn as_str(self) -> &'static str {
        match self {
            Injection::Cdi => "cdi",
            Injection::DeviceNodes => "device-nodes",
        }
    }
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
}

/// A part of the status document a service adds (the device plugins' resources), computed
/// when the document is asked for.
/// Reacts to container events on behalf of the engine.
pub struct Agent {
    engine: Arc<Engine>,
    settings: AgentSettings,
    containers: Mutex<ContainerMap>,
    sections: Mutex<Vec<(&'static str, StatusSection)>>,
    /// Serializes the owner decisions of removals, so an adopted claim is never handed over to a
    /// container whose own removal is deciding at the same time (see [`Agent::remove_container`]).
    removals: tokio::sync::Mutex<()>,
    /// Synchronizes started and finished, their release work included.
    syncs: Arc<watch::Sender<(u64, u64)>>,
}

/// What the first part of a Synchronize found: the container updates to answer with, and the
/// containers that are gone, whose claims [`Agent::release_gone`] releases after the answer.
#[derive(Debug, Default)]
pub struct Synced {
    /// Updates that bring each running container's cpuset to what the policy wants.
    pub updates: Vec<ContainerUpdate>,
    /// Containers the daemon knew that the runtime no longer has.
    pub gone: Vec<String>,
}

/// Marks a Synchronize as finished, its release work included, when dropped (a panic too).
pub struct SyncGuard(Arc<watch::Sender<(u64, u64)>>);

impl Drop for SyncGuard {
    fn drop(&mut self) {
        self.0.send_modify(|(_, done)| *done += 1);
    }
}

/// Gives one extra member of the status document (e.g. the kubelet's registration), evaluated
/// each time `status` is asked.
pub type StatusSection = Box<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The claim UID of a container's annotation claim.
pub fn annotation_claim_uid(container_id: &str) -> String {
    let id: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(100)
        .collect();
    format!("ctr-{id}")
}

/// Who owns which claims, read once per Synchronize.
#[derive(Default)]
struct Owners {
    /// Container -> the annotation and adopted claims it owns.
    by_container: BTreeMap<String, Vec<String>>,
    /// Adopted claims.
    adopted: BTreeSet<String>,
}

impl Agent {
    /// An agent over `engine`.
    pub fn new(engine: Arc<Engine>, settings: AgentSettings) -> Self {
        Agent {
            engine,
            settings,
            containers: Mutex::new(ContainerMap::default()),
            sections: Mutex::new(Vec::new()),
            removals: tokio::sync::Mutex::new(()),
            syncs: Arc::new(watch::channel((0, 0)).0),
        }
    }

    /// Adds the member `name` to the status document (a part of the daemon that runs only when
    /// configured, such as the DRA driver, tells its state this way). A second section of the
    /// same name replaces the first.
    pub fn add_status_section(&self, name: &'static str, section: StatusSection) {
        let mut sections = self.sections.lock().unwrap_or_else(|e| e.into_inner());
        sections.retain(|(n, _)| *n != name);
        sections.push((name, section));
    }

    /// The engine the agent drives.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    fn containers(&self) -> MutexGuard<'_, ContainerMap> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prefix of the annotation path's keys: a container's view carries only the pod
    /// annotations under it.
    pub fn annotation_prefix(&self) -> &str {
        &self.settings.annotation_prefix
    }

    /// Whether creating `c` may prepare a claim (its pod carries annotations of our prefix): the
    /// NRI side runs such a creation in a task of its own.
    pub fn may_prepare(&self, c: &ContainerView) -> bool {
        let prefix = &self.settings.annotation_prefix;
        c.pod_annotations.keys().any(|k| {
            k.strip_prefix(prefix.as_str())
                .is_some_and(|r| r.starts_with('/'))
        })
    }

    /// Claims a container holds: those its CDI names grant, those it owns (`owned`), and, for a
    /// device of ours it has the nodes of that none of those holds, the device's holders when the
    /// runtime reports no CDI names to tell them apart (NRI before v0.10).
    fn claims_of(&self, c: &ContainerView, owned: &[String]) -> BTreeSet<String> {
        let mut claims: BTreeSet<String> = c
            .cdi_devices
            .iter()
            .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
            .collect();
        claims.extend(owned.iter().cloned());
        self.engine.with_node(|node| {
            for (major, minor) in &c.device_nodes {
                let Some(dev) = node.device_by_node(*major, *minor) else {
                    continue;
                };
                let holders = node.holder_of(&dev.id);
                if holders.iter().any(|h| claims.contains(h)) {
                    continue;
                }
                if c.cdi_devices.is_empty() {
                    claims.extend(holders);
                }
            }
        });
        claims
    }

    /// Which claims each container owns, and which claims are adopted.
    fn owners(&self) -> Owners {
        self.engine.with_claims(|claims| {
            let mut o = Owners::default();
            for (a, origin) in claims {
                if let Some(c) = origin.container() {
                    o.by_container
                        .entry(c.to_string())
                        .or_default()
                        .push(a.claim_uid.clone());
                }
                if matches!(origin, Origin::Adopted { .. }) {
                    o.adopted.insert(a.claim_uid.clone());
                }
            }
            o
        })
    }

    /// The devices to adopt, as (container, device): a device of ours that running containers
    /// have the nodes of and that no claim of theirs holds. A shared device gives each such
    /// container a share of its own (while shares last), so each holds its own; a whole or sliced
    /// device is adopted once, for the first of them, and the others count among its holders.
    /// A shared device held only by adopted claims is treated the same way; a device held by any
    /// other claim is not adopted (the container may be that claim's, which older runtimes do not
    /// say).
    fn adoption_plan(&self, views: &[ContainerView], owners: &Owners) -> Vec<(String, String)> {
        self.engine.with_node(|node| {
            let mut by_device: BTreeMap<String, Vec<&str>> = BTreeMap::new();
            for c in views {
                let mut own: BTreeSet<String> = c
                    .cdi_devices
                    .iter()
                    .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
                    .collect();
                own.extend(
                    owners
                        .by_container
                        .get(&c.id)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                for (major, minor) in &c.device_nodes {
                    let Some(dev) = node.device_by_node(*major, *minor) else {
                        continue;
                    };
                    let holders = node.holder_of(&dev.id);
                    if holders.iter().any(|h| own.contains(h)) {
                        continue;
                    }
                    let shared = node.device_family(&dev.id) == Some(FamilyKind::Shared);
                    let adoptable = holders.is_empty()
                        || (shared && holders.iter().all(|h| owners.adopted.contains(h)));
                    if adoptable {
                        let users = by_device.entry(dev.id.clone()).or_default();
                        if !users.contains(&c.id.as_str()) {
                            users.push(&c.id);
                        }
                    }
                }
            }
            let mut plan = Vec::new();
            for (device, users) in by_device {
                if node.device_family(&device) == Some(FamilyKind::Shared) {
                    plan.extend(users.iter().map(|c| (c.to_string(), device.clone())));
                } else if node.holder_of(&device).is_empty() {
                    plan.push((users[0].to_string(), device));
                }
            }
            plan
        })
    }

    /// Marks the start of a Synchronize; the guard marks its end (release work included) when
    /// dropped. [`Agent::settled`] waits for every Synchronize started so far.
    pub fn sync_started(&self) -> SyncGuard {
        self.syncs.send_modify(|(started, _)| *started += 1);
        SyncGuard(self.syncs.clone())
    }

    /// Waits until every Synchronize started so far has finished, its release work included.
    pub async fn settled(&self) {
        let mut rx = self.syncs.subscribe();
        let _ = rx.wait_for(|(started, done)| done >= started).await;
    }

    /// The runtime's view of every running container: adopt devices held without a record, map
    /// the containers to claims, and compute the updates that bring each container's cpuset to
    /// what the policy wants. Adoption is done here, before the answer, so that no claim made
    /// after it can take such a device; the adoptions run at once, so their commits share
    /// fsyncs. Releasing the claims of containers that are gone is left to
    /// [`Agent::release_gone`], which may run after the answer.
    pub async fn synchronize(&self, views: &[ContainerView]) -> Synced {
        let live: BTreeSet<String> = views.iter().map(|c| c.id.clone()).collect();
        self.containers().retain(&live);
        let plan = self.adoption_plan(views, &self.owners());
        let adopted = futures::future::join_all(
            plan.iter()
                .map(|(container, device)| self.engine.adopt(container, device)),
        )
        .await;
        for ((container, device), result) in plan.iter().zip(adopted) {
            if let Err(e) = result {
                tracing::warn!(container = %container, device = %device, error = %e,
                    "could not adopt a device held by a running container; the container counts among the device's holders");
            }
        }
        let owners = self.owners();
        let none = Vec::new();
        let mut updates = Vec::new();
        for c in views {
            let claims = self.claims_of(c, owners.by_container.get(&c.id).unwrap_or(&none));
            let claim_list: Vec<String> = claims.iter().cloned().collect();
            let (adjustment, _) = self
                .engine
                .container_started(&c.id, &claim_list, &c.placement);
            self.device_plugin_used(c, &claim_list).await;
            self.containers().set(&c.id, claims);
            // The adjustment holds only what changes: a container already where it belongs
            // gets no update (every update is a cgroup write in the runtime).
            if adjustment.cpus.is_some() || adjustment.mems.is_some() {
                updates.push(ContainerUpdate {
                    container_id: c.id.clone(),
                    cpus: adjustment.cpus.unwrap_or_default(),
                    mems: adjustment.mems.unwrap_or_default(),
                });
            }
        }
        // Synchronize recomputed every cpuset: older pending updates are superseded.
        self.engine.forget_containers_except(&BTreeSet::new()).await;
        let mut gone: BTreeSet<String> = owners
            .by_container
            .into_keys()
            .filter(|c| !live.contains(c))
            .collect();
        self.engine.with_node(|node| {
            gone.extend(
                node.containers()
                    .map(|(id, _, _)| id)
                    .filter(|id| !live.contains(*id))
                    .map(str::to_string),
            )
        });
        Synced {
            updates,
            gone: gone.into_iter().collect(),
        }
    }

    /// Forgets the containers that are gone and releases the claims that lived with them (an
    /// adopted claim another running container still uses is handed over instead). The removals
    /// run at once, so their commits share fsyncs.
    pub async fn release_gone(&self, gone: &[String]) {
        let removals = gone.iter().map(|c| async move {
            if let Err(e) = self.remove_container(c).await {
                tracing::error!(container = %c, error = %e, "could not release the claims of a container that is gone");
            }
        });
        futures::future::join_all(removals).await;
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
        let own = annotation_claim_uid(&c.id);
        let owned: Vec<String> = self
            .engine
            .with_node(|n| n.allocation(&own).is_some())
            .then_some(own)
            .into_iter()
            .collect();
        let claims = self.claims_of(c, &owned);
        let claim_list: Vec<String> = claims.iter().cloned().collect();
        let (adjustment, more) = self
            .engine
            .container_started(&c.id, &claim_list, &c.placement);
        updates.extend(more);
        self.device_plugin_used(c, &claim_list).await;
        self.containers().set(&c.id, claims);
        for (k, v) in adjustment.env {
            match grant.env.iter_mut().find(|(key, _)| *key == k) {
                Some(existing) => existing.1 = v,
                None => grant.env.push((k, v)),
            }
        }
        // Only what changes: two plugins setting the same field fail the creation.
        grant.cpus = adjustment.cpus;
        grant.mems = adjustment.mems;
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

    /// A container was removed: the claims scoped to it are released, except an adopted claim
    /// whose device another running container still uses, which is handed over to that one.
    ///
    /// Forgetting the container and handing its adopted claims over happen under one lock
    /// shared by all removals: a removal that runs beside this one either has already left the
    /// map (and is not picked as the new owner) or runs after, and then finds the claim among its
    /// own and releases or hands it over in turn.
    pub async fn remove_container(&self, id: &str) -> Result<(), String> {
        let failed = |e: crate::engine::EngineError| format!("container {id}: {e}");
        {
            let _turn = self.removals.lock().await;
            self.containers().remove(id);
            for (uid, origin) in self.engine.owned_by(id) {
                if !matches!(origin, Origin::Adopted { .. }) {
                    continue;
                }
                if let Some(next) = self.successor(&uid) {
                    self.engine.hand_over(&uid, &next).await.map_err(failed)?;
                }
            }
        }
        self.engine.container_removed(id).await.map_err(failed)
    }

    /// The running container an adopted claim goes to when its owner is removed: one that uses
    /// it and holds no claim of its own on the same devices (a container that already holds its
    /// own share of a shared device does not take a second one).
    fn successor(&self, uid: &str) -> Option<String> {
        let devices_of = |claim: &str| -> BTreeSet<String> {
            self.engine.with_node(|n| {
                n.allocation(claim)
                    .map(|a| a.results.iter().map(|g| g.device_id.clone()).collect())
                    .unwrap_or_default()
            })
        };
        let devices = devices_of(uid);
        let candidates = self.containers().holders(uid);
        candidates.into_iter().find(|c| {
            !self
                .engine
                .owned_by(c)
                .iter()
                .any(|(other, _)| other != uid && !devices_of(other).is_disjoint(&devices))
        })
    }

    /// The containers holding claims, and their claims.
    pub fn container_claims(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.containers()
            .iter()
            .map(|(c, claims)| (c.clone(), claims.clone()))
            .collect()
    }

    /// The `status` document as JSON text (see [`super::status`]), with the gate as given.
    pub fn status(&self, gate_open: bool) -> String {
        let parts = super::status::StatusParts {
            gate_open,
            policy: self.engine.snapshot(),
            containers: self.container_claims(),
            pending_updates: self.engine.pending_updates(),
            sections: self
                .sections
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(name, section)| (*name, section()))
                .collect(),
        };
        self.engine
            .with_claims(|claims| super::status::render(&parts, claims))
    }
}
