//! Fixtures shared by the policy tests: devices shaped like real GPUs.
#![allow(dead_code, missing_docs)]

use policies::{
    Ask, ClaimRequest, CountRequest, CpuSet, Device, DeviceNode, FamilyConfig, Inventory,
    NamedResult, Node, NodeKind, PoolConfig, ProfileConfig, Registry,
};

pub fn cpus(list: &str) -> CpuSet {
    list.parse().unwrap()
}

/// A PCI GPU of `vendor` on NUMA node `numa` (local CPUs `local`), bus `bus`, minor `minor`.
pub fn gpu(id: &str, vendor: &str, numa: u32, local: &str, bus: u8, minor: u32) -> Device {
    let (major, node, ctl) = match vendor {
        "nvidia" => (195, format!("/dev/nvidia{minor}"), "/dev/nvidiactl"),
        _ => (226, format!("/dev/dri/renderD{}", 128 + minor), "/dev/kfd"),
    };
    Device {
        id: id.to_string(),
        vendor: vendor.to_string(),
        model: "test".to_string(),
        pci_address: Some(format!("0000:{bus:02x}:00.{}", minor % 8)),
        pci_id: None,
        numa_node: Some(numa),
        local_cpus: cpus(local),
        memory_mib: 81920,
        compute_units: 132,
        driver: None,
        nodes: vec![DeviceNode {
            path: node,
            host_path: None,
            kind: NodeKind::Char,
            major,
            minor,
            permissions: "rw".to_string(),
        }],
        control_nodes: vec![DeviceNode {
            path: ctl.to_string(),
            host_path: None,
            kind: NodeKind::Char,
            major: if vendor == "nvidia" { 195 } else { 240 },
            minor: 255,
            permissions: "rw".to_string(),
        }],
        uuid: None,
    }
}

pub fn pool(name: &str, ids: &[&str], family: FamilyConfig, cpus_per_device: u32) -> PoolConfig {
    PoolConfig {
        cpus_per_device,
        ..PoolConfig::of_ids(name, ids, family)
    }
}

pub fn shared(replicas: u32, mem: u64, pct: u32) -> FamilyConfig {
    FamilyConfig::Shared {
        replicas,
        memory_mib_per_share: mem,
        compute_percent_per_share: pct,
    }
}

/// An 8-slot MIG-like layout: 1g anywhere, 2g on even slots, 4g at 0 or 4, 7g at 0.
pub fn mig() -> FamilyConfig {
    let p = |name: &str, size: u32, starts: Vec<u32>| ProfileConfig {
        name: name.to_string(),
        size,
        memory_mib: u64::from(size) * 10240,
        compute_units: size * 14,
        starts,
    };
    FamilyConfig::Sliced {
        slots: 8,
        profiles: vec![
            p("1g.10gb", 1, (0..8).collect()),
            p("2g.20gb", 2, vec![0, 2, 4, 6]),
            p("4g.40gb", 4, vec![0, 4]),
            p("7g.80gb", 7, vec![0]),
        ],
    }
}

pub fn node(devices: Vec<Device>, cpu_list: &str, pools: &[PoolConfig]) -> Node {
    Node::new(
        Inventory {
            devices,
            cpus: cpus(cpu_list),
        },
        pools,
        &Registry::with_builtins(),
    )
    .unwrap()
}

pub fn count(request: &str, n: u32) -> CountRequest {
    CountRequest {
        request: request.to_string(),
        count: n,
        ..CountRequest::default()
    }
}

pub fn claim(uid: &str, ask: Ask) -> ClaimRequest {
    ClaimRequest {
        uid: uid.to_string(),
        namespace: "ns".to_string(),
        name: format!("claim-{uid}"),
        ask,
    }
}

pub fn counted(uid: &str, reqs: Vec<CountRequest>) -> ClaimRequest {
    claim(uid, Ask::Count(reqs))
}

pub fn named(uid: &str, items: &[(&str, &str)]) -> ClaimRequest {
    claim(
        uid,
        Ask::Named(
            items
                .iter()
                .enumerate()
                .map(|(i, (pool, device))| NamedResult {
                    request: format!("r{i}"),
                    pool: pool.to_string(),
                    device: device.to_string(),
                })
                .collect(),
        ),
    )
}

/// Four NVIDIA GPUs: g0,g1 on NUMA 0 (CPUs 0-3), g2,g3 on NUMA 1 (CPUs 4-7).
pub fn four_gpus() -> Vec<Device> {
    vec![
        gpu("g0", "nvidia", 0, "0-3", 0x17, 0),
        gpu("g1", "nvidia", 0, "0-3", 0x18, 1),
        gpu("g2", "nvidia", 1, "4-7", 0x65, 2),
        gpu("g3", "nvidia", 1, "4-7", 0x66, 3),
    ]
}
