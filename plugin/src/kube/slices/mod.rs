//! What the node publishes: a pure function from the inventory, the pools and what the API
//! server accepts to the devices and counter sets of the node's pool ([`build`]), and how they
//! are laid out in ResourceSlices so a change rewrites as few slices as it can ([`layout`]).
//!
//! Per family (docs/dra.md has the attribute list):
//! - exclusive: each device is one DRA device, allocated to one claim at a time;
//! - shared: each device is one DRA device with `allowMultipleAllocations` and a `shares`
//!   capacity of `replicas` (each claim takes one), so up to `replicas` claims hold it;
//! - sliced: each device has a counter set with one counter per slot; the whole device consumes
//!   every slot and each partition the slots it covers, so the scheduler can never hand out two
//!   overlapping partitions (or a partition and the whole device) at once.
//!
//! What the API server does not accept is never published in a form that could be
//! double-booked: without counters (gate `DRAPartitionableDevices` off) a sliced device's
//! partitions are withdrawn and only the whole device is published; without multiple
//! allocations (gate `DRAConsumableCapacity` off) a shared device is published as a device one
//! claim holds at a time. Unhealthy devices are withdrawn (their counter sets stay), or, where
//! their pool asks for it and the server keeps taints, published with a taint
//! ([`doors::taint`]). Devices held through another door than this node's DRA claims (the
//! annotation path, a device plugin, the claims API, an adopted container) are withdrawn, as
//! far as they are held ([`doors`]): the scheduler does not know those holders.

mod device;
pub mod doors;
pub mod layout;
pub mod limits;

use std::collections::BTreeMap;

pub use doors::{HeldElsewhere, Tainted, UnhealthyDevice};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use policies::{FamilyConfig, Inventory, PoolConfig, PublishedDevice, PublishedKind};
use serde::Serialize;

use device::{DeviceFacts, Shape};
pub use device::{NUMA_NODE, PCI_BUS_ID, PCIE_ROOT};

use crate::names::is_dns_label;

/// What the API server accepts, as learned by probing it and reading back writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// `sharedCounters` and `consumesCounters` are kept (gate `DRAPartitionableDevices`).
    pub partitions: bool,
    /// `allowMultipleAllocations` and capacity request policies are kept (gate
    /// `DRAConsumableCapacity`).
    pub multiple_allocations: bool,
    /// A device's `taints` are kept (gate `DRADeviceTaints`: alpha and off by default in
    /// Kubernetes 1.34, GA in 1.37).
    pub taints: bool,
    /// A list attribute value (`ints`) is kept (gate `DRAListTypeAttributes`): the standard
    /// `resource.kubernetes.io/numaNode` is published as KEP-6072's list, else as its scalar.
    #[serde(default)]
    pub numa_list: bool,
}

impl Capabilities {
    /// Everything accepted.
    pub const ALL: Capabilities = Capabilities {
        partitions: true,
        multiple_allocations: true,
        taints: true,
        numa_list: true,
    };

    /// How the standard `resource.kubernetes.io/numaNode` is published: `list` or `scalar`.
    pub fn numa_node_attribute(&self) -> &'static str {
        if self.numa_list { "list" } else { "scalar" }
    }
}

/// Everything the published pool is a function of.
#[derive(Debug, Clone, Copy)]
pub struct PoolInput<'a> {
    /// The node's devices.
    pub inventory: &'a Inventory,
    /// The configured pools (family parameters).
    pub pools: &'a [PoolConfig],
    /// The names the policies publish (`policies::Node::published`).
    pub published: &'a [PublishedDevice],
    /// Device id -> PCIe root (`pci<domain>:<bus>`).
    pub pcie_roots: &'a BTreeMap<String, String>,
    /// The devices that are unhealthy now, by id.
    pub unhealthy: &'a BTreeMap<String, UnhealthyDevice>,
    /// The units held through another door than this node's DRA claims, by device id.
    pub held: &'a HeldElsewhere,
    /// The DRA driver name: the domain of the taint key.
    pub driver: &'a str,
    /// What the API server accepts.
    pub caps: Capabilities,
}

/// One DRA device and the inventory device it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The inventory device id (devices of one id are kept in one slice when they fit).
    pub group: String,
    /// The DRA device.
    pub device: Device,
}

/// Why published names of a device are not in the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum Withdrawal {
    /// The device is unhealthy: all of its names are withdrawn until it recovers.
    Unhealthy {
        /// Inventory device id.
        device: String,
        /// Its pool asks for a taint, but the API server drops taints (gate `DRADeviceTaints`
        /// off): withdrawn instead.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        taint_dropped: bool,
    },
    /// Held through another door than this node's DRA claims (the annotation path, a device
    /// plugin, the claims API, an adopted container): what the scheduler could allocate on top
    /// of those holders is withdrawn until they release it.
    HeldElsewhere {
        /// Inventory device id.
        device: String,
        /// The claims holding it.
        claims: Vec<String>,
        /// The DRA devices withdrawn (all of its names, or the partitions overlapping what is
        /// held; none when a shared device only publishes fewer shares).
        names: Vec<String>,
        /// A shared device's shares still published.
        #[serde(skip_serializing_if = "Option::is_none")]
        shares_left: Option<u32>,
    },
    /// The API server drops counters: the device's partitions are withdrawn, the whole device
    /// stays.
    PartitionsUnsupported {
        /// Inventory device id.
        device: String,
        /// Partitions withdrawn.
        partitions: usize,
    },
    /// A custom family's slices carry no slot layout to build counters from.
    CustomPartitions {
        /// Inventory device id.
        device: String,
        /// Partitions withdrawn.
        partitions: usize,
    },
    /// A published or counter set name is not a DNS label (pool or profile names too long).
    BadName {
        /// Inventory device id.
        device: String,
        /// The name.
        name: String,
    },
}

/// The content of the node's pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolContent {
    /// The DRA devices, grouped by inventory device, in inventory order.
    pub devices: Vec<Entry>,
    /// The counter sets of the sliced devices.
    pub counter_sets: Vec<CounterSet>,
    /// What was left out and why.
    pub withdrawn: Vec<Withdrawal>,
    /// Unhealthy devices published with a taint.
    pub tainted: Vec<Tainted>,
}

/// Builds the pool's content from `input` (pure: same input, same content).
pub fn build(input: &PoolInput<'_>) -> PoolContent {
    let pools: BTreeMap<&str, &PoolConfig> =
        input.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut by_device: BTreeMap<&str, Vec<&PublishedDevice>> = BTreeMap::new();
    for p in input.published {
        by_device.entry(p.device_id.as_str()).or_default().push(p);
    }
    let mut out = PoolContent::default();
    for d in &input.inventory.devices {
        let Some(names) = by_device.get(d.id.as_str()) else {
            continue;
        };
        let Some(pool) = names.first().and_then(|p| pools.get(p.pool.as_str())) else {
            continue;
        };
        let facts = DeviceFacts {
            device: d,
            pool,
            pcie_root: input.pcie_roots.get(&d.id).map(String::as_str),
            multiple_allocations: input.caps.multiple_allocations,
            numa_list: input.caps.numa_list,
        };
        if let Some(bad) = names.iter().find(|p| !is_dns_label(&p.name)) {
            out.withdrawn.push(Withdrawal::BadName {
                device: d.id.clone(),
                name: bad.name.clone(),
            });
            continue;
        }
        let mut wholes = names.iter().filter(|p| p.kind != PublishedKind::Slice);
        let partitions: Vec<&&PublishedDevice> = names
            .iter()
            .filter(|p| p.kind == PublishedKind::Slice)
            .collect();
        let mut entries = Vec::new();
        match &pool.family {
            FamilyConfig::Sliced { slots, .. } => {
                let whole = wholes.next();
                let sets = whole.and_then(|w| device::counter_sets(&w.name, *slots));
                match (input.caps.partitions, whole, sets) {
                    (true, Some(w), Some(sets)) => {
                        let consumes = device::consumption(&w.name, 0, *slots);
                        entries.push(device::device(w, Shape::Whole, &facts, Some(consumes)));
                        for p in &partitions {
                            let consumes = match &p.unit {
                                Some(policies::Unit::Slice { start, size, .. }) => {
                                    device::consumption(&w.name, *start, *size)
                                }
                                _ => continue,
                            };
                            entries.push(device::device(
                                p,
                                Shape::Partition,
                                &facts,
                                Some(consumes),
                            ));
                        }
                        out.counter_sets.extend(sets);
                    }
                    (partitions_ok, whole, _) => {
                        if let Some(w) = whole {
                            entries.push(device::device(w, Shape::Whole, &facts, None));
                        }
                        if !partitions.is_empty() {
                            out.withdrawn.push(if partitions_ok {
                                Withdrawal::BadName {
                                    device: d.id.clone(),
                                    name: whole.map_or_else(String::new, |w| w.name.clone()),
                                }
                            } else {
                                Withdrawal::PartitionsUnsupported {
                                    device: d.id.clone(),
                                    partitions: partitions.len(),
                                }
                            });
                        }
                    }
                }
            }
            FamilyConfig::Shared { .. } => {
                for p in wholes {
                    let shape = if p.kind == PublishedKind::Shareable {
                        Shape::Shared
                    } else {
                        Shape::Whole
                    };
                    entries.push(device::device(p, shape, &facts, None));
                }
            }
            FamilyConfig::Exclusive | FamilyConfig::Custom { .. } => {
                // A custom family's shares are published as devices one claim holds at a time:
                // nothing says how many claims one may take.
                for p in wholes {
                    entries.push(device::device(p, Shape::Whole, &facts, None));
                }
                if !partitions.is_empty() {
                    out.withdrawn.push(Withdrawal::CustomPartitions {
                        device: d.id.clone(),
                        partitions: partitions.len(),
                    });
                }
            }
        }
        if let Some(held) = input.held.get(&d.id) {
            out.withdrawn.push(doors::withdraw_held(
                &d.id,
                &pool.family,
                held,
                &mut entries,
            ));
        }
        if let Some(sick) = input.unhealthy.get(&d.id) {
            match pool.unhealthy.taint_effect() {
                Some(effect) if input.caps.taints => {
                    let taint = doors::taint(input.driver, effect, sick);
                    for e in &mut entries {
                        e.taints = Some(vec![taint.clone()]);
                    }
                    out.tainted.push(Tainted {
                        device: d.id.clone(),
                        effect,
                        reason: sick.reason.clone(),
                    });
                }
                wanted => {
                    out.withdrawn.push(Withdrawal::Unhealthy {
                        device: d.id.clone(),
                        taint_dropped: wanted.is_some(),
                    });
                    continue;
                }
            }
        }
        out.devices.extend(entries.into_iter().map(|device| Entry {
            group: d.id.clone(),
            device,
        }));
    }
    out
}

#[cfg(test)]
mod tests;
