//! The NRI protocol benchmark, shared by the `nri_roundtrip` bench target and the `nri-bench`
//! binary (which builds without the dev-dependencies, for a quick release run).
//!
//! 1. Floor: a bare ping-pong of a CreateContainer-request-sized message over a unix socket
//!    between this process and a child process.
//! 2. CreateContainer round trip: fake runtime (this process) -> mux -> ttrpc -> plugin stub (the
//!    child `nri-test-plugin`) -> back, with 1,000 containers known to the runtime.
//! 3. Synchronize of 10,000 containers end to end (paged past 4 MiB).
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

async fn floor(plugin: &Path, dir: &Path, size: usize, iters: usize) -> Vec<Duration> {
    let path = dir.join("echo.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind echo socket");
    let mut child = tokio::process::Command::new(plugin)
        .arg("--echo")
        .arg(&path)
        .arg(size.to_string())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn echo child");
    let (mut s, _) = listener.accept().await.expect("accept echo child");
    let msg = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        s.write_all(&msg).await.expect("ping");
        s.read_exact(&mut back).await.expect("pong");
        if i >= iters / 10 {
            times.push(t.elapsed());
        }
    }
    drop(s);
    let _ = child.wait().await;
    times
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

    let mut fl = floor(plugin, dir, size, iters).await;
    let (f50, f99) = report(&format!("floor: unix ping-pong {size} B"), &mut fl);

    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        rt.create_container(&pd, &ctr)
            .await
            .expect("CreateContainer");
        if i >= iters / 10 {
            times.push(t.elapsed());
        }
    }
    let (c50, c99) = report("CreateContainer round trip (1,000 known)", &mut times);
    println!(
        "ratio to floor: p50 {:.2}x, p99 {:.2}x",
        c50.as_secs_f64() / f50.as_secs_f64(),
        c99.as_secs_f64() / f99.as_secs_f64()
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
