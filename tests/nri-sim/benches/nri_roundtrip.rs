//! NRI protocol benchmark (a bench binary, two processes); see `fake_runtime::bench`.
//!
//! Run: `cargo bench -p nri-sim --bench nri_roundtrip` (NRI_BENCH_ITERS sets the sample),
//! or without the dev-dependencies: `cargo run --release -p nri-sim --bin nri-bench`.

fn main() {
    let iters = std::env::var("NRI_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = std::path::Path::new(env!("CARGO_BIN_EXE_nri-test-plugin"));
    fake_runtime::bench::main(plugin, dir.path(), iters).expect("benchmark");
}
