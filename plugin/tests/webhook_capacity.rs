//! How the webhook learns the nodes' capacity: the DRA driver's ResourceSlices listed through
//! kube-rs from the simulated API server (kube-sim), and what it knows when the list fails.

use std::time::Duration;

use kube_sim::apiserver::{ApiServer, RESOURCE_SLICES};
use nri_accel::kube::KubeClient;
use nri_accel::webhook::check::{Rules, check};
use nri_accel::webhook::fleet::{Capacity, Fleet};
use nri_accel::webhook::review::decode;
use policies::{FamilyConfig, PoolConfig, Registry};
use serde_json::{Value, json};

fn slice(name: &str, driver: &str, node: &str, devices: usize) -> Value {
    let devices: Vec<Value> = (0..devices)
        .map(|i| {
            json!({
                "name": format!("gpus-gpu{i}"),
                "attributes": {
                    "deviceId": {"string": format!("gpu{i}")},
                    "pool": {"string": "gpus"},
                    "family": {"string": "exclusive"},
                    "vendor": {"string": "nvidia"},
                    "type": {"string": "device"}
                }
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices
        }
    })
}

fn verdict(fleet: &Fleet, count: u32) -> (bool, Option<String>, Vec<String>) {
    let rules = Rules {
        prefix: "accel.nri.io".into(),
        pools: vec![PoolConfig::of_ids("gpus", &[], FamilyConfig::Exclusive)],
        registry: Registry::with_builtins(),
    };
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "namespace": "ns",
            "object": {
                "metadata": {"name": "p", "annotations": {"accel.nri.io/container.c": format!("count={count}")}},
                "spec": {"containers": [{"name": "c"}]}
            }
        }
    });
    let request = decode(body.to_string().as_bytes()).unwrap();
    let v = check(
        &rules,
        "ns",
        &request.pod().unwrap().unwrap(),
        &fleet.capacity(),
    );
    (v.allowed, v.message, v.warnings)
}

#[tokio::test]
async fn capacity_comes_from_the_drivers_slices_and_survives_a_failed_list() {
    let server = ApiServer::start().await.unwrap();
    let client = KubeClient::for_url(&server.url(), Duration::from_secs(5)).unwrap();
    let fleet = Fleet::fixed(Capacity::Unknown("not read yet".into()));

    // No node publishes anything: unknown, admitted with a warning that says why.
    fleet.refresh(&client, "accel.nri.io").await;
    let (allowed, _, warnings) = verdict(&fleet, 64);
    assert!(allowed);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("no node publishes ResourceSlices of driver accel.nri.io")),
        "{warnings:?}"
    );

    // Two GPUs on node-a; another driver's eight GPUs elsewhere do not count.
    server.insert(
        &RESOURCE_SLICES,
        slice("node-a-accel", "accel.nri.io", "node-a", 2),
    );
    server.insert(
        &RESOURCE_SLICES,
        slice("node-b-other", "other.example.com", "node-b", 8),
    );
    fleet.refresh(&client, "accel.nri.io").await;
    let Capacity::Known(nodes) = fleet.capacity() else {
        panic!("capacity still unknown: {:?}", fleet.capacity());
    };
    assert_eq!(nodes.keys().collect::<Vec<_>>(), ["node-a"]);
    assert_eq!(nodes["node-a"].len(), 2);
    assert!(verdict(&fleet, 2).0);
    let (allowed, message, _) = verdict(&fleet, 3);
    assert!(!allowed);
    assert_eq!(
        message.as_deref(),
        Some(
            "container c of pod ns/p: claim ctr-<container id> refused: it asks 3 units of pool gpus but the pool's devices have at most 2"
        )
    );

    // The API server fails the next list: what was known is kept.
    server.fail_next(1, 500);
    fleet.refresh(&client, "accel.nri.io").await;
    assert!(matches!(fleet.capacity(), Capacity::Known(_)));
    assert!(!verdict(&fleet, 3).0);

    // A webhook that never read the slices and cannot: unknown, with the server's reason.
    let fresh = Fleet::fixed(Capacity::Unknown("not read yet".into()));
    server.fail_next(1, 403);
    fresh.refresh(&client, "accel.nri.io").await;
    let (allowed, _, warnings) = verdict(&fresh, 3);
    assert!(allowed);
    assert!(
        warnings.iter().any(|w| w.contains("cannot be listed")),
        "{warnings:?}"
    );
}
