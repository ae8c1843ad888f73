//! The demo's simulated node: a static inventory and pools of every family.

use std::path::Path;

use policies::{CpuSet, Device, DeviceNode, DeviceSelector, FamilyConfig, NodeKind, PoolConfig};

use crate::config::Config;

/// One simulated NVIDIA H100 for the demo, tests and benches: `i` picks its id
/// (`gpu<i>`) and device minor, `numa` its node; the caller gives its local CPUs
/// and PCI address, which steer the policy's NUMA and PCIe preferences.
pub fn simulated_gpu(i: u32, numa: u32, local_cpus: CpuSet, pci_address: String) -> Device {
    let node = |path: String, minor: u32| DeviceNode {
        path,
        host_path: None,
        kind: NodeKind::Char,
        major: 195,
        minor,
        permissions: "rw".into(),
    };
    Device {
        id: format!("gpu{i}"),
        vendor: "nvidia".into(),
        model: "H100 SXM5 80GB".into(),
        pci_address: Some(pci_address),
        pci_id: Some("10de:2330".into()),
        numa_node: Some(numa),
        local_cpus,
        memory_mib: 81_559,
        compute_units: 132,
        driver: Some("nvidia".into()),
        nodes: vec![node(format!("/dev/nvidia{i}"), i)],
        control_nodes: vec![node("/dev/nvidiactl".into(), 255)],
    }
}

fn gpu(i: u32, numa: u32) -> Device {
    let local: CpuSet = if numa == 0 { "0-7" } else { "8-15" }
        .parse()
        .unwrap_or_default();
    simulated_gpu(i, numa, local, format!("0000:{:02x}:00.0", 0x18 + i * 0x10))
}

fn ids(v: &[&str]) -> DeviceSelector {
    DeviceSelector {
        ids: v.iter().map(|s| s.to_string()).collect(),
        ..DeviceSelector::default()
    }
}

/// A config for a simulated 16-CPU, 2-NUMA node with four GPUs: two handed out
/// whole (with two local CPUs each), one shared four ways, one cut into slices.
// Nested defaults are overridden field by field: clearer than one struct literal here.
#[allow(clippy::field_reassign_with_default)]
pub fn config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.state_dir = dir.join("state");
    c.cdi.dir = dir.join("cdi");
    c.nri.socket = dir.join("nri.sock");
    c.claims_api.socket = dir.join("claims.sock");
    c.reconcile_interval_secs = 0;
    c.device_plugin.enabled = true;
    c.device_plugin.dir = dir.join("device-plugins");
    c.discovery.sysfs = false;
    c.discovery.cpus = "0-15".parse().ok();
    c.discovery.static_devices = vec![gpu(0, 0), gpu(1, 1), gpu(2, 0), gpu(3, 1)];
    c.pools = vec![
        PoolConfig {
            name: "whole".into(),
            select: ids(&["gpu0", "gpu1"]),
            family: FamilyConfig::Exclusive,
            cpus_per_device: 2,
        },
        PoolConfig {
            name: "shared".into(),
            select: ids(&["gpu2"]),
            family: FamilyConfig::Shared {
                replicas: 4,
                memory_mib_per_share: 20_000,
                compute_percent_per_share: 25,
            },
            cpus_per_device: 0,
        },
        PoolConfig {
            name: "mig".into(),
            select: ids(&["gpu3"]),
            family: FamilyConfig::Sliced {
                slots: 8,
                profiles: super::fixtures::mig_profiles(),
            },
            cpus_per_device: 0,
        },
    ];
    c
}
