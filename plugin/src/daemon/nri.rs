//! The NRI side of the daemon: the stub's event handlers, translating NRI
//! messages to and from the agent's plain types.
//!
//! Engine work a handler starts runs in a task of its own, inside
//! [`crate::engine::in_nri_handler`], and the handler only waits for it: when
//! the runtime's deadline passes or the connection closes, the NRI server drops
//! the handler, not the work, so a prepare or a release is never left half done
//! (the claims API runs its engine calls the same way). Inside that scope no
//! UpdateContainers is sent: updates are committed as pending and carried in the
//! replies that have a field for them (CreateContainer, StopContainer,
//! Synchronize); the daemon's flusher pushes what is left only on runtimes whose
//! NRI allows it (see `engine::Delivery`). A panic in the work is raised again in
//! the handler, where the NRI server answers that request with INTERNAL and goes
//! on.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use nri_proto::api::{
    ConfigureRequest, Container, ContainerAdjustment, ContainerUpdate, Event, Hook, Hooks,
    KeyValue, LinuxCPU, LinuxContainerAdjustment, LinuxContainerUpdate, LinuxDevice,
    LinuxDeviceCgroup, LinuxResources, Mount, OptionalInt, OptionalInt64, PodSandbox,
};
use nri_proto::protobuf::MessageField;
use nri_proto::{EventMask, Plugin, PluginError, SyncContainer, SyncDecoding, SyncPod};
use policies::{CpuSet, Placement};

use super::agent::{Agent, ContainerGrant};
use super::containers::ContainerView;
use crate::engine::{Delivery, in_nri_handler};
use crate::metrics::Metrics;

/// The daemon's NRI plugin.
pub struct NriPlugin {
    agent: Arc<Agent>,
    metrics: Arc<Metrics>,
}

impl NriPlugin {
    /// A plugin over `agent`.
    pub fn new(agent: Arc<Agent>, metrics: Arc<Metrics>) -> Self {
        NriPlugin { agent, metrics }
    }

    /// The runtime reported a container as existing: its grant is confirmed (see
    /// [`Agent::container_exists`]).
    async fn container_exists(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), PluginError> {
        let v = view(pod, container, self.agent.annotation_prefix());
        let agent = self.agent.clone();
        detached(async move { agent.container_exists(&v).await }).await
    }

    /// A pod stopped or was removed: the grants of its containers go (see
    /// [`Agent::pod_gone`]); the event's reply has no update list.
    async fn pod_gone(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        let (agent, id) = (self.agent.clone(), pod.id.clone());
        detached(async move { agent.pod_gone(&id).await }).await?;
        self.agent.engine().wake_flusher();
        Ok(())
    }
}

/// Runs `work` (engine work of a handler) in a task of its own and waits for it: the work
/// completes whatever happens to the handler. A panic in it is raised again here.
async fn detached<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, PluginError> {
    match tokio::spawn(in_nri_handler(work)).await {
        Ok(done) => Ok(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(PluginError::failed(format!(
            "nri-accel is shutting down; the event's work was stopped: {e}"
        ))),
    }
}

/// The agent's view of a container being created. Of the pod's annotations only those the
/// annotation path reads are copied: those under `annotation_prefix` (a CRI pod carries a few
/// kilobytes of others). The running containers of a Synchronize have [`sync_view`].
pub fn view(pod: &PodSandbox, c: &Container, annotation_prefix: &str) -> ContainerView {
    let linux = c.linux.as_ref();
    let cpu = linux
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref());
    ContainerView {
        id: c.id.clone(),
        name: c.name.clone(),
        pod_namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        pod_id: pod.id.clone(),
        stopped: false,
        pod_annotations: pod
            .annotations
            .iter()
            .filter(|(k, _)| {
                k.strip_prefix(annotation_prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cdi_devices: c.CDI_devices.iter().map(|d| d.name.clone()).collect(),
        device_nodes: linux
            .map(|l| {
                char_devices(
                    l.devices
                        .iter()
                        .map(|d| (d.type_.as_str(), d.major, d.minor)),
                )
            })
            .unwrap_or_default(),
        placement: Placement {
            cpus: cpu.and_then(|cpu| reported_set(&cpu.cpus)),
            mems: cpu.and_then(|cpu| reported_set(&cpu.mems)),
        },
    }
}

/// The daemon's view of a running container of a lean Synchronize, with the pod annotations of
/// the annotation path the lean decoding kept.
pub fn sync_view(pod: &SyncPod, c: &SyncContainer) -> ContainerView {
    ContainerView {
        id: c.id.clone(),
        name: c.name.clone(),
        pod_namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        pod_id: pod.id.clone(),
        stopped: c.state == nri_proto::api::ContainerState::CONTAINER_STOPPED as i32,
        pod_annotations: pod.annotations.iter().cloned().collect(),
        cdi_devices: c.cdi_devices.clone(),
        device_nodes: char_devices(
            c.devices
                .iter()
                .map(|d| (d.kind.as_str(), d.major, d.minor)),
        ),
        placement: Placement {
            cpus: reported_set(&c.cpus),
            mems: reported_set(&c.mems),
        },
    }
}

/// (major, minor) of the character devices among `(type, major, minor)` (a device without a
/// type counts as one), numbers out of range left out.
fn char_devices<'a>(devices: impl Iterator<Item = (&'a str, i64, i64)>) -> Vec<(u32, u32)> {
    devices
        .filter(|(kind, _, _)| *kind == "c" || kind.is_empty())
        .filter_map(|(_, major, minor)| {
            Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?))
        })
        .collect()
}

/// A cpuset or memory-node list as the runtime reports it: `None` when empty (not pinned). A
/// list that does not parse counts as an empty set, which differs from any the policy gives, so
/// the container is set to the policy's.
fn reported_set(list: &str) -> Option<CpuSet> {
    let list = list.trim();
    (!list.is_empty()).then(|| list.parse().unwrap_or_default())
}

/// The NRI adjustment for a grant.
pub fn adjustment(grant: &ContainerGrant) -> ContainerAdjustment {
    let mut adj = ContainerAdjustment::new();
    adj.env = grant
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = KeyValue::new();
            kv.key = k.clone();
            kv.value = v.clone();
            kv
        })
        .collect();
    adj.mounts = grant
        .mounts
        .iter()
        .map(|(host, path, options)| {
            let mut m = Mount::new();
            m.source = host.clone();
            m.destination = path.clone();
            m.type_ = "bind".into();
            m.options = if options.is_empty() {
                vec!["bind".into(), "ro".into()]
            } else {
                options.clone()
            };
            m
        })
        .collect();
    // The vendor's mounts as its CDI spec gives them (a bind unless the spec names a type).
    adj.mounts.extend(grant.vendor_mounts.iter().map(|v| {
        let mut m = Mount::new();
        m.source = v.host_path.clone();
        m.destination = v.container_path.clone();
        m.options = v.options.clone();
        m.type_ = match &v.kind {
            Some(t) => t.clone(),
            None => {
                if !m.options.iter().any(|o| o == "bind" || o == "rbind") {
                    m.options.push("bind".into());
                }
                "bind".into()
            }
        };
        m
    }));
    if !grant.hooks.is_empty() {
        adj.hooks = MessageField::some(hooks(&grant.hooks));
    }
    let mut linux = LinuxContainerAdjustment::new();
    let mut resources = LinuxResources::new();
    for node in &grant.device_nodes {
        let mut d = LinuxDevice::new();
        d.path = node.path.clone();
        d.type_ = match node.kind {
            policies::NodeKind::Char => "c".into(),
            policies::NodeKind::Block => "b".into(),
        };
        d.major = i64::from(node.major);
        d.minor = i64::from(node.minor);
        linux.devices.push(d);
        let mut rule = LinuxDeviceCgroup::new();
        rule.allow = true;
        rule.type_ = linux
            .devices
            .last()
            .map(|d| d.type_.clone())
            .unwrap_or_default();
        rule.major = MessageField::some(int64(i64::from(node.major)));
        rule.minor = MessageField::some(int64(i64::from(node.minor)));
        rule.access = node.permissions.clone();
        // One rule per device number: a node reached by two paths (nri-accel's and a vendor
        // spec's) widens the first rule's access instead of adding a second.
        match resources
            .devices
            .iter_mut()
            .find(|r| r.type_ == rule.type_ && r.major == rule.major && r.minor == rule.minor)
        {
            Some(first) => first.access = policies::union_access(&first.access, &rule.access),
            None => resources.devices.push(rule),
        }
    }
    if grant.cpus.is_some() || grant.mems.is_some() {
        let mut cpu = LinuxCPU::new();
        cpu.cpus = grant
            .cpus
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default();
        cpu.mems = grant
            .mems
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default();
        resources.cpu = MessageField::some(cpu);
    }
    if resources != LinuxResources::new() {
        linux.resources = MessageField::some(resources);
    }
    if linux != LinuxContainerAdjustment::new() {
        adj.linux = MessageField::some(linux);
    }
    adj
}

/// The NRI form of the vendor's OCI hooks, by CDI hook name. Every NRI version containerd
/// 1.7.0 and later run carries hooks in an adjustment (field 5 since NRI v0.1).
fn hooks(list: &[cdi::Hook]) -> Hooks {
    let mut h = Hooks::new();
    for c in list {
        let mut o = Hook::new();
        o.path = c.path.clone();
        o.args = c.args.clone();
        o.env = c.env.clone();
        if let Some(t) = c.timeout.and_then(|t| i32::try_from(t).ok()) {
            let mut v = OptionalInt::new();
            v.value = i64::from(t);
            o.timeout = MessageField::some(v);
        }
        let slot = match c.hook_name.as_str() {
            "prestart" => &mut h.prestart,
            "createRuntime" => &mut h.create_runtime,
            "createContainer" => &mut h.create_container,
            "startContainer" => &mut h.start_container,
            "poststart" => &mut h.poststart,
            _ => &mut h.poststop,
        };
        slot.push(o);
    }
    h
}

fn int64(v: i64) -> OptionalInt64 {
    let mut o = OptionalInt64::new();
    o.value = v;
    o
}

/// The NRI form of a policy's container update.
/// The NRI form of a container update an event reply carries: marked `ignore_failure`, since
/// the container it moves may have exited meanwhile (not every runtime tells plugins of an
/// exit), and a runtime fails the whole event when an update it cannot apply is not so marked
/// (CRI-O failed a create with "NRI update of containers failed"). Synchronize moves them all
/// again on the next connection.
pub fn reply_update(u: &policies::ContainerUpdate) -> ContainerUpdate {
    let mut out = update(u);
    out.ignore_failure = true;
    out
}

/// The NRI form of a policy's container update (a push: failures are reported and retried).
pub fn update(u: &policies::ContainerUpdate) -> ContainerUpdate {
    let mut cpu = LinuxCPU::new();
    cpu.cpus = u.cpus.to_string();
    cpu.mems = u.mems.to_string();
    let mut resources = LinuxResources::new();
    resources.cpu = MessageField::some(cpu);
    let mut linux = LinuxContainerUpdate::new();
    linux.resources = MessageField::some(resources);
    let mut out = ContainerUpdate::new();
    out.container_id = u.container_id.clone();
    out.linux = MessageField::some(linux);
    out
}

#[async_trait]
impl Plugin for NriPlugin {
    fn events(&self) -> EventMask {
        EventMask::of(&[
            Event::CREATE_CONTAINER,
            Event::POST_CREATE_CONTAINER,
            Event::START_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
            Event::STOP_POD_SANDBOX,
            Event::REMOVE_POD_SANDBOX,
        ])
    }

    async fn configure(&self, req: &ConfigureRequest) -> Result<Option<EventMask>, PluginError> {
        let delivery = Delivery::for_nri_version(&req.NRI_version);
        self.agent.engine().set_delivery(delivery);
        let nri_version = if req.NRI_version.is_empty() {
            "before v0.12 (not reported)"
        } else {
            req.NRI_version.as_str()
        };
        tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version,
            nri_version = %nri_version, updates = %delivery.as_str(), "configured by the runtime");
        Ok(None)
    }

    fn synchronize_pod_annotations(&self) -> Option<String> {
        // The annotation path's keys: running containers are checked against their asks.
        Some(format!("{}/", self.agent.annotation_prefix()))
    }

    fn synchronize_decoding(&self) -> SyncDecoding {
        // The daemon reads a few fields of each running container; the rest of a big node's
        // Synchronize (3 KB a container from containerd's CRI) is skipped on the wire.
        SyncDecoding::Lean
    }

    async fn synchronize_lean(
        &self,
        pods: &[SyncPod],
        containers: &[SyncContainer],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        let by_id: BTreeMap<&str, &SyncPod> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let empty = SyncPod::default();
        let views: Vec<ContainerView> = containers
            .iter()
            .map(|c| {
                sync_view(
                    by_id
                        .get(c.pod_sandbox_id.as_str())
                        .copied()
                        .unwrap_or(&empty),
                    c,
                )
            })
            .collect();
        let started = std::time::Instant::now();
        // Adoption and mapping are answered; releasing the claims of containers that are gone
        // goes on after the answer, in the same task, and the gate waits for it.
        let agent = self.agent.clone();
        let pod_uids = pods.iter().map(|p| p.uid.clone()).collect();
        self.agent
            .pods_listed(&pods.iter().map(|p| p.id.clone()).collect());
        let finished = self.agent.sync_started();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let work = tokio::spawn(in_nri_handler(async move {
            let _finished = finished;
            let synced = agent.synchronize(&views).await;
            let _ = answer.send(synced.updates);
            if !synced.gone.is_empty() {
                tracing::info!(
                    containers = synced.gone.len(),
                    "releasing the claims of containers that are gone"
                );
            }
            agent.release_gone(&synced.gone).await;
            agent.pods_present(&pod_uids).await;
        }));
        let updates = match answered.await {
            Ok(updates) => updates,
            // The work ended without an answer: it panicked.
            Err(_) => match work.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => {
                    return Err(PluginError::failed(
                        "nri-accel is shutting down; Synchronize was not completed",
                    ));
                }
            },
        };
        self.metrics
            .record_nri_event("Synchronize", started.elapsed(), false);
        tracing::info!(
            pods = pods.len(),
            containers = containers.len(),
            updates = updates.len(),
            "synchronized with the runtime"
        );
        Ok(updates.iter().map(reply_update).collect())
    }

    fn synchronize_freed(&self) {
        // The decoded Synchronize (a few kilobytes per container) is freed: give its pages back
        // to the system rather than keep them resident until the heap happens to reuse them.
        let trim = || {
            let released = crate::allocator::give_back_free_memory();
            tracing::debug!(released, "freed memory of the Synchronize given back");
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(trim)),
            Err(_) => trim(),
        }
    }

    async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        let v = view(pod, container, self.agent.annotation_prefix());
        let started = std::time::Instant::now();
        // In a task of its own whether or not it prepares: the pending updates the reply takes
        // are cleared by a commit, which must not be cut by the deadline either.
        let (agent, c) = (self.agent.clone(), v.clone());
        let result = detached(async move { agent.create_container(&c).await })
            .await
            .and_then(|r| r.map_err(PluginError::failed));
        self.metrics
            .record_nri_event("CreateContainer", started.elapsed(), result.is_err());
        match result {
            Ok((grant, updates)) => {
                if !grant.is_empty() {
                    tracing::info!(container = %v.id, name = %v.name, pod = %format!("{}/{}", v.pod_namespace, v.pod_name),
                        device_nodes = grant.device_nodes.len(), updates = updates.len(), "container adjusted");
                }
                Ok((
                    adjustment(&grant),
                    updates.iter().map(reply_update).collect(),
                ))
            }
            Err(e) => {
                tracing::warn!(container = %v.id, error = %e, "container creation refused");
                Err(e)
            }
        }
    }

    async fn post_create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), PluginError> {
        self.container_exists(pod, container).await
    }

    async fn start_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), PluginError> {
        // Confirms the grant too: CRI-O sends no PostCreateContainer for a container whose
        // create outlived the kubelet's deadline and that the kubelet's retry then picked up.
        // Never an error: containerd fails the start on one.
        if let Err(e) = self.container_exists(pod, container).await {
            tracing::warn!(container = %container.id, error = %e, "could not confirm a starting container's grant");
        }
        Ok(())
    }

    async fn stop_container(
        &self,
        _pod: &PodSandbox,
        container: &Container,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        let (agent, id) = (self.agent.clone(), container.id.clone());
        let updates = detached(async move { agent.stop_container(&id).await }).await?;
        Ok(updates.iter().map(reply_update).collect())
    }

    async fn stop_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        self.pod_gone(pod).await
    }

    async fn remove_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        self.pod_gone(pod).await
    }

    async fn remove_container(
        &self,
        _pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), PluginError> {
        let started = std::time::Instant::now();
        let (agent, id) = (self.agent.clone(), container.id.clone());
        let result = detached(async move { agent.remove_container(&id).await })
            .await
            .and_then(|r| r.map_err(PluginError::failed));
        // The reply has no update list: what the release gave back is pushed where allowed.
        self.agent.engine().wake_flusher();
        self.metrics
            .record_nri_event("RemoveContainer", started.elapsed(), result.is_err());
        result
    }
}
