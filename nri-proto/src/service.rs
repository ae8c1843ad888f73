//! The plugin-side ttrpc service: adapts the generated `Plugin` service trait to [`crate::Plugin`],
//! reassembles paged Synchronize requests, limits the event mask and routes StateChange.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ttrpc::r#async::TtrpcContext;

use crate::api::*;
use crate::error::{PluginError, to_ttrpc};
use crate::events::valid_mask_for;
use crate::generated::nri_ttrpc;
use crate::plugin::Plugin;
use crate::stub::{Notifier, StubEvent};

/// Pods and containers of the chunks received so far in a paged Synchronize.
#[derive(Default)]
struct SyncPages {
    pods: Vec<PodSandbox>,
    containers: Vec<Container>,
}

pub(crate) struct PluginService<P: Plugin> {
    pub(crate) plugin: Arc<P>,
    pub(crate) notify: Notifier,
    pages: Mutex<SyncPages>,
}

impl<P: Plugin> PluginService<P> {
    pub(crate) fn new(plugin: Arc<P>, notify: Notifier) -> Self {
        PluginService {
            plugin,
            notify,
            pages: Mutex::new(SyncPages::default()),
        }
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
    pod: Option<PodSandbox>,
    container: Option<Container>,
) -> Result<(), PluginError> {
    let p = pod.clone().unwrap_or_default();
    let c = container.clone().unwrap_or_default();
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

#[async_trait]
impl<P: Plugin> nri_ttrpc::Plugin for PluginService<P> {
    async fn configure(&self, _ctx: &TtrpcContext, req: ConfigureRequest) -> R<ConfigureResponse> {
        let wanted = match self.plugin.configure(&req).await.map_err(to_ttrpc)? {
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

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: SynchronizeRequest,
    ) -> R<SynchronizeResponse> {
        let (pods, containers) = {
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            pages.pods.extend(req.pods);
            pages.containers.extend(req.containers);
            if req.more {
                let mut resp = SynchronizeResponse::new();
                resp.more = true;
                return Ok(resp);
            }
            let all = std::mem::take(&mut *pages);
            (all.pods, all.containers)
        };
        let (n_pods, n_containers) = (pods.len(), containers.len());
        let update = lift(self.plugin.synchronize(pods, containers).await)?;
        self.notify.send(StubEvent::Synchronized {
            pods: n_pods,
            containers: n_containers,
        });
        let mut resp = SynchronizeResponse::new();
        resp.update = update;
        Ok(resp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: Empty) -> R<Empty> {
        self.plugin.shutdown().await;
        Ok(Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _: &TtrpcContext,
        mut req: RunPodSandboxRequest,
    ) -> R<RunPodSandboxResponse> {
        lift(
            self.plugin
                .run_pod_sandbox(req.pod.take().unwrap_or_default())
                .await,
        )?;
        Ok(RunPodSandboxResponse::new())
    }

    async fn update_pod_sandbox(
        &self,
        _: &TtrpcContext,
        mut req: UpdatePodSandboxRequest,
    ) -> R<UpdatePodSandboxResponse> {
        let pod = req.pod.take().unwrap_or_default();
        lift(
            self.plugin
                .update_pod_sandbox(
                    pod,
                    req.overhead_linux_resources.take(),
                    req.linux_resources.take(),
                )
                .await,
        )?;
        Ok(UpdatePodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        _: &TtrpcContext,
        mut req: PostUpdatePodSandboxRequest,
    ) -> R<PostUpdatePodSandboxResponse> {
        lift(
            self.plugin
                .post_update_pod_sandbox(req.pod.take().unwrap_or_default())
                .await,
        )?;
        Ok(PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _: &TtrpcContext,
        mut req: StopPodSandboxRequest,
    ) -> R<StopPodSandboxResponse> {
        lift(
            self.plugin
                .stop_pod_sandbox(req.pod.take().unwrap_or_default())
                .await,
        )?;
        Ok(StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _: &TtrpcContext,
        mut req: RemovePodSandboxRequest,
    ) -> R<RemovePodSandboxResponse> {
        lift(
            self.plugin
                .remove_pod_sandbox(req.pod.take().unwrap_or_default())
                .await,
        )?;
        Ok(RemovePodSandboxResponse::new())
    }

    async fn create_container(
        &self,
        _: &TtrpcContext,
        mut req: CreateContainerRequest,
    ) -> R<CreateContainerResponse> {
        let pod = req.pod.take().unwrap_or_default();
        let container = req.container.take().unwrap_or_default();
        let (adjust, update) = lift(self.plugin.create_container(pod, container).await)?;
        let mut resp = CreateContainerResponse::new();
        resp.adjust = protobuf::MessageField::some(adjust);
        resp.update = update;
        Ok(resp)
    }

    async fn post_create_container(
        &self,
        _: &TtrpcContext,
        mut req: PostCreateContainerRequest,
    ) -> R<PostCreateContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        lift(self.plugin.post_create_container(p, c).await)?;
        Ok(PostCreateContainerResponse::new())
    }

    async fn start_container(
        &self,
        _: &TtrpcContext,
        mut req: StartContainerRequest,
    ) -> R<StartContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        lift(self.plugin.start_container(p, c).await)?;
        Ok(StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        _: &TtrpcContext,
        mut req: PostStartContainerRequest,
    ) -> R<PostStartContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        lift(self.plugin.post_start_container(p, c).await)?;
        Ok(PostStartContainerResponse::new())
    }

    async fn update_container(
        &self,
        _: &TtrpcContext,
        mut req: UpdateContainerRequest,
    ) -> R<UpdateContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        let (update, evict) = lift(
            self.plugin
                .update_container(p, c, req.linux_resources.take())
                .await,
        )?;
        let mut resp = UpdateContainerResponse::new();
        resp.update = update;
        resp.evict = evict;
        Ok(resp)
    }

    async fn post_update_container(
        &self,
        _: &TtrpcContext,
        mut req: PostUpdateContainerRequest,
    ) -> R<PostUpdateContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        lift(self.plugin.post_update_container(p, c).await)?;
        Ok(PostUpdateContainerResponse::new())
    }

    async fn stop_container(
        &self,
        _: &TtrpcContext,
        mut req: StopContainerRequest,
    ) -> R<StopContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        let update = lift(self.plugin.stop_container(p, c).await)?;
        let mut resp = StopContainerResponse::new();
        resp.update = update;
        Ok(resp)
    }

    async fn remove_container(
        &self,
        _: &TtrpcContext,
        mut req: RemoveContainerRequest,
    ) -> R<RemoveContainerResponse> {
        let (p, c) = (
            req.pod.take().unwrap_or_default(),
            req.container.take().unwrap_or_default(),
        );
        lift(self.plugin.remove_container(p, c).await)?;
        Ok(RemoveContainerResponse::new())
    }

    async fn state_change(&self, _: &TtrpcContext, mut req: StateChangeEvent) -> R<Empty> {
        let event = req.event.enum_value().unwrap_or(Event::UNKNOWN);
        let r = notify_event(&*self.plugin, event, req.pod.take(), req.container.take()).await;
        lift(r)?;
        Ok(Empty::new())
    }

    async fn validate_container_adjustment(
        &self,
        _: &TtrpcContext,
        req: ValidateContainerAdjustmentRequest,
    ) -> R<ValidateContainerAdjustmentResponse> {
        lift(self.plugin.validate_container_adjustment(req).await)
    }
}
