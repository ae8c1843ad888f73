//! The whole `nri-accel` binary as a library function, so a policy author's crate can build the
//! same daemon and CLI with its own policies registered (docs/policy-guide.md):
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! fn main() -> ExitCode {
//!     let registry = policies::Registry::with_builtins();
//!     // registry.register("my-policy", my_policy::factory);
//!     nri_accel::cli::main_with(registry)
//! }
//! ```

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use policies::Registry;

use super::{Cli, Command, DemoFn};
use crate::logging::LogSettings;

/// Threads of the daemon's blocking pool. A commit's waiters share one leader's write (group
/// commit), so a few threads keep the disk busy; more only cost memory.
const MAX_BLOCKING_THREADS: usize = 8;

/// The version `--version` prints for a build with these policies: the crate version, and the
/// policies beyond the built-ins when there are any, so an operator can tell a custom build from
/// the stock one (`nri-accel 0.1.0 (extra policies: spread)`).
pub fn version_text(registry: &Registry) -> String {
    let extra: Vec<&str> = registry.extra_names().collect();
    if extra.is_empty() {
        env!("CARGO_PKG_VERSION").to_string()
    } else {
        format!(
            "{} (extra policies: {})",
            env!("CARGO_PKG_VERSION"),
            extra.join(", ")
        )
    }
}

/// The command line's definition. `--config` is global, but the demo runs its own simulated
/// node and takes none: its own hidden `--config` keeps the global one out of `demo --help`
/// (clap does not hand a global argument to a subcommand that has one of the same name), and is
/// refused when given.
pub fn command(version: &'static str) -> clap::Command {
    Cli::command()
        .version(version)
        .mut_subcommand("demo", |demo| {
            demo.arg(
                clap::Arg::new("config")
                    .long("config")
                    .hide(true)
                    .value_parser(clap::value_parser!(std::path::PathBuf)),
            )
        })
}

/// Runs the nri-accel command line with `registry` as the policies pools may name: parses the
/// arguments, sets up logging, runs the subcommand and answers the process exit code. The stock
/// binary is `main_with(Registry::with_builtins())`; it has no demo (`demo` says where it is).
pub fn main_with(registry: Registry) -> ExitCode {
    main_inner(registry, None)
}

/// The same command line with `demo` as the body of the `demo` subcommand: the demo build
/// (tests/demo), the one place that links the simulators it runs on. `capture_log` installs the
/// demo's log subscriber, which keeps the daemon's log for the story; it replaces the usual
/// logging for `demo` unless a filter was asked for (`--log` or `RUST_LOG`).
pub fn main_with_demo(registry: Registry, demo: DemoFn, capture_log: fn()) -> ExitCode {
    main_inner(registry, Some((demo, capture_log)))
}

fn main_inner(registry: Registry, demo: Option<(DemoFn, fn())>) -> ExitCode {
    crate::allocator::return_large_buffers();
    // Leaked once per process: clap keeps the version as a `&'static str`.
    let version: &'static str = Box::leak(version_text(&registry).into_boxed_str());
    let mut command = command(version);
    if demo.is_none() {
        // Still parsed, so that `nri-accel demo` says where the demo is instead of "unknown
        // subcommand"; not offered in the help of a build that cannot run it.
        command = command.mut_subcommand("demo", |c| c.hide(true));
    }
    let matches = command.get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let on_demo = matches
        .subcommand_matches("demo")
        .and_then(|m| m.value_source("config"));
    let config_given =
        [matches.value_source("config"), on_demo].contains(&Some(ValueSource::CommandLine));
    if matches!(cli.command, Command::Demo { .. }) && config_given && demo.is_some() {
        eprintln!(
            "nri-accel: demo runs on its own simulated node and takes no --config; run it \
             without --config (check a config with nri-accel check-config)"
        );
        return ExitCode::from(2);
    }

    // The daemon logs as its config says; the config is read before the subscriber exists, so a
    // config error is printed plainly.
    let daemon_config = match cli.command {
        Command::Run => match super::read_config(&cli.config) {
            Ok(loaded) => Some(loaded),
            Err(e) => {
                LogSettings::decide(cli.log.as_deref(), None).install();
                eprintln!(
                    "nri-accel: {}",
                    crate::logging::without_os_error_codes(&e.to_string())
                );
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    // The demo shows its daemon's log inside its story, unless a filter was asked for.
    let filter_asked =
        cli.log.is_some() || std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty());
    let demo_run = demo.map(|(run, _)| run);
    let capture_log = demo
        .map(|(_, capture_log)| capture_log)
        .filter(|_| matches!(cli.command, Command::Demo { .. }) && !filter_asked);
    // The webhook is a service too: it logs as the config's `log` section says (a config that
    // does not load is reported by the webhook itself, after this).
    let webhook_log = match cli.command {
        Command::Webhook(_) => super::read_config(&cli.config).ok().map(|(c, _)| c.log),
        _ => None,
    };
    if let Some(capture_log) = capture_log {
        capture_log();
    } else {
        LogSettings::decide(
            cli.log.as_deref(),
            daemon_config
                .as_ref()
                .map(|(c, _)| &c.log)
                .or(webhook_log.as_ref()),
        )
        .install();
    }

    let runtime = match cli.command {
        // The daemon, the demo and the webhook serve sockets: two workers. The one-shot
        // commands run on the calling thread, so nothing of theirs is still running when the
        // process exits.
        // Blocking file work (commits, spec writes) runs on a bounded pool: a burst of callers
        // queues there instead of starting a thread each (200 clients made 372 threads and
        // doubled the RSS; docs/performance.md, "Connection bursts").
        Command::Run | Command::Demo { .. } | Command::Webhook(_) => {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .max_blocking_threads(MAX_BLOCKING_THREADS)
                .thread_keep_alive(std::time::Duration::from_secs(2))
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nri-accel: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match daemon_config {
        Some((config, defaulted)) => {
            if defaulted {
                super::note_defaults(true);
            }
            super::run::drop_privileges(&config);
            match runtime.block_on(super::run::run(&config, &registry)) {
                Ok(code) => code,
                Err(e) => {
                    // The daemon's last word goes through its log, in its format and at error
                    // priority under journald.
                    tracing::error!("{}", error_chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
        None => match runtime.block_on(super::dispatch(cli, &registry, demo_run)) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("nri-accel: {}", error_chain(&e));
                ExitCode::FAILURE
            }
        },
    }
}

/// The error and its causes in one line, each said once: many of our errors already put their
/// cause in their own message (`checkpoint: {0}`), and `{:#}` would repeat it after a colon.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    crate::logging::without_os_error_codes(&out)
}
