//! The `nri-accel` command line: one file per subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Default config file path.
pub const DEFAULT_CONFIG: &str = crate::config::DEFAULT_CONFIG_PATH;

/// nri-accel: hands a node's accelerators to containers through NRI, DRA claims and CDI.
#[derive(Debug, Parser)]
#[command(name = "nri-accel", version, about, long_about = None)]
pub struct Cli {
    /// Config file. It must exist, except the default: without it, every command uses the
    /// built-in defaults and says so.
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
    /// Check a config file as `run` would, short of connecting: the file (errors name the line
    /// and column), the policies its pools name, and its pools against this node's devices.
    CheckConfig {
        /// The file to check (default: --config).
        file: Option<PathBuf>,
        /// Read sysfs and procfs under this root instead of the config's `discovery.root`
        /// (to check a config against a fixture tree or another host's copy).
        #[arg(long)]
        sysfs_root: Option<PathBuf>,
        /// Exit non-zero on warnings too (a pool that selects nothing, a shadowed pool, no
        /// devices at all).
        #[arg(long)]
        strict: bool,
    },
    /// Prepare a claim through the running daemon's claims API.
    Prepare {
        /// Claim UID.
        uid: String,
        /// Devices wanted (1 or more; 0 is refused before the daemon is asked).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        /// Family: exclusive (the default), shared, sliced, or the name of a policy this build
        /// registers for `kind: custom` pools.
        #[arg(long)]
        family: Option<String>,
        /// Vendor.
        #[arg(long)]
        vendor: Option<String>,
        /// Slice profile (sliced family).
        #[arg(long)]
        profile: Option<String>,
        /// Specific devices, by id (`gpu1`), as `status` lists them (`whole/gpu1`), or by
        /// published name (`whole-gpu1`).
        #[arg(long = "device")]
        devices: Vec<String>,
        /// The request's name, as refusals and records name it (default: what was asked, e.g.
        /// `count=1,family=sliced,profile=1g`).
        #[arg(long)]
        request: Option<String>,
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
    /// Serve the validating admission webhook: refuse at pod creation what the node would
    /// refuse at container creation (docs/webhook.md).
    Webhook(webhook::WebhookArgs),
    /// Ask the running daemon's loopback `/readyz`, `/livez` or `/healthz` (needs
    /// `metrics.listen`): exit 0 on 200, 1 with the daemon's sentence otherwise. The Helm
    /// chart's readiness, liveness and startup probes run it.
    Probe {
        /// Which endpoint.
        #[arg(value_enum, default_value = "ready")]
        kind: probe::ProbeKind,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
}

mod check_config;
mod claims;
mod cleanup;
mod discover;
mod entry;
mod probe;
mod reconcile;
pub mod run;
pub mod status;
mod table;
pub mod webhook;

use std::process::ExitCode;

use futures::future::LocalBoxFuture;
use policies::Registry;

pub use entry::{error_chain, main_with, main_with_demo, version_text};

/// The body of `demo`: the whole path on a simulated node, runtime and cluster with these
/// policies (`true`: keep the temp dir). The simulators live in tests/, which the shipped binary
/// never links, so the demo build (tests/demo) hands this to [`main_with_demo`] and the shipped
/// one has none.
pub type DemoFn = for<'a> fn(bool, &'a Registry) -> LocalBoxFuture<'a, anyhow::Result<ExitCode>>;

/// What `demo` says in a build without one (the shipped binary), and where the demo is.
pub const NO_DEMO: &str = "this build has no demo: the simulated runtime and node it runs on \
                           are not shipped; from a source checkout, run it with \
                           `cargo run --release -- demo`";

use crate::config::Config;

/// Reads the config named on the command line by the rule of
/// [`Config::load_or_defaults`]; `true` in the answer when the built-in defaults are used (say
/// so once logging is set up: [`note_defaults`]).
pub fn read_config(path: &std::path::Path) -> Result<(Config, bool), crate::config::ConfigError> {
    let (config, source) = Config::load_or_defaults(path)?;
    Ok((config, source == crate::config::ConfigSource::Defaults))
}

/// Says that the default config file is absent and the built-in defaults are used: the daemon
/// in its log, a one-shot command in one line on stderr (its answer stays on stdout).
pub fn note_defaults(daemon: bool) {
    if daemon {
        tracing::info!("{}", crate::config::DEFAULTS_NOTE);
    } else {
        eprintln!("nri-accel: {}", crate::config::DEFAULTS_NOTE);
    }
}

/// Loads the config named on the command line for a one-shot command (the rule of
/// [`Config::load_or_defaults`]), saying so when the defaults are used.
pub fn load_config(path: &std::path::Path) -> anyhow::Result<Config> {
    let (config, defaulted) = read_config(path)?;
    if defaulted {
        note_defaults(false);
    }
    Ok(config)
}

/// Runs the subcommand with `registry` as the policies pools may name and `demo` as the body of
/// `demo` (none in the shipped binary); the exit code says how it went.
pub async fn dispatch(
    cli: Cli,
    registry: &Registry,
    demo: Option<DemoFn>,
) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => {
            let (config, defaulted) = read_config(&cli.config)?;
            if defaulted {
                note_defaults(true);
            }
            run::run(&config, registry).await
        }
        Command::Demo { keep } => match demo {
            Some(demo) => demo(keep, registry).await,
            None => {
                eprintln!("nri-accel: {NO_DEMO}");
                Ok(ExitCode::from(2))
            }
        },
        Command::Status { json } => status::run(&cli.config, json).await,
        Command::Discover { sysfs_root, json } => {
            discover::run(&cli.config, sysfs_root, json, registry)
        }
        Command::CheckConfig {
            file,
            sysfs_root,
            strict,
        } => check_config::run(
            file.as_deref().unwrap_or(&cli.config),
            sysfs_root,
            strict,
            registry,
        ),
        Command::Prepare {
            uid,
            count,
            family,
            vendor,
            profile,
            devices,
            request,
            namespace,
            name,
        } => {
            let ask = claims::CountArgs {
                count,
                family,
                vendor,
                profile,
                devices,
                request,
            };
            claims::prepare(&cli.config, uid, namespace, name, ask).await
        }
        Command::Unprepare { uid } => claims::unprepare(&cli.config, uid).await,
        Command::Reconcile { dry_run } => reconcile::run(&cli.config, dry_run, registry).await,
        Command::Cleanup { force } => cleanup::run(&cli.config, force).await,
        Command::Webhook(args) => webhook::run(&cli.config, args, registry).await,
        Command::Probe { kind, timeout } => {
            let config = load_config(&cli.config)?;
            probe::run(&config, kind, std::time::Duration::from_secs(timeout))
        }
    }
}
