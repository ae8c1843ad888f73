//! One published name -> one DRA device: its attributes, capacity and counter consumption.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity,
    DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use policies::{Device as Inventoried, FamilyConfig, PoolConfig, PublishedDevice};

use super::limits::{MAX_ATTRIBUTE_STRING, MAX_COUNTERS_PER_SET};
use crate::names::{is_dns_label, truncate};

/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// The standard attribute naming a device's NUMA node (KEP-6072): a list of ints, the device's
/// own node first, where the API server keeps list values (`DRAListTypeAttributes`), else the
/// scalar int of its own node.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// What a published device is, as its `type` attribute says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A whole device one claim holds.
    Whole,
    /// A device several claims hold a share of each.
    Shared,
    /// A partition (slice) of a sliced device.
    Partition,
}

impl Shape {
    fn as_str(self) -> &'static str {
        match self {
            Shape::Whole => "device",
            Shape::Shared => "shared",
            Shape::Partition => "partition",
        }
    }
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(truncate(s, MAX_ATTRIBUTE_STRING).to_string()),
        ..DeviceAttribute::default()
    }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..DeviceAttribute::default()
    }
}

fn quantity(text: String) -> Quantity {
    Quantity(text)
}

fn capacity(value: String) -> DeviceCapacity {
    DeviceCapacity {
        value: quantity(value),
        request_policy: None,
    }
}

fn mib(n: u64) -> String {
    format!("{n}Mi")
}

/// The counter sets of a sliced device named `name` with `slots` slots: one counter per slot
/// (`s0`, `s1`, ...), 32 to a set; the first set is named like the device, the second `<name>-1`.
/// None when a set name would not be a DNS label.
pub fn counter_sets(name: &str, slots: u32) -> Option<Vec<CounterSet>> {
    let per = MAX_COUNTERS_PER_SET as u32;
    let mut sets = Vec::new();
    for k in 0..slots.div_ceil(per) {
        let set = if k == 0 {
            name.to_string()
        } else {
            format!("{name}-{k}")
        };
        if !is_dns_label(&set) {
            return None;
        }
        let counters = (k * per..((k + 1) * per).min(slots))
            .map(|s| {
                (
                    format!("s{s}"),
                    Counter {
                        value: quantity("1".into()),
                    },
                )
            })
            .collect();
        sets.push(CounterSet {
            name: set,
            counters,
        });
    }
    Some(sets)
}

/// What a device covering slots `start .. start + size` of the device whose counter sets are
/// named after `set` consumes.
pub fn consumption(set: &str, start: u32, size: u32) -> Vec<DeviceCounterConsumption> {
    let per = MAX_COUNTERS_PER_SET as u32;
    let mut by_set: BTreeMap<u32, BTreeMap<String, Counter>> = BTreeMap::new();
    for s in start..start.saturating_add(size) {
        by_set.entry(s / per).or_default().insert(
            format!("s{s}"),
            Counter {
                value: quantity("1".into()),
            },
        );
    }
    by_set
        .into_iter()
        .map(|(k, counters)| DeviceCounterConsumption {
            counter_set: if k == 0 {
                set.to_string()
            } else {
                format!("{set}-{k}")
            },
            counters,
        })
        .collect()
}

/// Everything [`device`] needs besides the published name.
pub struct DeviceFacts<'a> {
    /// The inventory device behind the name.
    pub device: &'a Inventoried,
    /// Its pool's config.
    pub pool: &'a PoolConfig,
    /// Its PCIe root, if known.
    pub pcie_root: Option<&'a str>,
    /// Whether shares may be published as multiple allocations.
    pub multiple_allocations: bool,
    /// Whether the standard NUMA node is published as a list (else as a scalar).
    pub numa_list: bool,
}

/// The DRA device for published name `p` of shape `shape`; `consumes` for partitions and the
/// whole device of a sliced pool. Attributes are in the driver's domain except the PCIe root.
pub fn device(
    p: &PublishedDevice,
    shape: Shape,
    facts: &DeviceFacts<'_>,
    consumes: Option<Vec<DeviceCounterConsumption>>,
) -> Device {
    let d = facts.device;
    let mut attributes = BTreeMap::new();
    let mut put = |k: &str, v: DeviceAttribute| {
        attributes.insert(k.to_string(), v);
    };
    put("type", string(shape.as_str()));
    put("vendor", string(&d.vendor));
    if !d.model.is_empty() {
        put("model", string(&d.model));
    }
    if let Some(driver) = &d.driver {
        put("driver", string(driver));
    }
    put("family", string(facts.pool.family.kind().name()));
    put("pool", string(&p.pool));
    put("deviceId", string(&d.id));
    if let Some(a) = &d.pci_address {
        put("pciAddress", string(a));
    }
    if let Some(id) = &d.pci_id {
        put("pciId", string(id));
    }
    // The GPU's UUID under the name NVIDIA's DRA driver gives it (`uuid`); a partition is not
    // the GPU, so it names its parent's as that driver does for MIG devices (`parentUUID`).
    if let Some(u) = &d.uuid {
        let key = if shape == Shape::Partition {
            "parentUUID"
        } else {
            "uuid"
        };
        put(key, string(u));
    }
    if let Some(n) = d.numa_node {
        put("numaNode", int(i64::from(n)));
        let standard = if facts.numa_list {
            crate::kube::publisher::wire::ints(&[i64::from(n)])
        } else {
            int(i64::from(n))
        };
        put(NUMA_NODE, standard);
    }
    if let Some(root) = facts.pcie_root {
        put(PCIE_ROOT, string(root));
    }
    let mut cap = BTreeMap::new();
    let mut allow_multiple = None;
    match (&facts.pool.family, shape, &p.unit) {
        (
            FamilyConfig::Shared {
                replicas,
                memory_mib_per_share,
                ..
            },
            Shape::Shared,
            _,
        ) => {
            put("replicas", int(i64::from(*replicas)));
            let policy = |default: String, only: bool| {
                facts.multiple_allocations.then(|| CapacityRequestPolicy {
                    default: Some(quantity(default.clone())),
                    valid_values: only.then(|| vec![quantity(default)]),
                    valid_range: None,
                })
            };
            // With multiple allocations every capacity is consumed by each claim (its whole value
            // when no policy says otherwise), so each one gets a default a share takes.
            cap.insert(
                "shares".to_string(),
                DeviceCapacity {
                    value: quantity(replicas.to_string()),
                    request_policy: policy("1".into(), true),
                },
            );
            let memory = if d.memory_mib > 0 {
                d.memory_mib
            } else {
                memory_mib_per_share.saturating_mul(u64::from(*replicas))
            };
            if memory > 0 {
                let per_share = *memory_mib_per_share;
                cap.insert(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: quantity(mib(memory)),
                        request_policy: policy(mib(per_share), per_share > 0),
                    },
                );
            }
            allow_multiple = facts.multiple_allocations.then_some(true);
        }
        (FamilyConfig::Sliced { profiles, .. }, Shape::Partition, Some(unit)) => {
            if let policies::Unit::Slice {
                profile,
                start,
                size,
            } = unit
            {
                put("profile", string(profile));
                put("sliceStart", int(i64::from(*start)));
                put("sliceSize", int(i64::from(*size)));
                cap.insert("slots".to_string(), capacity(size.to_string()));
                if let Some(pc) = profiles.iter().find(|pc| pc.name == *profile) {
                    if pc.memory_mib > 0 {
                        cap.insert("memory".to_string(), capacity(mib(pc.memory_mib)));
                    }
                    if pc.compute_units > 0 {
                        cap.insert(
                            "computeUnits".to_string(),
                            capacity(pc.compute_units.to_string()),
                        );
                    }
                }
            }
        }
        (family, _, _) => {
            if let FamilyConfig::Sliced { slots, .. } = family {
                cap.insert("slots".to_string(), capacity(slots.to_string()));
            }
            if d.memory_mib > 0 {
                cap.insert("memory".to_string(), capacity(mib(d.memory_mib)));
            }
            if d.compute_units > 0 {
                cap.insert(
                    "computeUnits".to_string(),
                    capacity(d.compute_units.to_string()),
                );
            }
        }
    }
    Device {
        name: p.name.clone(),
        attributes: Some(attributes),
        capacity: (!cap.is_empty()).then_some(cap),
        consumes_counters: consumes,
        allow_multiple_allocations: allow_multiple,
        ..Device::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_cover_every_slot_in_sets_of_32() {
        let sets = counter_sets("gpu-0", 40).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].counters.len(), 32);
        assert_eq!(sets[1].name, "gpu-0-1");
        assert!(sets[1].counters.contains_key("s39"));
        assert!(counter_sets(&"a".repeat(63), 40).is_none());
        let c = consumption("gpu-0", 30, 4);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].counters.len(), 2);
        assert!(c[1].counters.contains_key("s33"));
    }
}
