//! VFIO passthrough discovery and pools against the `vfio-passthrough` fixture tree (see
//! tests/fixtures/sysfs/generate.py): IOMMU groups of one and of two functions, a group with a
//! function still on a host driver, a NIC group with a bridge, and a GPU the host keeps.

use std::path::PathBuf;

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{Discovery, discover_root};
use policies::{
    Ask, ClaimRequest, CountRequest, DeviceNode, DeviceSelector, FamilyConfig, FamilyKind,
    NamedResult, NodeKind, PoolConfig, Registry, VfioGroup,
};

fn run() -> Discovery {
    let cfg = DiscoveryConfig {
        root: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs/vfio-passthrough"),
        ..DiscoveryConfig::default()
    };
    discover_root(&cfg).expect("fixture root is usable")
}

fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        path: path.to_string(),
        host_path: None,
        kind: NodeKind::Char,
        major,
        minor,
        permissions: "rw".to_string(),
    }
}

#[test]
fn groups_become_one_device_each_and_a_partly_bound_group_is_not_offered() {
    let d = run();
    let ids: Vec<&str> = d.inventory.devices.iter().map(|d| d.id.as_str()).collect();
    // Group 58 (0000:b3:00.*) is left out; the host's own GPU is found as before.
    assert_eq!(
        ids,
        [
            "0000:17:00.0",
            "0000:65:00.0",
            "0000:ca:00.0",
            "0000:e3:00.0"
        ]
    );
    let text: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(
        text[0].contains(
            "IOMMU group 58 is not offered: its function 0000:b3:00.1 is bound to the host driver snd_hda_intel"
        ),
        "{}",
        text[0]
    );
    assert_eq!(d.warnings[0].device.as_deref(), Some("0000:b3:00.0"));

    let control = vec![node("/dev/vfio/vfio", 10, 196), node("/dev/iommu", 10, 124)];
    // A group of one function.
    let h100 = &d.inventory.devices[0];
    assert_eq!(
        (h100.vendor.as_str(), h100.model.as_str()),
        ("nvidia", "H100 PCIe")
    );
    assert_eq!(h100.driver.as_deref(), Some("vfio-pci"));
    assert_eq!(h100.numa_node, Some(0));
    assert_eq!(
        h100.vfio,
        Some(VfioGroup {
            group: 21,
            functions: vec!["0000:17:00.0".into()]
        })
    );
    // The group node's minor is not the group number: it comes from sysfs.
    assert_eq!(
        h100.nodes,
        vec![
            node("/dev/vfio/21", 236, 0),
            node("/dev/vfio/devices/vfio0", 237, 0)
        ]
    );
    assert_eq!(h100.control_nodes, control);

    // A group of two functions: the GPU is the primary, its audio function goes with it.
    let rtx = &d.inventory.devices[1];
    assert_eq!(rtx.pci_id.as_deref(), Some("10de:2684"));
    assert_eq!(
        rtx.vfio.as_ref().map(|g| (g.group, g.functions.clone())),
        Some((34, vec!["0000:65:00.0".into(), "0000:65:00.1".into()]))
    );
    assert_eq!(
        rtx.nodes,
        vec![
            node("/dev/vfio/34", 236, 1),
            node("/dev/vfio/devices/vfio1", 237, 1),
            node("/dev/vfio/devices/vfio2", 237, 2)
        ]
    );

    // Any vendor and class: a NIC whose group also holds the bridge above it (on pcieport,
    // which the kernel allows); the bridge is not one of the functions a VM gets.
    let nic = &d.inventory.devices[2];
    assert_eq!(
        (nic.vendor.as_str(), nic.model.as_str()),
        ("intel", "8086:1592")
    );
    assert_eq!(
        nic.vfio.as_ref().map(|g| g.functions.clone()),
        Some(vec!["0000:ca:00.0".to_string()])
    );

    // The host's GPU is an ordinary device.
    let host = &d.inventory.devices[3];
    assert_eq!(host.driver.as_deref(), Some("nvidia"));
    assert!(host.vfio.is_none());
}

fn pools() -> Vec<PoolConfig> {
    let mut vm = PoolConfig::of_ids("vm-gpus", &[], FamilyConfig::Exclusive);
    vm.passthrough = true;
    vm.select = DeviceSelector {
        vendor: Some("nvidia".into()),
        ..DeviceSelector::default()
    };
    // Every device matches this selector, but it never takes a VFIO group.
    let host = PoolConfig::of_ids("gpus", &[], FamilyConfig::Exclusive);
    vec![host, vm]
}

#[test]
fn a_passthrough_pool_takes_only_groups_and_other_pools_never_do() {
    let node = policies::Node::new(run().inventory, &pools(), &Registry::with_builtins()).unwrap();
    let ids = |pool: &str| -> Vec<String> {
        node.pool_devices(pool)
            .unwrap()
            .iter()
            .map(|d| d.id.clone())
            .collect()
    };
    assert_eq!(ids("gpus"), ["0000:e3:00.0"]);
    assert_eq!(ids("vm-gpus"), ["0000:17:00.0", "0000:65:00.0"]);
    // The NIC's group matches no passthrough pool: never handed out.
    assert!(
        node.snapshot()
            .unpooled
            .contains(&"0000:ca:00.0".to_string())
    );
}

#[test]
fn a_grant_carries_the_whole_group_and_a_second_holder_is_refused() {
    let mut node =
        policies::Node::new(run().inventory, &pools(), &Registry::with_builtins()).unwrap();
    let published = node.published();
    let name = published
        .iter()
        .find(|p| p.device_id == "0000:65:00.0")
        .unwrap()
        .name
        .clone();
    let ask = |uid: &str| ClaimRequest {
        uid: uid.into(),
        namespace: "vms".into(),
        name: uid.into(),
        ask: Ask::Named(vec![NamedResult {
            request: "gpu".into(),
            pool: "vm-gpus".into(),
            device: name.clone(),
        }]),
    };
    node.allocate(&ask("vm-a")).unwrap();
    let edits = node.edits("vm-a").unwrap();
    assert_eq!(edits.len(), 1);
    let paths: Vec<&str> = edits[0]
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/vfio/34",
            "/dev/vfio/devices/vfio1",
            "/dev/vfio/devices/vfio2",
            "/dev/vfio/vfio",
            "/dev/iommu"
        ]
    );
    assert_eq!(
        edits[0].env,
        [(
            "ACCEL_VFIO_GROUP_34".to_string(),
            "0000:65:00.0,0000:65:00.1".to_string()
        )]
    );
    let refused = node.allocate(&ask("vm-b")).unwrap_err().to_string();
    assert!(refused.contains("vm-a"), "{refused}");

    // A count ask takes the other group whole, then nothing is left.
    let count = |uid: &str| ClaimRequest {
        uid: uid.into(),
        namespace: "vms".into(),
        name: uid.into(),
        ask: Ask::Count(vec![CountRequest {
            request: "gpu".into(),
            count: 1,
            family: Some(FamilyKind::Exclusive),
            selector: DeviceSelector {
                vendor: Some("nvidia".into()),
                ..DeviceSelector::default()
            },
            profile: None,
            shares: None,
        }]),
    };
    // While a pool of host devices matches, a count ask takes from it only: the host GPU,
    // then nothing, never a group.
    node.allocate(&count("c-1")).unwrap();
    let c = node.edits("c-1").unwrap();
    assert_eq!(c[0].device_nodes[0].path, "/dev/nvidia0", "{c:?}");
    let refused = node.allocate(&count("c-2")).unwrap_err().to_string();
    assert!(refused.contains("c-1"), "{refused}");
    // A selector only groups match (their PCI id) takes the other group, whole.
    let mut by_id = count("vm-c");
    if let Ask::Count(r) = &mut by_id.ask {
        r[0].selector.pci_id = Some("10de:2331".into());
    }
    node.allocate(&by_id).unwrap();
    let c = node.edits("vm-c").unwrap();
    assert_eq!(c[0].device_nodes[0].path, "/dev/vfio/21", "{c:?}");
}

#[test]
fn a_passthrough_pool_of_another_family_is_refused() {
    let mut p = pools();
    p[1].family = FamilyConfig::Shared {
        replicas: 2,
        memory_mib_per_share: 0,
        compute_percent_per_share: 0,
        mps: None,
    };
    let e = policies::Node::new(run().inventory, &p, &Registry::with_builtins())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        e,
        "pool vm-gpus: a passthrough pool hands out whole IOMMU groups, one holder each, so its family must be exclusive, not shared"
    );
}
