//! The plugin-side service: adapts the server's requests to [`crate::Plugin`], reassembles paged
//! Synchronize requests, limits the event mask and routes StateChange.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::api::*;
use crate::error::{PluginError, to_ttrpc};
use crate::events::valid_mask_for;
use crate::lean_sync::{LeanKeep, LeanSynchronize, SyncContainer, SyncDecoding, SyncPod};
use crate::notify::{Notifier, StubEvent};
use crate::plugin::Plugin;
use crate::server::Rpc;

/// Pods and containers of the chunks received so far in a paged Synchronize.
struct Pages<P, C> {
    pods: Vec<P>,
    containers: Vec<C>,
}

impl<P, C> Default for Pages<P, C> {
    fn default() -> Self {
        Pages {
            pods: Vec::new(),
            containers: Vec::new(),
        }
    }
}

impl<P, C> Pages<P, C> {
    /// Takes a page's pods and containers; everything received, once the page is the last.
    fn add(
        &mut self,
        pods: &mut Vec<P>,
        containers: &mut Vec<C>,
        more: bool,
    ) -> Option<(Vec<P>, Vec<C>)> {
        self.pods.append(pods);
        self.containers.append(containers);
        (!more).then(|| {
            (
                std::mem::take(&mut self.pods),
                std::mem::take(&mut self.containers),
            )
        })
    }
}

/// The pages of a Synchronize decoded whole or lean (a plugin takes one or the other).
#[derive(Default)]
struct SyncPages {
    whole: Pages<PodSandbox, Container>,
    lean: Pages<SyncPod, SyncContainer>,
}

pub(crate) struct PluginService<P: Plugin> {
    pub(crate) plugin: Arc<P>,
    pub(crate) notify: Notifier,
    pages: Mutex<SyncPages>,
    /// Set when the last page of a Synchronize has been handled; its request, freed by the
    /// server after the answer, then tells the plugin ([`Plugin::synchronize_freed`]).
    sync_done: AtomicBool,
}

impl<P: Plugin> PluginService<P> {
    pub(crate) fn new(plugin: Arc<P>, notify: Notifier) -> Self {
        PluginService {
            plugin,
            notify,
            pages: Mutex::new(SyncPages::default()),
            sync_done: AtomicBool::new(false),
        }
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, SyncPages> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer to the last page of a Synchronize of `(pods, containers)`, whose request
    /// (handed back to it) then tells the plugin once freed.
    fn synchronized(
        &self,
        (pods, containers): (usize, usize),
        update: Result<Vec<ContainerUpdate>, PluginError>,
    ) -> R<SynchronizeResponse> {
        self.sync_done.store(true, Ordering::Release);
        let update = lift(update)?;
        self.notify
            .send(StubEvent::Synchronized { pods, containers });
        let mut resp = SynchronizeResponse::new();
        resp.update = update;
        Ok(resp)
    }
}

/// The answer to a page of a Synchronize that more pages follow.
fn more_pages() -> SynchronizeResponse {
    let mut resp = SynchronizeResponse::new();
    resp.more = true;
    resp
}

/// The last Synchronize request, which calls [`Plugin::synchronize_freed`] once it is freed.
struct FreedThenTell<P: Plugin> {
    request: Option<Box<dyn Send>>,
    plugin: Arc<P>,
}

impl<P: Plugin> Drop for FreedThenTell<P> {
    fn drop(&mut self) {
        drop(self.request.take());
        self.plugin.synchronize_freed();
    }
}

type R<T> = ttrpc::Result<T>;

fn lift<T>(r: Result<T, PluginError>) -> R<T> {
    r.map_err(to_ttrpc)
}

/// Runs a notification event; Unimplemented goes on to `state_change`.
async fn notify_event<P: Plugin>(
    plugin: &P,
    event: Event,
    pod: Option<&PodSandbox>,
    container: Option<&Container>,
) -> Result<(), PluginError> {
    let (empty_pod, empty_container) = (PodSandbox::new(), Container::new());
    let p = pod.unwrap_or(&empty_pod);
    let c = container.unwrap_or(&empty_container);
    let r = match event {
        Event::RUN_POD_SANDBOX => plugin.run_pod_sandbox(p).await,
        Event::STOP_POD_SANDBOX => plugin.stop_pod_sandbox(p).await,
        Event::REMOVE_POD_SANDBOX => plugin.remove_pod_sandbox(p).await,
        Event::POST_UPDATE_POD_SANDBOX => plugin.post_update_pod_sandbox(p).await,
        Event::POST_CREATE_CONTAINER => plugin.post_create_container(p, c).await,
        Event::START_CONTAINER => plugin.start_container(p, c).await,
        Event::POST_START_CONTAINER => plugin.post_start_container(p, c).await,
        Event::POST_UPDATE_CONTAINER => plugin.post_update_container(p, c).await,
        Event::REMOVE_CONTAINER => plugin.remove_container(p, c).await,
        _ => Err(PluginError::Unimplemented),
    };
    match r {
        Err(PluginError::Unimplemented) => plugin.state_change(event, pod, container).await,
        other => other,
    }
}

/// The request's pod, or an empty one when the runtime sent none.
fn pod_of(pod: &protobuf::MessageField<PodSandbox>) -> &PodSandbox {
    pod.get_or_default()
}

/// The request's container, or an empty one when the runtime sent none.
fn container_of(c: &protobuf::MessageField<Container>) -> &Container {
    c.get_or_default()
}

impl<P: Plugin> Rpc for PluginService<P> {
    async fn configure(&self, req: &mut ConfigureRequest) -> R<ConfigureResponse> {
        let wanted = match self.plugin.configure(req).await.map_err(to_ttrpc)? {
            Some(mask) => mask,
            None => self.plugin.events(),
        };
        let valid = valid_mask_for(&req.NRI_version);
        let mask = wanted.intersect(valid);
        if mask != wanted {
            tracing::warn!(
                wanted = format!("{:#x}", wanted.bits()),
                subscribed = format!("{:#x}", mask.bits()),
                nri_version = %req.NRI_version,
                "runtime does not know some subscribed events; they are not subscribed"
            );
        }
        if mask.is_empty() {
            return Err(to_ttrpc(PluginError::failed(format!(
                "none of the plugin's events (mask {:#x}) is known to runtime NRI version {:?}",
                wanted.bits(),
                req.NRI_version
            ))));
        }
        self.notify.send(StubEvent::Configured {
            runtime_name: req.runtime_name.clone(),
            runtime_version: req.runtime_version.clone(),
            nri_version: req.NRI_version.clone(),
        });
        let mut resp = ConfigureResponse::new();
        // The mask holds at most 14 bits, so it fits an i32.
        resp.events = mask.bits() as i32;
        Ok(resp)
    }

    async fn synchronize(&self, req: &mut SynchronizeRequest) -> R<SynchronizeResponse> {
        let page = self
            .pages()
            .whole
            .add(&mut req.pods, &mut req.containers, req.more);
        let Some((pods, containers)) = page else {
            return Ok(more_pages());
        };
        let update = self.plugin.synchronize(&pods, &containers).await;
        let counts = (pods.len(), containers.len());
        // Handed back to the request, which the server frees after the answer is written.
        (req.pods, req.containers) = (pods, containers);
        self.synchronized(counts, update)
    }

    fn lean_synchronize(&self) -> Option<LeanKeep> {
        (self.plugin.synchronize_decoding() == SyncDecoding::Lean).then(|| LeanKeep {
            pod_annotation_prefix: self.plugin.synchronize_pod_annotations(),
        })
    }

    async fn synchronize_lean(&self, req: &mut LeanSynchronize) -> R<SynchronizeResponse> {
        let page = self
            .pages()
            .lean
            .add(&mut req.pods, &mut req.containers, req.more);
        let Some((pods, containers)) = page else {
            return Ok(more_pages());
        };
        let update = self.plugin.synchronize_lean(&pods, &containers).await;
        let counts = (pods.len(), containers.len());
        (req.pods, req.containers) = (pods, containers);
        self.synchronized(counts, update)
    }

    fn spent(&self, method: &'static str, req: Box<dyn Send>) -> Box<dyn Send> {
        if method == "Synchronize" && self.sync_done.swap(false, Ordering::AcqRel) {
            return Box::new(FreedThenTell {
                request: Some(req),
                plugin: self.plugin.clone(),
            });
        }
        req
    }

    async fn shutdown(&self, _req: &mut Empty) -> R<Empty> {
        self.plugin.shutdown().await;
        Ok(Empty::new())
    }

    async fn run_pod_sandbox(&self, req: &mut RunPodSandboxRequest) -> R<RunPodSandboxResponse> {
        lift(self.plugin.run_pod_sandbox(pod_of(&req.pod)).await)?;
        Ok(RunPodSandboxResponse::new())
    }

    async fn update_pod_sandbox(
        &self,
        req: &mut UpdatePodSandboxRequest,
    ) -> R<UpdatePodSandboxResponse> {
        let r = self.plugin.update_pod_sandbox(
            pod_of(&req.pod),
            req.overhead_linux_resources.as_ref(),
            req.linux_resources.as_ref(),
        );
        lift(r.await)?;
        Ok(UpdatePodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        req: &mut PostUpdatePodSandboxRequest,
    ) -> R<PostUpdatePodSandboxResponse> {
        lift(self.plugin.post_update_pod_sandbox(pod_of(&req.pod)).await)?;
        Ok(PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(&self, req: &mut StopPodSandboxRequest) -> R<StopPodSandboxResponse> {
        lift(self.plugin.stop_pod_sandbox(pod_of(&req.pod)).await)?;
        Ok(StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        req: &mut RemovePodSandboxRequest,
    ) -> R<RemovePodSandboxResponse> {
        lift(self.plugin.remove_pod_sandbox(pod_of(&req.pod)).await)?;
        Ok(RemovePodSandboxResponse::new())
    }

    async fn create_container(
        &self,
        req: &mut CreateContainerRequest,
    ) -> R<CreateContainerResponse> {
        let r = self
            .plugin
            .create_container(pod_of(&req.pod), container_of(&req.container));
        let (adjust, update) = lift(r.await)?;
        let mut resp = CreateContainerResponse::new();
        resp.adjust = protobuf::MessageField::some(adjust);
        resp.update = update;
        Ok(resp)
    }

    async fn post_create_container(
        &self,
        req: &mut PostCreateContainerRequest,
    ) -> R<PostCreateContainerResponse> {
        let r = self
            .plugin
            .post_create_container(pod_of(&req.pod), container_of(&req.container));
        lift(r.await)?;
        Ok(PostCreateContainerResponse::new())
    }

    async fn start_container(&self, req: &mut StartContainerRequest) -> R<StartContainerResponse> {
        let r = self
            .plugin
            .start_container(pod_of(&req.pod), container_of(&req.container));
        lift(r.await)?;
        Ok(StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        req: &mut PostStartContainerRequest,
    ) -> R<PostStartContainerResponse> {
        let r = self
            .plugin
            .post_start_container(pod_of(&req.pod), container_of(&req.container));
        lift(r.await)?;
        Ok(PostStartContainerResponse::new())
    }

    async fn update_container(
        &self,
        req: &mut UpdateContainerRequest,
    ) -> R<UpdateContainerResponse> {
        let r = self.plugin.update_container(
            pod_of(&req.pod),
            container_of(&req.container),
            req.linux_resources.as_ref(),
        );
        let (update, evict) = lift(r.await)?;
        let mut resp = UpdateContainerResponse::new();
        resp.update = update;
        resp.evict = evict;
        Ok(resp)
    }

    async fn post_update_container(
        &self,
        req: &mut PostUpdateContainerRequest,
    ) -> R<PostUpdateContainerResponse> {
        let r = self
            .plugin
            .post_update_container(pod_of(&req.pod), container_of(&req.container));
        lift(r.await)?;
        Ok(PostUpdateContainerResponse::new())
    }

    async fn stop_container(&self, req: &mut StopContainerRequest) -> R<StopContainerResponse> {
        let r = self
            .plugin
            .stop_container(pod_of(&req.pod), container_of(&req.container));
        let update = lift(r.await)?;
        let mut resp = StopContainerResponse::new();
        resp.update = update;
        Ok(resp)
    }

    async fn remove_container(
        &self,
        req: &mut RemoveContainerRequest,
    ) -> R<RemoveContainerResponse> {
        let r = self
            .plugin
            .remove_container(pod_of(&req.pod), container_of(&req.container));
        lift(r.await)?;
        Ok(RemoveContainerResponse::new())
    }

    async fn state_change(&self, req: &mut StateChangeEvent) -> R<Empty> {
        let event = req.event.enum_value().unwrap_or(Event::UNKNOWN);
        let r = notify_event(
            &*self.plugin,
            event,
            req.pod.as_ref(),
            req.container.as_ref(),
        );
        lift(r.await)?;
        Ok(Empty::new())
    }

    async fn validate_container_adjustment(
        &self,
        req: &mut ValidateContainerAdjustmentRequest,
    ) -> R<ValidateContainerAdjustmentResponse> {
        lift(self.plugin.validate_container_adjustment(req).await)
    }
}
