//! The `nri-accel` binary: parses the command line, sets up logging, runs the subcommand.

use std::process::ExitCode;

use clap::Parser;
use nri_accel::cli::{Cli, Command, dispatch};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    nri_accel::allocator::return_large_buffers();
    let cli = Cli::parse();
    let default = match cli.command {
        Command::Run => "info",
        Command::Demo { .. } => "warn",
        _ => "warn",
    };
    let filter = cli.log.clone().map(EnvFilter::new).unwrap_or_else(|| {
        EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(default))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    if matches!(cli.command, Command::Run) {
        nri_accel::cli::run::drop_privileges(&cli.config);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nri-accel: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nri-accel: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes in one line, each said once: many of our errors already put their
/// cause in their own message (`checkpoint: {0}`), and `{:#}` would repeat it after a colon.
fn error_chain(e: &anyhow::Error) -> String {
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
    out
}
