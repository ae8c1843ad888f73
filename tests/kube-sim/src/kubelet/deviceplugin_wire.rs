//! The kubelet's device plugin API (`v1beta1`), declared by hand from its field numbers
//! (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`), independently of nri-accel's `.proto`.
#![allow(missing_docs)]

use std::collections::HashMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DevicePluginOptions {
    #[prost(bool, tag = "1")]
    pub pre_start_required: bool,
    #[prost(bool, tag = "2")]
    pub get_preferred_allocation_available: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterRequest {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub endpoint: String,
    #[prost(string, tag = "3")]
    pub resource_name: String,
    #[prost(message, optional, tag = "4")]
    pub options: Option<DevicePluginOptions>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListAndWatchResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub health: String,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerPreferredAllocationRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationRequest {
    #[prost(string, repeated, tag = "1")]
    pub available_device_ids: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub must_include_device_ids: Vec<String>,
    #[prost(int32, tag = "3")]
    pub allocation_size: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerPreferredAllocationResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationResponse {
    #[prost(string, repeated, tag = "1")]
    pub device_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerAllocateRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerAllocateResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateResponse {
    #[prost(map = "string, string", tag = "1")]
    pub envs: HashMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "3")]
    pub devices: Vec<DeviceSpec>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "5")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub read_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceSpec {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(string, tag = "3")]
    pub permissions: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

pub const REGISTER: &str = "/v1beta1.Registration/Register";
pub const OPTIONS: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
pub const LIST_AND_WATCH: &str = "/v1beta1.DevicePlugin/ListAndWatch";
pub const PREFERRED: &str = "/v1beta1.DevicePlugin/GetPreferredAllocation";
pub const ALLOCATE: &str = "/v1beta1.DevicePlugin/Allocate";
pub const PRE_START: &str = "/v1beta1.DevicePlugin/PreStartContainer";
pub const VERSION: &str = "v1beta1";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_are_the_kubelets() {
        // cdi_devices = 5 (length-delimited: tag byte 0x2a), name = 1.
        let r = ContainerAllocateResponse {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec(), [0x2a, 3, 0x0a, 1, b'x']);
        // allocation_size = 3 (varint: 0x18), must_include_deviceIDs = 2 (0x12).
        let p = ContainerPreferredAllocationRequest {
            available_device_ids: vec![],
            must_include_device_ids: vec!["m".into()],
            allocation_size: 2,
        };
        assert_eq!(p.encode_to_vec(), [0x12, 1, b'm', 0x18, 2]);
        // Device: ID = 1, health = 2, topology = 3 { nodes = 1 { ID = 1 } }.
        let d = Device {
            id: "g".into(),
            health: "H".into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        };
        assert_eq!(
            d.encode_to_vec(),
            [0x0a, 1, b'g', 0x12, 1, b'H', 0x1a, 4, 0x0a, 2, 0x08, 1]
        );
    }
}
