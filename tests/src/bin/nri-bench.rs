//! The NRI protocol benchmark as a plain binary (see `fake_runtime::bench`): builds in release
//! without the test crate's dev-dependencies. Expects `nri-test-plugin` next to itself.
//!
//! Run: `cargo build --release -p nri-accel-tests --bins && target/release/nri-bench [ITERS]`.

fn main() {
    let iters = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let exe = std::env::current_exe().unwrap_or_default();
    let plugin = exe.with_file_name("nri-test-plugin");
    let dir = std::env::temp_dir().join(format!("nri-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("nri-bench: cannot create {}: {e}", dir.display());
        std::process::exit(1);
    }
    // NRI_BENCH_THREADS=0 runs the fake runtime on a current-thread scheduler.
    let threads: usize = std::env::var("NRI_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut builder = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nri-bench: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(fake_runtime::bench::run(&plugin, &dir, iters));
    let _ = std::fs::remove_dir_all(&dir);
}
