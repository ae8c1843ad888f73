//! `nri-accel check-config`: parse and validate a config file.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

/// Prints `ok` and a summary, or the error with its line and column.
pub fn run(path: &Path) -> anyhow::Result<ExitCode> {
    match Config::load(path) {
        Ok(c) => {
            println!(
                "{}: ok ({} pool(s), state dir {}, CDI dir {}, NRI socket {})",
                path.display(),
                c.pools.len(),
                c.state_dir.display(),
                c.cdi.dir.display(),
                c.nri.socket.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}
