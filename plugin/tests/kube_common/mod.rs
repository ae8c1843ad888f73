//! Shared by the API server tests: a node's published names, a publisher against the
//! simulated API server, and checks on what the server holds.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube_sim::apiserver::ApiServer;
use nri_accel::kube::publisher::{PublishSource, PublisherConfig};
use nri_accel::kube::{KubeApi, KubeClient, KubeSide, PublisherStatus};
use policies::{Device, FamilyConfig, Inventory, Node, PoolConfig, ProfileConfig, Registry};
use serde_json::Value;

/// The driver name the tests publish under.
pub const DRIVER: &str = "accel.nri.io";
/// The node the tests publish for.
pub const NODE: &str = "node-1";
/// Longest a test waits for the publisher.
pub const WAIT: Duration = Duration::from_secs(30);

/// The demo's simulated GPU under id `id`, on NUMA node `numa`, without a PCI address.
pub fn gpu(id: &str, numa: u32) -> Device {
    Device {
        id: id.into(),
        pci_address: None,
        ..nri_accel::fixtures::simulated_gpu(0, numa, Default::default(), String::new())
    }
}

/// Pools of the three families over `exclusive` whole GPUs, one shared and one sliced.
pub fn source(exclusive: usize) -> PublishSource {
    let mut devices: Vec<Device> = (0..exclusive)
        .map(|i| gpu(&format!("g{i:04}"), 0))
        .collect();
    devices.push(gpu("s0", 1));
    devices.push(gpu("m0", 1));
    let whole: Vec<String> = (0..exclusive).map(|i| format!("g{i:04}")).collect();
    let whole: Vec<&str> = whole.iter().map(String::as_str).collect();
    let pools = vec![
        PoolConfig::of_ids("whole", &whole, FamilyConfig::Exclusive),
        PoolConfig::of_ids(
            "shared",
            &["s0"],
            FamilyConfig::Shared {
                replicas: 4,
                memory_mib_per_share: 20480,
                compute_percent_per_share: 25,
                mps: None,
            },
        ),
        PoolConfig::of_ids(
            "sliced",
            &["m0"],
            FamilyConfig::Sliced {
                slots: 8,
                profiles: vec![
                    ProfileConfig {
                        name: "1g".into(),
                        size: 1,
                        memory_mib: 10240,
                        compute_units: 16,
                        starts: (0..8).collect(),
                    },
                    ProfileConfig {
                        name: "4g".into(),
                        size: 4,
                        memory_mib: 40960,
                        compute_units: 64,
                        starts: vec![0, 4],
                    },
                ],
            },
        ),
    ];
    let inventory = Inventory {
        devices,
        cpus: Default::default(),
    };
    let node = Node::new(inventory.clone(), &pools, &Registry::with_builtins()).expect("node");
    PublishSource {
        published: node.published(),
        inventory,
        pools,
        pcie_roots: BTreeMap::new(),
    }
}

/// A publisher config with short deadlines for tests.
pub fn fast_config() -> PublisherConfig {
    PublisherConfig {
        call_timeout: Duration::from_millis(500),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        settle: Duration::from_millis(50),
        ..PublisherConfig::new(DRIVER, NODE)
    }
}

/// The real client pointed at the simulated server.
pub fn client(server: &ApiServer) -> Arc<dyn KubeApi> {
    Arc::new(KubeClient::for_url(&server.url(), Duration::from_millis(500)).expect("client"))
}

/// A server with the node registered.
pub async fn server() -> ApiServer {
    let s = ApiServer::start().await.expect("api server");
    s.add_node(NODE);
    s
}

/// Starts publishing `source` to `server` through `api`.
pub fn side(api: Arc<dyn KubeApi>, source: PublishSource) -> KubeSide {
    KubeSide::with_api(api, fast_config(), source)
}

/// Waits until the publisher has completed a round after `after` rounds and is in sync.
pub async fn published_after(side: &KubeSide, after: u64) -> PublisherStatus {
    tokio::time::timeout(
        WAIT,
        side.publisher()
            .wait_for(|s| s.rounds > after && s.last_error.is_none()),
    )
    .await
    .unwrap_or_else(|_| panic!("not published: {:?}", side.publisher().status()))
}

/// The devices of every slice the server holds.
pub fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn counters(d: &Value) -> BTreeSet<String> {
    d["consumesCounters"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            let set = c["counterSet"].as_str().unwrap_or("").to_string();
            c["counters"]
                .as_object()
                .into_iter()
                .flatten()
                .map(move |(k, _)| format!("{set}/{k}"))
        })
        .collect()
}

/// The slots a DRA device covers: its slice for a partition, everything otherwise.
fn slots(d: &Value) -> std::ops::Range<i64> {
    let a = &d["attributes"];
    if a["type"]["string"] == "partition" {
        let start = a["sliceStart"]["int"].as_i64().unwrap_or(0);
        start..start + a["sliceSize"]["int"].as_i64().unwrap_or(0)
    } else {
        0..i64::MAX
    }
}

fn overlap(a: &Value, b: &Value) -> bool {
    let (x, y) = (slots(a), slots(b));
    x.start < y.end && y.start < x.end
}

/// Fails unless the pool the server holds is one the scheduler cannot double-book: two DRA
/// devices of one physical device that cover a common slot (a whole device covers all) consume
/// a common counter, and every counter consumed exists in the pool. Returns the devices checked.
pub fn assert_no_double_booking(slices: &[Value]) -> usize {
    let sets: BTreeSet<String> = slices
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|set| {
            let name = set["name"].as_str().unwrap_or("").to_string();
            set["counters"]
                .as_object()
                .into_iter()
                .flatten()
                .map(move |(k, _)| format!("{name}/{k}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let all = devices(slices);
    let mut by_device: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for d in &all {
        let id = d["attributes"]["deviceId"]["string"]
            .as_str()
            .unwrap_or("")
            .to_string();
        by_device.entry(id).or_default().push(d);
    }
    for (id, ds) in &by_device {
        for d in ds {
            for c in counters(d) {
                assert!(
                    sets.contains(&c),
                    "device {} consumes {c}, which the pool lacks",
                    d["name"]
                );
            }
        }
        for (i, a) in ds.iter().enumerate() {
            for b in &ds[i + 1..] {
                if !overlap(a, b) {
                    continue;
                }
                let common = !counters(a).is_disjoint(&counters(b));
                assert!(
                    common,
                    "{} and {} of device {id} overlap and can be allocated together",
                    a["name"], b["name"]
                );
            }
        }
    }
    all.len()
}
