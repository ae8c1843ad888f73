//! `nri-accel discover`: the inventory as the policy sees it, the pools each device lands in, and
//! the same warnings `check-config` and `run` give.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use policies::Registry;

use super::table::Table;
use crate::discovery::DiscoveryError;

/// The error for a `--sysfs-root` that has no readable `sys/`: it names the flag, not the config
/// setting the message would otherwise point at.
pub(super) fn sysfs_root_error(e: &DiscoveryError) -> String {
    match e {
        DiscoveryError::Root { root, path } => format!(
            "--sysfs-root {}: {} is not a readable directory; point --sysfs-root at a root that \
             has sys/ (and proc/), such as a copy of a host's /sys and /proc",
            root.display(),
            root.join(path.strip_prefix("/").unwrap_or(path)).display()
        ),
    }
}

/// Prints the devices found (a table, or JSON), the published devices and any warnings.
pub fn run(
    config: &Path,
    sysfs_root: Option<PathBuf>,
    json: bool,
    registry: &Registry,
) -> anyhow::Result<ExitCode> {
    let mut cfg = super::load_config(config)?;
    let from_flag = sysfs_root.is_some();
    if let Some(root) = sysfs_root {
        cfg.discovery.root = root;
        cfg.discovery.sysfs = true;
    }
    let found = match crate::discovery::discover_root(&cfg.discovery) {
        Ok(found) => found,
        Err(e) if from_flag => anyhow::bail!(sysfs_root_error(&e)),
        Err(e) => anyhow::bail!(e),
    };
    let inventory = found.inventory.clone();
    let checked = crate::check::check_inventory(&cfg, registry, found);
    let policies: Vec<&str> = registry.names().collect();
    if json {
        let (published, warnings, error) = match &checked {
            Ok(c) => (
                c.node.published(),
                c.warnings.iter().map(|w| w.to_string()).collect(),
                None,
            ),
            Err(e) => (Vec::new(), Vec::new(), Some(e.to_string())),
        };
        let doc = serde_json::json!({
            "inventory": inventory,
            "policies": policies,
            "warnings": warnings,
            "published": published,
            "error": error,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(if checked.is_err() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    // The UUID column only where discovery found one (NVIDIA GPUs).
    let with_uuid = inventory.devices.iter().any(|d| d.uuid.is_some());
    let mut head = vec!["DEVICE", "VENDOR", "MODEL"];
    if with_uuid {
        head.push("UUID");
    }
    head.extend([">NUMA", "LOCAL CPUS", ">MEM MiB", ">CUs", "NODES"]);
    let mut devices = Table::new(&head);
    for d in &inventory.devices {
        let nodes: Vec<String> = d
            .nodes
            .iter()
            .chain(&d.control_nodes)
            .map(|n| format!("{}({}:{})", n.path, n.major, n.minor))
            .collect();
        let mut row = vec![d.id.clone(), d.vendor.clone(), d.model.clone()];
        if with_uuid {
            row.push(d.uuid.clone().unwrap_or_else(|| "-".into()));
        }
        row.extend([
            d.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
            d.local_cpus.to_string(),
            d.memory_mib.to_string(),
            d.compute_units.to_string(),
            nodes.join(" "),
        ]);
        devices.row(row);
    }
    print!("{}", devices.render(""));
    if devices.is_empty() {
        println!("(no devices)");
    }
    if inventory.cpus.is_empty() {
        println!("online CPUs: none known (discovery.sysfs is off and discovery.cpus is not set)");
    } else {
        println!("online CPUs: {}", inventory.cpus);
    }
    println!("policies in this build: {}", policies.join(", "));
    let checked = match checked {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return Ok(ExitCode::from(1));
        }
    };
    println!("published devices (what a DRA driver would publish):");
    let mut published = Table::new(&["POOL", "KIND", "DEVICE", "NAME"]);
    for p in checked.node.published() {
        let kind = match p.kind {
            policies::PublishedKind::Whole => "whole",
            policies::PublishedKind::Shareable => "shareable",
            policies::PublishedKind::Slice => "slice",
        };
        published.row(vec![p.pool, kind.to_string(), p.device_id, p.name]);
    }
    print!("{}", published.render("  "));
    if published.is_empty() {
        println!("  (none)");
    }
    for w in &checked.warnings {
        eprintln!("warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}
