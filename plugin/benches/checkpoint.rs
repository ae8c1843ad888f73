//! Checkpoint costs, measured on real files (a bench binary: it reports
//! percentiles, which criterion's summaries do not):
//! - the fsync floor: append + fdatasync of a file, and fsync of its directory;
//! - one commit with 10 and with 10,000 records held (should be equal);
//! - group commit throughput with 64 threads;
//! - open (startup) with 10,000 records.
//!
//! Run: `cargo bench -p nri-accel --bench checkpoint`. Files go under
//! `CHECKPOINT_BENCH_DIR` if set, else the target dir (a real disk, not tmpfs).
//! `CHECKPOINT_BENCH_QUICK=1` runs a few iterations only (a smoke test).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nri_accel::checkpoint::{Change, Checkpoint};
use serde::{Deserialize, Serialize};

/// A record about the size of an allocation of two devices.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Rec {
    claim: String,
    devices: Vec<String>,
    units: u32,
    numa: u32,
}

type Cp = Checkpoint<Rec, String>;

const BOOT: &str = "00000000-1111-2222-3333-444444444444";

fn rec(i: u32) -> Rec {
    Rec {
        claim: format!("default/claim-{i}"),
        devices: vec![
            format!("0000:{:02x}:00.0", i % 256),
            format!("0000:{:02x}:00.0", (i + 1) % 256),
        ],
        units: 1,
        numa: i % 2,
    }
}

fn uid(i: u32) -> String {
    format!("8d3f4c2a-0000-4000-8000-{i:012}")
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let n = samples.len();
    Stats {
        p50: samples[n / 2],
        p99: samples[(n * 99 / 100).min(n - 1)],
        mean: samples.iter().sum::<Duration>() / n as u32,
    }
}

fn report(name: &str, s: &Stats) {
    println!(
        "{name:<44} p50 {:>9.1?}  p99 {:>9.1?}  mean {:>9.1?}",
        s.p50, s.p99, s.mean
    );
}

fn base_dir() -> PathBuf {
    std::env::var_os("CHECKPOINT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

fn fsync_floor(dir: &Path, iterations: usize) {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("floor"))
        .unwrap();
    let block = [7u8; 200];
    let mut at = 0;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        file.write_all_at(&block, at).unwrap();
        file.sync_data().unwrap();
        samples.push(start.elapsed());
        at += block.len() as u64;
    }
    report("fsync floor: 200 B append + fdatasync", &stats(samples));
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        File::open(dir).unwrap().sync_all().unwrap();
        samples.push(start.elapsed());
    }
    report("fsync floor: directory fsync", &stats(samples));
}

fn prefill(dir: &Path, records: u32) -> Cp {
    let (cp, _) = Cp::open(dir, BOOT).unwrap();
    let mut i = 0;
    while i < records {
        let end = (i + 500).min(records);
        cp.commit(
            (i..end)
                .map(|n| Change::PutRecord(uid(n), rec(n)))
                .collect(),
        )
        .unwrap();
        i = end;
    }
    cp.compact().unwrap();
    cp
}

fn one_commit(dir: &Path, held: u32, iterations: usize) {
    let cp = prefill(dir, held);
    let mut samples = Vec::with_capacity(iterations);
    for n in 0..iterations as u32 {
        // Prepare-shaped: one record and one pending update, then clear it.
        let changes = if n % 2 == 0 {
            vec![
                Change::PutRecord(uid(held + n), rec(n)),
                Change::PutPending(format!("ctr-{n}"), "0-3".to_owned()),
            ]
        } else {
            vec![Change::DeletePending(format!("ctr-{}", n - 1))]
        };
        let start = Instant::now();
        cp.commit(changes).unwrap();
        samples.push(start.elapsed());
    }
    report(&format!("commit, {held} records held"), &stats(samples));
}

fn group_commit(dir: &Path, threads: u32, per_thread: u32) {
    let (cp, _) = Cp::open(dir, BOOT).unwrap();
    let cp = Arc::new(cp);
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cp, barrier) = (cp.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..per_thread {
                    let n = t * per_thread + i;
                    cp.commit(vec![Change::PutRecord(uid(n), rec(n))]).unwrap();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let s = cp.stats();
    println!(
        "group commit, {threads} threads: {} commits in {elapsed:.2?} = {:.0} commits/s, {} batches ({:.1} commits per fdatasync)",
        s.commits,
        s.commits as f64 / elapsed.as_secs_f64(),
        s.batches,
        s.commits as f64 / s.batches as f64
    );
}

fn open_cost(dir: &Path, records: u32, wal_commits: u32, iterations: usize) {
    let cp = prefill(dir, records);
    for n in 0..wal_commits {
        cp.commit(vec![Change::PutRecord(uid(n), rec(n + 1))])
            .unwrap();
    }
    drop(cp);
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        let (cp, report) = Cp::open(dir, BOOT).unwrap();
        samples.push(start.elapsed());
        assert_eq!(report.records, records as usize);
        drop(cp);
    }
    report(
        &format!("open, {records} records + {wal_commits} log entries"),
        &stats(samples),
    );
}

fn main() {
    let quick = std::env::var_os("CHECKPOINT_BENCH_QUICK").is_some();
    let (iterations, per_thread, opens) = if quick { (20, 5, 2) } else { (1000, 50, 10) };
    let base = base_dir();
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    println!("checkpoint bench in {}", tmp.path().display());
    let dir = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    fsync_floor(&dir("floor"), iterations);
    one_commit(&dir("held-10"), 10, iterations);
    one_commit(&dir("held-10000"), 10_000, iterations);
    fsync_floor(&dir("floor-again"), iterations);
    group_commit(&dir("group"), 64, per_thread);
    group_commit(&dir("group-1"), 1, per_thread * 8);
    open_cost(&dir("open"), 10_000, 0, opens);
    open_cost(&dir("open-wal"), 10_000, 2_000, opens);
}
