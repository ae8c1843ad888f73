//! Discovery edge cases on small trees built in a temp dir.

use std::fs;
use std::path::Path;

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{Discovery, MAX_HOST_FILE_BYTES, RootFs, discover};

fn write(root: &Path, host_path: &str, text: &str) {
    let p = root.join(host_path.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// One PCI function written as a plain directory (no symlinks needed here).
fn pci(root: &Path, bdf: &str, class: &str, vendor: &str, device: &str) -> String {
    let d = format!("/sys/bus/pci/devices/{bdf}");
    write(root, &format!("{d}/class"), class);
    write(root, &format!("{d}/vendor"), vendor);
    write(root, &format!("{d}/device"), device);
    write(root, &format!("{d}/numa_node"), "0\n");
    write(root, &format!("{d}/local_cpulist"), "0-3\n");
    write(root, "/sys/devices/system/cpu/online", "0-3\n");
    d
}

fn run(root: &Path) -> Discovery {
    let cfg = DiscoveryConfig {
        root: root.to_path_buf(),
        ..DiscoveryConfig::default()
    };
    discover(&RootFs::new(root), &cfg).unwrap()
}

#[test]
fn kfd_topology_compute_units_override_the_model_table() {
    // An MI300X in CPX mode: each partition reports 38 CUs, not the table's 304.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let d = pci(root, "0000:0c:00.0", "0x120000\n", "0x1002\n", "0x74a1\n");
    write(root, &format!("{d}/drm/renderD128/dev"), "226:128\n");
    write(root, "/sys/class/kfd/kfd/dev", "511:0\n");
    write(
        root,
        "/sys/class/kfd/kfd/topology/nodes/1/properties",
        &format!(
            "simd_count 152\nsimd_per_cu 4\nlocation_id {}\ndomain 0\n",
            0x0c << 8
        ),
    );
    let found = run(root);
    assert_eq!(found.warnings, vec![]);
    let gpu = &found.inventory.devices[0];
    assert_eq!(gpu.compute_units, 38);
    assert_eq!(
        gpu.memory_mib,
        192 * 1024,
        "no mem_info_vram_total: the table's size"
    );
    assert_eq!(gpu.control_nodes[0].path, "/dev/kfd");
    assert_eq!(
        (gpu.control_nodes[0].major, gpu.control_nodes[0].minor),
        (511, 0)
    );
}

#[test]
fn amd_gpu_without_kfd_is_kept_with_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (i, bdf) in ["0000:0c:00.0", "0000:0d:00.0"].iter().enumerate() {
        let d = pci(root, bdf, "0x030000\n", "0x1002\n", "0x740f\n");
        write(
            root,
            &format!("{d}/drm/renderD{}/dev", 128 + i),
            &format!("226:{}\n", 128 + i),
        );
    }
    let found = run(root);
    assert_eq!(found.inventory.devices.len(), 2);
    assert!(
        found
            .inventory
            .devices
            .iter()
            .all(|d| d.control_nodes.is_empty())
    );
    assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
    assert!(found.warnings[0].message.contains("/dev/kfd"));
}

#[test]
fn oversized_sysfs_file_skips_the_device_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let big = "0,".repeat(usize::try_from(MAX_HOST_FILE_BYTES).unwrap()) + "0\n";
    let d = pci(root, "0000:0c:00.0", "0x030000\n", "0x8086\n", "0x56a0\n");
    write(root, &format!("{d}/local_cpulist"), &big);
    write(root, &format!("{d}/drm/renderD128/dev"), "226:128\n");
    let found = run(root);
    assert!(found.inventory.devices.is_empty());
    assert_eq!(found.warnings.len(), 1);
    let w = &found.warnings[0];
    assert_eq!(w.device.as_deref(), Some("0000:0c:00.0"));
    assert!(w.to_string().contains("larger than 65536 bytes"), "{w}");
}

#[test]
fn unknown_vendor_gets_a_pci_name_and_its_id_as_model() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let d = pci(root, "0000:41:00.0", "0x120000\n", "0x1e52\n", "0x0001\n");
    fs::create_dir_all(root.join("sys/class/accel/accel0")).unwrap();
    write(root, "/sys/class/accel/accel0/dev", "261:0\n");
    std::os::unix::fs::symlink(
        root.join(d.trim_start_matches('/')),
        root.join("sys/class/accel/accel0/device"),
    )
    .unwrap();
    let found = run(root);
    assert_eq!(found.warnings, vec![]);
    let dev = &found.inventory.devices[0];
    assert_eq!(dev.vendor, "pci-1e52");
    assert_eq!(dev.model, "1e52:0001");
    assert_eq!(dev.nodes[0].path, "/dev/accel/accel0");
}

#[test]
fn accel_node_of_a_device_that_is_not_an_accelerator_is_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let d = pci(root, "0000:41:00.0", "0x020000\n", "0x8086\n", "0x1593\n");
    fs::create_dir_all(root.join("sys/class/accel/accel0")).unwrap();
    write(root, "/sys/class/accel/accel0/dev", "261:0\n");
    std::os::unix::fs::symlink(
        root.join(d.trim_start_matches('/')),
        root.join("sys/class/accel/accel0/device"),
    )
    .unwrap();
    let found = run(root);
    assert!(found.inventory.devices.is_empty());
    assert_eq!(found.warnings.len(), 1);
    assert_eq!(found.warnings[0].device.as_deref(), Some("0000:41:00.0"));
}

#[test]
fn nvidia_without_uvm_keeps_the_gpu_and_warns_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (i, bdf) in ["0000:0c:00.0", "0000:0d:00.0"].iter().enumerate() {
        pci(root, bdf, "0x030000\n", "0x10de\n", "0x2684\n");
        write(
            root,
            &format!("/proc/driver/nvidia/gpus/{bdf}/information"),
            &format!("Model: \t\t NVIDIA GeForce RTX 4090\nDevice Minor: \t {i}\n"),
        );
    }
    write(
        root,
        "/proc/devices",
        "Character devices:\n195 nvidia\n\nBlock devices:\n",
    );
    let found = run(root);
    assert_eq!(found.inventory.devices.len(), 2);
    assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
    assert!(found.warnings[0].message.contains("nvidia-uvm"));
    assert_eq!(found.inventory.devices[1].nodes[0].path, "/dev/nvidia1");
    assert_eq!(found.inventory.devices[1].control_nodes.len(), 1);
}

#[test]
fn a_gpu_uuid_the_driver_does_not_know_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let lines = [
        "GPU UUID: \t GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\n",
        // Older drivers print question marks; a cut value is no UUID either.
        "GPU UUID: \t ??\n",
        "GPU UUID: \t GPU-4cf8db2d\n",
    ];
    for (i, line) in lines.iter().enumerate() {
        let bdf = format!("0000:0{i}:00.0");
        pci(root, &bdf, "0x030000\n", "0x10de\n", "0x2684\n");
        write(
            root,
            &format!("/proc/driver/nvidia/gpus/{bdf}/information"),
            &format!("Model: \t\t NVIDIA L4\n{line}Device Minor: \t {i}\n"),
        );
    }
    write(
        root,
        "/proc/devices",
        "Character devices:\n195 nvidia\n510 nvidia-uvm\n\nBlock devices:\n",
    );
    let found = run(root);
    let uuids: Vec<Option<&str>> = found
        .inventory
        .devices
        .iter()
        .map(|d| d.uuid.as_deref())
        .collect();
    assert_eq!(
        uuids,
        [Some("GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"), None, None]
    );
}
