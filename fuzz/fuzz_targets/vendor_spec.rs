//! Vendor CDI specs (docs/gpus.md): arbitrary file content in a vendor spec directory, read the
//! way the daemon reads it (`vendor::load_dirs`), then matched against a GPU of the inventory and
//! merged for the annotation path. Whatever the file holds, reading it is a catalog or one
//! sentence naming the file, never a panic.
#![no_main]

use nri_accel::vendor::{load_dirs, merge_for_container};
use policies::{Device, DeviceNode, Inventory, NodeKind};

fn gpu() -> Device {
    let node = |path: &str, minor| DeviceNode {
        path: path.into(),
        host_path: None,
        kind: NodeKind::Char,
        major: 195,
        minor,
        permissions: "rw".into(),
    };
    Device {
        id: "0000:18:00.0".into(),
        vendor: "nvidia".into(),
        model: String::new(),
        pci_address: Some("0000:18:00.0".into()),
        pci_id: None,
        numa_node: None,
        local_cpus: Default::default(),
        memory_mib: 0,
        compute_units: 0,
        driver: None,
        nodes: vec![node("/dev/nvidia0", 0)],
        vfio: None,
        control_nodes: vec![node("/dev/nvidiactl", 255)],
        uuid: Some("GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c".into()),
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, content)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let ext = if sel & 1 == 0 { "yaml" } else { "json" };
    let path = dir.path().join(format!("vendor.{ext}"));
    std::fs::write(&path, content).expect("write spec");
    let dirs = vec![dir.path().to_path_buf()];
    let Ok(catalog) = load_dirs(&dirs, "accel.nri.io/device", "accel.nri.io-device_") else {
        return;
    };
    let dev = gpu();
    if let Ok(Some(m)) = catalog.find(&dev) {
        let inventory = Inventory {
            devices: vec![dev],
            cpus: Default::default(),
        };
        let _ = merge_for_container(&catalog, &[m.name], &inventory, dir.path());
    }
});
