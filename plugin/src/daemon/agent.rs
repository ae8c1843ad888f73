//! The node agent's reactions to container events, independent of the NRI wire
//! types: map containers to claims, run the annotation path, adopt devices held
//! without a record, and compute the adjustments and updates to answer with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use policies::{ContainerUpdate, CpuSet, DeviceNode, FamilyKind};
use tokio::sync::watch;

use super::annotations;
use super::containers::{ContainerMap, ContainerView, claim_of_cdi_name, short_id};
use super::pods::PodAsks;
use crate::engine::{Engine, Origin};

/// What a container is given when it is created. The annotation path's grant is injected as
/// device nodes, device cgroup rules, env and mounts, never as CDI device names: its spec is
/// written inside CreateContainer, and a runtime's CDI cache (containerd's watches the
/// directory) cannot be relied on to have seen a file written in the same breath as the reply
/// that names it (docs/operator-guide.md, "How the annotation path injects devices").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerGrant {
    /// Device nodes to create and allow.
    pub device_nodes: Vec<DeviceNode>,
    /// Environment to set.
    pub env: Vec<(String, String)>,
    /// Mounts to add: (host path, container path, options).
    pub mounts: Vec<(String, String, Vec<String>)>,
    /// Mounts of the vendor's CDI spec (docs/gpus.md), kept as the spec gives them (type
    /// included).
    pub vendor_mounts: Vec<cdi::Mount>,
    /// OCI hooks of the vendor's CDI spec.
    pub hooks: Vec<cdi::Hook>,
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
/// What the annotation path needs to merge vendor CDI devices into an adjustment.
struct VendorMerge {
    composer: Arc<crate::vendor::VendorComposer>,
    inventory: Arc<policies::Inventory>,
    root: std::path::PathBuf,
}

/// Reacts to container events on behalf of the engine.
pub struct Agent {
    /// Set when a pool composes grants with vendor CDI devices.
    vendor: std::sync::OnceLock<VendorMerge>,
    engine: Arc<Engine>,
    settings: AgentSettings,
    containers: Mutex<ContainerMap>,
    sections: Mutex<Vec<(&'static str, StatusSection)>>,
    /// Serializes the owner decisions of removals, so an adopted claim is never handed over to a
    /// container whose own removal is deciding at the same time (see [`Agent::remove_container`]).
    removals: tokio::sync::Mutex<()>,
    /// Synchronizes started and finished, their release work included.
    syncs: Arc<watch::Sender<(u64, u64)>>,
    /// Which container names the pods on the annotation path ask devices for, and which
    /// appeared (a name that never appears gets no device: say so).
    asks: Mutex<PodAsks>,
    /// Running containers whose pod asks devices for them and that hold none (created while
    /// nri-accel was not connected), as found by the latest Synchronize: container -> what.
    unmet: Mutex<BTreeMap<String, String>>,
    /// Containers whose grant [`Agent::release_unconfirmed`] released because the runtime never
    /// reported them created, with when: one that shows up after all is adopted again.
    released_unconfirmed: Mutex<BTreeMap<String, Instant>>,
    /// Serializes [`Agent::release_unconfirmed`] with the runtime's confirmations
    /// ([`Agent::container_exists`]).
    confirmations: tokio::sync::Mutex<()>,
}

/// How long a container whose grant was released unconfirmed is remembered, in case it shows up
/// after all (beyond this its devices are found by the next Synchronize's adoption only).
const RELEASED_UNCONFIRMED_KEPT: Duration = Duration::from_secs(3600);
/// The most such containers remembered; the oldest are forgotten first.
const RELEASED_UNCONFIRMED_MAX: usize = 4096;

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

/// `carried` (older) overridden by `newer` for the same container, sorted by container.
fn merge_updates(
    carried: Vec<ContainerUpdate>,
    newer: Vec<ContainerUpdate>,
) -> Vec<ContainerUpdate> {
    let mut by_id: BTreeMap<String, ContainerUpdate> = BTreeMap::new();
    for u in carried.into_iter().chain(newer) {
        by_id.insert(u.container_id.clone(), u);
    }
    by_id.into_values().collect()
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
            asks: Mutex::new(PodAsks::default()),
            unmet: Mutex::new(BTreeMap::new()),
            released_unconfirmed: Mutex::new(BTreeMap::new()),
            confirmations: tokio::sync::Mutex::new(()),
            vendor: std::sync::OnceLock::new(),
        }
    }

    /// Merges the vendor CDI devices of annotation-path grants into their adjustments from now
    /// on (docs/gpus.md): `inventory` resolves the numbers of nodes nri-accel knows, `root` is
    /// where other nodes are looked up (discovery's root).
    pub fn set_vendor(
        &self,
        composer: Arc<crate::vendor::VendorComposer>,
        inventory: policies::Inventory,
        root: std::path::PathBuf,
    ) {
        let _ = self.vendor.set(VendorMerge {
            composer,
            inventory: Arc::new(inventory),
            root,
        });
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
    /// runtime reports no CDI names to tell them apart (NRI before v0.10), or else the adopted
    /// claims among them.
    ///
    /// An adopted claim holds a device for every running container that uses it. A container
    /// whose CDI names name a claim that does not hold the device it has (the claim's record
    /// was lost, or it was released while nri-accel was away) is such a user: mapped to the
    /// adopted claim, it is where the claim is handed over when the container the device was
    /// adopted for goes, instead of the device being released under it.
    fn claims_of(&self, c: &ContainerView, owned: &[String]) -> BTreeSet<String> {
        let mut claims: BTreeSet<String> = c
            .cdi_devices
            .iter()
            .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
            .collect();
        claims.extend(owned.iter().cloned());
        let mut others = Vec::new();
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
                } else {
                    others.extend(holders);
                }
            }
        });
        claims.extend(
            others
                .into_iter()
                .filter(|h| matches!(self.engine.origin_of(h), Some(Origin::Adopted { .. }))),
        );
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

    /// Whether the runtime has synchronized with this process at least once: before that the
    /// containers already running are unknown, so nothing may be granted (the gate).
    pub fn has_synchronized(&self) -> bool {
        self.syncs.borrow().0 > 0
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
        // The claims the running containers name are locked from before the adoption plan until
        // every container is mapped, as CreateContainer locks them: an Unprepare that found no
        // user before this Synchronize (one of these containers started while nri-accel was
        // away) releases before the plan is made, which then adopts the device it freed; one
        // that asks after finds the containers mapped and is refused. Without the locks, a
        // release between the two left the device free under a running container.
        let named: BTreeSet<String> = views
            .iter()
            .flat_map(|c| &c.cdi_devices)
            .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
            .collect();
        let mut locks = BTreeMap::new();
        for uid in named {
            let guard = self.engine.lock_claim(&uid).await;
            locks.insert(uid, guard);
        }
        self.containers().retain(&live);
        let plan = self.adoption_plan(views, &self.owners());
        for (container, device) in &plan {
            // Adoption takes the adopted claim's lock (a container naming that claim's CDI
            // devices is all that would have it locked here).
            locks.remove(&crate::engine::adopted_claim_uid(container, device));
        }
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
        let mut mapped = Vec::with_capacity(views.len());
        for c in views {
            let claims = self.claims_of(c, owners.by_container.get(&c.id).unwrap_or(&none));
            let claim_list: Vec<String> = claims.iter().cloned().collect();
            let (adjustment, _) = self
                .engine
                .container_started(&c.id, &claim_list, &c.placement);
            self.containers().set(c, claims, true);
            mapped.push(claim_list);
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
        // Mapped: an Unprepare now sees the containers. Recording a device plugin claim's user
        // takes that claim's lock itself.
        drop(locks);
        for (c, claim_list) in views.iter().zip(&mapped) {
            self.device_plugin_used(c, claim_list).await;
        }
        self.report_unmet(views);
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

    /// Records and reports the running containers whose pod asks devices for them on the
    /// annotation path and that hold no annotation claim: they were created while nri-accel was
    /// not connected to the runtime, so nothing injected the devices. A running container
    /// cannot be given devices afterwards; the pod must be recreated.
    fn report_unmet(&self, views: &[ContainerView]) {
        let prefix = &self.settings.annotation_prefix;
        let mut unmet = BTreeMap::new();
        for c in views
            .iter()
            .filter(|c| !c.stopped && !c.pod_annotations.is_empty())
        {
            let pod = format!("{}/{}", c.pod_namespace, c.pod_name);
            let ask = match annotations::container_ask(prefix, &pod, &c.pod_annotations, &c.name) {
                Ok(Some(_)) => annotations::key_for(prefix, &c.name),
                Ok(None) => continue,
                Err(e) => e.to_string(),
            };
            let holds = self
                .engine
                .owned_by(&c.id)
                .iter()
                .any(|(_, o)| matches!(o, Origin::Annotation { .. }));
            if holds {
                continue;
            }
            let what = format!("{pod}/{}: {ask}", c.name);
            tracing::warn!(container = %short_id(&c.id), pod = %pod, name = %c.name, ask = %ask,
                "a running container's pod asks for devices it does not have: it was created while nri-accel was not connected to the runtime; recreate the pod (docs/operator-guide.md, \"Making nri-accel required for pods that ask for devices\")");
            unmet.insert(c.id.clone(), what);
        }
        *self.unmet.lock().unwrap_or_else(|e| e.into_inner()) = unmet;
    }

    /// The running containers whose pod asks devices for them and that hold none (see
    /// [`Agent::synchronize`]): container -> `namespace/pod/container: annotation`.
    pub fn unmet_asks(&self) -> BTreeMap<String, String> {
        self.unmet.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn forget_unmet(&self, id: &str) {
        self.unmet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
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
    /// accelerators for it, and answer its grant and the updates other containers need (those
    /// this creation makes and every pending one: a reply is where updates may safely go).
    /// An error is one sentence that fails the container's creation.
    pub async fn create_container(
        &self,
        c: &ContainerView,
    ) -> Result<(ContainerGrant, Vec<ContainerUpdate>), String> {
        let pod = format!("{}/{}", c.pod_namespace, c.pod_name);
        if self.may_prepare(c) && !self.has_synchronized() {
            return Err(format!(
                "container {} of pod {pod} asks for devices, but the runtime has not synchronized with nri-accel, so the containers already running are unknown and nothing is granted (containerd 1.7.0-1.7.6, NRI v0.3.0, never synchronizes a plugin it launches itself: run nri-accel as a service on the NRI socket instead)",
                c.name
            ));
        }
        let failed = self.release_failed_attempts(c).await;
        self.note_asks(c);
        let ask = annotations::container_ask(
            &self.settings.annotation_prefix,
            &pod,
            &c.pod_annotations,
            &c.name,
        )
        .map_err(|e| e.to_string())?;
        // Claims named by the container's CDI devices: held while the container is mapped, so
        // an unprepare cannot release one between the check and the mapping.
        let named: BTreeSet<String> = c
            .cdi_devices
            .iter()
            .filter_map(|n| claim_of_cdi_name(&self.settings.cdi_kind, n))
            .collect();
        let mut locks = Vec::with_capacity(named.len());
        for uid in &named {
            locks.push(self.engine.lock_claim(uid).await);
        }
        if let Some(uid) = named
            .iter()
            .find(|uid| self.engine.with_node(|n| n.allocation(uid).is_none()))
        {
            return Err(format!(
                "container {} of pod {pod} names CDI devices of claim {uid}, which is not prepared on this node (it was unprepared, or never prepared): prepare the claim again, then create the container",
                c.name
            ));
        }
        let mut grant = ContainerGrant::default();
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
            let vendor = self.vendor_grant(&prepared, &uid, &pod, &c.name).await?;
            let edits = self.engine.with_node(|n| n.edits(&uid)).unwrap_or_default();
            let mut seen = BTreeSet::new();
            for e in edits {
                for node in e.device_nodes {
                    if seen.insert(node.path.clone()) {
                        grant.device_nodes.push(node);
                    }
                }
                grant.env.extend(e.env);
                // One mount per container path (an MPS pool's directories come with every
                // device of the pool): a runtime refuses an adjustment mounting a path twice.
                for m in e.mounts {
                    if !grant.mounts.iter().any(|(_, c, _)| *c == m.container_path) {
                        grant
                            .mounts
                            .push((m.host_path, m.container_path, m.options));
                    }
                }
            }
            if let Some(v) = vendor {
                for node in v.device_nodes {
                    if seen.insert(node.path.clone()) {
                        grant.device_nodes.push(node);
                    } else if let Some(own) =
                        grant.device_nodes.iter_mut().find(|d| d.path == node.path)
                    {
                        // The vendor's spec may allow more on a node nri-accel also grants
                        // (`rwm` where discovery says `rw`): the container gets the union, as a
                        // runtime applying both specs would give it.
                        own.permissions =
                            policies::union_access(&own.permissions, &node.permissions);
                    }
                }
                // The vendor's variables first: nri-accel's own (share and slice limits) win.
                let own = std::mem::replace(&mut grant.env, v.env);
                for (k, val) in own {
                    match grant.env.iter_mut().find(|(key, _)| *key == k) {
                        Some(existing) => existing.1 = val,
                        None => grant.env.push((k, val)),
                    }
                }
                grant.vendor_mounts = v.mounts;
                grant.hooks = v.hooks;
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
        self.containers().set(c, claims, false);
        // Mapped: an unprepare now sees the container. Recording a device plugin claim's user
        // takes that claim's lock itself.
        drop(locks);
        // The failed attempts go now that this one uses what it names: a device plugin
        // allocation is the pod's, and the kubelet's retry names it again.
        for old in failed {
            if let Err(e) = self.remove_container(&old).await {
                tracing::error!(container = %old, error = %e, "could not release the grant of a container whose creation failed");
            }
        }
        self.device_plugin_used(c, &claim_list).await;
        for (k, v) in adjustment.env {
            match grant.env.iter_mut().find(|(key, _)| *key == k) {
                Some(existing) => existing.1 = v,
                None => grant.env.push((k, v)),
            }
        }
        // Only what changes: two plugins setting the same field fail the creation.
        grant.cpus = adjustment.cpus;
        grant.mems = adjustment.mems;
        let carried = self.engine.take_pending_for_reply(&c.id).await;
        Ok((grant, merge_updates(carried, more)))
    }

    /// The vendor CDI edits an annotation-path grant carries (docs/gpus.md), resolved from the
    /// vendor specs as they are now; `None` when it names no vendor device. When they cannot be
    /// merged, the grant is released and the container refused: nothing half-done.
    async fn vendor_grant(
        &self,
        prepared: &crate::engine::Prepared,
        uid: &str,
        pod: &str,
        name: &str,
    ) -> Result<Option<crate::vendor::VendorGrant>, String> {
        let names: Vec<String> = prepared
            .devices
            .iter()
            .filter_map(|d| d.vendor_cdi_id.clone())
            .collect();
        let Some(v) = self.vendor.get().filter(|_| !names.is_empty()) else {
            return Ok(None);
        };
        // Reads the vendor spec files when they changed and stats device nodes: off the runtime.
        let (specs, inventory, root) = (
            v.composer.specs().clone(),
            v.inventory.clone(),
            v.root.clone(),
        );
        let merged = tokio::task::spawn_blocking(move || {
            specs
                .current()
                .and_then(|cat| crate::vendor::merge_for_container(&cat, &names, &inventory, &root))
        })
        .await
        .unwrap_or_else(|e| Err(format!("merging the vendor CDI edits failed: {e}")));
        match merged {
            Ok(mut m) => {
                // As the claim's spec records it, for the container to see on every door.
                let all: Vec<Option<String>> = prepared
                    .devices
                    .iter()
                    .map(|d| d.vendor_cdi_id.clone())
                    .collect();
                if let Some(v) = crate::vendor::env_value(&all) {
                    m.env.push((crate::vendor::VENDOR_ENV.to_string(), v));
                }
                Ok(Some(m))
            }
            Err(why) => {
                if let Err(e) = self.engine.unprepare(uid).await {
                    tracing::error!(claim = %uid, error = %e, "releasing the grant of a container whose vendor CDI devices cannot be merged");
                }
                Err(format!(
                    "container {name} of pod {pod} not created: {why}; nothing was granted"
                ))
            }
        }
    }

    /// Releases the annotation grants of earlier attempts at creating `c` that never came to
    /// exist: the runtime's create failed after nri-accel answered (a command that does not
    /// exist, say), and CRI-O sends no event for such a container. The pod retrying the same
    /// container is the proof: a runtime never creates two containers of one name in a pod at
    /// once. Answers those attempts; the caller forgets them once `c` is mapped, so that what
    /// `c` names (a device plugin allocation, reused by the kubelet's retry) stays held.
    async fn release_failed_attempts(&self, c: &ContainerView) -> Vec<String> {
        let failed = self.containers().failed_attempts(c);
        for old in &failed {
            tracing::info!(container = %short_id(old), retry = %short_id(&c.id), name = %c.name,
                pod = %format!("{}/{}", c.pod_namespace, c.pod_name),
                "releasing the grant of a container whose creation failed (the pod is creating it again)");
            for (uid, origin) in self.engine.owned_by(old) {
                if !matches!(origin, Origin::Annotation { .. }) {
                    continue;
                }
                if let Err(e) = self.engine.unprepare(&uid).await {
                    tracing::error!(container = %old, claim = %uid, error = %e, "could not release the grant of a container whose creation failed");
                }
            }
        }
        failed
    }

    /// Records the names `c`'s pod asks devices for and that `c` appeared; warns at once when
    /// the runtime reports no container name (CRI-O takes it from the
    /// `io.kubernetes.container.name` label).
    fn note_asks(&self, c: &ContainerView) {
        let asked = annotations::asked_names(&self.settings.annotation_prefix, &c.pod_annotations);
        if asked.is_empty() {
            return;
        }
        let label = format!("{}/{}", c.pod_namespace, c.pod_name);
        if c.name.is_empty() {
            tracing::warn!(container = %short_id(&c.id), pod = %label, asked = %asked.join(","),
                "the runtime reports no name for this container, so it gets none of the devices its pod asks for by container name (CRI-O takes the name from the io.kubernetes.container.name label: a CRI client must set it)");
        }
        self.asks().seen(&c.pod_id, &label, asked, &c.name);
    }

    fn asks(&self) -> MutexGuard<'_, PodAsks> {
        self.asks.lock().unwrap_or_else(|e| e.into_inner())
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

    /// A container is being stopped: it no longer uses its devices, so the claims scoped to it
    /// on the annotation path are released (the pod's next attempt at the container, or
    /// another pod, may have them), and it leaves the CPU pool updates. Answers the updates
    /// for the StopContainer reply: those the release made and every pending one.
    pub async fn stop_container(&self, id: &str) -> Vec<ContainerUpdate> {
        self.containers().remove(id);
        self.forget_unmet(id);
        // A device plugin allocation it used is free for the kubelet now (the kubelet admits the
        // next pod as soon as this one's containers stopped, before it removes them).
        self.engine.container_stopped(id);
        for (uid, origin) in self.engine.owned_by(id) {
            if !matches!(origin, Origin::Annotation { .. }) {
                continue;
            }
            if let Err(e) = self.engine.unprepare(&uid).await {
                tracing::error!(container = %id, claim = %uid, error = %e,
                    "could not release the claim of a stopped container; its removal retries");
            }
        }
        self.engine.take_pending_for_reply(id).await
    }

    /// The runtime created the container (PostCreateContainer): its grant is no longer a
    /// failed attempt's.
    pub fn container_created(&self, id: &str) {
        self.containers().created(id);
    }

    /// The runtime reported container `c` as existing (PostCreateContainer, StartContainer): its
    /// grant is confirmed. When its grant was already released as never confirmed (its create
    /// took longer than `nri.unconfirmed_grant_secs`), the devices it was given are adopted
    /// again where they are still free; a device another claim took meanwhile is reported, since
    /// two containers may now use it.
    pub async fn container_exists(&self, c: &ContainerView) {
        let _turn = self.confirmations.lock().await;
        self.container_created(&c.id);
        let late = self.released().remove(&c.id).is_some();
        if !late {
            return;
        }
        let pod = format!("{}/{}/{}", c.pod_namespace, c.pod_name, c.name);
        let plan = self.adoption_plan(std::slice::from_ref(c), &self.owners());
        for (container, device) in &plan {
            match self.engine.adopt(container, device).await {
                Ok(_) => {
                    tracing::warn!(container = %short_id(&c.id), name = %pod, device = %device,
                    "a container whose grant was released because the runtime had not reported it created within nri.unconfirmed_grant_secs exists after all: its device is held for it again")
                }
                Err(e) => {
                    tracing::error!(container = %short_id(&c.id), name = %pod, device = %device, error = %e,
                    "a container whose grant was released as never created exists after all, and its device could not be held for it again")
                }
            }
        }
        let owned = self.owners().by_container.remove(&c.id).unwrap_or_default();
        let claims = self.claims_of(c, &owned);
        let taken: Vec<String> = self.engine.with_node(|node| {
            c.device_nodes
                .iter()
                .filter_map(|(major, minor)| node.device_by_node(*major, *minor))
                .filter(|dev| !node.holder_of(&dev.id).iter().any(|h| claims.contains(h)))
                .map(|dev| {
                    format!(
                        "{} (held by {})",
                        dev.id,
                        node.holder_of(&dev.id).join(", ")
                    )
                })
                .collect()
        });
        if !taken.is_empty() {
            tracing::error!(container = %short_id(&c.id), name = %pod, devices = %taken.join("; "),
                "a container whose grant was released because the runtime had not reported it created within nri.unconfirmed_grant_secs exists after all, and another claim holds its device meanwhile: two containers may use it; remove this container, or raise nri.unconfirmed_grant_secs above the runtime's slowest create");
        }
        let claim_list: Vec<String> = claims.iter().cloned().collect();
        // Its cpuset is left as the runtime made it: a late container gets no adjustment.
        let _ = self
            .engine
            .container_started(&c.id, &claim_list, &c.placement);
        self.containers().set(c, claims, true);
    }

    fn released(&self) -> MutexGuard<'_, BTreeMap<String, Instant>> {
        self.released_unconfirmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Releases the grants of containers the runtime has not reported as existing
    /// (PostCreateContainer, StartContainer, a Synchronize) although their CreateContainer was
    /// answered at least `age` ago: the runtime's create failed after nri-accel answered, and
    /// CRI-O sends no event for such a container. A container using a device plugin allocation
    /// is left alone (the allocation is its pod's, reused by the kubelet's retry). Runs only
    /// while the runtime is connected and
    /// synchronized (the caller checks the gate): an event lost with a connection is made up for
    /// by the next Synchronize, which lists every container that exists. Answers how many
    /// containers' grants went.
    pub async fn release_unconfirmed(&self, age: Duration) -> usize {
        // A confirmation either comes first (the container is no longer unconfirmed) or after
        // the release (and finds the container among the released ones).
        let _turn = self.confirmations.lock().await;
        let now = Instant::now();
        // A device plugin allocation belongs to the pod, not to one attempt at a container: the
        // kubelet creates the next attempt with the same allocation, without a new Allocate.
        // Such a container is left to its retry and its pod's end.
        let pod_scoped: BTreeSet<String> = self
            .engine
            .device_plugin_claims()
            .into_iter()
            .flat_map(|c| c.users.into_iter().chain(c.user.map(|u| u.container_id)))
            .collect();
        let stale: Vec<(String, String)> = self
            .containers()
            .unconfirmed(age, now)
            .into_iter()
            .filter(|(id, _)| !pod_scoped.contains(id))
            .collect();
        for (id, label) in &stale {
            tracing::warn!(container = %short_id(id), name = %label, after_secs = age.as_secs(),
                "releasing the grant of a container the runtime never reported created (its create failed after nri-accel answered, and the runtime sent no event for it; nri.unconfirmed_grant_secs)");
            if let Err(e) = self.remove_container(id).await {
                tracing::error!(container = %id, error = %e, "could not release the grant of a container that never came to exist");
                continue;
            }
            let mut released = self.released();
            released.retain(|_, at| now.saturating_duration_since(*at) < RELEASED_UNCONFIRMED_KEPT);
            while released.len() >= RELEASED_UNCONFIRMED_MAX {
                let Some(oldest) = released
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(id, _)| id.clone())
                else {
                    break;
                };
                released.remove(&oldest);
            }
            released.insert(id.clone(), now);
        }
        stale.len()
    }

    /// A pod sandbox stopped or was removed: the grants of its containers go with it, those of
    /// containers that never came to exist too (no event names them). Warns about container
    /// names the pod asked devices for that never appeared.
    pub async fn pod_gone(&self, pod_id: &str) {
        if let Some(never) = self.asks().pod_gone(pod_id) {
            tracing::warn!(pod = %never.pod, names = %never.names.join(","), seen = %never.seen.join(","),
                "the pod asked for devices for containers the runtime never created under those names: they got no device (check the names in the pod's annotations; CRI-O takes a container's name from its io.kubernetes.container.name label)");
        }
        let containers = self.containers().of_pod(pod_id);
        for id in containers {
            if let Err(e) = self.remove_container(&id).await {
                tracing::error!(container = %id, error = %e, "could not release the claims of a container whose pod is gone");
            }
        }
    }

    /// The containers using claim `uid`, each as `id (namespace/pod/container)`: a claim they
    /// use is not released under them.
    pub fn users_of(&self, uid: &str) -> Vec<String> {
        self.containers().holders_described(uid)
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
        self.forget_unmet(id);
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

    /// Forgets what the pods that are no longer present asked (a Synchronize lists those that
    /// are).
    pub fn pods_listed(&self, pod_ids: &BTreeSet<String>) {
        self.asks().retain(pod_ids);
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
                .chain(std::iter::once((
                    "unmet_asks",
                    serde_json::to_value(self.unmet_asks()).unwrap_or_default(),
                )))
                .collect(),
        };
        self.engine
            .with_claims(|claims| super::status::render(&parts, claims))
    }
}
