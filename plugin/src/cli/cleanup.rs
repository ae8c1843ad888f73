//! `nri-accel cleanup`: deletes the ResourceSlices this node published (run by package removal).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::kube::{KubeClient, cleanup};
use crate::nodelock::NodeLock;

/// How long the whole cleanup may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Deletes the node's ResourceSlices of the configured driver. Refuses while the daemon runs
/// (it would publish them again); `force` also cleans up when `dra.enabled` is false.
pub async fn run(config: &Path, force: bool) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    if !cfg.dra.enabled && !force {
        println!(
            "dra.enabled is false in the config: nri-accel published no ResourceSlices (use --force to delete those of driver {} anyway)",
            cfg.dra.driver_name
        );
        return Ok(ExitCode::SUCCESS);
    }
    if cfg.state_dir.is_dir() {
        let lock = NodeLock::open(&cfg.state_dir)?;
        if lock.lock(Duration::ZERO).is_err() {
            anyhow::bail!(
                "nri-accel is running on this node (it holds {}) and would publish the ResourceSlices again; stop it first",
                lock.path().display()
            );
        }
    }
    let node = cfg
        .kubernetes
        .resolve_node_name()
        .context("no node name: set kubernetes.node_name or $NODE_NAME")?;
    let driver = &cfg.dra.driver_name;
    let client = KubeClient::from_kubeconfig(cfg.kubernetes.kubeconfig.as_deref(), DEADLINE)
        .await
        .context("connecting to the API server")?;
    let deleted = tokio::time::timeout(
        DEADLINE,
        cleanup::delete_slices(&client, driver, &node, DEADLINE),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "the API server did not finish within {} s",
            DEADLINE.as_secs()
        )
    })?
    .with_context(|| format!("deleting the ResourceSlices of driver {driver} on node {node}"))?;
    println!("deleted {deleted} ResourceSlice(s) of driver {driver} on node {node}");
    Ok(ExitCode::SUCCESS)
}
