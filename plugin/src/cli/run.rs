//! `nri-accel run`: the daemon.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::daemon::{Daemon, DaemonOptions};

/// Drops every capability the configured daemon does not need. Capabilities are
/// per thread, so this runs before the async runtime starts its threads.
pub fn drop_privileges(config: &Path) {
    let Ok(cfg) = super::load_config(config) else {
        // `run` reports the config error itself.
        return;
    };
    let keep = crate::privileges::keep_list(&crate::privileges::PrivilegeNeeds {
        claims_socket_group: cfg.claims_api.group.is_some(),
        metrics_port: cfg.metrics.listen.map(|a| a.port()),
    });
    match crate::privileges::drop_to(&keep) {
        Ok(r) => {
            tracing::info!(kept = ?r.kept, bounding_reduced = r.bounding_reduced, "capabilities dropped")
        }
        Err(e) => tracing::warn!(error = %e, "could not drop capabilities"),
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(config: &Path) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    let launched = crate::preflight::launched_by_runtime();
    let report = crate::preflight::run(&crate::preflight::PreflightPaths {
        nri_socket: (!launched).then(|| cfg.nri.socket.clone()),
        state_dir: cfg.state_dir.clone(),
        cdi_dir: cfg.cdi.dir.clone(),
        claims_socket_dir: cfg
            .claims_api
            .socket
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    })?;
    for dir in &report.created {
        tracing::info!(dir = %dir.display(), "created a missing directory");
    }
    let crash = crate::engine::hook_from_env().map_err(anyhow::Error::msg)?;
    let daemon = Daemon::start(
        &cfg,
        DaemonOptions {
            crash,
            ..DaemonOptions::default()
        },
    )
    .await
    .context("starting nri-accel")?;
    let metrics = match cfg.metrics.listen {
        Some(addr) => Some(
            crate::metrics::serve(addr, daemon.metrics().clone(), daemon.health().clone())
                .await
                .context("starting the metrics server")?,
        ),
        None => None,
    };
    tokio::select! {
        r = wait_for_signal() => r?,
        _ = daemon.nri_ended() => tracing::warn!(
            "the runtime closed the NRI connection it launched us with; exiting so that its next instance gets the node"
        ),
    }
    tracing::info!("stopping");
    let _ = crate::notify::Notifier::from_env().and_then(|n| n.stopping());
    if let Some(m) = metrics {
        m.shutdown();
    }
    daemon.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
