//! A simulated node driven out of process: a config with static devices of all three families,
//! the real `nri-accel run` binary as a child process, and helpers to read its memory and wait
//! for its gate. Shared by the soak test and the daemon benches (`#[path]`-included).
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nri_accel::claims_api::{ClaimAsk, ClaimSpec, ClaimsClient, CountAsk, Family, Selector};
use nri_accel::config::Config;
use policies::{CpuSet, Device, DeviceSelector, FamilyConfig, PoolConfig};

/// One simulated GPU; `i` picks its PCI address and minor, `numa` its local CPUs (16 per node).
pub fn gpu(i: u32, numa: u32) -> Device {
    let local: CpuSet = if numa == 0 { "0-15" } else { "16-31" }
        .parse()
        .unwrap_or_default();
    let pci = format!("0000:{:02x}:{:02x}.0", 0x18 + i / 32, i % 32);
    nri_accel::fixtures::simulated_gpu(i, numa, local, pci)
}

fn select(ids: impl Iterator<Item = u32>) -> DeviceSelector {
    DeviceSelector {
        ids: ids.map(|i| format!("gpu{i}")).collect(),
        ..DeviceSelector::default()
    }
}

/// Pool layout of a simulated node: how many devices of each family.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Devices handed out whole (pool `whole`).
    pub exclusive: u32,
    /// Devices shared `replicas` ways (pool `shared`).
    pub shared: u32,
    /// Replicas per shared device.
    pub replicas: u32,
    /// Devices cut into 8-slot slices (pool `mig`, profiles `1g.10gb` and `3g.40gb`).
    pub sliced: u32,
    /// Accelerator-local CPUs per whole device.
    pub cpus_per_device: u32,
}

/// The soak node: 16 devices across all three families.
pub const SOAK_LAYOUT: Layout = Layout {
    exclusive: 6,
    shared: 5,
    replicas: 4,
    sliced: 5,
    cpus_per_device: 1,
};

/// A config for a 32-CPU, 2-NUMA node with `layout`'s devices, everything under `dir`.
#[allow(clippy::field_reassign_with_default)]
pub fn config(dir: &Path, layout: Layout) -> Config {
    let mut c = Config::default();
    c.state_dir = dir.join("state");
    c.cdi.dir = dir.join("cdi");
    c.nri.socket = dir.join("nri.sock");
    c.claims_api.socket = dir.join("claims.sock");
    c.reconcile_interval_secs = 0;
    c.discovery.sysfs = false;
    c.discovery.cpus = "0-31".parse().ok();
    let total = layout.exclusive + layout.shared + layout.sliced;
    c.discovery.static_devices = (0..total).map(|i| gpu(i, i % 2)).collect();
    let e = layout.exclusive;
    let s = e + layout.shared;
    c.pools = Vec::new();
    if layout.exclusive > 0 {
        c.pools.push(PoolConfig {
            name: "whole".into(),
            select: select(0..e),
            family: FamilyConfig::Exclusive,
            cpus_per_device: layout.cpus_per_device,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        });
    }
    if layout.shared > 0 {
        c.pools.push(PoolConfig {
            name: "shared".into(),
            select: select(e..s),
            family: FamilyConfig::Shared {
                replicas: layout.replicas,
                memory_mib_per_share: 1_000,
                compute_percent_per_share: 1,
            },
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        });
    }
    if layout.sliced > 0 {
        c.pools.push(PoolConfig {
            name: "mig".into(),
            select: select(s..total),
            family: FamilyConfig::Sliced {
                slots: 8,
                profiles: nri_accel::fixtures::mig_profiles(),
            },
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        });
    }
    c
}

/// Writes `cfg` as a config file (JSON is a subset of the YAML the daemon reads).
pub fn write_config(cfg: &Config, path: &Path) {
    let text = serde_json::to_string_pretty(cfg).expect("config serializes");
    std::fs::write(path, text).expect("writing the config");
}

/// The release (or debug) `nri-accel` binary next to the test executable.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nri-accel"))
}

/// A running `nri-accel run` child.
pub struct DaemonProc {
    pub child: Child,
}

impl DaemonProc {
    /// Starts `nri-accel --config <config> run`, its log appended to `log`.
    pub fn spawn(config: &Path, log: &Path) -> DaemonProc {
        Self::spawn_binary(&binary(), config, log)
    }

    /// Starts `<binary> --config <config> run` (another build, or a wrapper that execs one), its
    /// log appended to `log`.
    pub fn spawn_binary(binary: &Path, config: &Path, log: &Path) -> DaemonProc {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("opening the daemon log");
        let err = out.try_clone().expect("cloning the log fd");
        let child = Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("--log")
            .arg("warn")
            .arg("run")
            .env_remove("NRI_PLUGIN_SOCKET")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting nri-accel");
        DaemonProc { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB (`VmRSS` of /proc/<pid>/status); `None` once it exited.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid())
    }

    /// SIGKILL and reap.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit (SIGKILL after 20 s).
    pub fn stop(mut self) -> Option<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

/// `VmRSS` of a process in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Connects to the claims API and waits until its gate is open; `None` on timeout.
/// Polls every 5 ms.
pub async fn wait_gate(socket: &Path, timeout: Duration) -> Option<ClaimsClient> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(c) = ClaimsClient::connect(socket).await {
            let c = c.with_timeout(Duration::from_secs(10));
            // An empty Prepare is refused whole while the gate is closed and costs nothing once
            // it is open (Status would build the whole document on every poll).
            if c.prepare(Vec::new()).await.is_ok() {
                return Some(c);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// A small seeded PRNG (splitmix64): the soak's choices are reproducible from its seed.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `p` percent.
    pub fn chance(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// The machine's load average as `/proc/loadavg` gives it, for a bench's first line (the figures
/// of this 2-core VM depend on what else runs).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The runtime a bench drives its clients on: two workers, like the daemon's host.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// An env var as a number, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50, p99 and max of `v`, in milliseconds.
pub fn pct(mut v: Vec<Duration>) -> String {
    v.sort();
    let n = v.len();
    let p = |q: f64| v[((n as f64 * q) as usize).min(n - 1)];
    format!(
        "p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  (n={n})",
        ms(p(0.5)),
        ms(p(0.99)),
        ms(v[n - 1])
    )
}

/// A claim `uid` in namespace `bench` asking for one unit of `family`.
pub fn count_spec(uid: &str, family: Family) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "bench".into(),
        name: format!("{uid}-claim"),
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpu".into(),
            count: 1,
            family,
            selector: Selector::default(),
            profile: None,
            shares: None,
        }]),
        env: Default::default(),
    }
}

/// Prepares `held-<from..to>` (one shared unit each) with 64 concurrent clients on the claims
/// socket; returns prepared claims/s.
pub async fn fill(socket: &Path, from: usize, to: usize) -> f64 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = Arc::new(AtomicU64::new(from as u64));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let c = ClaimsClient::connect(socket).await.unwrap();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= to {
                    break;
                }
                let uid = format!("held-{i}");
                let r = c
                    .prepare(vec![count_spec(&uid, Family::Shared)])
                    .await
                    .unwrap();
                assert!(matches!(r.get(&uid), Some(Ok(_))), "prepare {uid}: {r:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (to - from) as f64 / t.elapsed().as_secs_f64()
}

/// A claim of one share of any shared device.
pub fn shared_claim(uid: &str) -> ClaimSpec {
    count_spec(uid, Family::Shared)
}
