//! Learning what the API server keeps before publishing: two dry-run creates (nothing is
//! stored) whose answers show whether counters and multiple allocations survive.
//!
//! A server with `DRAPartitionableDevices` off drops `sharedCounters` and `consumesCounters`; one
//! with `DRAConsumableCapacity` off drops `allowMultipleAllocations` and request policies. A
//! Kubernetes 1.34 server with the gate on refuses a device consuming a counter set that is not
//! in its own slice (1.34 kept counters beside the devices): that 422 also means "no partitions".
//! One with `DRADeviceTaints` off (the 1.34 default) drops a device's `taints`.
//! A third asks whether a list attribute value (`ints`, gate `DRAListTypeAttributes`) is kept:
//! servers without the gate drop it (1.34 does not know the field) and then refuse the
//! attribute left without a value, so a 422 or an answer without the list both mean "no".

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Counter, CounterSet, Device, DeviceCapacity, DeviceCounterConsumption,
    DeviceTaint, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::call;
use super::wire::{self, PoolMeta};
use crate::kube::slices::layout::Body;
use crate::kube::slices::{Capabilities, NUMA_NODE};
use crate::kube::{KubeApi, KubeError};

const PROBE: &str = "nri-accel-probe";

/// A probe slice: the pool's own driver, node and pool, a generated name, no owner.
fn probe_slice(meta: &PoolMeta, body: Body) -> ResourceSlice {
    let mut slice = wire::render(meta, "", None, 0, 1, body);
    slice.metadata = ObjectMeta {
        generate_name: Some(format!(
            "{}-probe-",
            crate::kube::slices::layout::name_base(&meta.node, &meta.driver)
        )),
        ..ObjectMeta::default()
    };
    slice
}

fn one() -> BTreeMap<String, Counter> {
    BTreeMap::from([(
        "s0".to_string(),
        Counter {
            value: Quantity("1".into()),
        },
    )])
}

fn probe_device(consumes: bool) -> Device {
    Device {
        name: PROBE.into(),
        allow_multiple_allocations: Some(true),
        capacity: Some(BTreeMap::from([(
            "shares".to_string(),
            DeviceCapacity {
                value: Quantity("2".into()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity("1".into())),
                    valid_values: Some(vec![Quantity("1".into())]),
                    valid_range: None,
                }),
            },
        )])),
        consumes_counters: consumes.then(|| {
            vec![DeviceCounterConsumption {
                counter_set: PROBE.into(),
                counters: one(),
            }]
        }),
        taints: Some(vec![DeviceTaint {
            key: format!("{PROBE_DOMAIN}/probe"),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        }]),
        ..Device::default()
    }
}

/// The domain of the probe device's taint key (any label prefix will do).
const PROBE_DOMAIN: &str = "accel.nri.io";

fn taints_kept(stored: &ResourceSlice) -> bool {
    stored
        .spec
        .devices
        .iter()
        .flatten()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

fn multiple_kept(stored: &ResourceSlice) -> bool {
    stored.spec.devices.iter().flatten().any(|d| {
        d.allow_multiple_allocations == Some(true)
            && d.capacity
                .iter()
                .flatten()
                .any(|(_, c)| c.request_policy.is_some())
    })
}

/// Asks the server (dry run) what it keeps of counters and multiple allocations.
pub async fn probe(
    api: &dyn KubeApi,
    meta: &PoolMeta,
    timeout: Duration,
) -> Result<Capabilities, KubeError> {
    let counters = probe_slice(
        meta,
        Body::Counters(vec![CounterSet {
            name: PROBE.into(),
            counters: one(),
        }]),
    );
    let sets_kept = match call(
        timeout,
        "a dry-run ResourceSlice",
        api.create_slice(&counters, true),
    )
    .await
    {
        Ok(stored) => stored.spec.shared_counters.is_some_and(|s| !s.is_empty()),
        Err(KubeError::Invalid { .. }) => false,
        Err(e) => return Err(e),
    };
    let devices = |consumes| probe_slice(meta, Body::Devices(vec![probe_device(consumes)]));
    let (consumes_kept, multiple, taints) = match call(
        timeout,
        "a dry-run ResourceSlice",
        api.create_slice(&devices(true), true),
    )
    .await
    {
        Ok(stored) => (
            stored
                .spec
                .devices
                .iter()
                .flatten()
                .any(|d| d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())),
            multiple_kept(&stored),
            taints_kept(&stored),
        ),
        Err(KubeError::Invalid { .. }) => {
            match call(
                timeout,
                "a dry-run ResourceSlice",
                api.create_slice(&devices(false), true),
            )
            .await
            {
                Ok(stored) => (false, multiple_kept(&stored), taints_kept(&stored)),
                Err(KubeError::Invalid { .. }) => (false, false, false),
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let numa_list = numa_list_kept(api, meta, timeout).await?;
    Ok(Capabilities {
        partitions: sets_kept && consumes_kept,
        multiple_allocations: multiple,
        numa_list,
        taints,
    })
}

/// Whether a dry-run device with the standard NUMA node as a list comes back with the list.
async fn numa_list_kept(
    api: &dyn KubeApi,
    meta: &PoolMeta,
    timeout: Duration,
) -> Result<bool, KubeError> {
    let sent = wire::ints(&[0]);
    let device = Device {
        name: PROBE.into(),
        attributes: Some(BTreeMap::from([(NUMA_NODE.to_string(), sent.clone())])),
        ..Device::default()
    };
    let slice = probe_slice(meta, Body::Devices(vec![device]));
    match call(
        timeout,
        "a dry-run ResourceSlice",
        api.create_slice(&slice, true),
    )
    .await
    {
        Ok(stored) => Ok(stored.spec.devices.iter().flatten().any(|d| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get(NUMA_NODE))
                .is_some_and(|a| *a == sent)
        })),
        Err(KubeError::Invalid { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}
