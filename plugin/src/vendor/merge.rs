//! The annotation path's share of composition: the edits of the vendor devices a grant names,
//! resolved into what an NRI adjustment carries (device nodes with their numbers, mounts, hooks,
//! env), so no runtime CDI cache is involved and every NRI version works.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use cdi::{DeviceEdits, DeviceKind, Hook, Mount};
use policies::{DeviceNode, Inventory, NodeKind};

use super::catalog::Catalog;

/// What the vendor devices of one container's grant add to its adjustment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VendorGrant {
    /// Device nodes, each once.
    pub device_nodes: Vec<DeviceNode>,
    /// Environment, in spec order (common edits first, then each device's).
    pub env: Vec<(String, String)>,
    /// Mounts, each container path once.
    pub mounts: Vec<Mount>,
    /// Hooks, each once.
    pub hooks: Vec<Hook>,
}

/// Resolves the vendor devices `names` against `catalog`: each device's edits and, once, the
/// common edits of each spec. Device nodes without numbers take them from the inventory (a node
/// nri-accel knows) or from the node under `root`. Any name the specs no longer define, any
/// field an adjustment cannot carry, or any node that cannot be resolved is one sentence and
/// nothing is merged.
pub fn merge_for_container(
    catalog: &Catalog,
    names: &[String],
    inventory: &Inventory,
    root: &Path,
) -> Result<VendorGrant, String> {
    let mut out = VendorGrant::default();
    let mut commons_done: Vec<std::path::PathBuf> = Vec::new();
    for name in names {
        let Some(m) = catalog.by_name(name)? else {
            return Err(format!(
                "vendor CDI device {name} is defined by no vendor CDI spec in {} any more: the spec was removed or regenerated without it; regenerate it, or prepare again",
                catalog.dirs_text()
            ));
        };
        if !m.unmergeable.is_empty() {
            return Err(format!(
                "vendor CDI device {name} (spec {}) uses {}, which nri-accel cannot put into an NRI adjustment: grant it through DRA or the claims API, where the runtime applies the vendor's spec itself",
                m.file.display(),
                m.unmergeable.join(", ")
            ));
        }
        if !commons_done.contains(&m.file) {
            commons_done.push(m.file.clone());
            add(&mut out, &m.common, &m.file, inventory, root)?;
        }
        add(&mut out, &m.device, &m.file, inventory, root)?;
    }
    Ok(out)
}

fn add(
    out: &mut VendorGrant,
    e: &DeviceEdits,
    file: &Path,
    inventory: &Inventory,
    root: &Path,
) -> Result<(), String> {
    for (k, v) in &e.env {
        match out.env.iter_mut().find(|(key, _)| key == k) {
            Some(existing) => existing.1 = v.clone(),
            None => out.env.push((k.clone(), v.clone())),
        }
    }
    for n in &e.device_nodes {
        if out.device_nodes.iter().any(|d| d.path == n.path) {
            continue;
        }
        out.device_nodes
            .push(resolve_node(n, file, inventory, root)?);
    }
    for m in &e.mounts {
        out.mounts.retain(|x| x.container_path != m.container_path);
        out.mounts.push(m.clone());
    }
    for h in &e.hooks {
        if !out.hooks.contains(h) {
            out.hooks.push(h.clone());
        }
    }
    Ok(())
}

fn resolve_node(
    n: &cdi::DeviceNode,
    file: &Path,
    inventory: &Inventory,
    root: &Path,
) -> Result<DeviceNode, String> {
    let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
    let permissions = n.permissions.clone().unwrap_or_else(|| "rwm".into());
    let kind_of = |k: Option<DeviceKind>| match k {
        Some(DeviceKind::Block) => Ok(NodeKind::Block),
        Some(DeviceKind::Char) | Some(DeviceKind::Unbuffered) | None => Ok(NodeKind::Char),
        Some(DeviceKind::Fifo) => Err(format!(
            "vendor CDI spec {} names FIFO {}, which nri-accel does not create",
            file.display(),
            n.path
        )),
    };
    let (kind, major, minor) = match (n.major, n.minor) {
        (Some(ma), Some(mi)) => (kind_of(n.kind)?, number(ma, n, file)?, number(mi, n, file)?),
        _ => match known_node(inventory, &host) {
            Some(k) => (k.kind, k.major, k.minor),
            None => stat_node(root, &host).map_err(|why| {
                format!(
                    "vendor CDI spec {} names device node {host}, which {why}: install the driver's nodes, or regenerate the spec",
                    file.display()
                )
            })?,
        },
    };
    Ok(DeviceNode {
        path: n.path.clone(),
        host_path: n.host_path.clone(),
        kind,
        major,
        minor,
        permissions,
    })
}

fn number(v: i64, n: &cdi::DeviceNode, file: &Path) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| {
        format!(
            "vendor CDI spec {} gives device node {} the number {v}, out of range",
            file.display(),
            n.path
        )
    })
}

fn known_node<'a>(inventory: &'a Inventory, host: &str) -> Option<&'a DeviceNode> {
    inventory
        .devices
        .iter()
        .flat_map(|d| d.nodes.iter().chain(&d.control_nodes))
        .find(|k| k.host_path.as_deref().unwrap_or(&k.path) == host)
}

fn stat_node(root: &Path, host: &str) -> Result<(NodeKind, u32, u32), String> {
    let p = root.join(host.trim_start_matches('/'));
    let m = std::fs::metadata(&p).map_err(|e| format!("cannot be read ({e})"))?;
    let ft = m.file_type();
    let kind = if ft.is_char_device() {
        NodeKind::Char
    } else if ft.is_block_device() {
        NodeKind::Block
    } else {
        return Err("is not a device node".into());
    };
    let rdev = m.rdev();
    Ok((
        kind,
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    ))
}
