//! DRM nodes (`/dev/dri/renderD*`, `/dev/dri/card*`) of AMD, Intel and other
//! DRM GPUs, and AMD's `/dev/kfd`, memory and compute units.

use std::collections::BTreeMap;
use std::path::Path;

use policies::DeviceNode;

use super::pci::{AMD, PciCandidate};
use super::scan::Scan;
use super::warning::short;

/// Host directory of the AMD kernel fusion driver.
const KFD: &str = "/sys/class/kfd/kfd";

/// Adds the render node (then the card node) of a DRM GPU. Returns false for a
/// display-only device (a card node and no render node, like a BMC's VGA):
/// nothing to compute on, so it is left out without a warning.
pub(crate) fn attach(scan: &mut Scan<'_>, c: &mut PciCandidate) -> bool {
    let drm_dir = c.dir.join("drm");
    let Ok(entries) = scan.host.read_dir(&drm_dir) else {
        return true;
    };
    let bdf = c.device.id.clone();
    let mut render = Vec::new();
    let mut card = Vec::new();
    for name in entries {
        let is_render = numbered(&name, "renderD");
        if !is_render && !numbered(&name, "card") {
            continue;
        }
        let dev_file = drm_dir.join(&name).join("dev");
        if let Some(node) = scan.dev_node(Some(&bdf), &dev_file, format!("/dev/dri/{name}")) {
            if is_render {
                render.push(node)
            } else {
                card.push(node)
            }
        }
    }
    if render.is_empty() && !card.is_empty() {
        tracing::debug!(device = %bdf, "discovery: display-only DRM device left out");
        return false;
    }
    c.device.nodes.extend(render);
    c.device.nodes.extend(card);
    true
}

/// Whether `name` is `prefix` followed by decimal digits only.
pub(crate) fn numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// AMD extras: `/dev/kfd`, VRAM size, compute units from the KFD topology.
pub(crate) fn attach_amd(scan: &mut Scan<'_>, c: &mut PciCandidate, kfd: &Kfd) {
    if c.vendor != AMD {
        return;
    }
    match &kfd.node {
        Some(node) => c.device.control_nodes.push(node.clone()),
        None => scan.warn_once(
            "kfd",
            Some(Path::new(KFD)),
            "no /dev/kfd (amdgpu KFD not loaded): AMD GPUs get no compute in containers"
                .to_string(),
        ),
    }
    let vram = c.dir.join("mem_info_vram_total");
    if let Ok(text) = scan.host.read(&vram) {
        match text.trim().parse::<u64>() {
            Ok(bytes) => c.device.memory_mib = bytes / (1024 * 1024),
            Err(_) => scan.warn(
                Some(&c.device.id),
                Some(&vram),
                format!(
                    "VRAM size {:?} is not a number; kept the model's nominal size",
                    short(&text)
                ),
            ),
        }
    }
    if let Some(cus) = location_id(&c.device.id).and_then(|id| kfd.compute_units.get(&id)) {
        c.device.compute_units = *cus;
    }
}

/// What the KFD tells about AMD GPUs: its control node and compute units by PCI location.
#[derive(Default)]
pub(crate) struct Kfd {
    node: Option<DeviceNode>,
    /// (domain, location_id) -> compute units.
    compute_units: BTreeMap<(u32, u32), u32>,
}

/// Reads `/sys/class/kfd/kfd` once per run (absent on hosts without amdgpu).
pub(crate) fn read_kfd(scan: &mut Scan<'_>) -> Kfd {
    let mut kfd = Kfd::default();
    let dev = Path::new(KFD).join("dev");
    if !scan.host.is_dir(Path::new(KFD)) {
        return kfd;
    }
    kfd.node = scan.dev_node(None, &dev, "/dev/kfd".to_string());
    let nodes_dir = Path::new(KFD).join("topology/nodes");
    let Ok(nodes) = scan.host.read_dir(&nodes_dir) else {
        return kfd;
    };
    for n in nodes {
        let Ok(props) = scan.host.read(&nodes_dir.join(&n).join("properties")) else {
            continue;
        };
        let mut values = BTreeMap::new();
        for line in props.lines() {
            if let Some((k, v)) = line.split_once(' ')
                && let Ok(v) = v.trim().parse::<u64>()
            {
                values.insert(k, v);
            }
        }
        let get = |k| values.get(k).copied().unwrap_or(0);
        let (simds, per_cu) = (get("simd_count"), get("simd_per_cu"));
        if simds == 0 || per_cu == 0 {
            continue; // a CPU node
        }
        let (Ok(domain), Ok(loc), Ok(cus)) = (
            u32::try_from(get("domain")),
            u32::try_from(get("location_id")),
            u32::try_from(simds / per_cu),
        ) else {
            continue;
        };
        kfd.compute_units.insert((domain, loc), cus);
    }
    kfd
}

/// KFD's `(domain, location_id)` of a PCI address: location = bus << 8 | device << 3 | function.
fn location_id(bdf: &str) -> Option<(u32, u32)> {
    let (domain, rest) = bdf.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |s| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)? << 8 | hex(dev)? << 3 | hex(func)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_id_packs_bus_device_function() {
        assert_eq!(location_id("0000:1b:00.0"), Some((0, 0x1b00)));
        assert_eq!(location_id("0001:9d:01.2"), Some((1, 0x9d0a)));
        assert_eq!(location_id("garbage"), None);
    }

    #[test]
    fn numbered_names_only() {
        assert!(numbered("renderD128", "renderD"));
        assert!(!numbered("renderD", "renderD"));
        assert!(!numbered("card0-DP-1", "card"));
    }
}
