//! The kernel accel subsystem: `/sys/class/accel/accelN` -> `/dev/accel/accelN`.

use std::path::Path;

use policies::DeviceNode;

use super::drm::numbered;
use super::pci::is_pci_address;
use super::scan::Scan;

/// Host directory of accel devices.
const ACCEL_CLASS: &str = "/sys/class/accel";

/// Accel device nodes by the PCI address they belong to, in accel order.
pub(crate) fn scan_accel(scan: &mut Scan<'_>) -> Vec<(String, DeviceNode)> {
    let class = Path::new(ACCEL_CLASS);
    let Ok(names) = scan.host.read_dir(class) else {
        return Vec::new(); // no accel subsystem on this kernel
    };
    let mut found = Vec::new();
    for name in names.into_iter().filter(|n| numbered(n, "accel")) {
        let dir = class.join(&name);
        let link = dir.join("device");
        let bdf = match scan.host.read_link(&link) {
            Ok(t) => t.file_name().and_then(|n| n.to_str()).map(str::to_string),
            Err(e) => {
                scan.warn(
                    None,
                    Some(&link),
                    format!("{name}: cannot read its device link: {e}; skipped"),
                );
                continue;
            }
        };
        let Some(bdf) = bdf.filter(|b| is_pci_address(b)) else {
            scan.warn(
                None,
                Some(&link),
                format!("{name}: its device is not a PCI device; skipped"),
            );
            continue;
        };
        if let Some(node) =
            scan.dev_node(Some(&bdf), &dir.join("dev"), format!("/dev/accel/{name}"))
        {
            found.push((bdf, node));
        }
    }
    found
}
