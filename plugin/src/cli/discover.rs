//! `nri-accel discover`: the inventory as the policy sees it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

/// Prints the devices found (a table, or JSON) and any warnings.
pub fn run(config: &Path, sysfs_root: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let mut cfg = super::load_config(config)?;
    if let Some(root) = sysfs_root {
        cfg.discovery.root = root;
        cfg.discovery.sysfs = true;
    }
    let found = crate::discovery::discover_root(&cfg.discovery).context("discovering devices")?;
    let node = policies::Node::new(
        found.inventory.clone(),
        &cfg.pools,
        &policies::Registry::with_builtins(),
    );
    if json {
        let doc = serde_json::json!({
            "inventory": found.inventory,
            "warnings": found.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
            "published": node.as_ref().map(|n| n.published()).unwrap_or_default(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<14} {:<8} {:<22} {:>4} {:<12} {:>9} {:>5}  nodes",
        "DEVICE", "VENDOR", "MODEL", "NUMA", "LOCAL CPUS", "MEM MiB", "CUs"
    );
    for d in &found.inventory.devices {
        let nodes: Vec<String> = d
            .nodes
            .iter()
            .chain(&d.control_nodes)
            .map(|n| format!("{}({}:{})", n.path, n.major, n.minor))
            .collect();
        println!(
            "{:<14} {:<8} {:<22} {:>4} {:<12} {:>9} {:>5}  {}",
            d.id,
            d.vendor,
            truncate(&d.model, 22),
            d.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            d.local_cpus.to_string(),
            d.memory_mib,
            d.compute_units,
            nodes.join(" ")
        );
    }
    println!("online CPUs: {}", found.inventory.cpus);
    match node {
        Ok(n) => {
            println!("published devices (what a DRA driver would publish):");
            println!("  {:<12} {:<10} {:<12} NAME", "POOL", "KIND", "DEVICE");
            for p in n.published() {
                let kind = match p.kind {
                    policies::PublishedKind::Whole => "whole",
                    policies::PublishedKind::Shareable => "shareable",
                    policies::PublishedKind::Slice => "slice",
                };
                println!(
                    "  {:<12} {:<10} {:<12} {}",
                    p.pool, kind, p.device_id, p.name
                );
            }
        }
        Err(e) => println!("the pools do not fit this inventory: {e}"),
    }
    for w in &found.warnings {
        println!("warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}
