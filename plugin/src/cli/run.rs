//! `nri-accel run`: the daemon.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use policies::Registry;

use crate::config::Config;
use crate::daemon::{Daemon, DaemonOptions};

/// Drops every capability the configured daemon does not need. Capabilities are
/// per thread, so this runs before the async runtime starts its threads. The drop logs the set it
/// kept (`capabilities dropped to the keep-list`).
pub fn drop_privileges(cfg: &Config) {
    let keep = crate::privileges::keep_list(&crate::privileges::PrivilegeNeeds {
        claims_socket_group: cfg.claims_api.group.is_some(),
        metrics_port: cfg.metrics.listen.map(|a| a.port()),
    });
    if let Err(e) = crate::privileges::drop_to(&keep) {
        tracing::warn!("could not drop capabilities: {e}; the daemon runs with the ones it has");
    }
}

/// Runs until SIGTERM or SIGINT, with `registry` as the policies pools may name.
pub async fn run(cfg: &Config, registry: &Registry) -> anyhow::Result<ExitCode> {
    // Installed before anything starts: a SIGTERM while the daemon starts (systemctl stop, or a
    // test stopping it the moment the gate opens) stops it at once, never the default action's
    // silent death.
    let mut stop = StopSignals::install()?;
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
    let starting = Daemon::start(
        cfg,
        DaemonOptions {
            crash,
            registry: registry.clone(),
            ..DaemonOptions::default()
        },
    );
    // A stop while starting (waiting for the node lock, say) stops at once: the start is
    // dropped before it binds a socket or registers with the runtime. Dropping it at any later
    // step is no worse than a kill there, which every step survives.
    let daemon = tokio::select! {
        started = starting => started.context("starting nri-accel")?,
        _ = stop.recv() => {
            tracing::info!("stopped while starting; nothing was served");
            return Ok(ExitCode::SUCCESS);
        }
    };
    let metrics = match cfg.metrics.listen {
        Some(addr) => Some(
            crate::metrics::serve(addr, daemon.metrics().clone(), daemon.health().clone())
                .await
                .context("starting the metrics server")?,
        ),
        None => None,
    };
    tokio::select! {
        _ = stop.recv() => {}
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

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// Resolves at the first SIGTERM or SIGINT received since [`StopSignals::install`].
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
