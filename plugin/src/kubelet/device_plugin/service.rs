//! The `v1beta1.DevicePlugin` service of one resource: each call turns into the device plugins'
//! (and so the engine's) calls, and errors become gRPC statuses in one place
//! ([`super::DevicePluginError::to_status`]).

use std::pin::Pin;
use std::sync::Arc;

use kubelet_proto::deviceplugin as pb;
use kubelet_proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::DevicePlugins;

/// The options every resource registers with: GetPreferredAllocation is asked, PreStartContainer
/// is not needed.
pub fn options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The device plugin service of one resource.
pub struct DevicePluginService {
    plugins: Arc<DevicePlugins>,
    resource: usize,
}

impl DevicePluginService {
    /// The service of resource `resource` (an index into [`DevicePlugins::resources`]).
    pub fn new(plugins: Arc<DevicePlugins>, resource: usize) -> Self {
        DevicePluginService { plugins, resource }
    }

    /// The tonic service to add to a router.
    pub fn into_server(self) -> DevicePluginServer<DevicePluginService> {
        DevicePluginServer::new(self)
    }
}

/// The stream ListAndWatch answers.
pub type ListStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _req: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _req: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let plugins = self.plugins.clone();
        let i = self.resource;
        tokio::spawn(async move { plugins.watch_listing(i, tx).await });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| pb::ContainerPreferredAllocationResponse {
                device_i_ds: self.plugins.preferred(
                    self.resource,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in &req.into_inner().container_requests {
            match self.plugins.allocate(self.resource, &c.devices_ids).await {
                Ok(answer) => container_responses.push(answer),
                Err(e) => {
                    tracing::warn!(resource = %self.plugins.resources()[self.resource].name,
                        error = %e, "Allocate refused");
                    return Err(e.to_status());
                }
            }
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _req: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}
