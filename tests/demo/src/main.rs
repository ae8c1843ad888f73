//! `nri-accel-demo`: the nri-accel command line with the `demo` subcommand, which runs the whole
//! path on an embedded simulated runtime, node and Kubernetes. The workspace's default run
//! target, so `cargo run --release -- demo` from the root runs it.
//!
//! A crate of its own so that the shipped binary links no simulator: nri-sim and kube-sim are
//! normal dependencies here and only dev-dependencies of the plugin. A cargo feature on the
//! plugin could not promise that: a workspace build unifies features, and one member asking for
//! the demo would put the simulators into the binary the .deb ships.

mod steps;
mod story;

use std::process::ExitCode;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use policies::Registry;

fn demo(keep: bool, registry: &Registry) -> LocalBoxFuture<'_, anyhow::Result<ExitCode>> {
    steps::run(keep, registry).boxed_local()
}

fn main() -> ExitCode {
    nri_accel::cli::main_with_demo(Registry::with_builtins(), demo, story::capture_log)
}
