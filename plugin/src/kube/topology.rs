//! The PCIe root complex of each device, published as `resource.kubernetes.io/pcieRoot` so a
//! claim can ask for devices of several drivers behind the same root.
//!
//! The value is the root complex's sysfs name, `pci<domain>:<bus>` (the format Kubernetes
//! defines for the attribute), read from where `/sys/bus/pci/devices/<address>` links to:
//! `../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0` is behind root `pci0000:16`. A device
//! without a PCI address or whose link cannot be read gets no attribute (never a guess).

use std::collections::BTreeMap;
use std::path::Path;

use policies::Inventory;

use crate::discovery::HostFs;

/// Host directory of the PCI devices' links.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Whether `part` is a root complex name: `pci` + 4 hex digits + `:` + 2 or more hex digits.
fn is_root_name(part: &str) -> bool {
    let Some(rest) = part.strip_prefix("pci") else {
        return false;
    };
    let Some((domain, bus)) = rest.split_once(':') else {
        return false;
    };
    domain.len() == 4
        && (2..=4).contains(&bus.len())
        && domain
            .bytes()
            .chain(bus.bytes())
            .all(|b| b.is_ascii_hexdigit())
}

/// The root complex in a device link target, if any.
pub fn root_of_link(target: &Path) -> Option<String> {
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|p| is_root_name(p))
        .map(str::to_string)
}

/// Device id -> PCIe root, for every device of `inventory` whose root can be read.
pub fn pcie_roots(host: &dyn HostFs, inventory: &Inventory) -> BTreeMap<String, String> {
    inventory
        .devices
        .iter()
        .filter_map(|d| {
            let addr = d.pci_address.as_deref()?;
            let target = host.read_link(&Path::new(PCI_DEVICES).join(addr)).ok()?;
            Some((d.id.clone(), root_of_link(&target)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::RootFs;

    #[test]
    fn the_root_is_read_from_the_device_link() {
        let t = Path::new("../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0");
        assert_eq!(root_of_link(t).as_deref(), Some("pci0000:16"));
        assert_eq!(root_of_link(Path::new("../../../devices/platform/x")), None);
    }

    #[test]
    fn roots_come_from_a_sysfs_tree() {
        let dir = tempfile::tempdir().unwrap();
        let devices = dir
            .path()
            .join("sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        std::fs::create_dir_all(&devices).unwrap();
        let bus = dir.path().join("sys/bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
            bus.join("0000:3b:00.0"),
        )
        .unwrap();
        let gpu = |id: &str, pci: Option<&str>| policies::Device {
            id: id.into(),
            pci_address: pci.map(str::to_string),
            ..crate::fixtures::simulated_gpu(0, 0, Default::default(), String::new())
        };
        let inventory = Inventory {
            devices: vec![gpu("g0", Some("0000:3b:00.0")), gpu("static", None)],
            cpus: Default::default(),
        };
        let roots = pcie_roots(&RootFs::new(dir.path()), &inventory);
        assert_eq!(roots.len(), 1);
        assert_eq!(roots["g0"], "pci0000:3a");
    }
}
