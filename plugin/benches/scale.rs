//! The daemon on a big node: pods and containers shaped as containerd's CRI reports them
//! (`fake_runtime::fixtures::cri_pod` / `cri_container`, about 3 KB per pod and container on
//! the wire), each figure next to the same run's no-op plugin (`nri-test-plugin`, a plugin on
//! nri-proto that keeps nothing), both driven by the fake runtime in this process:
//! 1. RSS after Synchronize of 1,000 containers, no claim;
//! 2. RSS after Synchronize of 10,000 containers with 10,000 claims prepared, after more
//!    Synchronizes, and after a restart;
//! 3. Synchronize of 20,000 containers with CPU management configured (`cpus_per_device: 1`)
//!    and no CPU held, as the runtime sees it (encode, transfer, the plugin's work, the answer),
//!    alternating daemon and no-op plugin, with the updates each answer holds; then two claims
//!    take a CPU each and the runtime applies the updates pushed, 1,000 more containers start
//!    unpinned, and the next Synchronize must update exactly those.
//!
//! Run (the no-op plugin is a binary of nri-sim):
//! `cargo build --release -p nri-sim --bins && cargo bench -p nri-accel --bench scale`.
//! `SCALE_BENCH_DIR` picks where files go (default: the target dir), `SCALE_BENCH_SYNCS` (10)
//! the Synchronizes per series, `SCALE_BENCH_CONTAINERS` (20000) the size of part 3,
//! `SCALE_BENCH_SETTLE_MS` the pause after each Synchronize, `SCALE_BENCH_DAEMON` another
//! `nri-accel` binary to measure (e.g. an older build), and `SCALE_BENCH_PARTS` which parts
//! to run (default `123`), `SCALE_BENCH_NOOP_SYNC=lean` a no-op plugin that decodes Synchronize
//! lean too (default: whole).
#![allow(missing_docs, clippy::print_stdout)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use fake_runtime::fixtures::{cri_container, cri_node_state, cri_pod};
use fake_runtime::{FakeRuntime, RuntimeConfig};
use nri_accel::claims_api::{ClaimsClient, Family};
use nri_proto::api::{Container, PodSandbox};
use proc_node::{DaemonProc, Layout, count_spec, env_usize, fill, ms};

/// 8 whole devices giving one accelerator-local CPU each (CPU management configured), and 56
/// shared devices of 200 replicas (11,200 units: 10,000 claims fit and hold no CPU).
const LAYOUT: Layout = Layout {
    exclusive: 8,
    shared: 56,
    replicas: 200,
    sliced: 0,
    cpus_per_device: 1,
};

/// Long enough that a loaded machine does not drop a plugin mid-benchmark; a real runtime gives
/// Synchronize 2 s (the figures say how far below that each run was).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn mib(kib: Option<u64>) -> f64 {
    kib.unwrap_or(0) as f64 / 1024.0
}

/// A process's resident memory, `VmRSS` with its anonymous part (`RssAnon`: the heap, the
/// arenas and the stacks; the rest is the binary's and libraries' pages).
fn rss(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    format!(
        "{:.1} MiB (anon {:.1})",
        mib(field("VmRSS:")),
        mib(field("RssAnon:"))
    )
}

fn p50(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn spread(v: &[Duration]) -> String {
    let mut s = v.to_vec();
    s.sort();
    format!(
        "p50 {:>7.1} ms  min {:>7.1}  max {:>7.1}  (n={})",
        ms(s[s.len() / 2]),
        ms(s[0]),
        ms(s[s.len() - 1]),
        s.len()
    )
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The no-op plugin: `nri-test-plugin` next to the `nri-accel` binary.
fn noop_plugin_binary() -> PathBuf {
    let p = proc_node::binary().with_file_name("nri-test-plugin");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release -p nri-sim --bins` first",
        p.display()
    );
    p
}

/// A fake runtime on `socket` reporting `pods` and `containers`.
async fn runtime(socket: &Path, pods: &[PodSandbox], containers: &[Container]) -> FakeRuntime {
    let config = RuntimeConfig {
        request_timeout: REQUEST_TIMEOUT,
        registration_timeout: REQUEST_TIMEOUT,
        ..RuntimeConfig::default()
    };
    let rt = FakeRuntime::start_with(socket, config).await.unwrap();
    pods.iter().cloned().for_each(|p| rt.add_pod(p));
    containers.iter().cloned().for_each(|c| rt.add_container(c));
    rt
}

/// How the no-op plugin decodes Synchronize: whole (the default, as every plugin on NRI's Go
/// stub does) or, with `SCALE_BENCH_NOOP_SYNC=lean`, lean as the daemon does.
fn noop_sync() -> String {
    std::env::var("SCALE_BENCH_NOOP_SYNC").unwrap_or_else(|_| "full".into())
}

/// The no-op plugin process, connected to `rt` and synchronized.
struct Noop {
    child: Child,
}

impl Noop {
    async fn start(rt: &FakeRuntime, socket: &Path) -> Noop {
        let before = rt.sync_chunks().len();
        let child = Command::new(noop_plugin_binary())
            .arg("--socket")
            .arg(socket)
            .env("NRI_TEST_PLUGIN_SYNC", noop_sync())
            .stdin(Stdio::null())
            .spawn()
            .expect("starting nri-test-plugin");
        rt.wait_synchronized(before + 1, Duration::from_secs(120))
            .await
            .expect("no-op plugin synchronized");
        Noop { child }
    }

    fn rss(&self) -> String {
        rss(self.child.id())
    }
}

impl Drop for Noop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node: config, the daemon's state and sockets under a fresh directory in `base`.
struct Node {
    _dir: tempfile::TempDir,
    config_path: PathBuf,
    log: PathBuf,
    cfg: nri_accel::config::Config,
}

impl Node {
    fn new(base: &Path) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("scale-bench-")
            .tempdir_in(base)
            .unwrap();
        let cfg = proc_node::config(dir.path(), LAYOUT);
        let config_path = dir.path().join("config.yaml");
        proc_node::write_config(&cfg, &config_path);
        Node {
            log: dir.path().join("daemon.log"),
            config_path,
            cfg,
            _dir: dir,
        }
    }

    /// Starts the daemon (`SCALE_BENCH_DAEMON` if set) and waits for its gate: the runtime
    /// has synchronized it.
    async fn start(&self) -> (DaemonProc, ClaimsClient) {
        let binary = std::env::var_os("SCALE_BENCH_DAEMON")
            .map(PathBuf::from)
            .unwrap_or_else(proc_node::binary);
        let d = DaemonProc::spawn_binary(&binary, &self.config_path, &self.log);
        let c = proc_node::wait_gate(&self.cfg.claims_api.socket, Duration::from_secs(300))
            .await
            .expect("gate");
        (d, c)
    }
}

/// How long the bench lets a plugin settle after a Synchronize before the next
/// (`SCALE_BENCH_SETTLE_MS`, default 5000): each frees the decoded request after its answer
/// (nri-accel then gives the pages back), which took 2-2.7 s for 20,000 CRI containers on the
/// loaded 2-core machine. A runtime synchronizes once per plugin connection, so back-to-back
/// Synchronizes would measure that freeing, not a Synchronize.
fn settle() -> Duration {
    Duration::from_millis(env_usize("SCALE_BENCH_SETTLE_MS", 5_000) as u64)
}

/// One Synchronize from `rt`: (time as the runtime sees it, updates in the answer); with
/// `apply`, the runtime then applies the answer's updates.
async fn sync(rt: &FakeRuntime, apply: bool) -> (Duration, usize) {
    let before = rt.sync_updates().len();
    let t = Instant::now();
    rt.resynchronize().await.expect("Synchronize");
    let took = t.elapsed();
    let answer = rt.sync_updates().split_off(before);
    if apply {
        rt.apply_updates(&answer);
    }
    tokio::time::sleep(settle()).await;
    (took, answer.len())
}

/// Synchronizes of the daemon and the no-op plugin, alternating.
struct Series {
    ours: Vec<Duration>,
    theirs: Vec<Duration>,
    /// Updates in each of the daemon's answers (the runtime applies each answer).
    updates: Vec<usize>,
}

/// `syncs` Synchronizes from `rt` (the daemon's runtime, which applies the answers) and from
/// `rt_noop`, alternating.
async fn series(rt: &FakeRuntime, rt_noop: &FakeRuntime, syncs: usize) -> Series {
    let mut s = Series {
        ours: Vec::new(),
        theirs: Vec::new(),
        updates: Vec::new(),
    };
    for _ in 0..syncs {
        let (t, u) = sync(rt, true).await;
        s.ours.push(t);
        s.updates.push(u);
        s.theirs.push(sync(rt_noop, false).await.0);
    }
    s
}

impl Series {
    fn print(&self) {
        println!("   daemon          {}", spread(&self.ours));
        println!(
            "   no-op plugin    {} ({} Synchronize)",
            spread(&self.theirs),
            noop_sync()
        );
        println!(
            "   ratio of p50s {:.2}x; updates per daemon answer (the runtime applies each): {:?}",
            p50(&self.ours).as_secs_f64() / p50(&self.theirs).as_secs_f64(),
            self.updates
        );
    }
}

/// Waits until the daemon has no update left to push.
async fn pushed(c: &ClaimsClient) {
    for _ in 0..6_000 {
        let doc = c.status().await.unwrap().document;
        if doc["pending_updates"] == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("updates still pending after 60 s");
}

/// Part 1 and 2: RSS after Synchronize with 1,000 containers and no claim, then with 10,000
/// containers and 10,000 claims.
async fn rss_parts(base: &Path, parts: &str) {
    let node = Node::new(base);
    let (pods, containers) = cri_node_state(1_000);
    let rt = runtime(&node.cfg.nri.socket, &pods, &containers).await;
    let noop_socket = base.join(format!("noop-{}.sock", std::process::id()));
    let rt_noop = runtime(&noop_socket, &pods, &containers).await;
    let (d, c) = node.start().await;
    let noop = Noop::start(&rt_noop, &noop_socket).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    if parts.contains('1') {
        println!(
            "1. RSS after Synchronize, 1,000 CRI containers, no claim: daemon {}, no-op plugin {} (load {})",
            rss(d.pid()),
            noop.rss(),
            load()
        );
    }
    if !parts.contains('2') {
        d.stop();
        return;
    }
    let more: Vec<(PodSandbox, Container)> = (1_000..10_000)
        .map(|n| {
            let p = cri_pod(n);
            let c = cri_container(n, &p, None, None);
            (p, c)
        })
        .collect();
    for (p, ctr) in &more {
        for r in [&rt, &rt_noop] {
            r.add_pod(p.clone());
            r.add_container(ctr.clone());
        }
    }
    drop(more);
    let rate = fill(&node.cfg.claims_api.socket, 0, 10_000).await;
    println!("   10,000 shared claims prepared ({rate:.0} claims/s)");
    let (took, updates) = sync(&rt, true).await;
    let (took_noop, _) = sync(&rt_noop, false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "2. RSS after Synchronize, 10,000 CRI containers, 10,000 claims: daemon {}, no-op plugin {} (Synchronize {:.0} / {:.0} ms, {updates} updates; load {})",
        rss(d.pid()),
        noop.rss(),
        ms(took),
        ms(took_noop),
        load()
    );
    for _ in 0..4 {
        sync(&rt, true).await;
        sync(&rt_noop, false).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "   after 5 Synchronizes: daemon {}, no-op plugin {}",
        rss(d.pid()),
        noop.rss()
    );
    drop(c);
    d.stop();
    let (d, c) = node.start().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "   after a restart (10,000 records, 10,000 containers): daemon {}",
        rss(d.pid())
    );
    drop(c);
    d.stop();
    drop(noop);
    rt.stop().await;
    rt_noop.stop().await;
}

/// Part 3: Synchronize of `n` containers with CPU management configured, daemon against the
/// no-op plugin, no CPU held and then CPUs held.
async fn sync_part(base: &Path, n: usize, syncs: usize) {
    let node = Node::new(base);
    let (pods, containers) = cri_node_state(n);
    let rt = runtime(&node.cfg.nri.socket, &pods, &containers).await;
    let noop_socket = base.join(format!("noop3-{}.sock", std::process::id()));
    let rt_noop = runtime(&noop_socket, &pods, &containers).await;
    drop((pods, containers));
    let (d, c) = node.start().await;
    let noop = Noop::start(&rt_noop, &noop_socket).await;
    let chunks = rt.sync_chunks().last().copied().unwrap_or(0);
    let series_no_cpu = series(&rt, &rt_noop, syncs).await;
    println!(
        "3. Synchronize of {n} CRI containers ({chunks} chunks), CPU management configured, no CPU held (load {}):",
        load()
    );
    series_no_cpu.print();
    println!(
        "   RSS after: daemon {}, no-op plugin {}",
        rss(d.pid()),
        noop.rss()
    );

    // Two claims take one accelerator-local CPU each: every container then leaves those CPUs,
    // through UpdateContainers pushes, which the runtime applies.
    let pushes_before = rt.updates().len();
    for uid in ["cpu-a", "cpu-b"] {
        let r = c
            .prepare(vec![count_spec(uid, Family::Exclusive)])
            .await
            .unwrap();
        if let Some(Err(why)) = r.get(uid) {
            // Each container update is pending in the checkpoint until pushed: with too many
            // containers in the shared pool the claim's commit is over the cap (a known limit,
            // docs/performance.md); measure that part with fewer containers.
            println!("   a claim taking a CPU is refused with {n} containers: {why}");
            drop(c);
            d.stop();
            return;
        }
        assert!(matches!(r.get(uid), Some(Ok(_))), "prepare {uid}: {r:?}");
    }
    pushed(&c).await;
    let pushes = rt.updates();
    let pushed_updates: Vec<_> = pushes[pushes_before..]
        .iter()
        .flat_map(|r| r.update.iter().cloned())
        .collect();
    rt.apply_updates(&pushed_updates);
    // 1,000 containers started while the daemon was away: unpinned, on every CPU.
    for i in n..n + 1_000 {
        let p = cri_pod(i);
        let ctr = cri_container(i, &p, None, None);
        for r in [&rt, &rt_noop] {
            r.add_pod(p.clone());
            r.add_container(ctr.clone());
        }
    }
    let series_held = series(&rt, &rt_noop, syncs).await;
    println!(
        "   then 2 CPUs held ({} updates pushed, applied by the runtime), 1,000 new unpinned containers:",
        pushed_updates.len()
    );
    series_held.print();
    drop(c);
    d.stop();
    drop(noop);
    rt.stop().await;
    rt_noop.stop().await;
}

fn main() {
    let syncs = env_usize("SCALE_BENCH_SYNCS", 10);
    let n = env_usize("SCALE_BENCH_CONTAINERS", 20_000);
    let parts = std::env::var("SCALE_BENCH_PARTS").unwrap_or_else(|_| "123".into());
    let base = std::env::var_os("SCALE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    noop_plugin_binary();
    println!(
        "scale bench: {} against {}, load average {}",
        std::env::var("SCALE_BENCH_DAEMON")
            .unwrap_or_else(|_| proc_node::binary().display().to_string()),
        noop_plugin_binary().display(),
        load()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(async {
        if parts.contains('1') || parts.contains('2') {
            rss_parts(&base, &parts).await;
        }
        if parts.contains('3') {
            sync_part(&base, n, syncs).await;
        }
    });
}
