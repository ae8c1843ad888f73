//! Why a device plugin call failed, and the one place that maps it to a gRPC status.

use crate::engine::EngineError;

/// Why the kubelet's call to a device plugin was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    /// The gate is closed: the runtime's containers have not reached the policy (nri-accel is
    /// starting, or its NRI connection is down until the next Synchronize).
    #[error(
        "resource {resource}: nri-accel is not synchronized with the container runtime (starting, or its NRI connection is down); retry once it is"
    )]
    NotReady {
        /// The resource.
        resource: String,
    },
    /// The request names no device, or one device twice.
    #[error("resource {resource}: {why}")]
    Invalid {
        /// The resource.
        resource: String,
        /// What is wrong.
        why: String,
    },
    /// A device ID the plugin does not advertise.
    #[error(
        "resource {resource} has no device {id}; the kubelet's list is stale, it gets the current one through ListAndWatch"
    )]
    UnknownDevice {
        /// The resource.
        resource: String,
        /// The unknown ID.
        id: String,
    },
    /// A device is still held by a container that runs (or has not been removed).
    #[error(
        "resource {resource}: device {id} is still held by container {container} of pod {pod} (claim {claim}); it is handed out again once that container stops"
    )]
    HeldByContainer {
        /// The resource.
        resource: String,
        /// The device asked for.
        id: String,
        /// The holding claim.
        claim: String,
        /// A container holding it.
        container: String,
        /// Its pod, `namespace/name` (or `-` when not known).
        pod: String,
    },
    /// A device is held by an allocation no container has used yet, made too recently to be
    /// taken for lost.
    #[error(
        "resource {resource}: device {id} was allocated {age_secs} s ago (claim {claim}) to a container that has not started yet; it is handed out again once {grace_secs} s have passed without one"
    )]
    NotYetUsed {
        /// The resource.
        resource: String,
        /// The device asked for.
        id: String,
        /// The holding claim.
        claim: String,
        /// Seconds since that allocation.
        age_secs: u64,
        /// The grace period (`device_plugin.unused_grace_secs`).
        grace_secs: u64,
    },
    /// The engine refused or failed the claim.
    #[error("resource {resource}: {source}")]
    Engine {
        /// The resource.
        resource: String,
        /// The engine's error (a refusal names the claim, the device and the reason).
        #[source]
        source: Box<EngineError>,
    },
}

impl DevicePluginError {
    /// The gRPC status the kubelet gets: a refusal the kubelet can act on is
    /// `FailedPrecondition`, a bad request `InvalidArgument`, a daemon not ready `Unavailable`,
    /// anything else `Internal`. The message is the error's sentence.
    pub fn to_status(&self) -> tonic::Status {
        let code = match self {
            DevicePluginError::NotReady { .. } => tonic::Code::Unavailable,
            DevicePluginError::Invalid { .. } | DevicePluginError::UnknownDevice { .. } => {
                tonic::Code::InvalidArgument
            }
            DevicePluginError::HeldByContainer { .. } | DevicePluginError::NotYetUsed { .. } => {
                tonic::Code::FailedPrecondition
            }
            DevicePluginError::Engine { source, .. } => match **source {
                EngineError::Refused(_) | EngineError::InvalidClaim { .. } => {
                    tonic::Code::FailedPrecondition
                }
                EngineError::NoLongerAdmitted { .. } => tonic::Code::Unavailable,
                _ => tonic::Code::Internal,
            },
        };
        tonic::Status::new(code, self.to_string())
    }
}

impl From<DevicePluginError> for tonic::Status {
    fn from(e: DevicePluginError) -> Self {
        e.to_status()
    }
}
