//! Memory and threads of the real daemon under a burst of claims API clients (issue 27,
//! item 10): `VmRSS` and `Threads` of `nri-accel run` before, at the peak during and after
//! 200 clients, each on its own connection, prepare and unprepare claims at once.
//!
//! Run: `cargo bench -p nri-accel --bench burst` (release), or `--profile dev` for the debug
//! binary. `BURST_CLIENTS` (200) and `BURST_ROUNDS` (5) size the burst; `BURST_BINARY` runs
//! another build (an older one: its config then leaves out the settings it does not know).
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use nri_accel::claims_api::{ClaimRef, ClaimsClient};
use proc_node::{DaemonProc, Layout, env_usize, shared_claim};

const LAYOUT: Layout = Layout {
    exclusive: 0,
    shared: 64,
    replicas: 200,
    sliced: 0,
    cpus_per_device: 0,
};

/// (`VmRSS` in MiB, `Threads`) of a process.
fn sample(pid: u32) -> (f64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:") as f64 / 1024.0, field("Threads:"))
}

fn main() {
    let clients = env_usize("BURST_CLIENTS", 200);
    let rounds = env_usize("BURST_ROUNDS", 5);
    let binary = std::env::var_os("BURST_BINARY").map(PathBuf::from);
    let tmp = tempfile::Builder::new()
        .prefix("burst-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let mut cfg = proc_node::config(tmp.path(), LAYOUT);
    // The burst is about threads and memory, not the connection cap: every client is served.
    cfg.claims_api.max_connections = (clients as u32 + 8).max(128);
    let config_path = tmp.path().join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    if binary.is_some() {
        let text = std::fs::read_to_string(&config_path).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("max_connections") && !l.contains("idle_timeout_seconds"))
            .collect();
        std::fs::write(&config_path, kept.join("\n")).unwrap();
    }
    let log = tmp.path().join("daemon.log");
    let socket = cfg.claims_api.socket.clone();
    let bin = binary.clone().unwrap_or_else(proc_node::binary);
    println!(
        "burst bench: {} ({clients} clients x {rounds} prepare+unprepare), load average {}",
        bin.display(),
        proc_node::load_average()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(async {
        let _fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
        let d = DaemonProc::spawn_binary(&bin, &config_path, &log);
        let c = proc_node::wait_gate(&socket, Duration::from_secs(60))
            .await
            .expect("gate");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss, threads) = sample(d.pid());
        println!("before: RSS {rss:.1} MiB, {threads} threads");

        let pid = d.pid();
        let running = Arc::new(AtomicBool::new(true));
        let sampler = {
            let running = running.clone();
            std::thread::spawn(move || {
                let mut peak = (0.0f64, 0u64);
                while running.load(Ordering::Relaxed) {
                    let (r, t) = sample(pid);
                    peak = (peak.0.max(r), peak.1.max(t));
                    std::thread::sleep(Duration::from_millis(5));
                }
                peak
            })
        };
        let t = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..clients {
            let socket = socket.clone();
            tasks.push(tokio::spawn(async move {
                let c = ClaimsClient::connect(&socket).await.unwrap();
                for r in 0..rounds {
                    let uid = format!("burst-{i}-{r}");
                    let p = c.prepare(vec![shared_claim(&uid)]).await.unwrap();
                    assert!(matches!(p.get(&uid), Some(Ok(_))), "{uid}: {p:?}");
                    let u = c
                        .unprepare(vec![ClaimRef {
                            uid: uid.clone(),
                            namespace: "bench".into(),
                            name: String::new(),
                        }])
                        .await
                        .unwrap();
                    assert!(matches!(u.get(&uid), Some(Ok(()))), "{uid}: {u:?}");
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let took = t.elapsed();
        running.store(false, Ordering::Relaxed);
        let (peak_rss, peak_threads) = sampler.join().unwrap();
        println!(
            "during: peak RSS {peak_rss:.1} MiB, peak {peak_threads} threads ({} claims prepared and released in {:.2} s, {:.0}/s)",
            clients * rounds,
            took.as_secs_f64(),
            (clients * rounds) as f64 / took.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss, threads) = sample(d.pid());
        println!("1 s after: RSS {rss:.1} MiB, {threads} threads");
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (rss, threads) = sample(d.pid());
        println!("16 s after: RSS {rss:.1} MiB, {threads} threads");
        drop(c);
        d.stop();
    });
}
