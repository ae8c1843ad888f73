//! Accelerator policies for nri-accel: the device model, pools, the `Policy`
//! trait and the built-in exclusive, shared and sliced families.
//!
//! Everything here is pure, synchronous and deterministic: no I/O, no async,
//! no clocks. Given the same inventory, records and request, a policy answers
//! the same, which is what makes it testable by properties and replayable
//! after a crash.

mod cpuset;
mod device;
mod pool;

pub use cpuset::{CpuSet, CpuSetParseError, MAX_CPU_ID};
pub use device::{Device, DeviceNode, Inventory, NodeKind};
pub use pool::{DeviceSelector, FamilyConfig, PoolConfig, ProfileConfig};
