//! Claims as the engine hands them to the node, and the allocations (records) it gets back.

use serde::{Deserialize, Serialize};

use crate::{CpuSet, DeviceSelector, FamilyKind};

/// A claim's UID, as the DRA driver or the annotation path names it.
pub type ClaimUid = String;

/// One claim to allocate: who it is and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// The claim's UID; allocation is idempotent per UID.
    pub uid: ClaimUid,
    /// Namespace of the claim (for status and logs).
    pub namespace: String,
    /// Name of the claim (for status and logs).
    pub name: String,
    /// What the claim asks for.
    pub ask: Ask,
}

/// What a claim asks for: named devices (DRA results), counts the node chooses, or exact units
/// someone else chose (the kubelet, for a device plugin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ask {
    /// DRA allocation results: take exactly these published devices or refuse.
    Named(Vec<NamedResult>),
    /// Counts with a selector: the node chooses the devices.
    Count(Vec<CountRequest>),
    /// Exactly these units of these devices, or refuse: a device plugin's Allocate, where the
    /// kubelet picked one advertised device per result (a whole device, one replica, one slice).
    Units(Vec<UnitResult>),
}

/// One exact unit of one device of a pool, asked for as one result.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UnitResult {
    /// The request name inside the claim.
    pub request: String,
    /// The pool the device belongs to.
    pub pool: String,
    /// The device's id in the inventory.
    pub device_id: String,
    /// The part of the device asked for.
    pub unit: Unit,
}

/// One DRA allocation result: a published device of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedResult {
    /// The request name inside the claim.
    pub request: String,
    /// The pool the device was published in.
    pub pool: String,
    /// The published device name (see [`crate::Node::published`]).
    pub device: String,
}

/// A request for `count` results chosen by the node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CountRequest {
    /// The request name inside the claim.
    pub request: String,
    /// Number of results (devices, shares or slices).
    pub count: u32,
    /// The family asked for; `None` takes any pool whose devices match.
    #[serde(default)]
    pub family: Option<FamilyKind>,
    /// Which devices qualify.
    #[serde(default)]
    pub selector: DeviceSelector,
    /// Slice profile (sliced pools only).
    #[serde(default)]
    pub profile: Option<String>,
    /// Replicas per result (shared pools only; default 1).
    #[serde(default)]
    pub shares: Option<u32>,
}

/// What the node allocated to one claim: the record payload the engine checkpoints.
///
/// Serde-stable: field names and shapes only grow, with defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The claim's UID.
    pub claim_uid: ClaimUid,
    /// Namespace of the claim.
    #[serde(default)]
    pub namespace: String,
    /// Name of the claim.
    #[serde(default)]
    pub name: String,
    /// One grant per result, in request order.
    pub results: Vec<Grant>,
    /// Accelerator-local CPUs given exclusively to this claim.
    #[serde(default)]
    pub cpus: CpuSet,
}

/// One result of a claim: a unit of one device of one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Grant {
    /// The request name inside the claim.
    pub request: String,
    /// The pool the device belongs to.
    pub pool: String,
    /// The published DRA device name of the unit.
    pub device: String,
    /// The device's id in the inventory.
    pub device_id: String,
    /// Which part of the device.
    pub unit: Unit,
}

/// The part of a device a grant holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Unit {
    /// The whole device (on a sliced device: every slot).
    Whole,
    /// Replicas `index .. index + count` of a shared device.
    Share {
        /// First replica held.
        index: u32,
        /// Replicas held.
        count: u32,
    },
    /// A slice covering slots `start .. start + size`.
    Slice {
        /// Profile the slice was cut by.
        profile: String,
        /// First slot.
        start: u32,
        /// Slots covered.
        size: u32,
    },
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Whole => f.write_str("the whole device"),
            Unit::Share { index, count: 1 } => write!(f, "replica {index}"),
            Unit::Share { index, count } => {
                write!(
                    f,
                    "replicas {index} to {}",
                    index.saturating_add(count.saturating_sub(1))
                )
            }
            Unit::Slice {
                profile,
                start,
                size: 0 | 1,
            } => write!(f, "a {profile} slice at slot {start}"),
            Unit::Slice {
                profile,
                start,
                size,
            } => write!(
                f,
                "a {profile} slice at slots {start} to {}",
                start.saturating_add(size - 1)
            ),
        }
    }
}

/// The answer to an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The allocation (new, or the one already held for this UID), shared with the node: keep
    /// the `Arc` in a record rather than copying it.
    pub allocation: std::sync::Arc<Allocation>,
    /// Cpuset updates for other containers (the engine commits and pushes them).
    pub updates: Vec<crate::ContainerUpdate>,
    /// Whether the claim was already allocated (idempotent repeat): nothing changed.
    pub already: bool,
}
