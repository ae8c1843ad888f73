//! The stock `nri-accel` binary: the library's command line with the built-in policies.
//! A custom build registers more policies and calls the same function (docs/policy-guide.md).

use std::process::ExitCode;

fn main() -> ExitCode {
    nri_accel::cli::main_with(policies::Registry::with_builtins())
}
