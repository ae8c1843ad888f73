//! What the kubelet path adds to a prepare: NodePrepareResources of a one-device claim over the
//! DRA socket (kube-sim's kubelet client; the daemon reads the ResourceClaim from kube-sim's API
//! server on 127.0.0.1, then prepares through the engine) against the claims API's Prepare of the
//! same one-device result over its socket, on the same `nri-accel run` process (release).
//!
//! Each sample prepares a fresh claim on the one whole GPU (spec written, checkpoint synced),
//! prepares it again (the engine answers the held claim from its record: no write) and
//! unprepares it untimed; the two paths alternate, and which goes first too, so that drift in the
//! machine's load hits both alike. The fresh prepares are dominated by two fsyncs whose spread on
//! a shared VM is larger than the difference sought, so the added cost is read from the repeats:
//! the same engine work on both paths, plus, on the kubelet path, the claim read from the API
//! server (a repeat reads it too) and gRPC over HTTP/2 instead of ttrpc. The claim read is also
//! timed alone, in this process: the daemon's `ApiServerClaims` over the kube-rs client against
//! the same server.
//!
//! Run: `cargo bench -p nri-accel --bench dra`. `DRA_BENCH_SAMPLES` (200) sets the samples per path.
#![allow(missing_docs)]

#[path = "../tests/support/proc_node.rs"]
mod proc_node;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use kube_sim::apiserver::{ApiServer, RESOURCE_CLAIMS};
use kube_sim::kubelet::wire::dra::Claim;
use kube_sim::kubelet::{DraClient, PluginWatcher};
use kube_sim::scheduler;
use nri_accel::claims_api::{ClaimAsk, ClaimRef, ClaimSpec, ClaimsClient, DraResult};
use nri_accel::kube::{ApiServerClaims, KubeClient};
use nri_accel::kubelet::ClaimSource;
use proc_node::{DaemonProc, Layout, env_usize, pct};
use serde_json::json;

const NODE: &str = "bench-node";
const DRIVER: &str = "accel.nri.io";
const NS: &str = "bench";
/// The one GPU's published name and its policy pool.
const DEVICE: &str = "whole-gpu0";
const POOL: &str = "whole";

/// Stores claim `uid` allocated [`DEVICE`] on the API server; the kubelet's reference to it.
fn stored_claim(api: &ApiServer, uid: &str) -> Claim {
    let allocation = json!({"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": DEVICE}
    ]}});
    api.insert(
        &RESOURCE_CLAIMS,
        scheduler::allocated_claim(NS, uid, uid, "gpu.accel.nri.io", &["gpu"], allocation),
    );
    Claim {
        namespace: NS.into(),
        uid: uid.into(),
        name: uid.into(),
    }
}

/// The claims API's ask for the same device.
fn results_claim(uid: &str) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: NS.into(),
        name: uid.into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: DRIVER.into(),
            pool: POOL.into(),
            device: DEVICE.into(),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

async fn kubelet_prepare(dra: &DraClient, claim: &Claim) -> Duration {
    let t = Instant::now();
    let r = dra.prepare(std::slice::from_ref(claim)).await.unwrap();
    let took = t.elapsed();
    assert!(matches!(r.get(&claim.uid), Some(Ok(_))), "{r:?}");
    took
}

async fn claims_prepare(claims: &ClaimsClient, uid: &str) -> Duration {
    let t = Instant::now();
    let r = claims.prepare(vec![results_claim(uid)]).await.unwrap();
    let took = t.elapsed();
    assert!(matches!(r.get(uid), Some(Ok(_))), "{r:?}");
    took
}

async fn unprepare(claims: &ClaimsClient, uid: &str) {
    let r = claims
        .unprepare(vec![ClaimRef {
            uid: uid.into(),
            namespace: NS.into(),
            name: uid.into(),
        }])
        .await
        .unwrap();
    assert!(matches!(r.get(uid), Some(Ok(()))), "{r:?}");
}

async fn bench(dir: &Path, samples: usize) {
    let layout = Layout {
        exclusive: 1,
        shared: 0,
        replicas: 1,
        sliced: 0,
        cpus_per_device: 0,
    };
    let mut cfg = proc_node::config(dir, layout);
    let api = ApiServer::start().await.unwrap();
    api.add_node(NODE);
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    cfg.dra.enabled = true;
    cfg.dra.plugins_registry_dir = dir.join("kubelet/plugins_registry");
    cfg.dra.plugins_dir = dir.join("kubelet/plugins");
    cfg.kubernetes.node_name = NODE.into();
    cfg.kubernetes.kubeconfig = Some(kubeconfig);
    let config_path = dir.join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    let _fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
    let daemon = DaemonProc::spawn(&config_path, &dir.join("daemon.log"));
    let claims = proc_node::wait_gate(&cfg.claims_api.socket, Duration::from_secs(60))
        .await
        .expect("gate");
    let mut kubelet = PluginWatcher::new(&cfg.dra.plugins_registry_dir);
    let plugin = kubelet
        .wait_for(DRIVER, Duration::from_secs(60))
        .await
        .expect("registered");
    let dra = DraClient::for_plugin(&plugin).await.unwrap();

    // Warm both paths (connections, the kube client's pool, page cache).
    for i in 0..10 {
        let uid = format!("warm-{i}");
        kubelet_prepare(&dra, &stored_claim(&api, &uid)).await;
        unprepare(&claims, &uid).await;
        claims_prepare(&claims, &uid).await;
        unprepare(&claims, &uid).await;
    }

    let (mut kube, mut direct) = (Vec::new(), Vec::new());
    let (mut kube_again, mut direct_again) = (Vec::new(), Vec::new());
    for i in 0..samples {
        // Which path goes first alternates too: the fsync after another fsync is not the same.
        for kubelet_path in [i % 2 == 0, i % 2 != 0] {
            if kubelet_path {
                let uid = format!("k-{i}");
                let claim = stored_claim(&api, &uid);
                kube.push(kubelet_prepare(&dra, &claim).await);
                kube_again.push(kubelet_prepare(&dra, &claim).await);
                unprepare(&claims, &uid).await;
            } else {
                let uid = format!("c-{i}");
                direct.push(claims_prepare(&claims, &uid).await);
                direct_again.push(claims_prepare(&claims, &uid).await);
                unprepare(&claims, &uid).await;
            }
        }
    }

    // What the kubelet path does on top of the claims API's, timed alone in this process with the
    // daemon's own code: reading the claim from the API server and narrowing it to this driver's
    // results (ApiServerClaims over the kube-rs client).
    let source = ApiServerClaims::new(
        Arc::new(KubeClient::for_url(&api.url(), Duration::from_secs(10)).unwrap()),
        DRIVER,
        NODE,
    );
    let claim = stored_claim(&api, "read");
    let reference = ClaimRef {
        uid: claim.uid.clone(),
        namespace: NS.into(),
        name: claim.name.clone(),
    };
    let mut read = Vec::new();
    for i in 0..samples + 10 {
        let t = Instant::now();
        let got = source.allocation(&reference).await.unwrap();
        if i >= 10 {
            read.push(t.elapsed());
        }
        assert_eq!(got.results.len(), 1);
    }

    let p50 = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let added = p50(&kube_again) - p50(&direct_again);
    println!("one-device claim, fresh each sample (spec written, checkpoint synced):");
    println!(
        "  kubelet NodePrepareResources (API server read): {}",
        pct(kube.clone())
    );
    println!(
        "  claims API Prepare, same device:                {}",
        pct(direct.clone())
    );
    println!(
        "  difference of the p50s: {:.3} ms (two fsyncs each: read it against the spread)",
        p50(&kube) - p50(&direct)
    );
    println!("repeated: the engine answers from its record (no write, no API server read):");
    println!(
        "  kubelet NodePrepareResources (held claim):      {}",
        pct(kube_again.clone())
    );
    println!(
        "  claims API Prepare:                             {}",
        pct(direct_again.clone())
    );
    println!(
        "the claim read alone (ApiServerClaims, in-process): {}",
        pct(read.clone())
    );
    println!(
        "added by the kubelet path at p50: repeats {added:.3} ms (the gRPC call); fresh {:.3} ms, \
         which includes the claim read ({:.3} ms)",
        p50(&kube) - p50(&direct),
        p50(&read)
    );
    daemon.stop();
}

fn main() {
    let samples = env_usize("DRA_BENCH_SAMPLES", 200);
    let base = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("dra-bench-")
        .tempdir_in(&base)
        .unwrap();
    println!(
        "dra bench ({samples} samples per path), load average {}",
        proc_node::load_average()
    );
    let rt = proc_node::bench_runtime();
    rt.block_on(bench(tmp.path(), samples));
}
