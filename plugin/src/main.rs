//! The `nri-accel` binary: parses the command line, sets up logging, runs the subcommand.

use std::process::ExitCode;

use clap::Parser;
use nri_accel::cli::{Cli, Command, dispatch};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
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
            eprintln!("nri-accel: {e:#}");
            ExitCode::FAILURE
        }
    }
}
