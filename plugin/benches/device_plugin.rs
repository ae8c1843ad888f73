//! The kubelet device plugin path, measured:
//! - Allocate of one device over the plugin's socket against the real daemon (`nri-accel run`,
//!   a child process), next to a claims API Prepare of one claim over its socket to the same
//!   daemon, the two interleaved so that both see the same node and the same background;
//! - ListAndWatch update latency: from the health monitor publishing a change to the simulated
//!   kubelet holding the new list (in process, over the real socket).
//!
//! Run: `cargo bench -p nri-accel --bench device_plugin`. Files go under `DP_BENCH_DIR` if set,
//! else the target dir. `DP_BENCH_SAMPLES` (200) sizes the run.
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use kube_sim::kubelet::DevicePluginKubelet;
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, Family};
use nri_accel::device_health::{DeviceHealth, HealthMonitor, HealthReport};
use nri_accel::gate::Gate;
use nri_accel::kubelet::device_plugin::DevicePlugins;
use proc_node::{DaemonProc, Layout, env_usize, pct};

const LAYOUT: Layout = Layout {
    exclusive: 8,
    shared: 8,
    replicas: 64,
    sliced: 0,
    cpus_per_device: 0,
};
const SHARED: &str = "accel.nri.io/shared";
const WHOLE: &str = "accel.nri.io/whole";
const WAIT: Duration = Duration::from_secs(60);

/// One shared unit from the claims API's half of the shared GPUs (the kubelet allocates from
/// the other).
fn spec(uid: &str) -> ClaimSpec {
    let mut spec = proc_node::count_spec(uid, Family::Shared);
    if let ClaimAsk::Count(asks) = &mut spec.ask {
        asks[0].selector.device_ids = (12..16).map(|i| format!("gpu{i}")).collect();
    }
    spec
}

/// Allocate vs Prepare against the real daemon.
async fn allocate_vs_prepare(base: &std::path::Path, samples: usize) {
    let tmp = tempfile::Builder::new()
        .prefix("dp-bench-")
        .tempdir_in(base)
        .unwrap();
    let mut cfg = proc_node::config(tmp.path(), LAYOUT);
    cfg.device_plugin.enabled = true;
    cfg.device_plugin.dir = tmp.path().join("device-plugins");
    let config_path = tmp.path().join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    let log = tmp.path().join("daemon.log");
    let _fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
    let kubelet = DevicePluginKubelet::start(&cfg.device_plugin.dir).unwrap();
    let d = DaemonProc::spawn(&config_path, &log);
    let claims = proc_node::wait_gate(&cfg.claims_api.socket, WAIT)
        .await
        .expect("gate");
    let plugin = kubelet
        .wait_registered(SHARED, WAIT)
        .await
        .expect("registered");
    let ours = ["gpu8::", "gpu9::", "gpu10::", "gpu11::"];
    let ids: Vec<String> = plugin
        .devices
        .iter()
        .map(|d| d.id.clone())
        .filter(|id| ours.iter().any(|p| id.starts_with(p)))
        .collect();
    let client = kubelet.client(SHARED).await.unwrap();
    let n = samples.min(ids.len() - 10);
    // Warm-up: connections, page cache, the daemon's allocator.
    let mut next = ids.iter().rev();
    for i in 0..10 {
        let id = next.next().unwrap().clone();
        client.allocate(&[id]).await.unwrap();
        let r = claims
            .prepare(vec![spec(&format!("warm-{i}"))])
            .await
            .unwrap();
        assert!(r.values().all(Result::is_ok));
    }
    let (mut alloc, mut prep) = (Vec::new(), Vec::new());
    for (i, id) in ids.iter().take(n).enumerate() {
        let t = Instant::now();
        let a = client.allocate(std::slice::from_ref(id)).await.unwrap();
        alloc.push(t.elapsed());
        assert_eq!(a.cdi_devices.len(), 1);
        let uid = format!("lat-{i}");
        let t = Instant::now();
        let r = claims.prepare(vec![spec(&uid)]).await.unwrap();
        prep.push(t.elapsed());
        assert!(matches!(r.get(&uid), Some(Ok(_))), "{r:?}");
    }
    println!(
        "device plugin Allocate of one replica over its socket: {}",
        pct(alloc)
    );
    println!(
        "claims API Prepare of one claim over its socket:      {}",
        pct(prep)
    );
    // Whole devices too (one claim per GPU, at most 8).
    let whole = kubelet.wait_registered(WHOLE, WAIT).await.unwrap();
    let wc = kubelet.client(WHOLE).await.unwrap();
    let mut w = Vec::new();
    for dev in &whole.devices {
        let t = Instant::now();
        wc.allocate(std::slice::from_ref(&dev.id)).await.unwrap();
        w.push(t.elapsed());
    }
    println!(
        "device plugin Allocate of one whole GPU:               {}",
        pct(w)
    );
    drop(claims);
    d.stop();
}

/// Health change -> ListAndWatch update at the kubelet, in process.
async fn listing_latency(base: &std::path::Path, samples: usize) {
    let tmp = tempfile::Builder::new()
        .prefix("dp-bench-watch-")
        .tempdir_in(base)
        .unwrap();
    let cfg = proc_node::config(tmp.path(), LAYOUT);
    let inv = policies::Inventory {
        devices: cfg.discovery.static_devices.clone(),
        cpus: "0-31".parse().unwrap(),
    };
    let node = policies::Node::new(
        inv.clone(),
        &cfg.pools,
        &policies::Registry::with_builtins(),
    )
    .unwrap();
    std::fs::create_dir_all(&cfg.cdi.dir).unwrap();
    let journal = nri_accel::checkpoint::Checkpoint::load(&cfg.state_dir, "bench").unwrap();
    let specs = cdi::SpecStore::open(nri_accel::daemon::run::store_config(&cfg.cdi)).unwrap();
    let engine = Arc::new(
        nri_accel::engine::Engine::start(node, journal, specs, None)
            .unwrap()
            .0,
    );
    let (monitor, health) = HealthMonitor::fixed(HealthReport::all_healthy(&inv));
    let mut dp = cfg.device_plugin.clone();
    dp.enabled = true;
    dp.dir = tmp.path().join("device-plugins");
    let kubelet = DevicePluginKubelet::start(&dp.dir).unwrap();
    let gate = Gate::new();
    gate.open();
    let plugins = DevicePlugins::start(&dp, &cfg.pools, engine, gate, monitor);
    kubelet.wait_registered(SHARED, WAIT).await.unwrap();
    let mut v = Vec::new();
    for i in 0..samples + 10 {
        let before = kubelet.plugin(SHARED).unwrap().updates;
        let mut report = HealthReport::all_healthy(&inv);
        if i % 2 == 0 {
            report.devices.insert(
                "gpu8".into(),
                DeviceHealth {
                    healthy: false,
                    reason: "bench".into(),
                },
            );
        }
        let t = Instant::now();
        health.send_replace(Arc::new(report));
        kubelet
            .wait_plugin(SHARED, WAIT, |p| p.updates > before)
            .await
            .unwrap();
        if i >= 10 {
            v.push(t.elapsed());
        }
    }
    println!(
        "ListAndWatch update at the kubelet after a health change ({} devices listed): {}",
        LAYOUT.shared * LAYOUT.replicas,
        pct(v)
    );
    plugins.shutdown().await;
}

fn main() {
    let samples = env_usize("DP_BENCH_SAMPLES", 200);
    let base = std::env::var_os("DP_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    println!(
        "device plugin bench: {} ({samples} samples), load average {}",
        proc_node::binary().display(),
        proc_node::load_average()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(async {
        allocate_vs_prepare(&base, samples).await;
        listing_latency(&base, samples).await;
    });
}
