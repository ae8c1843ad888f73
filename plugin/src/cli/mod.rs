//! The `nri-accel` command line: one file per subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Default config file path.
pub const DEFAULT_CONFIG: &str = "/etc/nri-accel/config.yaml";

/// nri-accel: hands a node's accelerators to containers through NRI, DRA claims and CDI.
#[derive(Debug, Parser)]
#[command(name = "nri-accel", version, about, long_about = None)]
pub struct Cli {
    /// Config file.
    #[arg(long, global = true, default_value = DEFAULT_CONFIG, env = "NRI_ACCEL_CONFIG")]
    pub config: PathBuf,
    /// Log filter (tracing env-filter syntax), e.g. `info` or `nri_accel=debug`.
    #[arg(long, global = true, env = "NRI_ACCEL_LOG")]
    pub log: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: connect to the runtime over NRI and serve the claims API.
    Run,
    /// Run the whole path on an embedded simulated node and runtime, and explain each step.
    Demo {
        /// Keep the demo's temp dir and print its path.
        #[arg(long)]
        keep: bool,
    },
    /// Show devices, shares, slices, claims, containers and the gate, from the running daemon.
    Status {
        /// Print JSON for tools.
        #[arg(long)]
        json: bool,
    },
    /// Show the inventory as the policy sees it.
    Discover {
        /// Read sysfs and procfs under this root instead of `/` (for fixtures).
        #[arg(long)]
        sysfs_root: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a config file; errors name the line and column.
    CheckConfig {
        /// The file to check (default: --config).
        file: Option<PathBuf>,
    },
    /// Prepare a claim through the running daemon's claims API.
    Prepare {
        /// Claim UID.
        uid: String,
        /// Devices wanted.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Family: exclusive, shared or sliced.
        #[arg(long)]
        family: Option<String>,
        /// Vendor.
        #[arg(long)]
        vendor: Option<String>,
        /// Slice profile (sliced family).
        #[arg(long)]
        profile: Option<String>,
        /// Specific device ids.
        #[arg(long = "device")]
        devices: Vec<String>,
        /// Namespace recorded with the claim.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Name recorded with the claim (default: the UID).
        #[arg(long)]
        name: Option<String>,
    },
    /// Release a claim through the running daemon's claims API.
    Unprepare {
        /// Claim UID.
        uid: String,
    },
    /// Delete the ResourceSlices this node published (run by package removal; stop the daemon first).
    Cleanup {
        /// Also when `dra.enabled` is false in the config.
        #[arg(long)]
        force: bool,
    },
    /// Compare records and specs and show (or do) what reconciliation would do.
    Reconcile {
        /// Only show what would be done.
        #[arg(long)]
        dry_run: bool,
    },
}

mod check_config;
mod claims;
mod cleanup;
mod discover;
mod reconcile;
pub mod run;
pub mod status;

use std::process::ExitCode;

use crate::config::Config;

/// Loads the config named on the command line; a missing default file gives the defaults.
pub fn load_config(path: &std::path::Path) -> anyhow::Result<Config> {
    use anyhow::Context;
    if path == std::path::Path::new(DEFAULT_CONFIG) && !path.exists() {
        tracing::info!("{DEFAULT_CONFIG} not found: using the built-in defaults");
        return Ok(Config::default());
    }
    Config::load(path).with_context(|| format!("loading the config {}", path.display()))
}

/// Runs the subcommand; the exit code says how it went.
pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => run::run(&cli.config).await,
        Command::Demo { keep } => crate::demo::run(keep).await,
        Command::Status { json } => status::run(&cli.config, json).await,
        Command::Discover { sysfs_root, json } => discover::run(&cli.config, sysfs_root, json),
        Command::CheckConfig { file } => check_config::run(file.as_deref().unwrap_or(&cli.config)),
        Command::Prepare {
            uid,
            count,
            family,
            vendor,
            profile,
            devices,
            namespace,
            name,
        } => {
            let ask = claims::CountArgs {
                count,
                family,
                vendor,
                profile,
                devices,
            };
            claims::prepare(&cli.config, uid, namespace, name, ask).await
        }
        Command::Unprepare { uid } => claims::unprepare(&cli.config, uid).await,
        Command::Reconcile { dry_run } => reconcile::run(&cli.config, dry_run).await,
        Command::Cleanup { force } => cleanup::run(&cli.config, force).await,
    }
}
