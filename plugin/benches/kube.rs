//! The API server half of the DRA driver against the simulated API server (kube-sim, plain HTTP
//! on 127.0.0.1, the real kube-rs client):
//! - building the pool of 1,000 devices in-process (content + layout, no server);
//! - publishing 1,000 whole devices from nothing (probe, node, list, 8 creates), and 100 sliced
//!   devices (1,200 DRA devices consuming counters, 13 counter sets);
//! - a one-device change (a device turns unhealthy, then back): time and writes;
//! - a round with nothing to change;
//! - daemon RSS (`nri-accel run`, release) idle with `dra.enabled` off and on, and with 10,000
//!   claims prepared over the claims API with it on.
//!
//! Run: `cargo bench -p nri-accel --bench kube`. `KUBE_BENCH_SAMPLES` (20) sizes the publish runs,
//! `KUBE_BENCH_CLAIMS` (10000) the RSS run; `KUBE_BENCH_RSS=0` skips the daemon part.
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use kube_sim::apiserver::{ApiServer, RESOURCE_SLICES};
use nri_accel::kube::publisher::{PublishSource, PublisherConfig};
use nri_accel::kube::slices::{self, Capabilities, PoolInput, layout};
use nri_accel::kube::{KubeClient, KubeSide};
use policies::{Inventory, Node, Registry};
use proc_node::{DaemonProc, Layout, env_usize, fill, ms, pct};

const NODE: &str = "bench-node";
const DRIVER: &str = "accel.nri.io";

/// The publish source of a node laid out as `layout` (proc_node's simulated GPUs).
fn source(layout: Layout) -> PublishSource {
    let cfg = proc_node::config(Path::new("/nonexistent"), layout);
    let inventory = Inventory {
        devices: cfg.discovery.static_devices.clone(),
        cpus: "0-31".parse().unwrap(),
    };
    let node = Node::new(inventory.clone(), &cfg.pools, &Registry::with_builtins()).unwrap();
    PublishSource {
        published: node.published(),
        inventory,
        pools: cfg.pools,
        pcie_roots: BTreeMap::new(),
    }
}

fn layout_of(exclusive: u32, sliced: u32) -> Layout {
    Layout {
        exclusive,
        shared: 0,
        replicas: 1,
        sliced,
        cpus_per_device: 0,
    }
}

async fn started(source: PublishSource) -> (ApiServer, KubeSide) {
    let server = ApiServer::start().await.unwrap();
    server.add_node(NODE);
    let api = Arc::new(KubeClient::for_url(&server.url(), Duration::from_secs(10)).unwrap());
    let config = PublisherConfig {
        backoff_min: Duration::from_millis(10),
        ..PublisherConfig::new(DRIVER, NODE)
    };
    (server, KubeSide::with_api(api, config, source))
}

async fn round_after(side: &KubeSide, rounds: u64) {
    let st = side
        .publisher()
        .wait_for(|s| s.rounds > rounds && s.last_error.is_none())
        .await;
    assert!(st.rounds > rounds, "{st:?}");
}

async fn publish_bench(samples: usize) {
    let big = source(layout_of(1000, 0));
    let n = 200;
    let (mut building, mut packing) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        let t = Instant::now();
        let content = slices::build(&PoolInput {
            inventory: &big.inventory,
            pools: &big.pools,
            published: &big.published,
            pcie_roots: &big.pcie_roots,
            unhealthy: &Default::default(),
            held: &Default::default(),
            driver: "accel.nri.io",
            caps: Capabilities::ALL,
        });
        building += t.elapsed();
        let t = Instant::now();
        std::hint::black_box(layout::pack(&content));
        packing += t.elapsed();
    }
    println!(
        "1,000 devices in-process: build {:.2} ms, pack {:.2} ms (mean of {n})",
        ms(building) / n as f64,
        ms(packing) / n as f64
    );

    for (label, src) in [
        ("1,000 whole devices", big.clone()),
        (
            "100 sliced devices (1,200 DRA devices, 13 counter sets)",
            source(layout_of(0, 100)),
        ),
    ] {
        let mut first = Vec::new();
        let mut change = Vec::new();
        let mut back = Vec::new();
        let mut idle = Vec::new();
        let (mut creates, mut change_writes, mut requests) = (0, Vec::new(), 0);
        for _ in 0..samples {
            let t = Instant::now();
            let (server, side) = started(src.clone()).await;
            round_after(&side, 0).await;
            first.push(t.elapsed());
            creates = server.writes(&RESOURCE_SLICES).creates;
            requests = server.requests();
            let victim = src.inventory.devices[src.inventory.devices.len() / 2]
                .id
                .clone();
            for (bad, into) in [
                (BTreeSet::from([victim.clone()]), &mut change),
                (BTreeSet::new(), &mut back),
            ] {
                server.reset_writes();
                let rounds = side.publisher().status().rounds;
                let t = Instant::now();
                side.set_unhealthy(bad);
                round_after(&side, rounds).await;
                into.push(t.elapsed());
                change_writes.push(server.writes(&RESOURCE_SLICES).total());
            }
            server.reset_writes();
            let rounds = side.publisher().status().rounds;
            let t = Instant::now();
            side.republish(src.clone());
            round_after(&side, rounds).await;
            idle.push(t.elapsed());
            assert_eq!(server.writes(&RESOURCE_SLICES).total(), 0);
        }
        change_writes.sort();
        change_writes.dedup();
        println!("{label}:");
        println!(
            "  first publish (probe, node, list, {creates} creates; {requests} requests): {}",
            pct(first)
        );
        println!("  one device unhealthy: {}", pct(change));
        println!("  the device back:      {}", pct(back));
        println!("  writes per one-device change: {change_writes:?}");
        println!(
            "  a round with nothing to change (no request: the pool is known): {}",
            pct(idle)
        );
    }
}

fn rss_mib(d: &DaemonProc) -> f64 {
    d.rss_kib().unwrap_or(0) as f64 / 1024.0
}

/// RSS of the daemon idle (and with `claims` claims when `claims > 0`), DRA on or off.
async fn rss_run(base: &Path, dra: bool, claims: usize) {
    let tmp = tempfile::Builder::new()
        .prefix("kube-bench-")
        .tempdir_in(base)
        .unwrap();
    let layout = Layout {
        exclusive: 8,
        shared: 64,
        replicas: 200,
        sliced: 8,
        cpus_per_device: 0,
    };
    let mut cfg = proc_node::config(tmp.path(), layout);
    let server = ApiServer::start().await.unwrap();
    server.add_node(NODE);
    let kubeconfig = tmp.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    cfg.dra.enabled = dra;
    // The kubelet side runs too (registration, DRA and health sockets), in the temp dir.
    cfg.dra.plugins_registry_dir = tmp.path().join("kubelet/plugins_registry");
    cfg.dra.plugins_dir = tmp.path().join("kubelet/plugins");
    cfg.kubernetes.node_name = NODE.into();
    cfg.kubernetes.kubeconfig = Some(kubeconfig);
    let config_path = tmp.path().join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    let _fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
    let d = DaemonProc::spawn(&config_path, &tmp.path().join("daemon.log"));
    let _c = proc_node::wait_gate(&cfg.claims_api.socket, Duration::from_secs(60))
        .await
        .expect("gate");
    if dra {
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.resource_slices().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!server.resource_slices().is_empty(), "nothing published");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let what = if dra { "on " } else { "off" };
    println!(
        "daemon RSS idle, dra.enabled {what} (80 devices, {} slices): {:.1} MiB",
        server.resource_slices().len(),
        rss_mib(&d)
    );
    if claims > 0 {
        fill(&cfg.claims_api.socket, 0, claims).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!(
            "daemon RSS with {claims} claims, dra.enabled {what}: {:.1} MiB",
            rss_mib(&d)
        );
    }
    d.stop();
}

fn main() {
    let samples = env_usize("KUBE_BENCH_SAMPLES", 20);
    let claims = env_usize("KUBE_BENCH_CLAIMS", 10_000);
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    println!(
        "kube bench ({samples} samples), load average {}",
        proc_node::load_average()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(async {
        publish_bench(samples).await;
        if env_usize("KUBE_BENCH_RSS", 1) != 0 {
            rss_run(&base, false, claims).await;
            rss_run(&base, true, claims).await;
        }
    });
}
