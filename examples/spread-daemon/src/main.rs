//! `nri-accel-spread`: the stock nri-accel daemon and CLI with one more policy, `spread`.
//!
//! This is the whole of a custom daemon: register the policies, hand the registry to nri-accel.
//! Every subcommand, the config, metrics, the claims API and the NRI side come from nri-accel.

use std::process::ExitCode;

use policies::Registry;

fn main() -> ExitCode {
    let mut registry = Registry::with_builtins();
    registry.register(spread::NAME, spread::factory);
    nri_accel::cli::main_with(registry)
}
