//! The NRI protocol benchmark as a plain binary (see `fake_runtime::bench`): builds in release
//! without the test crate's dev-dependencies. Expects `nri-test-plugin` next to itself.
//!
//! Run: `cargo build --release -p nri-sim --bins && target/release/nri-bench [ITERS]`.

fn main() {
    let iters = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let plugin = std::env::current_exe()
        .unwrap_or_default()
        .with_file_name("nri-test-plugin");
    if let Err(e) = fake_runtime::bench::main(&plugin, &std::env::temp_dir(), iters) {
        eprintln!("nri-bench: {e}");
        std::process::exit(1);
    }
}
