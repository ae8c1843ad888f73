//! Between layout bodies and ResourceSlice objects: rendering what is written, reading what the
//! server has, and comparing what was sent with what was stored.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::kube::slices::layout::{Body, Existing};

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
