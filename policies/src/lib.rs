//! Accelerator policies for nri-accel: the device model, pools, the `Policy`
//! trait and the built-in exclusive, shared and sliced families.
//!
//! Everything here is pure, synchronous and deterministic: no I/O, no async,
//! no clocks. Given the same inventory, records and request, a policy answers
//! the same, which is what makes it testable by properties and replayable
//! after a crash.
//!
//! The claim engine talks to [`Node`]; a policy author implements [`Policy`]
//! and registers a factory in the [`Registry`] (see `docs/policy-guide.md`).

mod claim;
mod containers;
mod cpuset;
mod device;
mod edits;
mod exclusive;
pub mod naming;
mod node;
mod policy;
mod pool;
mod prefer;
mod refusal;
mod registry;
mod restore;
mod shared;
mod sliced;
mod snapshot;
mod units;

pub use claim::{
    Allocation, Ask, ClaimRequest, ClaimUid, CountRequest, Grant, NamedResult, Outcome, Unit,
    UnitResult,
};
pub use cpuset::{CpuSet, CpuSetParseError, MAX_CPU_ID};
pub use device::{Device, DeviceNode, Inventory, NodeKind, VfioGroup, union_access};
pub use edits::{Adjustment, ContainerEdits, ContainerUpdate, Hook, Mount, Placement};
pub use exclusive::exclusive;
pub use node::Node;
pub use policy::{
    DeviceSnapshot, HeldUnit, Near, Policy, PoolRequest, PoolSnapshot, PoolUsage, PublishedDevice,
    PublishedKind,
};
pub use pool::{
    DeviceSelector, FamilyConfig, FamilyKind, MpsConfig, PoolConfig, ProfileConfig,
    UnhealthyDevices, VendorCdi,
};
pub use prefer::Candidate;
pub use refusal::{PolicyError, PoolFree, Refusal, RefusalContext, RefusalReason};
pub use registry::{PolicyFactory, Registry};
pub use shared::{MAX_REPLICAS, MPS_LOG_ENV, MPS_PIPE_ENV, shared};
pub use sliced::{MAX_SLOTS, sliced};
pub use snapshot::Snapshot;
