//! The device model: what the node has, as discovery or the static inventory describe it.

use serde::{Deserialize, Serialize};

use crate::CpuSet;

/// One accelerator the node can hand out.
///
/// `id` is the stable name used in records, refusals and status (for PCI
/// devices the PCI address, for static devices whatever the config says).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Stable identifier, unique on the node (e.g. `0000:17:00.0` or `gpu0`).
    pub id: String,
    /// Vendor name in lower case (`nvidia`, `amd`, `intel`, `habana`, ...).
    pub vendor: String,
    /// Model name as the vendor's tooling shows it (e.g. `H100 SXM5 80GB`).
    #[serde(default)]
    pub model: String,
    /// PCI address (`dddd:bb:dd.f`) when the device is on PCI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// PCI vendor and device id as `vvvv:dddd` (lower-case hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// NUMA node the device is attached to, if the platform reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPUs local to the device (its NUMA node's CPUs, from `local_cpulist`).
    #[serde(default)]
    pub local_cpus: CpuSet,
    /// Device memory in MiB.
    #[serde(default)]
    pub memory_mib: u64,
    /// Compute units (SMs, CUs, cores) the device has; slices are cut from these.
    #[serde(default)]
    pub compute_units: u32,
    /// Kernel driver bound to the device (`nvidia`, `amdgpu`, ...), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Device nodes that belong to this device alone (e.g. `/dev/nvidia0`, `/dev/dri/renderD128`).
    #[serde(default)]
    pub nodes: Vec<DeviceNode>,
    /// The IOMMU group this device stands for when it is a VFIO passthrough device (docs/vms.md):
    /// the whole group is one device, so a grant can never split it. `None` for host-driver
    /// devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<VfioGroup>,
    /// Vendor control nodes every container using a device of this vendor needs
    /// (e.g. `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/kfd`); shared between devices.
    #[serde(default)]
    pub control_nodes: Vec<DeviceNode>,
    /// The vendor's unique id of the device when its driver tells one (an NVIDIA GPU's
    /// `GPU-<uuid>`, from `/proc/driver/nvidia/gpus/<bdf>/information`): published, shown in
    /// `status`, and used to find the device in the vendor's CDI spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// An IOMMU group of PCI functions bound to `vfio-pci`, handed out whole (docs/vms.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VfioGroup {
    /// The group number: `/sys/kernel/iommu_groups/<group>`, `/dev/vfio/<group>`.
    pub group: u32,
    /// The PCI addresses of the group's `vfio-pci` functions, the primary function (the
    /// device's own address) first. Bridges and driver-less functions of the group are not
    /// listed: no VM is given them.
    pub functions: Vec<String>,
}

impl VfioGroup {
    /// The function a VM is given the group by (the first of [`VfioGroup::functions`]).
    pub fn primary(&self) -> Option<&str> {
        self.functions.first().map(String::as_str)
    }

    /// The env variable a grant of this group sets: `ACCEL_VFIO_GROUP_<group>`, whose value is
    /// the group's functions, comma-separated. Named after the group so that a claim of several
    /// groups sets one variable for each.
    pub fn env_name(&self) -> String {
        format!("ACCEL_VFIO_GROUP_{}", self.group)
    }
}

/// A device node to create in a container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceNode {
    /// Path inside the container (e.g. `/dev/nvidia0`).
    pub path: String,
    /// Path on the host when it differs from `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Character or block device.
    #[serde(default)]
    pub kind: NodeKind,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// cgroup access, a subset of `rwm`.
    #[serde(default = "default_permissions")]
    pub permissions: String,
}

fn default_permissions() -> String {
    "rw".to_string()
}

/// The union of two cgroup access strings, in `rwm` order: what a container may do with a node
/// two grants (or two specs) both give it.
pub fn union_access(a: &str, b: &str) -> String {
    "rwm"
        .chars()
        .filter(|c| a.contains(*c) || b.contains(*c))
        .collect()
}

/// Kind of a device node.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A character device (`c`); all accelerators seen so far.
    #[default]
    Char,
    /// A block device (`b`).
    Block,
}

/// Everything the policies may hand out on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// The accelerators, in a stable order (sorted by id).
    pub devices: Vec<Device>,
    /// Online CPUs of the node: the shared CPU pool before any CPU is given exclusively.
    #[serde(default)]
    pub cpus: CpuSet,
}

impl Inventory {
    /// The device with this id.
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }
}
