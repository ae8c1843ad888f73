//! What a grant puts into a container: CDI edits, NRI adjustments and updates.

use serde::{Deserialize, Serialize};

use crate::{CpuSet, DeviceNode};

/// The container edits one result grants (the content of one CDI device entry).
///
/// Device nodes are the device's own nodes plus its vendor's control nodes;
/// env carries share and slice limits. Visibility variables such as
/// `NVIDIA_VISIBLE_DEVICES` are not set: the device nodes are injected directly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    /// Environment variables, in a stable order.
    pub env: Vec<(String, String)>,
    /// Device nodes to create.
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// OCI hooks.
    pub hooks: Vec<Hook>,
}

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Path on the host.
    pub host_path: String,
    /// Path in the container.
    pub container_path: String,
    /// Mount options (e.g. `ro`, `bind`).
    pub options: Vec<String>,
}

/// An OCI hook to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// OCI hook point (`createContainer`, ...).
    pub hook_name: String,
    /// Executable path.
    pub path: String,
    /// Arguments, including argv\[0\].
    pub args: Vec<String>,
    /// Environment of the hook.
    pub env: Vec<String>,
}

/// The adjustment for a starting container: limit env and NUMA-aligned cpuset/mems.
///
/// `cpus` and `mems` are set only where they change what the container has (its
/// [`Placement`]): a runtime fails a creation when two plugins set the same field, and a
/// container that already runs where it should needs no cgroup write.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adjustment {
    /// Environment variables to add.
    pub env: Vec<(String, String)>,
    /// Cpuset to set, if it changes.
    pub cpus: Option<CpuSet>,
    /// Memory nodes to set, if they change.
    pub mems: Option<CpuSet>,
}

/// A new cpuset (and memory nodes) for a running container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerUpdate {
    /// The container to update.
    pub container_id: String,
    /// Its new cpuset; empty when it does not change (leave as is).
    pub cpus: CpuSet,
    /// Its new memory nodes; empty when they do not change or the node's NUMA layout is
    /// unknown (leave as is).
    pub mems: CpuSet,
}

/// Where a container runs, as the runtime reports it: its cpuset and memory nodes. `None` is
/// what a runtime reports for a container it did not pin, which runs on every online CPU and
/// may use every NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The container's cpuset; `None`: every online CPU.
    pub cpus: Option<CpuSet>,
    /// The container's memory nodes; `None`: every NUMA node.
    pub mems: Option<CpuSet>,
}

impl Placement {
    /// A container the runtime did not pin: every online CPU, every NUMA node.
    pub fn unpinned() -> Placement {
        Placement::default()
    }

    /// A container pinned to `cpus` (memory nodes not reported).
    pub fn cpus(cpus: CpuSet) -> Placement {
        Placement {
            cpus: Some(cpus),
            mems: None,
        }
    }
}
