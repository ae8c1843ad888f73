//! The NRI protocol benchmark, shared by the `nri_roundtrip` bench target and the `nri-bench`
//! binary (which builds without the dev-dependencies, for a quick release run).
//!
//! 1. Floor: a bare ping-pong of a CreateContainer-request-sized message over a unix socket
//!    between this process and a child process.
//! 2. CreateContainer round trip: fake runtime (this process) -> mux -> ttrpc -> plugin stub (the
//!    child `nri-test-plugin`) -> back, with 1,000 containers known to the runtime. The request
//!    (pod and container) is encoded once and sent with a fresh stream id each time, so the
//!    runtime's own protobuf encoding is not charged to the plugin; the answer is decoded and
//!    recorded each time. The same round trip with the request encoded for each call is
//!    reported next to it.
//!
//! 3. Synchronize of 10,000 containers end to end (paged past 4 MiB).
//!
//! 1 and 2 (both forms) are sampled in alternating blocks of 100 (`BLOCK`) so all see the same
//! machine, and each side's CPU time per round trip is reported with them.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::FakeRuntime;
use crate::fixtures::{container, node_state, pod};
use nri_proto::api::CreateContainerRequest;
use nri_proto::protobuf::{Message, MessageField};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pct(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn report(name: &str, v: &mut [Duration]) -> (Duration, Duration) {
    let (p50, p99) = (pct(v, 50), pct(v, 99));
    println!(
        "{name:<40} n={:<6} p50={:>8.1?} p99={:>8.1?}",
        v.len(),
        p50,
        p99
    );
    (p50, p99)
}

/// The floor's peer: a child process that echoes `size`-byte messages over a unix socket.
struct Echo {
    stream: tokio::net::UnixStream,
    child: tokio::process::Child,
    msg: Vec<u8>,
    back: Vec<u8>,
}

impl Echo {
    async fn start(plugin: &Path, dir: &Path, size: usize) -> Echo {
        let path = dir.join("echo.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind echo socket");
        let child = tokio::process::Command::new(plugin)
            .arg("--echo")
            .arg(&path)
            .arg(size.to_string())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn echo child");
        let (stream, _) = listener.accept().await.expect("accept echo child");
        Echo {
            stream,
            child,
            msg: vec![0x5au8; size],
            back: vec![0u8; size],
        }
    }

    async fn ping(&mut self) {
        self.stream.write_all(&self.msg).await.expect("ping");
        self.stream.read_exact(&mut self.back).await.expect("pong");
    }

    async fn stop(mut self) {
        drop(self.stream);
        let _ = self.child.wait().await;
    }
}

/// Time on CPU of every thread of process `pid` so far (`/proc/<pid>/task/*/schedstat`), or zero
/// where the kernel does not report it.
fn cpu_time(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// CPU time spent by this process and by `peer` while `f` runs.
struct CpuMeter {
    peer: u32,
    ours: Duration,
    theirs: Duration,
}

impl CpuMeter {
    fn new(peer: u32) -> CpuMeter {
        CpuMeter {
            peer,
            ours: Duration::ZERO,
            theirs: Duration::ZERO,
        }
    }

    async fn measure<T>(&mut self, f: impl std::future::Future<Output = T>) -> T {
        let (a, b) = (cpu_time(std::process::id()), cpu_time(self.peer));
        let out = f.await;
        self.ours += cpu_time(std::process::id()).saturating_sub(a);
        self.theirs += cpu_time(self.peer).saturating_sub(b);
        out
    }

    fn per(&self, n: usize) -> (Duration, Duration) {
        let n = n.max(1) as u32;
        (self.ours / n, self.theirs / n)
    }
}

/// Samples taken in alternating blocks, so that the floor and the round trip see the same
/// machine (on a shared VM the floor alone moves by half between minutes).
const BLOCK: usize = 100;

/// Samples dropped at the start of each block, from every series alike: the first exchange after
/// the other series' block finds the peer process idle for milliseconds (cold caches, a halted
/// vCPU), which the alternation causes and which would otherwise be 1 sample in 100, the p99.
const SETTLE: usize = 2;

/// Runs [`run`] on the fake runtime's scheduler: `NRI_BENCH_THREADS` workers (default 2; 0 runs
/// it on a current-thread scheduler). Sockets go under a fresh directory in `dir`.
pub fn main(plugin: &Path, dir: &Path, iters: usize) -> Result<(), String> {
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
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let dir = dir.join(format!("nri-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    runtime.block_on(run(plugin, &dir, iters));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Runs the benchmark with `plugin` (the `nri-test-plugin` binary) as the plugin process,
/// `iters` samples per round-trip figure, sockets under `dir`; prints the figures.
pub async fn run(plugin: &Path, dir: &Path, iters: usize) {
    let path = dir.join("nri.sock");
    let rt = FakeRuntime::start(&path).await.expect("fake runtime");
    let (pods, containers) = node_state(1_000, 200);
    pods.iter().cloned().for_each(|p| rt.add_pod(p));
    containers.into_iter().for_each(|c| rt.add_container(c));
    let mut child = tokio::process::Command::new(plugin)
        .arg("--socket")
        .arg(&path)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn plugin");
    rt.wait_synchronized(1, Duration::from_secs(30))
        .await
        .expect("plugin registered");

    let pd = pod(0);
    let ctr = container(5_000, &pd, 200);
    let mut req = CreateContainerRequest::new();
    req.pod = MessageField::some(pd.clone());
    req.container = MessageField::some(ctr.clone());
    // ttrpc body ~ payload + service/method names; plus 10-byte ttrpc and 8-byte frame headers.
    let size = req.compute_size() as usize + 70 + 18;
    let mut echo = Echo::start(plugin, dir, size).await;
    let encoded = crate::runtime::EncodedCreate::new(&pd, &ctr);

    let (mut fl, mut times) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let mut times_full = Vec::with_capacity(iters);
    let mut echo_cpu = CpuMeter::new(echo.child.id().unwrap_or(0));
    let mut plugin_cpu = CpuMeter::new(child.id().unwrap_or(0));
    let warm = iters / 10;
    for i in 0..(iters + warm).div_ceil(BLOCK) {
        let keep = i * BLOCK >= warm;
        echo_cpu
            .measure(async {
                for k in 0..BLOCK {
                    let t = Instant::now();
                    echo.ping().await;
                    if keep && k >= SETTLE {
                        fl.push(t.elapsed());
                    }
                }
            })
            .await;
        plugin_cpu
            .measure(async {
                for k in 0..BLOCK {
                    let t = Instant::now();
                    rt.create_container_encoded(&encoded)
                        .await
                        .expect("CreateContainer");
                    if keep && k >= SETTLE {
                        times.push(t.elapsed());
                    }
                }
            })
            .await;
        for k in 0..BLOCK {
            let t = Instant::now();
            rt.create_container(&pd, &ctr)
                .await
                .expect("CreateContainer");
            if keep && k >= SETTLE {
                times_full.push(t.elapsed());
            }
        }
    }
    let rounds = (iters + warm).div_ceil(BLOCK) * BLOCK;
    let (fa, fb) = echo_cpu.per(rounds);
    let (ca, cb) = plugin_cpu.per(rounds);
    println!(
        "CPU per round trip: floor {fa:.1?} here + {fb:.1?} echo; CreateContainer {ca:.1?} fake runtime + {cb:.1?} plugin"
    );
    echo.stop().await;
    let (f50, f99) = report(&format!("floor: unix ping-pong {size} B"), &mut fl);
    let (c50, c99) = report("CreateContainer round trip (1,000 known)", &mut times);
    println!(
        "ratio to floor: p50 {:.2}x, p99 {:.2}x",
        c50.as_secs_f64() / f50.as_secs_f64(),
        c99.as_secs_f64() / f99.as_secs_f64()
    );
    let (e50, e99) = report("same, request encoded for each call", &mut times_full);
    println!(
        "ratio to floor, encoding each call: p50 {:.2}x, p99 {:.2}x",
        e50.as_secs_f64() / f50.as_secs_f64(),
        e99.as_secs_f64() / f99.as_secs_f64()
    );

    let (pods, containers) = node_state(10_000, 500);
    let rt2_path = dir.join("nri2.sock");
    let rt2 = FakeRuntime::start(&rt2_path).await.expect("fake runtime 2");
    pods.into_iter().for_each(|p| rt2.add_pod(p));
    containers.into_iter().for_each(|c| rt2.add_container(c));
    let mut child2 = tokio::process::Command::new(plugin)
        .arg("--socket")
        .arg(&rt2_path)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn plugin 2");
    rt2.wait_synchronized(1, Duration::from_secs(30))
        .await
        .expect("plugin 2 registered");
    let mut syncs = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        rt2.resynchronize().await.expect("Synchronize");
        syncs.push(t.elapsed());
    }
    println!("synchronize chunks: {:?}", rt2.sync_chunks().last());
    report("Synchronize 10,000 containers", &mut syncs);

    rt.stop().await;
    rt2.stop().await;
    let _ = child.wait().await;
    let _ = child2.wait().await;
}
