//! The kubelet's messages, declared by hand from its field numbers (pluginregistration v1,
//! dra v1/v1beta1, dra-health v1/v1alpha1), independently of nri-accel's `.proto` files.
#![allow(missing_docs)]

/// `pluginregistration` (v1).
pub mod registration {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InfoRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginInfo {
        #[prost(string, tag = "1")]
        pub r#type: String,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(string, tag = "3")]
        pub endpoint: String,
        #[prost(string, repeated, tag = "4")]
        pub supported_versions: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegistrationStatus {
        #[prost(bool, tag = "1")]
        pub plugin_registered: bool,
        #[prost(string, tag = "2")]
        pub error: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegistrationStatusResponse {}

    pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
    pub const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
}

/// `k8s.io.kubelet.pkg.apis.dra.{v1,v1beta1}`: the same messages in both versions, except that
/// v1beta1 has no `Device.share_id` (field 5), which a v1beta1 server never sets.
pub mod dra {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct Claim {
        #[prost(string, tag = "1")]
        pub namespace: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, tag = "3")]
        pub name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodePrepareResourcesRequest {
        #[prost(message, repeated, tag = "1")]
        pub claims: Vec<Claim>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodePrepareResourcesResponse {
        #[prost(map = "string, message", tag = "1")]
        pub claims: HashMap<String, NodePrepareResourceResponse>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodePrepareResourceResponse {
        #[prost(message, repeated, tag = "1")]
        pub devices: Vec<Device>,
        #[prost(string, tag = "2")]
        pub error: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Device {
        #[prost(string, repeated, tag = "1")]
        pub request_names: Vec<String>,
        #[prost(string, tag = "2")]
        pub pool_name: String,
        #[prost(string, tag = "3")]
        pub device_name: String,
        #[prost(string, repeated, tag = "4")]
        pub cdi_device_ids: Vec<String>,
        #[prost(string, optional, tag = "5")]
        pub share_id: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeUnprepareResourcesRequest {
        #[prost(message, repeated, tag = "1")]
        pub claims: Vec<Claim>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeUnprepareResourcesResponse {
        #[prost(map = "string, message", tag = "1")]
        pub claims: HashMap<String, NodeUnprepareResourceResponse>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeUnprepareResourceResponse {
        #[prost(string, tag = "1")]
        pub error: String,
    }

    pub const V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    pub const V1_UNPREPARE: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
    pub const V1BETA1_PREPARE: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
    pub const V1BETA1_UNPREPARE: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
}

/// DRA device health (`v1` and `v1alpha1`: the same messages under two package names).
pub mod health {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeWatchResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeviceIdentifier {
        #[prost(string, tag = "1")]
        pub pool_name: String,
        #[prost(string, tag = "2")]
        pub device_name: String,
    }

    /// `HealthStatus`: 0 unknown, 1 healthy, 2 unhealthy.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeviceHealth {
        #[prost(message, optional, tag = "1")]
        pub device: Option<DeviceIdentifier>,
        #[prost(int32, tag = "2")]
        pub health: i32,
        #[prost(int64, tag = "3")]
        pub last_updated_time: i64,
        #[prost(int64, tag = "4")]
        pub health_check_timeout_seconds: i64,
        #[prost(string, tag = "5")]
        pub message: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeWatchResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub devices: Vec<DeviceHealth>,
    }

    pub const HEALTHY: i32 = 1;
    pub const UNHEALTHY: i32 = 2;
    pub const V1_WATCH: &str = "/v1.DRAResourceHealth/NodeWatchResources";
    pub const V1ALPHA1_WATCH: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";
}
