//! The vendor devices of a set of vendor CDI specs, and which of them describes a device of the
//! inventory. Pure: the specs are decoded already (see `load`); nothing here reads a file.
//!
//! A vendor device describes an inventory device when it is named by the device's UUID
//! (`GPU-...`), or when every node of its own edits that is not a control node of the device
//! (and not a MIG capability under `/dev/nvidia-caps`) is a node of the device, matched by path,
//! host path, `major:minor`, or a `/dev/dri/by-path/pci-<address>-...` link. `all` and MIG
//! entries never describe a whole device. Within one spec the UUID-named entry is preferred,
//! then the first in the file. Two files describing one device are an error naming both,
//! unless they describe it identically under the same name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdi::{DeviceEdits, VendorDevice, VendorSpec};
use policies::Device;

/// A vendor spec read from a file.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// The file it was read from.
    pub file: PathBuf,
    /// Its content.
    pub spec: Arc<VendorSpec>,
}

/// The vendor device that describes an inventory device.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// Its qualified CDI name, `kind=name` (`nvidia.com/gpu=GPU-...`).
    pub name: String,
    /// The spec file.
    pub file: PathBuf,
    /// The device's own edits.
    pub device: DeviceEdits,
    /// The spec's common edits.
    pub common: DeviceEdits,
    /// CDI fields of the device or the spec that nri-accel cannot merge into an NRI adjustment.
    pub unmergeable: Vec<&'static str>,
}

/// What the vendor specs of the configured directories hold.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The directories read, in order.
    pub dirs: Vec<PathBuf>,
    /// Every vendor spec found, in directory then file-name order.
    pub specs: Vec<LoadedSpec>,
}

impl Catalog {
    /// The directories read, as a sentence part: `/etc/cdi, /var/run/cdi`.
    pub fn dirs_text(&self) -> String {
        let d: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        d.join(", ")
    }

    /// How many MIG entries the specs hold (recognised and never matched to a whole device).
    pub fn mig_entries(&self) -> usize {
        self.specs
            .iter()
            .map(|s| s.spec.devices.iter().filter(|d| d.is_mig()).count())
            .sum()
    }

    /// The vendor device that describes `dev`, `None` when no spec does, or one sentence when
    /// two files disagree about it.
    pub fn find(&self, dev: &Device) -> Result<Option<Matched>, String> {
        let mut found: Option<Matched> = None;
        for loaded in &self.specs {
            let Some(d) = best_in_spec(&loaded.spec, dev) else {
                continue;
            };
            let m = matched(loaded, d);
            match &found {
                None => found = Some(m),
                Some(prev)
                    if prev.name == m.name
                        && prev.device == m.device
                        && prev.common == m.common => {}
                Some(prev) => {
                    return Err(format!(
                        "vendor CDI specs {} and {} both describe device {} ({} and {}){}; remove or regenerate one of them",
                        prev.file.display(),
                        m.file.display(),
                        dev.id,
                        prev.name,
                        m.name,
                        if prev.name == m.name {
                            ", with different edits"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
        Ok(found)
    }

    /// The vendor device named `name` (qualified), as [`Catalog::find`] would answer it.
    pub fn by_name(&self, name: &str) -> Result<Option<Matched>, String> {
        let mut found: Option<Matched> = None;
        for loaded in &self.specs {
            let Some(d) = loaded
                .spec
                .devices
                .iter()
                .find(|d| loaded.spec.qualified(d) == name)
            else {
                continue;
            };
            let m = matched(loaded, d);
            match &found {
                None => found = Some(m),
                Some(prev) if prev.device == m.device && prev.common == m.common => {}
                Some(prev) => {
                    return Err(format!(
                        "vendor CDI specs {} and {} both define {name} with different edits; remove or regenerate one of them",
                        prev.file.display(),
                        m.file.display()
                    ));
                }
            }
        }
        Ok(found)
    }
}

fn matched(loaded: &LoadedSpec, d: &VendorDevice) -> Matched {
    let mut unmergeable = d.container_edits.unmergeable();
    unmergeable.extend(loaded.spec.container_edits.unmergeable());
    Matched {
        name: loaded.spec.qualified(d),
        file: loaded.file.clone(),
        device: d.container_edits.to_device_edits(),
        common: loaded.spec.container_edits.to_device_edits(),
        unmergeable,
    }
}

/// The entry of `spec` that best describes `dev`: its UUID-named entry, else the first entry
/// whose nodes are the device's.
fn best_in_spec<'a>(spec: &'a VendorSpec, dev: &Device) -> Option<&'a VendorDevice> {
    if let Some(uuid) = &dev.uuid
        && let Some(d) = spec
            .devices
            .iter()
            .find(|d| d.name.eq_ignore_ascii_case(uuid) && !d.is_mig())
    {
        return Some(d);
    }
    let by_nodes: Vec<&VendorDevice> = spec
        .devices
        .iter()
        .filter(|d| d.name != "all" && !d.is_mig() && nodes_are(d, dev))
        .collect();
    by_nodes
        .iter()
        .find(|d| d.name.starts_with("GPU-"))
        .or(by_nodes.first())
        .copied()
}

/// Whether the device-specific nodes of `d` are all nodes of `dev` (and there is one).
fn nodes_are(d: &VendorDevice, dev: &Device) -> bool {
    let own: Vec<&cdi::DeviceNode> = d
        .container_edits
        .device_nodes
        .iter()
        .filter(|n| !n.path.starts_with("/dev/nvidia-caps/"))
        .filter(|n| !dev.control_nodes.iter().any(|c| same_node(n, c, None)))
        .collect();
    !own.is_empty()
        && own.iter().all(|n| {
            dev.nodes
                .iter()
                .any(|m| same_node(n, m, dev.pci_address.as_deref()))
        })
}

fn same_node(v: &cdi::DeviceNode, n: &policies::DeviceNode, pci: Option<&str>) -> bool {
    let host = v.host_path.as_deref().unwrap_or(&v.path);
    let ours = n.host_path.as_deref().unwrap_or(&n.path);
    if v.path == n.path || host == ours {
        return true;
    }
    if let (Some(ma), Some(mi)) = (v.major, v.minor)
        && ma == i64::from(n.major)
        && mi == i64::from(n.minor)
    {
        return true;
    }
    // /dev/dri/by-path/pci-0000:c1:00.0-render names the function by its PCI address.
    pci.is_some_and(|addr| {
        Path::new(host)
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(|f| f.strip_prefix("pci-"))
            .is_some_and(|f| {
                f.strip_prefix(addr)
                    .is_some_and(|rest| rest.starts_with('-'))
                    && ((f.ends_with("-render") && ours.contains("renderD"))
                        || (f.ends_with("-card") && ours.contains("/card")))
            })
    })
}
