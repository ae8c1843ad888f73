//! `nri-accel check-config`: the checks `run` makes before it serves, short of connecting.
//!
//! The config is read by the rule every command follows (a missing default file is the built-in
//! defaults, and the answer says so; any other missing file is an error), parsed and validated
//! (errors name the line and column), then discovery runs and
//! the node is built from the inventory and the pools under this build's policies
//! ([`crate::check`], the same function `run` calls). Warnings (a pool that selects nothing, a
//! shadowed pool, an empty inventory) are printed and, with `--strict`, fail the check.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use policies::Registry;

use crate::check::CheckError;

/// Exit code of a config that `run` would refuse.
const INVALID: u8 = 1;
/// Exit code of `--strict` when the config is valid but has warnings.
const WARNINGS: u8 = 3;

/// Prints `ok`, a summary and any warnings, or the error; see the exit codes above.
pub fn run(
    path: &Path,
    sysfs_root: Option<PathBuf>,
    strict: bool,
    registry: &Registry,
) -> anyhow::Result<ExitCode> {
    // The rule every command follows: a missing default file is the built-in defaults, which
    // is then what `run` would run with and so what is checked.
    let (mut cfg, defaulted) = match super::read_config(path) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(INVALID));
        }
    };
    let checked_what = if defaulted {
        format!("the built-in defaults ({} does not exist)", path.display())
    } else {
        path.display().to_string()
    };
    let from_flag = sysfs_root.is_some();
    if let Some(root) = sysfs_root {
        cfg.discovery.root = root;
        cfg.discovery.sysfs = true;
    }
    let policies: Vec<&str> = registry.names().collect();
    let checked = match crate::check::check(&cfg, registry) {
        Ok(c) => c,
        Err(CheckError::Discovery(e)) if from_flag => {
            eprintln!("{}", super::discover::sysfs_root_error(&e));
            return Ok(ExitCode::from(INVALID));
        }
        Err(e) => {
            eprintln!("{checked_what}: {e}");
            return Ok(ExitCode::from(INVALID));
        }
    };
    let inventory = checked.node.inventory();
    println!(
        "{checked_what}: ok ({} pool(s), {} device(s) found, state dir {}, CDI dir {}, NRI socket {})",
        cfg.pools.len(),
        inventory.devices.len(),
        cfg.state_dir.display(),
        cfg.cdi.dir.display(),
        cfg.nri.socket.display()
    );
    println!("policies in this build: {}", policies.join(", "));
    for w in &checked.warnings {
        eprintln!("warning: {w}");
    }
    if strict && !checked.warnings.is_empty() {
        eprintln!(
            "{checked_what}: {} warning(s) and --strict: not accepted",
            checked.warnings.len()
        );
        return Ok(ExitCode::from(WARNINGS));
    }
    Ok(ExitCode::SUCCESS)
}
