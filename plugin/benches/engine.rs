//! Claim engine costs, in-process, on real files (a bench binary: it reports percentiles):
//! - the fsync floor of a spec-sized write: file write + fsync + directory fsync in the CDI dir;
//! - prepare + unprepare of one claim, with 10 and with 10,000 claims held (durable commits: the
//!   real checkpoint and real CDI specs in a temp dir on the same file system);
//! - throughput with 64 concurrent callers: filling to 10,000 claims on a shared pool, and
//!   prepare + unprepare cycles on 64 distinct whole devices;
//! - startup with 10,000 records (checkpoint open + spec store open + `Engine::start`);
//! - a Synchronize after the checkpoint was lost: 256 running containers on 64 shared devices
//!   without records, all adopted before the answer (256 records, 256 specs), then the release
//!   of all of them when the runtime comes back without them (after the answer).
//!
//! Run: `cargo bench -p nri-accel --bench engine`. Files go under `ENGINE_BENCH_DIR` if set, else
//! the target dir (a real disk, not tmpfs). `ENGINE_BENCH_SAMPLES` (200), `ENGINE_BENCH_CLAIMS`
//! (10000) and `ENGINE_BENCH_SECS` (3) size the run.
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use proc_node::{env_usize, ms};

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nri_accel::checkpoint::Checkpoint;
use nri_accel::engine::Engine;
use policies::{
    Ask, ClaimRequest, CountRequest, DeviceSelector, FamilyConfig, Inventory, Node, PoolConfig,
    Registry,
};

const BOOT: &str = "00000000-1111-2222-3333-444444444444";

fn pct(mut v: Vec<Duration>) -> String {
    v.sort();
    let n = v.len();
    let p = |q: f64| v[((n as f64 * q) as usize).min(n - 1)];
    let mean = v.iter().sum::<Duration>() / n as u32;
    format!(
        "p50 {:>8.2} ms  p99 {:>8.2} ms  mean {:>8.2} ms  (n={n})",
        ms(p(0.5)),
        ms(p(0.99)),
        ms(mean)
    )
}

fn base_dir() -> PathBuf {
    let base = std::env::var_os("ENGINE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    base
}

struct Dirs {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    cdi: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::Builder::new()
        .prefix("engine-bench-")
        .tempdir_in(base_dir())
        .unwrap();
    let state = tmp.path().join("state");
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&cdi).unwrap();
    Dirs {
        _tmp: tmp,
        state,
        cdi,
    }
}

fn node(devices: u32, family: FamilyConfig) -> Node {
    let inv = Inventory {
        devices: (0..devices).map(|i| proc_node::gpu(i, i % 2)).collect(),
        cpus: "0-31".parse().unwrap(),
    };
    let pools = vec![PoolConfig {
        name: "gpus".into(),
        select: DeviceSelector::default(),
        family,
        cpus_per_device: 0,
        unhealthy: Default::default(),
        vendor_cdi: Default::default(),
    }];
    Node::new(inv, &pools, &Registry::with_builtins()).unwrap()
}

fn shared() -> FamilyConfig {
    FamilyConfig::Shared {
        replicas: 200,
        memory_mib_per_share: 100,
        compute_percent_per_share: 1,
    }
}

fn open(d: &Dirs, node: Node) -> Engine {
    let journal = Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let store = cdi::SpecStore::open(cdi::StoreConfig {
        dir: d.cdi.clone(),
        vendor: "accel.nri.io".into(),
        class: "device".into(),
        format: cdi::SpecFormat::Yaml,
    })
    .unwrap();
    Engine::start(node, journal, store, None).unwrap().0
}

fn claim(uid: &str, device: Option<u32>) -> ClaimRequest {
    let selector = DeviceSelector {
        ids: device.map(|i| vec![format!("gpu{i}")]).unwrap_or_default(),
        ..DeviceSelector::default()
    };
    ClaimRequest {
        uid: uid.into(),
        namespace: "bench".into(),
        name: format!("{uid}-claim"),
        ask: Ask::Count(vec![CountRequest {
            request: "gpu".into(),
            count: 1,
            family: None,
            selector,
            profile: None,
            shares: None,
        }]),
    }
}

/// File write + fsync + directory fsync of a spec-sized file in `dir`, `n` times.
fn floor(dir: &Path, n: usize) -> Vec<Duration> {
    let bytes = vec![b'x'; 600];
    let dirf = File::open(dir).unwrap();
    (0..n)
        .map(|i| {
            let t = Instant::now();
            let mut f = File::create(dir.join(format!("floor-{}", i % 4))).unwrap();
            f.write_all(&bytes).unwrap();
            f.sync_all().unwrap();
            dirf.sync_all().unwrap();
            t.elapsed()
        })
        .collect()
}

/// Sequential prepare + unprepare of new claims on `engine`: (prepare, unprepare, pair) samples.
async fn latency(
    engine: &Engine,
    n: usize,
    tag: &str,
) -> (Vec<Duration>, Vec<Duration>, Vec<Duration>) {
    let (mut p, mut u, mut pair) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let uid = format!("lat-{tag}-{i}");
        let t = Instant::now();
        engine.prepare(claim(&uid, None)).await.unwrap();
        let t1 = Instant::now();
        engine.unprepare(&uid).await.unwrap();
        let t2 = Instant::now();
        p.push(t1 - t);
        u.push(t2 - t1);
        pair.push(t2 - t);
    }
    (p, u, pair)
}

/// Prepares claims `from..to` with 64 concurrent callers; returns claims/s.
async fn fill(engine: &Arc<Engine>, from: usize, to: usize) -> f64 {
    let next = Arc::new(AtomicU64::new(from as u64));
    let t = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= to {
                        break;
                    }
                    engine
                        .prepare(claim(&format!("held-{i}"), None))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (to - from) as f64 / t.elapsed().as_secs_f64()
}

/// 64 callers, each preparing and unpreparing claims on its own whole device for `secs`.
async fn cycles(secs: u64) -> (f64, f64, Vec<Duration>) {
    let d = dirs();
    let engine = Arc::new(open(&d, node(64, FamilyConfig::Exclusive)));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let t = Instant::now();
    let tasks: Vec<_> = (0..64u32)
        .map(|dev| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut prep = Vec::new();
                let mut n = 0;
                while Instant::now() < deadline {
                    let uid = format!("cyc-{dev}-{n}");
                    n += 1;
                    let s = Instant::now();
                    engine.prepare(claim(&uid, Some(dev))).await.unwrap();
                    prep.push(s.elapsed());
                    engine.unprepare(&uid).await.unwrap();
                }
                prep
            })
        })
        .collect();
    let mut prep = Vec::new();
    for t in tasks {
        prep.extend(t.await.unwrap());
    }
    let el = t.elapsed().as_secs_f64();
    (prep.len() as f64 / el, prep.len() as f64 / el, prep)
}

/// A Synchronize that adopts `n` containers (4 per shared device) and answers, then the release
/// of all of them after the next (empty) Synchronize: (time to answer, time to release).
async fn adoption(n: u32) -> (Duration, Duration) {
    use nri_accel::daemon::{Agent, AgentSettings, ContainerView};
    let d = dirs();
    let agent = Agent::new(
        Arc::new(open(&d, node(64, shared()))),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    );
    let views: Vec<ContainerView> = (0..n)
        .map(|i| ContainerView {
            id: format!("running-{i:04}"),
            name: "app".into(),
            device_nodes: vec![(195, i % 64)],
            ..ContainerView::default()
        })
        .collect();
    let t = Instant::now();
    let synced = agent.synchronize(&views).await;
    let answer = t.elapsed();
    assert!(synced.gone.is_empty());
    assert_eq!(agent.engine().claims().len(), n as usize);
    let synced = agent.synchronize(&[]).await;
    let t = Instant::now();
    agent.release_gone(&synced.gone).await;
    let release = t.elapsed();
    assert!(agent.engine().claims().is_empty());
    (answer, release)
}

fn main() {
    let samples = env_usize("ENGINE_BENCH_SAMPLES", 200);
    let claims = env_usize("ENGINE_BENCH_CLAIMS", 10_000);
    let secs = env_usize("ENGINE_BENCH_SECS", 3) as u64;
    let rt = proc_node::bench_runtime();
    println!(
        "engine bench: {samples} samples, {claims} claims, load average {}",
        proc_node::load_average()
    );
    rt.block_on(async {
        let d = dirs();
        println!("floor (600 B write + fsync + dir fsync): {}", pct(floor(&d.cdi, samples)));
        let engine = Arc::new(open(&d, node(64, shared())));
        fill(&engine, 0, 10).await;
        let (p, u, pair) = latency(&engine, samples, "10").await;
        println!("10 held:     prepare   {}", pct(p));
        println!("10 held:     unprepare {}", pct(u));
        println!("10 held:     pair      {}", pct(pair));
        let rate = fill(&engine, 10, claims).await;
        println!("fill to {claims} with 64 callers (shared pool): {rate:.0} prepared claims/s");
        println!("floor again: {}", pct(floor(&d.cdi, samples)));
        let (p, u, pair) = latency(&engine, samples, "10k").await;
        println!("{claims} held: prepare   {}", pct(p));
        println!("{claims} held: unprepare {}", pct(u));
        println!("{claims} held: pair      {}", pct(pair));
        drop(engine);
        let mut starts = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let e = open(&d, node(64, shared()));
            starts.push(t.elapsed());
            assert_eq!(e.claims().len(), claims);
        }
        println!("startup with {claims} records (checkpoint + specs + Engine::start): {}", pct(starts));
        let (mut answers, mut releases) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let (a, r) = adoption(256).await;
            answers.push(a);
            releases.push(r);
        }
        println!("Synchronize adopting 256 containers on 64 shared devices, to the answer: {}", pct(answers));
        println!("releasing those 256 adopted claims after the answer: {}", pct(releases));
        let (rate, _, prep) = cycles(secs).await;
        println!(
            "64 callers on 64 whole devices, prepare+unprepare cycles for {secs} s: {rate:.0} prepared claims/s; prepare {}",
            pct(prep)
        );
    });
}
