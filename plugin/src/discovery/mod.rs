//! Device discovery: what accelerators the node has, read from sysfs and
//! procfs under a configurable root, merged with the config's static devices.
//!
//! A device that cannot be read whole is skipped and named in a warning;
//! discovery goes on. Only a root without `/sys` is an error.

mod accel;
mod drm;
mod hostfs;
mod nvidia;
mod pci;
mod scan;
mod vfio;
mod warning;

use std::path::Path;

use policies::{CpuSet, Device, Inventory};

pub use hostfs::{HostFs, MAX_HOST_FILE_BYTES, RootFs};
pub use pci::{PCI_DEVICES, VFIO_PCI};
pub use warning::{DiscoveryError, DiscoveryWarning};

use crate::config::{DiscoveryConfig, same_device};

/// What discovery found, and what it had to leave out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Devices sorted by id, and the node's CPUs.
    pub inventory: Inventory,
    /// Devices or files skipped, each naming the device and file.
    pub warnings: Vec<DiscoveryWarning>,
}

/// Host path of the online CPU list.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// Builds the inventory as `cfg` says: sysfs (read through `host`), the
/// static devices, or both (a static device replaces a found one of the same id).
/// `host` is normally `RootFs::new(&cfg.root)` (see [`discover_root`]); `cfg.root`
/// itself is only used to name the root in errors.
pub fn discover(host: &dyn HostFs, cfg: &DiscoveryConfig) -> Result<Discovery, DiscoveryError> {
    let mut found = if cfg.sysfs {
        discover_sysfs(host, cfg)?
    } else {
        Discovery::default()
    };
    if let Some(cpus) = &cfg.cpus {
        found.inventory.cpus = cpus.clone();
    }
    let merged = merge_static(&mut found.inventory, &cfg.static_devices);
    found.warnings.extend(merged);
    Ok(found)
}

/// [`discover`] on the real host under `cfg.root`: what `nri-accel run` and
/// `nri-accel discover` call.
pub fn discover_root(cfg: &DiscoveryConfig) -> Result<Discovery, DiscoveryError> {
    discover(&RootFs::new(&cfg.root), cfg)
}

/// Adds `static_devices` to `inventory`, replacing devices of the same id, and keeps it sorted.
///
/// A found device that is a static one under another id (the same PCI address or device node,
/// see [`crate::config::same_device`]) is dropped too, with a warning naming both ids and what
/// they share: published under both ids it would be granted twice. The static entry is kept
/// because it is the operator's word, as for a device of the same id (docs/configuration.md,
/// "One device, one id"). Returns the warnings, in the found devices' order.
pub fn merge_static(inventory: &mut Inventory, static_devices: &[Device]) -> Vec<DiscoveryWarning> {
    let mut warnings = Vec::new();
    inventory.devices.retain(|found| {
        if static_devices.iter().any(|s| s.id == found.id) {
            return true;
        }
        let Some((i, dev, what)) = static_devices
            .iter()
            .enumerate()
            .find_map(|(i, s)| same_device::shared(found, s).map(|what| (i, s, what)))
        else {
            return true;
        };
        warnings.push(DiscoveryWarning {
            device: Some(found.id.clone()),
            path: None,
            message: format!(
                "found by discovery with {what}, which static device {} (discovery.static_devices[{i}]) has too: one device under two ids, so only the static entry is kept; give that entry the id {} (it then replaces the found device without this warning) or remove it",
                dev.id, found.id
            ),
        });
        false
    });
    for dev in static_devices {
        match inventory.devices.iter_mut().find(|d| d.id == dev.id) {
            Some(existing) => *existing = dev.clone(),
            None => inventory.devices.push(dev.clone()),
        }
    }
    inventory.devices.sort_by(|a, b| a.id.cmp(&b.id));
    warnings
}

/// Scans the host: PCI accelerators, their nodes, VFIO passthrough groups, and the online CPUs.
fn discover_sysfs(host: &dyn HostFs, cfg: &DiscoveryConfig) -> Result<Discovery, DiscoveryError> {
    if !host.is_dir(Path::new("/sys")) {
        return Err(DiscoveryError::Root {
            root: cfg.root.clone(),
            path: "/sys".into(),
        });
    }
    let mut scan = scan::Scan::new(host);
    let (passthrough, mut candidates): (Vec<_>, Vec<_>) = pci::scan_pci(&mut scan)
        .into_iter()
        .partition(|c| c.device.driver.as_deref() == Some(pci::VFIO_PCI));
    let accel_nodes = accel::scan_accel(&mut scan);
    let kfd = if candidates.iter().any(|c| c.vendor == pci::AMD) {
        drm::read_kfd(&mut scan)
    } else {
        drm::Kfd::default()
    };

    for (bdf, node) in &accel_nodes {
        match candidates.iter_mut().find(|c| c.device.id == *bdf) {
            Some(c) => c.device.nodes.push(node.clone()),
            None => scan.warn(
                Some(bdf),
                None,
                format!("{} belongs to a PCI device that is not an accelerator or was skipped; node ignored", node.path),
            ),
        }
    }

    let mut devices = Vec::new();
    for mut c in candidates.drain(..) {
        if c.vendor == pci::NVIDIA {
            if !nvidia::attach(&mut scan, &mut c) {
                continue;
            }
        } else {
            if !drm::attach(&mut scan, &mut c) {
                continue;
            }
            drm::attach_amd(&mut scan, &mut c, &kfd);
        }
        if c.device.nodes.is_empty() {
            let driver = c.device.driver.as_deref().unwrap_or("none");
            scan.warn(
                Some(&c.device.id),
                Some(&c.dir),
                format!("no device node found (bound driver: {driver}); device skipped"),
            );
            continue;
        }
        devices.push(c.device);
    }
    devices.extend(vfio::groups(&mut scan, passthrough));
    devices.sort_by(|a, b| a.id.cmp(&b.id));

    let online = Path::new(ONLINE_CPUS);
    let cpus = match host.read(online) {
        Ok(text) => text.parse::<CpuSet>().unwrap_or_else(|e| {
            scan.warn(
                None,
                Some(online),
                format!("{e}; the node's CPU list is left empty"),
            );
            CpuSet::new()
        }),
        Err(e) => {
            if cfg.cpus.is_none() {
                scan.warn(
                    None,
                    Some(online),
                    format!("cannot read the online CPUs: {e}; set discovery.cpus"),
                );
            }
            CpuSet::new()
        }
    };
    let mut warnings = scan.warnings;
    warnings.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(Discovery {
        inventory: Inventory { devices, cpus },
        warnings,
    })
}
