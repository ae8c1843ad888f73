//! VFIO passthrough devices: PCI functions bound to `vfio-pci`, gathered into their IOMMU groups.
//!
//! The kernel hands an IOMMU group to one user as a whole (`/dev/vfio/<group>`), so a group is
//! one device of the inventory: named and described by its primary function (an accelerator
//! function if the group has one, else its lowest address), with every `vfio-pci` function of the
//! group in [`VfioGroup::functions`]. A group with a function still bound to a host driver cannot
//! be opened by a VM and is not offered; the warning names that function. docs/vms.md.

use std::collections::BTreeMap;
use std::path::Path;

use policies::{Device, DeviceNode, VfioGroup};

use super::pci::{
    PCI_DEVICES, PciCandidate, VFIO_PCI, is_accelerator_class, is_bridge_class, read_class,
    read_driver,
};
use super::scan::{Scan, char_node};

/// Host directory of the IOMMU groups.
pub(crate) const IOMMU_GROUPS: &str = "/sys/kernel/iommu_groups";

/// The container-wide VFIO node: misc major 10, minor 196 (the kernel's `VFIO_MINOR`), used
/// when `/sys/class/misc/vfio/dev` cannot be read.
const VFIO_CONTAINER: (u32, u32) = (10, 196);

/// Drivers the kernel lets a function of a group be bound to while the group is used through
/// VFIO, besides `vfio-pci` and no driver at all.
const ALLOWED_DRIVERS: &[&str] = &["pci-stub"];

/// The IOMMU group number a PCI function's `iommu_group` link names.
fn group_of(scan: &Scan<'_>, dir: &Path) -> Option<u32> {
    let link = scan.host.read_link(&dir.join("iommu_group")).ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Turns the `vfio-pci` functions `functions` into one device per IOMMU group.
pub(crate) fn groups(scan: &mut Scan<'_>, functions: Vec<PciCandidate>) -> Vec<Device> {
    let mut by_group: BTreeMap<u32, Vec<PciCandidate>> = BTreeMap::new();
    for f in functions {
        match group_of(scan, &f.dir) {
            Some(g) => by_group.entry(g).or_default().push(f),
            None => {
                let id = f.device.id.clone();
                scan.warn(
                    Some(&id),
                    Some(&f.dir.join("iommu_group")),
                    format!(
                        "bound to {VFIO_PCI} but in no IOMMU group, so no VM can open it; turn the IOMMU on (intel_iommu=on or amd_iommu=on on the kernel command line); device skipped"
                    ),
                );
            }
        }
    }
    let control = control_nodes(scan);
    let mut out = Vec::new();
    for (group, members) in by_group {
        if let Some(d) = group_device(scan, group, members, &control) {
            out.push(d);
        }
    }
    out
}

/// The device standing for IOMMU group `group`, whose `vfio-pci` functions are `vfio`; `None`
/// (with a warning) when the group cannot be handed out whole.
fn group_device(
    scan: &mut Scan<'_>,
    group: u32,
    mut vfio: Vec<PciCandidate>,
    control: &[DeviceNode],
) -> Option<Device> {
    // The primary function: an accelerator if the group has one, else the lowest address.
    vfio.sort_by(|a, b| {
        (!is_accelerator_class(a.class), &a.device.id)
            .cmp(&(!is_accelerator_class(b.class), &b.device.id))
    });
    let primary = vfio[0].device.id.clone();
    let members_dir = Path::new(IOMMU_GROUPS)
        .join(group.to_string())
        .join("devices");
    let members = match scan.host.read_dir(&members_dir) {
        Ok(m) => m,
        Err(e) => {
            scan.warn(
                Some(&primary),
                Some(&members_dir),
                format!(
                    "cannot list the functions of IOMMU group {group}: {e}; the group is handed out whole or not at all, so it is not offered"
                ),
            );
            return None;
        }
    };
    for m in members {
        if vfio.iter().any(|f| f.device.id == m) {
            continue;
        }
        let dir = Path::new(PCI_DEVICES).join(&m);
        let driver = read_driver(scan, &dir);
        let bridge = read_class(scan, &dir).is_some_and(is_bridge_class);
        match driver {
            Some(d) if !bridge && !ALLOWED_DRIVERS.contains(&d.as_str()) => {
                scan.warn(
                    Some(&primary),
                    Some(&dir.join("driver")),
                    format!(
                        "IOMMU group {group} is not offered: its function {m} is bound to the host driver {d}, and a group goes to a VM whole; bind {m} to {VFIO_PCI} too (or unbind it)"
                    ),
                );
                return None;
            }
            _ => {}
        }
    }
    let group_file = Path::new("/sys/class/vfio")
        .join(group.to_string())
        .join("dev");
    let mut nodes =
        vec![scan.dev_node(Some(&primary), &group_file, format!("/dev/vfio/{group}"))?];
    // iommufd: each function's VFIO device cdev, where the kernel made one.
    for f in &vfio {
        let cdev_dir = f.dir.join("vfio-dev");
        let Ok(names) = scan.host.read_dir(&cdev_dir) else {
            continue;
        };
        for name in names
            .into_iter()
            .filter(|n| super::drm::numbered(n, "vfio"))
        {
            let dev_file = cdev_dir.join(&name).join("dev");
            let id = f.device.id.clone();
            nodes.extend(scan.dev_node(Some(&id), &dev_file, format!("/dev/vfio/devices/{name}")));
        }
    }
    let mut control = control.to_vec();
    if nodes.len() > 1 {
        let iommu = Path::new("/sys/class/misc/iommu/dev");
        if scan.host.exists(iommu) {
            control.extend(scan.dev_node(Some(&primary), iommu, "/dev/iommu".to_string()));
        }
    }
    let functions = vfio.iter().map(|f| f.device.id.clone()).collect();
    let PciCandidate { mut device, .. } = vfio.swap_remove(0);
    device.nodes = nodes;
    device.control_nodes = control;
    device.vfio = Some(VfioGroup { group, functions });
    Some(device)
}

/// `/dev/vfio/vfio`, the node every VFIO user opens first.
fn control_nodes(scan: &mut Scan<'_>) -> Vec<DeviceNode> {
    let path = Path::new("/sys/class/misc/vfio/dev");
    let node = match scan.host.read(path) {
        Ok(_) => scan.dev_node(None, path, "/dev/vfio/vfio".to_string()),
        Err(_) => None,
    };
    vec![node.unwrap_or_else(|| {
        char_node(
            "/dev/vfio/vfio".to_string(),
            VFIO_CONTAINER.0,
            VFIO_CONTAINER.1,
        )
    })]
}
