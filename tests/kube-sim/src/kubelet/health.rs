//! The kubelet's side of DRA device health: it watches a driver's NodeWatchResources stream,
//! using the health service version the driver listed in its registration.

use std::path::Path;
use std::time::Duration;

use super::wire::health as pb;
use super::{GrpcCaller, RegisteredPlugin, SimError};

/// Which health service a watch goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthApi {
    /// `v1.DRAResourceHealth`.
    V1,
    /// `v1alpha1.DRAResourceHealth`.
    V1alpha1,
}

impl HealthApi {
    /// The version the kubelet picks from a plugin's `supported_versions`: v1 when listed, else
    /// v1alpha1, else none (the plugin serves no health).
    pub fn of(plugin: &RegisteredPlugin) -> Option<HealthApi> {
        let listed = |v: &str| plugin.supported_versions.iter().any(|s| s == v);
        if listed("v1.DRAResourceHealth") {
            Some(HealthApi::V1)
        } else if listed("v1alpha1.DRAResourceHealth") {
            Some(HealthApi::V1alpha1)
        } else {
            None
        }
    }
}

/// One device's health as the stream reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedHealth {
    /// The pool named.
    pub pool: String,
    /// The device named.
    pub device: String,
    /// 0 unknown, 1 healthy, 2 unhealthy.
    pub health: i32,
    /// The driver's message.
    pub message: String,
    /// When the driver last checked, in Unix seconds.
    pub last_updated_time: i64,
    /// After how long the kubelet treats the entry as unknown.
    pub timeout_seconds: i64,
}

impl ReportedHealth {
    /// Whether the entry says healthy.
    pub fn is_healthy(&self) -> bool {
        self.health == pb::HEALTHY
    }
}

/// An open NodeWatchResources stream.
pub struct HealthWatch {
    stream: tonic::Streaming<pb::NodeWatchResourcesResponse>,
}

impl std::fmt::Debug for HealthWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HealthWatch")
    }
}

impl HealthWatch {
    /// Opens the stream of the plugin at `socket` with `api`.
    pub async fn start(socket: &Path, api: HealthApi) -> Result<HealthWatch, SimError> {
        let caller = GrpcCaller::connect(socket).await?;
        let path = match api {
            HealthApi::V1 => pb::V1_WATCH,
            HealthApi::V1alpha1 => pb::V1ALPHA1_WATCH,
        };
        let stream = caller
            .server_streaming(path, pb::NodeWatchResourcesRequest {})
            .await?;
        Ok(HealthWatch { stream })
    }

    /// The next message's devices.
    pub async fn next(&mut self, timeout: Duration) -> Result<Vec<ReportedHealth>, SimError> {
        let message = tokio::time::timeout(timeout, self.stream.message())
            .await
            .map_err(|_| SimError::Timeout("the next health message".into()))?
            .map_err(|s| super::call::status("NodeWatchResources", s))?
            .ok_or_else(|| SimError::Status {
                method: "NodeWatchResources".into(),
                code: tonic::Code::Unavailable,
                message: "the driver ended the health stream".into(),
            })?;
        Ok(message
            .devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap_or_default();
                ReportedHealth {
                    pool: id.pool_name,
                    device: id.device_name,
                    health: d.health,
                    message: d.message,
                    last_updated_time: d.last_updated_time,
                    timeout_seconds: d.health_check_timeout_seconds,
                }
            })
            .collect())
    }

    /// Reads messages until one satisfies `want`, and returns it.
    pub async fn wait_for(
        &mut self,
        timeout: Duration,
        want: impl Fn(&[ReportedHealth]) -> bool,
    ) -> Result<Vec<ReportedHealth>, SimError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let devices = self.next(left).await?;
            if want(&devices) {
                return Ok(devices);
            }
        }
    }
}
