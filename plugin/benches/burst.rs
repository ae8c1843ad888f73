//! Memory and threads of the real daemon under a burst of claims API clients (issue 27,
//! item 10): `VmRSS` and `Threads` of `nri-accel run` before, at the peak during and after
//! 200 clients, each on its own connection, prepare and unprepare claims at once.
//!
//! Then an idle flood (issue 39, item 6): `BURST_FLOOD` (1,000) connections that never send
//! anything, then one new client, whose Status must be served; the peak `VmRSS` and `Threads`
//! during the flood and the daemon's log lines about connections are printed.
//!
//! Run: `cargo bench -p nri-accel --bench burst` (release), or `--profile dev` for the debug
//! binary. `BURST_CLIENTS` (200) and `BURST_ROUNDS` (5) size the burst; `BURST_BINARY` runs
//! another build (main before issue 39: its config then leaves out the two settings it does
//! not know, `first_request_timeout_seconds` and `unconfirmed_grant_secs`).
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

/// Samples a process every 5 ms until `running` is cleared; answers the peak (`VmRSS` in MiB,
/// `Threads`).
fn sample_peak(pid: u32, running: Arc<AtomicBool>) -> std::thread::JoinHandle<(f64, u64)> {
    std::thread::spawn(move || {
        let mut peak = (0.0f64, 0u64);
        while running.load(Ordering::Relaxed) {
            let (r, t) = sample(pid);
            peak = (peak.0.max(r), peak.1.max(t));
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    })
}

/// Lines of the daemon's log about claims API connections.
fn connection_lines(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("claims API connection"))
        .count()
}

/// Raises this process's open file limit to its hard limit (the flood holds one descriptor per
/// connection; the daemon inherits it).
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

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
    raise_nofile();
    let clients = env_usize("BURST_CLIENTS", 200);
    let flood = env_usize("BURST_FLOOD", 1000);
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
            .filter(|l| {
                !["first_request_timeout_seconds", "unconfirmed_grant_secs"]
                    .iter()
                    .any(|k| l.contains(k))
            })
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
        let sampler = sample_peak(pid, running.clone());
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

        // The idle flood: connections that never send anything, then a new client.
        let lines_before = connection_lines(&log);
        let running = Arc::new(AtomicBool::new(true));
        let sampler = sample_peak(d.pid(), running.clone());
        let t = Instant::now();
        let path = socket.clone();
        let idle = tokio::task::spawn_blocking(move || {
            (0..flood)
                .map(|_| std::os::unix::net::UnixStream::connect(&path))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let opened = idle.iter().filter(|c| c.is_ok()).count();
        let fresh = ClaimsClient::connect(&socket)
            .await
            .map(|c| c.with_timeout(Duration::from_secs(30)));
        let answer = match fresh {
            Ok(c) => c.status().await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let took = t.elapsed();
        running.store(false, Ordering::Relaxed);
        let (peak_rss, peak_threads) = sampler.join().unwrap();
        match &answer {
            Ok(()) => println!(
                "idle flood: {opened} of {flood} connections opened that never send; a new client was served {:.2} s after the flood began",
                took.as_secs_f64()
            ),
            Err(e) => println!(
                "idle flood: {opened} of {flood} connections opened that never send; a new client was NOT served: {e}"
            ),
        }
        println!(
            "idle flood: peak RSS {peak_rss:.1} MiB, peak {peak_threads} threads; {} log lines about connections by then",
            connection_lines(&log) - lines_before
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        let (rss, threads) = sample(d.pid());
        println!(
            "idle flood, 11 s after: RSS {rss:.1} MiB, {threads} threads; {} log lines about connections in all",
            connection_lines(&log) - lines_before
        );
        drop(idle);
        drop(c);
        d.stop();
    });
}
