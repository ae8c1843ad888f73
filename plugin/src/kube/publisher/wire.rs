//! Between layout bodies and ResourceSlice objects: rendering what is written, reading what the
//! server has, and comparing what was sent with what was stored.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::kube::slices::layout::{Body, Existing};

/// How a list of ints (`ints`, an alpha attribute value since Kubernetes 1.36, gate
/// `DRAListTypeAttributes`) travels inside the resource.k8s.io/v1 types of Kubernetes 1.34 that
/// nri-accel is built on, which have no such field: as a string `ints:<n>,<n>...`. Only the
/// standard NUMA node attribute ([`crate::kube::slices::NUMA_NODE`]) is ever carried so; the
/// API client turns it into `ints` on the wire and back ([`ints_to_wire`], [`ints_from_wire`]).
pub const INTS_PREFIX: &str = "ints:";

/// A list of ints as the 1.34 types carry it ([`INTS_PREFIX`]).
pub fn ints(values: &[i64]) -> DeviceAttribute {
    let list: Vec<String> = values.iter().map(i64::to_string).collect();
    DeviceAttribute {
        string: Some(format!("{INTS_PREFIX}{}", list.join(","))),
        ..DeviceAttribute::default()
    }
}

/// The attributes of every device of a ResourceSlice (as JSON) that may carry a list.
fn list_attributes(slice: &mut serde_json::Value) -> impl Iterator<Item = &mut serde_json::Value> {
    slice["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            d.get_mut("attributes")?
                .get_mut(crate::kube::slices::NUMA_NODE)
        })
}

/// Turns the carried lists of a ResourceSlice about to be sent into `ints`.
pub fn ints_to_wire(slice: &mut serde_json::Value) {
    for a in list_attributes(slice) {
        let Some(text) = a["string"]
            .as_str()
            .and_then(|s| s.strip_prefix(INTS_PREFIX))
        else {
            continue;
        };
        let values: Vec<i64> = text.split(',').filter_map(|v| v.parse().ok()).collect();
        *a = serde_json::json!({ "ints": values });
    }
}

/// Turns the `ints` of a ResourceSlice the server sent into the carried form.
pub fn ints_from_wire(slice: &mut serde_json::Value) {
    for a in list_attributes(slice) {
        let Some(values) = a["ints"].as_array() else {
            continue;
        };
        let values: Vec<i64> = values
            .iter()
            .filter_map(serde_json::Value::as_i64)
            .collect();
        if let Ok(carried) = serde_json::to_value(ints(&values)) {
            *a = carried;
        }
    }
}

/// Label on every slice we write.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "nri-accel");

/// Who the node's pool is and who owns its slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolMeta {
    /// DRA driver name.
    pub driver: String,
    /// Node name.
    pub node: String,
    /// Pool name.
    pub pool: String,
    /// The Node object's UID (owner of the slices), when known.
    pub node_uid: Option<String>,
}

/// The ResourceSlice for one slice of the pool.
pub fn render(
    meta: &PoolMeta,
    name: &str,
    resource_version: Option<&str>,
    generation: i64,
    count: usize,
    body: Body,
) -> ResourceSlice {
    let (devices, shared_counters) = match body {
        Body::Devices(d) => (Some(d), None),
        Body::Counters(c) => (None, Some(c)),
    };
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: resource_version.map(str::to_string),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
            )])),
            owner_references: meta.node_uid.as_ref().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: meta.node.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: meta.driver.clone(),
            node_name: Some(meta.node.clone()),
            pool: ResourcePool {
                name: meta.pool.clone(),
                generation,
                resource_slice_count: count as i64,
            },
            devices,
            shared_counters,
            ..ResourceSliceSpec::default()
        },
    }
}

/// A slice read from the server, as the layout sees it (its devices moved, not copied).
pub fn existing(slice: ResourceSlice) -> Existing {
    let spec = slice.spec;
    let devices = spec.devices.unwrap_or_default();
    let counters = spec.shared_counters.unwrap_or_default();
    let body = match (devices.is_empty(), counters.is_empty()) {
        (_, true) => Some(Body::Devices(devices)),
        (true, false) => Some(Body::Counters(counters)),
        (false, false) => None,
    };
    Existing {
        name: slice.metadata.name.unwrap_or_default(),
        resource_version: slice.metadata.resource_version.unwrap_or_default(),
        pool: spec.pool.name,
        generation: spec.pool.generation,
        count: spec.pool.resource_slice_count,
        body,
    }
}

/// What the server left out of a written slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// `sharedCounters` or a device's `consumesCounters` (gate `DRAPartitionableDevices`).
    pub counters: bool,
    /// A device's `allowMultipleAllocations` or a capacity's `requestPolicy` (gate
    /// `DRAConsumableCapacity`).
    pub multiple_allocations: bool,
    /// A device's `taints` (gate `DRADeviceTaints`).
    pub taints: bool,
    /// Anything else: a device, attribute or capacity missing or changed.
    pub other: bool,
}

impl Dropped {
    /// Whether anything was dropped.
    pub fn any(&self) -> bool {
        self.counters || self.multiple_allocations || self.taints || self.other
    }
}

/// Compares what was sent with what the server stored.
pub fn dropped(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Dropped {
    let mut d = Dropped::default();
    let sent_sets = sent.shared_counters.as_deref().unwrap_or_default();
    let stored_sets = stored.shared_counters.as_deref().unwrap_or_default();
    if !sent_sets.is_empty() && stored_sets.is_empty() {
        d.counters = true;
    } else if sent_sets != stored_sets {
        d.other = true;
    }
    let stored_devices = stored.devices.as_deref().unwrap_or_default();
    for s in sent.devices.as_deref().unwrap_or_default() {
        let Some(t) = stored_devices.iter().find(|t| t.name == s.name) else {
            d.other = true;
            continue;
        };
        if s.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
            && t.consumes_counters.as_ref().is_none_or(Vec::is_empty)
        {
            d.counters = true;
        }
        if s.allow_multiple_allocations == Some(true) && t.allow_multiple_allocations != Some(true)
        {
            d.multiple_allocations = true;
        }
        let policies = |dev: &k8s_openapi::api::resource::v1::Device| {
            dev.capacity
                .iter()
                .flatten()
                .filter(|(_, c)| c.request_policy.is_some())
                .count()
        };
        if policies(s) > policies(t) {
            d.multiple_allocations = true;
        }
        if s.taints.as_ref().is_some_and(|x| !x.is_empty())
            && t.taints.as_ref().is_none_or(Vec::is_empty)
        {
            d.taints = true;
        }
        if s.attributes != t.attributes {
            d.other = true;
        }
    }
    if stored_devices.len() != sent.devices.as_deref().unwrap_or_default().len() {
        d.other = true;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_of_ints_travels_as_ints_and_comes_back_as_it_went() {
        let carried = serde_json::to_value(ints(&[1, 0])).unwrap();
        let mut slice = json!({"spec": {"devices": [{"name": "d", "attributes": {
            "resource.kubernetes.io/numaNode": carried.clone(),
            "accel.nri.io/model": {"string": "ints:1"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        }}]}});
        let before = slice.clone();
        ints_to_wire(&mut slice);
        let attrs = &slice["spec"]["devices"][0]["attributes"];
        assert_eq!(
            attrs["resource.kubernetes.io/numaNode"],
            json!({"ints": [1, 0]})
        );
        // Only the standard NUMA node is ever a list.
        assert_eq!(attrs["accel.nri.io/model"], json!({"string": "ints:1"}));
        ints_from_wire(&mut slice);
        assert_eq!(slice, before);
        // A scalar stays a scalar both ways.
        let mut scalar = json!({"spec": {"devices": [{"name": "d", "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 0}}}]}});
        let kept = scalar.clone();
        ints_to_wire(&mut scalar);
        ints_from_wire(&mut scalar);
        assert_eq!(scalar, kept);
    }
}
