//! Discovery on arbitrary sysfs file contents: never panics, and every
//! device is either found whole or named in a warning.

use std::fs;
use std::path::Path;

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{RootFs, discover};
use proptest::prelude::*;

fn write(root: &Path, host_path: &str, text: &[u8]) {
    let p = root.join(host_path.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// Either a plausible value or arbitrary bytes.
fn content(good: &'static str) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(good.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..24),
        1 => "[0-9a-fx:,\\- \n]{0,16}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_file_contents_give_a_device_or_a_warning_naming_it(
        class in content("0x030000\n"),
        vendor in content("0x1002\n"),
        numa in content("1\n"),
        cpus in content("0-7\n"),
        render in content("226:128\n"),
        minor_info in content("Model: X\nDevice Minor: 0\n"),
        proc_devices in content("Character devices:\n195 nvidia\n"),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let d = "/sys/bus/pci/devices/0000:0c:00.0";
        write(root, &format!("{d}/class"), &class);
        write(root, &format!("{d}/vendor"), &vendor);
        write(root, &format!("{d}/device"), b"0x1234\n");
        write(root, &format!("{d}/numa_node"), &numa);
        write(root, &format!("{d}/local_cpulist"), &cpus);
        write(root, &format!("{d}/drm/renderD128/dev"), &render);
        write(root, "/proc/driver/nvidia/gpus/0000:0c:00.0/information", &minor_info);
        write(root, "/proc/devices", &proc_devices);
        write(root, "/sys/devices/system/cpu/online", b"0-7\n");
        let cfg = DiscoveryConfig { root: root.to_path_buf(), ..DiscoveryConfig::default() };
        let found = discover(&RootFs::new(root), &cfg).unwrap();
        let is_accel = std::str::from_utf8(&class)
            .ok()
            .and_then(|c| u32::from_str_radix(c.trim().trim_start_matches("0x"), 16).ok())
            .is_some_and(|c| matches!(c >> 16, 0x03 | 0x12));
        let kept = found.inventory.devices.len();
        let warned = found.warnings.iter().any(|w| w.device.as_deref() == Some("0000:0c:00.0"));
        if kept == 1 {
            let dev = &found.inventory.devices[0];
            prop_assert!(!dev.nodes.is_empty());
            prop_assert_eq!(&dev.id, "0000:0c:00.0");
        } else if is_accel {
            prop_assert!(warned, "an accelerator was dropped silently: {:?}", found.warnings);
        }
    }
}
