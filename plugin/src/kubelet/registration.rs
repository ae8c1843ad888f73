//! The kubelet's plugin registration service (`pluginregistration.Registration`), served by a
//! DRA plugin on `<plugins_registry>/<driver>-reg.sock`.
//!
//! The kubelet finds the socket in its registry directory, asks GetInfo who the plugin is and
//! where its services are, and says with NotifyRegistrationStatus whether it took it. A refusal
//! is an error an operator must see: it is logged as one and kept for `status`.

use kubelet_proto::pluginregistration as pb;
use kubelet_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use std::sync::Arc;

use tokio::sync::watch;

/// Where the kubelet's registration of a plugin stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RegistrationState {
    /// The kubelet has not answered yet.
    #[default]
    Waiting,
    /// The kubelet registered the plugin.
    Registered,
    /// The kubelet refused it, with its reason.
    Refused(String),
}

/// Answers the kubelet's GetInfo and records its verdict. Clones share the verdict, so the
/// service can be served again (on a new socket) without losing it.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    info: pb::PluginInfo,
    state: Arc<watch::Sender<RegistrationState>>,
}

impl RegistrationService {
    /// A DRA plugin named `driver` whose services are on `endpoint`, serving `versions`
    /// (e.g. `v1.DRAPlugin`, `v1beta1.DRAPlugin`, `v1.DRAResourceHealth`).
    pub fn dra(driver: &str, endpoint: &std::path::Path, versions: &[&str]) -> Self {
        let (state, _) = watch::channel(RegistrationState::Waiting);
        RegistrationService {
            info: pb::PluginInfo {
                r#type: kubelet_proto::DRA_PLUGIN_TYPE.to_string(),
                name: driver.to_string(),
                endpoint: endpoint.display().to_string(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            state: Arc::new(state),
        }
    }

    /// Back to waiting for a verdict: the socket was served anew, so the kubelet registers the
    /// plugin again.
    pub fn reset(&self) {
        self.state.send_replace(RegistrationState::Waiting);
    }

    /// Follows the kubelet's verdicts.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }

    /// The tonic service to add to a router.
    pub fn into_server(self) -> RegistrationServer<RegistrationService> {
        RegistrationServer::new(self)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: tonic::Request<pb::InfoRequest>,
    ) -> Result<tonic::Response<pb::PluginInfo>, tonic::Status> {
        tracing::debug!(driver = %self.info.name, "the kubelet asked for the plugin's info");
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: tonic::Request<pb::RegistrationStatus>,
    ) -> Result<tonic::Response<pb::RegistrationStatusResponse>, tonic::Status> {
        let status = req.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, endpoint = %self.info.endpoint,
                "the kubelet registered nri-accel as a DRA driver");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = %self.info.name, reason = %status.error,
                "the kubelet refused to register nri-accel as a DRA driver; claims of this driver cannot be prepared on this node until this is fixed");
            RegistrationState::Refused(status.error)
        };
        self.state.send_replace(state);
        Ok(tonic::Response::new(pb::RegistrationStatusResponse {}))
    }
}
