//! Discovery against fixture trees shaped like real machines.

use std::path::PathBuf;

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{Discovery, DiscoveryError, RootFs, discover, discover_root};
use policies::{CpuSet, Device, DeviceNode, NodeKind};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn run(name: &str) -> Discovery {
    let cfg = DiscoveryConfig {
        root: fixture(name),
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

fn cpus(list: &str) -> CpuSet {
    list.parse().unwrap()
}

fn ids(d: &Discovery) -> Vec<&str> {
    d.inventory.devices.iter().map(|d| d.id.as_str()).collect()
}

#[test]
fn dgx_8xh100_finds_eight_gpus_over_two_numa_nodes() {
    let d = run("dgx-8xh100");
    assert_eq!(d.warnings, vec![]);
    assert_eq!(
        ids(&d),
        [
            "0000:18:00.0",
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
            "0000:9a:00.0",
            "0000:ab:00.0",
            "0000:ba:00.0",
            "0000:db:00.0"
        ]
    );
    assert_eq!(d.inventory.cpus, cpus("0-223"));
    let control = vec![
        node("/dev/nvidiactl", 195, 255),
        node("/dev/nvidia-uvm", 510, 0),
        node("/dev/nvidia-uvm-tools", 510, 1),
    ];
    for (i, dev) in d.inventory.devices.iter().enumerate() {
        let minor = u32::try_from(i).unwrap();
        let numa = if i < 4 { 0 } else { 1 };
        let local = if i < 4 {
            "0-55,112-167"
        } else {
            "56-111,168-223"
        };
        assert_eq!(dev.vendor, "nvidia");
        assert_eq!(dev.model, "NVIDIA H100 80GB HBM3");
        // "GPU UUID" of the driver's information file (the fixture's: minor, then the bus).
        let uuid = format!("GPU-{minor:08x}-5f1c-3b7e-a0d2-{}00c0ffee00", &dev.id[5..7]);
        assert_eq!(dev.uuid.as_deref(), Some(uuid.as_str()));
        assert_eq!(dev.pci_id.as_deref(), Some("10de:2330"));
        assert_eq!(dev.pci_address.as_deref(), Some(dev.id.as_str()));
        assert_eq!(dev.numa_node, Some(numa), "{}", dev.id);
        assert_eq!(dev.local_cpus, cpus(local), "{}", dev.id);
        assert_eq!(dev.driver.as_deref(), Some("nvidia"));
        assert_eq!(dev.compute_units, 132);
        assert_eq!(dev.memory_mib, 80 * 1024);
        assert_eq!(
            dev.nodes,
            vec![node(&format!("/dev/nvidia{minor}"), 195, minor)]
        );
        assert_eq!(dev.control_nodes, control);
    }
}

#[test]
fn mi300x_8_finds_render_and_card_nodes_and_kfd() {
    let d = run("mi300x-8");
    assert_eq!(
        d.warnings,
        vec![],
        "the BMC's display-only VGA is left out quietly"
    );
    let expected_ids = [
        "0000:05:00.0",
        "0000:26:00.0",
        "0000:46:00.0",
        "0000:65:00.0",
        "0000:85:00.0",
        "0000:a6:00.0",
        "0000:c6:00.0",
        "0000:e5:00.0",
    ];
    assert_eq!(ids(&d), expected_ids);
    assert_eq!(d.inventory.cpus, cpus("0-383"));
    for (i, dev) in d.inventory.devices.iter().enumerate() {
        let n = u32::try_from(i).unwrap();
        assert_eq!(dev.vendor, "amd");
        assert_eq!(dev.model, "Instinct MI300X");
        assert_eq!(dev.pci_id.as_deref(), Some("1002:74a1"));
        assert_eq!(dev.driver.as_deref(), Some("amdgpu"));
        assert_eq!(dev.numa_node, Some(if i < 4 { 0 } else { 1 }));
        let local = if i < 4 {
            "0-95,192-287"
        } else {
            "96-191,288-383"
        };
        assert_eq!(dev.local_cpus, cpus(local));
        assert_eq!(dev.memory_mib, 206_141_652_992 / (1024 * 1024));
        assert_eq!(dev.compute_units, 1216 / 4);
        assert_eq!(
            dev.nodes,
            vec![
                node(&format!("/dev/dri/renderD{}", 128 + n), 226, 128 + n),
                node(&format!("/dev/dri/card{}", n + 1), 226, n + 1),
            ]
        );
        assert_eq!(dev.control_nodes, vec![node("/dev/kfd", 235, 0)]);
    }
}

#[test]
fn accel_gaudi_maps_accel_nodes_by_device_link_not_by_order() {
    let d = run("accel-gaudi");
    assert_eq!(d.warnings, vec![]);
    assert_eq!(
        ids(&d),
        [
            "0000:33:00.0",
            "0000:34:00.0",
            "0000:9a:00.0",
            "0000:9b:00.0"
        ]
    );
    let accel: Vec<(&str, &DeviceNode)> = d
        .inventory
        .devices
        .iter()
        .map(|d| (d.id.as_str(), &d.nodes[0]))
        .collect();
    assert_eq!(accel[0].1, &node("/dev/accel/accel0", 261, 0));
    assert_eq!(accel[1].1, &node("/dev/accel/accel1", 261, 1));
    assert_eq!(accel[2].1, &node("/dev/accel/accel3", 261, 3));
    assert_eq!(accel[3].1, &node("/dev/accel/accel2", 261, 2));
    for dev in &d.inventory.devices {
        assert_eq!(dev.vendor, "habana");
        assert_eq!(dev.model, "Gaudi2");
        assert_eq!(dev.driver.as_deref(), Some("habanalabs"));
        assert_eq!(dev.nodes.len(), 1);
        assert!(dev.control_nodes.is_empty());
    }
    assert_eq!(d.inventory.devices[0].numa_node, Some(0));
    assert_eq!(d.inventory.devices[3].numa_node, Some(1));
    assert_eq!(d.inventory.devices[3].local_cpus, cpus("40-79,120-159"));
}

#[test]
fn workstation_mixed_keeps_the_igpu_and_the_rtx_and_ignores_the_rest() {
    let d = run("workstation-mixed");
    assert_eq!(d.warnings, vec![]);
    assert_eq!(ids(&d), ["0000:00:02.0", "0000:01:00.0"]);
    let igpu: &Device = &d.inventory.devices[0];
    assert_eq!(igpu.vendor, "intel");
    assert_eq!(igpu.model, "UHD Graphics 770");
    assert_eq!(igpu.numa_node, None, "numa_node -1 means none");
    assert_eq!(igpu.local_cpus, cpus("0-31"));
    assert_eq!(igpu.driver.as_deref(), Some("i915"));
    assert_eq!(
        igpu.nodes,
        vec![
            node("/dev/dri/renderD128", 226, 128),
            node("/dev/dri/card0", 226, 0)
        ]
    );
    assert!(igpu.control_nodes.is_empty());
    let rtx = &d.inventory.devices[1];
    assert_eq!(rtx.vendor, "nvidia");
    assert_eq!(rtx.model, "NVIDIA GeForce RTX 4090");
    assert_eq!(rtx.nodes, vec![node("/dev/nvidia0", 195, 0)]);
    assert_eq!(
        rtx.control_nodes,
        vec![
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-uvm", 511, 0),
            node("/dev/nvidia-uvm-tools", 511, 1)
        ]
    );
    assert_eq!(d.inventory.cpus, cpus("0-31"));
}

#[test]
fn broken_tree_warns_about_each_bad_device_and_keeps_the_good_ones() {
    let d = run("broken");
    assert_eq!(ids(&d), ["0000:18:00.0", "0000:ab:00.0"]);
    let warned: Vec<&str> = d
        .warnings
        .iter()
        .filter_map(|w| w.device.as_deref())
        .collect();
    assert_eq!(
        warned,
        [
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
            "0000:9a:00.0"
        ]
    );
    let text: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    assert!(
        text[0].contains("NUMA node \"banana\" is not a number"),
        "{}",
        text[0]
    );
    assert!(
        text[0].ends_with("(/sys/bus/pci/devices/0000:2a:00.0/numa_node)"),
        "{}",
        text[0]
    );
    assert!(text[1].contains("cannot read the PCI class"), "{}", text[1]);
    assert!(text[2].contains("bound driver: vfio-pci"), "{}", text[2]);
    assert!(text[3].contains("CPU id too large"), "{}", text[3]);
    assert!(
        text.iter().all(|t| t.contains("device skipped")),
        "{text:?}"
    );
}

#[test]
fn a_root_without_sys_is_an_error_naming_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DiscoveryConfig {
        root: dir.path().to_path_buf(),
        ..DiscoveryConfig::default()
    };
    let err = discover(&RootFs::new(dir.path()), &cfg).unwrap_err();
    let DiscoveryError::Root { root, .. } = &err;
    assert_eq!(root, dir.path());
    assert!(
        err.to_string().contains("discovery.static_devices"),
        "{err}"
    );
}
