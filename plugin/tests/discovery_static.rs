//! The static inventory: alone, and merged over what sysfs finds.

use std::path::PathBuf;

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{RootFs, discover};
use policies::{Device, DeviceNode, NodeKind};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn static_device(id: &str, model: &str) -> Device {
    Device {
        id: id.to_string(),
        vendor: "nvidia".to_string(),
        model: model.to_string(),
        pci_address: None,
        pci_id: None,
        numa_node: Some(0),
        local_cpus: "0-3".parse().unwrap(),
        memory_mib: 1024,
        compute_units: 8,
        driver: None,
        nodes: vec![DeviceNode {
            path: "/dev/null".to_string(),
            host_path: None,
            kind: NodeKind::Char,
            major: 1,
            minor: 3,
            permissions: "rw".to_string(),
        }],
        control_nodes: vec![],
        uuid: None,
    }
}

#[test]
fn static_only_reads_nothing_from_the_host() {
    let cfg = DiscoveryConfig {
        sysfs: false,
        root: PathBuf::from("/nonexistent-root"),
        static_devices: vec![static_device("sim1", "Sim"), static_device("sim0", "Sim")],
        cpus: Some("0-7".parse().unwrap()),
        ..DiscoveryConfig::default()
    };
    let d = discover(&RootFs::new("/nonexistent-root"), &cfg).unwrap();
    assert!(d.warnings.is_empty());
    let ids: Vec<&str> = d.inventory.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["sim0", "sim1"], "sorted by id");
    assert_eq!(d.inventory.cpus, "0-7".parse().unwrap());
}

#[test]
fn static_devices_replace_by_id_and_add_to_sysfs() {
    let root = fixture("workstation-mixed");
    let cfg = DiscoveryConfig {
        sysfs: true,
        root: root.clone(),
        static_devices: vec![
            static_device("0000:01:00.0", "Overridden"),
            static_device("zz-sim", "Sim"),
        ],
        cpus: Some("0-15".parse().unwrap()),
        ..DiscoveryConfig::default()
    };
    let d = discover(&RootFs::new(root), &cfg).unwrap();
    let ids: Vec<&str> = d.inventory.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["0000:00:02.0", "0000:01:00.0", "zz-sim"]);
    assert_eq!(d.inventory.devices[1].model, "Overridden");
    assert_eq!(
        d.inventory.devices[0].vendor, "intel",
        "the found device stays"
    );
    assert_eq!(d.inventory.cpus, "0-15".parse().unwrap(), "config cpus win");
}

/// One GPU under two ids (issue 39, item 2): a static device that is a discovered one under
/// another id (the same PCI address, or the same device node) would be published and granted
/// twice. The static entry is the operator's word, as it is for a device of the same id: the
/// discovered device is dropped, and a warning names both ids and what they share.
#[test]
fn a_static_device_that_is_a_discovered_one_under_another_id_replaces_it_with_a_warning() {
    let root = fixture("workstation-mixed");
    // The RTX 4090 is 0000:01:00.0 with /dev/nvidia0 (c 195:0); the iGPU 0000:00:02.0.
    let by_node = Device {
        nodes: vec![DeviceNode {
            path: "/dev/nvidia0".to_string(),
            host_path: None,
            kind: NodeKind::Char,
            major: 195,
            minor: 0,
            permissions: "rw".to_string(),
        }],
        ..static_device("rtx", "RTX by node")
    };
    let by_pci = Device {
        pci_address: Some("0000:00:02.0".to_string()),
        ..static_device("igpu", "iGPU by PCI address")
    };
    let cfg = DiscoveryConfig {
        sysfs: true,
        root: root.clone(),
        static_devices: vec![by_node, by_pci],
        cpus: Some("0-15".parse().unwrap()),
        ..DiscoveryConfig::default()
    };
    let d = discover(&RootFs::new(root), &cfg).unwrap();
    let ids: Vec<&str> = d.inventory.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["igpu", "rtx"], "each GPU once, under its static id");
    let warnings: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "device 0000:00:02.0: found by discovery with PCI address 0000:00:02.0, which static device igpu (discovery.static_devices[1]) has too: one device under two ids, so only the static entry is kept; give that entry the id 0000:00:02.0 (it then replaces the found device without this warning) or remove it",
            "device 0000:01:00.0: found by discovery with device node c 195:0 (/dev/nvidia0), which static device rtx (discovery.static_devices[0]) has too: one device under two ids, so only the static entry is kept; give that entry the id 0000:01:00.0 (it then replaces the found device without this warning) or remove it",
        ]
    );
}
