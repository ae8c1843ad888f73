//! The trait an NRI plugin implements: one method per event, with defaults.

use async_trait::async_trait;

use crate::api::{
    ConfigureRequest, Container, ContainerAdjustment, ContainerEviction, ContainerUpdate, Event,
    LinuxResources, PodSandbox, ValidateContainerAdjustmentRequest,
    ValidateContainerAdjustmentResponse,
};
use crate::error::PluginError;
use crate::events::EventMask;
use crate::lean_sync::{SyncContainer, SyncDecoding, SyncPod};

/// An NRI plugin. Implement the events you subscribe to in [`Plugin::events`].
///
/// Notification events (pod run/stop/remove, post-create, start, post-start, post-update,
/// post-update-pod, remove-container) default to [`PluginError::Unimplemented`]: an NRI v0.12+
/// runtime then retries them through StateChange, and the stub routes StateChange to the dedicated
/// method or, when that is not implemented either, to [`Plugin::state_change`]. Events with a reply
/// (create, update, stop container, update pod, validate) default to an empty reply.
///
/// Handlers borrow what the runtime sent: the stub frees a request only after its answer is on
/// the wire, so a plugin that keeps nothing pays nothing for it, and the runtime does not wait
/// while a 10,000-container Synchronize is freed. Clone what you keep.
///
/// Never call [`crate::Updater::update_containers`] from inside a handler (some runtimes deadlock);
/// return in-handler updates in the handler's reply instead.
#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// The events to subscribe to. The stub drops those the runtime's NRI version does not know.
    fn events(&self) -> EventMask;

    /// Called with the runtime's configuration; return `Some(mask)` to override [`Plugin::events`].
    async fn configure(&self, _req: &ConfigureRequest) -> Result<Option<EventMask>, PluginError> {
        Ok(None)
    }

    /// Called once per connection with every pod and container (paged requests reassembled).
    /// Returned updates are applied by the runtime.
    async fn synchronize(
        &self,
        _pods: &[PodSandbox],
        _containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(Vec::new())
    }

    /// How this plugin takes Synchronize: whole ([`Plugin::synchronize`], the default) or lean
    /// ([`Plugin::synchronize_lean`]: the ids, names, devices and cpuset of each pod and
    /// container, every other field skipped on the wire). Asked once per request.
    fn synchronize_decoding(&self) -> SyncDecoding {
        SyncDecoding::Full
    }

    /// For a lean Synchronize: the prefix of the pod annotation keys to keep in
    /// [`SyncPod::annotations`] (a plugin that reads requests from pod annotations checks the
    /// running containers against them); `None`, the default, keeps none.
    fn synchronize_pod_annotations(&self) -> Option<String> {
        None
    }

    /// [`Plugin::synchronize`] for a plugin whose [`Plugin::synchronize_decoding`] is
    /// [`SyncDecoding::Lean`]: called once per connection with every pod and container (paged
    /// requests reassembled). Returned updates are applied by the runtime.
    async fn synchronize_lean(
        &self,
        _pods: &[SyncPod],
        _containers: &[SyncContainer],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(Vec::new())
    }

    /// Called once the last request of a Synchronize (every page of it) has been freed, after
    /// its answer is on the wire. It runs on the connection's task: keep it short and spawn
    /// anything longer. A plugin that keeps little of a large Synchronize can give the memory
    /// the decoded containers took back to the system here (glibc's `malloc_trim`; see
    /// docs/nri-proto.md, "Allocator").
    fn synchronize_freed(&self) {}

    /// The runtime is shutting the plugin down (sent to pre-launched plugins only).
    async fn shutdown(&self) {}

    /// A pod sandbox is being started.
    async fn run_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A pod sandbox's resources are being updated.
    async fn update_pod_sandbox(
        &self,
        _pod: &PodSandbox,
        _overhead: Option<&LinuxResources>,
        _resources: Option<&LinuxResources>,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    /// A pod sandbox's resources were updated.
    async fn post_update_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A pod sandbox is being stopped.
    async fn stop_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A pod sandbox was removed.
    async fn remove_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A container is being created: return its adjustment and updates of other containers.
    async fn create_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        Ok((ContainerAdjustment::new(), Vec::new()))
    }

    /// A container was created.
    async fn post_create_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A container is being started.
    async fn start_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A container was started.
    async fn post_start_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A container's resources are being updated.
    async fn update_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
        _resources: Option<&LinuxResources>,
    ) -> Result<(Vec<ContainerUpdate>, Vec<ContainerEviction>), PluginError> {
        Ok((Vec::new(), Vec::new()))
    }

    /// A container's resources were updated.
    async fn post_update_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// A container is being stopped: return updates of other containers.
    async fn stop_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(Vec::new())
    }

    /// A container was removed.
    async fn remove_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), PluginError> {
        Err(PluginError::Unimplemented)
    }

    /// Validate the combined adjustment of all plugins (NRI v0.10+).
    async fn validate_container_adjustment(
        &self,
        _req: &ValidateContainerAdjustmentRequest,
    ) -> Result<ValidateContainerAdjustmentResponse, PluginError> {
        Ok(ValidateContainerAdjustmentResponse::new())
    }

    /// Catch-all for notification events delivered through StateChange whose dedicated method is
    /// not implemented. `pod` and `container` are those the runtime sent (absent ones are `None`).
    async fn state_change(
        &self,
        _event: Event,
        _pod: Option<&PodSandbox>,
        _container: Option<&Container>,
    ) -> Result<(), PluginError> {
        Ok(())
    }
}
