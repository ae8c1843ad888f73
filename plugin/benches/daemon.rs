//! The real daemon (`nri-accel run`, a child process) against the fake runtime, driven through
//! the claims API socket:
//! - startup to gate open (empty, and with 10,000 records: checkpoint + 10,000 specs);
//! - RSS (`VmRSS`) idle after Synchronize, with 10,000 claims prepared, and after a restart;
//! - prepare + unprepare of one claim over the socket with 10 and with 10,000 claims held;
//! - prepared claims/s over the socket with 64 concurrent clients;
//! - the time of a Status call (the whole status document) with 1,000 and 10,000 claims.
//!
//! Run: `cargo bench -p nri-accel --bench daemon` (builds the release binary it starts).
//! Files go under `DAEMON_BENCH_DIR` if set, else the target dir. `DAEMON_BENCH_SAMPLES` (200)
//! and `DAEMON_BENCH_CLAIMS` (10000) size the run.
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use nri_accel::claims_api::{ClaimRef, ClaimsClient};
use proc_node::{DaemonProc, Layout, env_usize, fill, ms, pct, shared_claim};

const LAYOUT: Layout = Layout {
    exclusive: 0,
    shared: 64,
    replicas: 200,
    sliced: 0,
    cpus_per_device: 0,
};

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "bench".into(),
        name: String::new(),
    }
}

async fn prepare(c: &ClaimsClient, uid: &str) {
    let r = c.prepare(vec![shared_claim(uid)]).await.unwrap();
    assert!(matches!(r.get(uid), Some(Ok(_))), "prepare {uid}: {r:?}");
}

async fn unprepare(c: &ClaimsClient, uid: &str) {
    let r = c.unprepare(vec![claim_ref(uid)]).await.unwrap();
    assert!(matches!(r.get(uid), Some(Ok(()))), "unprepare {uid}: {r:?}");
}

async fn latency(c: &ClaimsClient, n: usize, tag: &str) -> Vec<Duration> {
    let mut v = Vec::new();
    for i in 0..n {
        let uid = format!("lat-{tag}-{i}");
        let t = Instant::now();
        prepare(c, &uid).await;
        unprepare(c, &uid).await;
        v.push(t.elapsed());
    }
    v
}

async fn status_times(c: &ClaimsClient, n: usize, claims: usize) -> Vec<Duration> {
    let mut v = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = c.status().await.unwrap();
        v.push(t.elapsed());
        assert_eq!(r.document["claims"].as_array().map(Vec::len), Some(claims));
    }
    v
}

fn rss_mib(d: &DaemonProc) -> f64 {
    d.rss_kib().unwrap_or(0) as f64 / 1024.0
}

fn main() {
    let samples = env_usize("DAEMON_BENCH_SAMPLES", 200);
    let claims = env_usize("DAEMON_BENCH_CLAIMS", 10_000);
    let base = std::env::var_os("DAEMON_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("daemon-bench-")
        .tempdir_in(&base)
        .unwrap();
    let cfg = proc_node::config(tmp.path(), LAYOUT);
    let config_path = tmp.path().join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    let log = tmp.path().join("daemon.log");
    let socket = cfg.claims_api.socket.clone();
    println!(
        "daemon bench: {} ({samples} samples, {claims} claims), load average {}",
        proc_node::binary().display(),
        proc_node::load_average()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(async {
        let _fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
        let t = Instant::now();
        let d = DaemonProc::spawn(&config_path, &log);
        let c = proc_node::wait_gate(&socket, Duration::from_secs(60))
            .await
            .expect("gate");
        println!("startup to gate open, empty: {:.1} ms", ms(t.elapsed()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("RSS idle after Synchronize: {:.1} MiB", rss_mib(&d));
        fill(&socket, 0, 10).await;
        println!(
            "socket, 10 held: prepare+unprepare {}",
            pct(latency(&c, samples, "10").await)
        );
        let rate = fill(&socket, 10, 1_000).await;
        println!("socket, fill to 1,000 with 64 clients: {rate:.0} prepared claims/s");
        println!(
            "status with 1,000 claims: {}",
            pct(status_times(&c, 20, 1_000).await)
        );
        println!("RSS with 1,000 claims: {:.1} MiB", rss_mib(&d));
        let rate = fill(&socket, 1_000, claims).await;
        println!("socket, fill to {claims} with 64 clients: {rate:.0} prepared claims/s");
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("RSS with {claims} claims: {:.1} MiB", rss_mib(&d));
        println!(
            "status with {claims} claims: {}",
            pct(status_times(&c, 5, claims).await)
        );
        println!(
            "RSS after 5 status calls with {claims} claims: {:.1} MiB",
            rss_mib(&d)
        );
        println!(
            "socket, {claims} held: prepare+unprepare {}",
            pct(latency(&c, samples, "10k").await)
        );
        println!("RSS after the latency runs: {:.1} MiB", rss_mib(&d));
        drop(c);
        let status = d.stop();
        assert!(
            status.is_some_and(|s| s.success()),
            "daemon stop: {status:?}"
        );
        let mut starts = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let d = DaemonProc::spawn(&config_path, &log);
            let c = proc_node::wait_gate(&socket, Duration::from_secs(60))
                .await
                .expect("gate");
            starts.push(t.elapsed());
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!(
                "RSS after a restart with {claims} records: {:.1} MiB",
                rss_mib(&d)
            );
            drop(c);
            d.stop();
        }
        println!(
            "startup to gate open with {claims} records: {}",
            pct(starts)
        );
    });
}
