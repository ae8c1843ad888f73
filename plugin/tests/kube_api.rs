//! The API server half of the DRA driver against the simulated API server (kube-sim): the
//! real kube-rs client over HTTP, ResourceSlices published, updated minimally and deleted,
//! claims refused per claim, recovery after the server fails, and gated fields dropped.

mod kube_common;

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube_common::*;
use kube_sim::apiserver::{ApiServer, Gates, RESOURCE_CLAIMS, RESOURCE_SLICES};
use nri_accel::kube::publisher::PublishState;
use nri_accel::kube::{ClaimError, KubeApi, KubeError, SliceEvents, allocation_for, cleanup};
use serde_json::json;

#[tokio::test]
async fn slices_are_created_updated_minimally_and_deleted() {
    let server = server().await;
    let node_uid = server.get(&kube_sim::apiserver::NODES, "", NODE).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let side = side(client(&server), source(300));
    let st = published_after(&side, 0).await;
    assert_eq!(st.state, PublishState::Published);
    assert_eq!(st.generation, 1);
    let slices = server.resource_slices();
    // 300 whole GPUs, 1 shared, 1 sliced whole + 10 partitions; 1 counter set.
    assert_eq!(devices(&slices).len(), 312);
    assert_eq!(slices.len(), st.slices.len());
    for s in &slices {
        assert_eq!(s["spec"]["driver"], DRIVER);
        assert_eq!(s["spec"]["nodeName"], NODE);
        assert_eq!(s["spec"]["pool"]["name"], NODE);
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], slices.len());
        let owner = &s["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["uid"].as_str()),
            (Some("Node"), Some(node_uid.as_str()))
        );
    }
    assert_no_double_booking(&slices);
    let created = server.writes(&RESOURCE_SLICES);
    assert_eq!(
        (created.creates, created.updates, created.deletes),
        (slices.len() as u64, 0, 0)
    );

    // One device turns unhealthy: one slice is rewritten, in place, at the same generation.
    server.reset_writes();
    let requests = server.requests();
    side.set_unhealthy(BTreeSet::from(["g0150".to_string()]));
    let st = published_after(&side, st.rounds).await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 1);
    // The pool is known from the answers to the last writes: no list, just the one write.
    assert_eq!(server.requests() - requests, 1);
    assert_eq!(st.generation, 1);
    assert!(
        !devices(&server.resource_slices())
            .iter()
            .any(|d| d["name"] == "whole-g0150")
    );

    // Nothing changed: nothing written.
    server.reset_writes();
    side.set_unhealthy(BTreeSet::from(["g0150".to_string()]));
    side.republish(source(300));
    let st = published_after(&side, st.rounds).await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 0, "{st:?}");

    // Inventory grows by one device: still one write when its slice has room.
    side.republish(source(301));
    let st = published_after(&side, st.rounds).await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 1);
    assert_eq!(devices(&server.resource_slices()).len(), 312);

    // The daemon stops; cleanup deletes every slice of ours and nothing else.
    let foreign = json!({"metadata": {"name": "other-driver"}, "spec": {
        "driver": "gpu.example.com", "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": []}});
    server.insert(&RESOURCE_SLICES, foreign);
    side.publisher().stop();
    let api = client(&server);
    let deleted = cleanup::delete_slices(api.as_ref(), DRIVER, NODE, WAIT)
        .await
        .unwrap();
    assert_eq!(deleted, st.slices.len());
    let left = server.resource_slices();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["metadata"]["name"], "other-driver");
}

#[tokio::test]
async fn a_slice_changed_behind_our_back_is_repaired_after_the_conflict() {
    let server = server().await;
    let side = side(client(&server), source(4));
    let st = published_after(&side, 0).await;
    let name = st.slices.last().unwrap().name.clone();
    let mut s = server.get(&RESOURCE_SLICES, "", &name).unwrap();
    s["spec"]["devices"] = json!([]);
    server.insert(&RESOURCE_SLICES, s);
    // Our next write carries the old resourceVersion: 409, then a fresh list and a repair.
    side.set_unhealthy(BTreeSet::from(["g0001".to_string()]));
    let st = published_after(&side, st.rounds).await;
    assert_eq!(devices(&server.resource_slices()).len(), 4 + 1 + 11 - 1);
    assert_no_double_booking(&server.resource_slices());
    assert!(st.writes >= 2);
}

#[tokio::test]
async fn the_publisher_retries_until_the_server_comes_back() {
    let server = server().await;
    server.go_down().await;
    let side = side(client(&server), source(2));
    let down = tokio::time::timeout(WAIT, side.publisher().wait_for(|s| s.failures >= 2))
        .await
        .expect("failures reported");
    assert_eq!(down.state, PublishState::Retrying);
    assert!(
        down.last_error.as_deref().unwrap().contains("unavailable"),
        "{down:?}"
    );
    server.come_back().await.unwrap();
    let st = published_after(&side, 0).await;
    assert_eq!(st.failures, 0);
    assert!(!server.resource_slices().is_empty());

    // A stalled server: every call runs into its deadline, then the pool is published.
    server.stall(true);
    side.set_unhealthy(BTreeSet::from(["g0000".to_string()]));
    let stalled = tokio::time::timeout(WAIT, side.publisher().wait_for(|s| s.failures >= 1))
        .await
        .expect("stall reported");
    assert!(
        stalled
            .last_error
            .as_deref()
            .unwrap()
            .contains("unavailable"),
        "{stalled:?}"
    );
    server.stall(false);
    published_after(&side, stalled.rounds).await;
    assert!(
        !devices(&server.resource_slices())
            .iter()
            .any(|d| d["name"] == "whole-g0000")
    );

    // 503s on writes: retried until one goes through.
    server.fail_next_writes(3, 503);
    side.set_unhealthy(BTreeSet::new());
    let before = side.publisher().status().rounds;
    published_after(&side, before).await;
    assert!(
        devices(&server.resource_slices())
            .iter()
            .any(|d| d["name"] == "whole-g0000")
    );
}

#[tokio::test]
async fn without_the_gates_nothing_can_be_double_booked() {
    let server = ApiServer::start_with(Gates::NONE).await.unwrap();
    server.add_node(NODE);
    let side = side(client(&server), source(2));
    let st = published_after(&side, 0).await;
    assert_eq!(
        st.missing_gates,
        vec!["DRAPartitionableDevices", "DRAConsumableCapacity"]
    );
    let slices = server.resource_slices();
    let all = devices(&slices);
    // The sliced GPU is published whole, its partitions withdrawn; no counters anywhere.
    assert!(all.iter().any(|d| d["name"] == "sliced-m0"));
    assert!(
        !all.iter()
            .any(|d| d["attributes"]["type"]["string"] == "partition")
    );
    assert!(slices.iter().all(|s| s["spec"]["sharedCounters"].is_null()));
    // The shared GPU is one device one claim holds at a time.
    let shared = all.iter().find(|d| d["name"] == "shared-s0").unwrap();
    assert!(shared["allowMultipleAllocations"].is_null());
    assert_no_double_booking(&slices);
    assert_eq!(all.len(), 4);
}

/// Answers the dry-run probes as if every gate were on, and forwards everything else: the
/// server's real answers to the writes then show the gates are off.
struct LyingProbe(Arc<dyn KubeApi>);

#[async_trait]
impl KubeApi for LyingProbe {
    async fn resource_claim(&self, ns: &str, name: &str) -> Result<ResourceClaim, KubeError> {
        self.0.resource_claim(ns, name).await
    }
    async fn node(&self, name: &str) -> Result<Node, KubeError> {
        self.0.node(name).await
    }
    async fn list_slices(&self, driver: &str, node: &str) -> Result<Vec<ResourceSlice>, KubeError> {
        self.0.list_slices(driver, node).await
    }
    async fn list_slices_versioned(
        &self,
        driver: &str,
        node: &str,
    ) -> Result<(Vec<ResourceSlice>, String), KubeError> {
        self.0.list_slices_versioned(driver, node).await
    }
    async fn watch_slices(
        &self,
        driver: &str,
        node: &str,
        rv: &str,
    ) -> Result<SliceEvents, KubeError> {
        self.0.watch_slices(driver, node, rv).await
    }
    async fn create_slice(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, KubeError> {
        if dry_run {
            return Ok(slice.clone());
        }
        self.0.create_slice(slice, dry_run).await
    }
    async fn replace_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, KubeError> {
        self.0.replace_slice(slice).await
    }
    async fn delete_slice(&self, name: &str, rv: &str) -> Result<(), KubeError> {
        self.0.delete_slice(name, rv).await
    }
}

#[tokio::test]
async fn fields_dropped_on_write_are_read_back_and_withdrawn_at_once() {
    let server = ApiServer::start_with(Gates::NONE).await.unwrap();
    server.add_node(NODE);
    let side = side(Arc::new(LyingProbe(client(&server))), source(2));
    let st = tokio::time::timeout(
        WAIT,
        side.publisher()
            .wait_for(|s| s.rounds >= 1 && s.missing_gates.len() == 2),
    )
    .await
    .expect("the dropped fields were noticed");
    assert_eq!(st.state, PublishState::Published);
    let slices = server.resource_slices();
    assert!(
        !devices(&slices)
            .iter()
            .any(|d| d["attributes"]["type"]["string"] == "partition")
    );
    assert_no_double_booking(&slices);
}

fn claim(uid: &str, results: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"namespace": "team-a", "name": "train", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "accel"}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })
}

#[tokio::test]
async fn prepare_side_checks_refuse_per_claim() {
    let server = server().await;
    let api = client(&server);
    let published = source(2).published;
    let ours =
        |device: &str| json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device});

    // Missing.
    let e = api.resource_claim("team-a", "train").await.unwrap_err();
    assert!(matches!(e, KubeError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("ResourceClaim team-a/train"), "{e}");

    // Allocated on this node: the results and the policy pool behind each.
    server.insert(
        &RESOURCE_CLAIMS,
        claim("uid-1", json!([ours("whole-g0001")])),
    );
    let c = api.resource_claim("team-a", "train").await.unwrap();
    let a = allocation_for(&c, "uid-1", DRIVER, NODE).unwrap();
    let engine = a.engine_results("team-a/train", &published).unwrap();
    assert_eq!(
        (engine[0].pool.as_str(), engine[0].device.as_str()),
        ("whole", "whole-g0001")
    );

    // Deleted and recreated under the same name: another UID.
    let e = allocation_for(&c, "uid-0", DRIVER, NODE).unwrap_err();
    assert!(matches!(e, ClaimError::OtherUid { .. }), "{e}");

    // Not allocated yet.
    let mut pending = claim("uid-2", json!([]));
    pending["status"] = json!({});
    server.insert(&RESOURCE_CLAIMS, pending);
    let c = api.resource_claim("team-a", "train").await.unwrap();
    let e = allocation_for(&c, "uid-2", DRIVER, NODE).unwrap_err();
    assert!(matches!(e, ClaimError::NotAllocated { .. }), "{e}");

    // Allocated another node's device, or a device this node does not publish.
    let foreign =
        json!({"request": "gpu", "driver": DRIVER, "pool": "node-2", "device": "whole-g0001"});
    server.insert(&RESOURCE_CLAIMS, claim("uid-3", json!([foreign])));
    let c = api.resource_claim("team-a", "train").await.unwrap();
    let e = allocation_for(&c, "uid-3", DRIVER, NODE).unwrap_err();
    assert!(matches!(e, ClaimError::ForeignPool { .. }), "{e}");
    server.insert(
        &RESOURCE_CLAIMS,
        claim("uid-4", json!([ours("whole-g9999")])),
    );
    let c = api.resource_claim("team-a", "train").await.unwrap();
    let a = allocation_for(&c, "uid-4", DRIVER, NODE).unwrap();
    let e = a.engine_results("team-a/train", &published).unwrap_err();
    assert!(matches!(e, ClaimError::UnknownDevice { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "claim team-a/train was allocated device whole-g9999, which this node does not publish"
    );

    // The server failing is an error for that claim, not a hang.
    server.stall(true);
    let e = tokio::time::timeout(WAIT, api.resource_claim("team-a", "train"))
        .await
        .expect("the client gives up")
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    server.stall(false);
}

#[tokio::test]
async fn devices_the_health_monitor_reports_unhealthy_are_withdrawn_and_return() {
    use nri_accel::device_health::{DeviceHealth, HealthMonitor, HealthReport};
    let server = server().await;
    let src = source(2);
    let side = side(client(&server), src.clone());
    let st = published_after(&side, 0).await;
    let (monitor, tx) = HealthMonitor::fixed(HealthReport::all_healthy(&src.inventory));
    let _follow = side.follow_health(monitor.subscribe());
    let mut report = HealthReport::all_healthy(&src.inventory);
    report.devices.insert(
        "m0".into(),
        DeviceHealth {
            healthy: false,
            reason: "its driver was unbound".into(),
        },
    );
    tx.send_replace(Arc::new(report));
    let st = published_after(&side, st.rounds).await;
    assert!(st.withdrawn.iter().any(
        |w| matches!(w, nri_accel::kube::slices::Withdrawal::Unhealthy { device, .. } if device == "m0")
    ));
    let all = devices(&server.resource_slices());
    assert!(
        !all.iter()
            .any(|d| d["attributes"]["deviceId"]["string"] == "m0")
    );
    // Its counter set stays, so nothing else moves when it returns.
    assert!(
        server
            .resource_slices()
            .iter()
            .any(|s| !s["spec"]["sharedCounters"].is_null())
    );
    tx.send_replace(Arc::new(HealthReport::all_healthy(&src.inventory)));
    published_after(&side, st.rounds).await;
    let all = devices(&server.resource_slices());
    assert_eq!(
        all.iter()
            .filter(|d| d["attributes"]["deviceId"]["string"] == "m0")
            .count(),
        11
    );
}
