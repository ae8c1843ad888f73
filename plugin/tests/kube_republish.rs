//! What the API server holds is not what was published (issue 39 item 0): a starting kubelet
//! deletes every driver's ResourceSlices of its node and registers the drivers again. The
//! publisher republishes when the kubelet registers the driver and when its watch sees the
//! server's copy differ, long before its resync, and `status` says what the server holds.
//! Against the simulated API server through the real kube-rs client; every wait is on the
//! publisher's status, the resync is an hour, so nothing here can pass by the resync.

mod kube_common;

use std::time::Duration;

use kube_common::*;
use kube_sim::apiserver::RESOURCE_SLICES;
use nri_accel::kube::KubeSide;
use nri_accel::kube::publisher::PublishState;
use nri_accel::kube::publisher::server::ServerState;
use serde_json::json;

/// Longer than any test runs: a republish seen here is not the resync's.
const NO_RESYNC: Duration = Duration::from_secs(3600);

fn side_with(server: &kube_sim::apiserver::ApiServer, settle: Duration) -> KubeSide {
    let config = nri_accel::kube::publisher::PublisherConfig {
        resync: NO_RESYNC,
        settle,
        ..fast_config()
    };
    KubeSide::with_api(client(server), config, source(2))
}

/// Waits until the publisher's status satisfies `ready`, failing with `what` and the status.
async fn until(
    side: &KubeSide,
    what: &str,
    ready: impl FnMut(&nri_accel::kube::PublisherStatus) -> bool,
) -> nri_accel::kube::PublisherStatus {
    tokio::time::timeout(WAIT, side.publisher().wait_for(ready))
        .await
        .unwrap_or_else(|_| panic!("{what}: {:#?}", side.publisher().status()))
}

#[tokio::test]
async fn the_kubelets_wipe_is_republished_at_once_and_status_says_what_the_server_holds() {
    let server = server().await;
    let side = side_with(&server, Duration::from_millis(50));
    let st = until(&side, "published and seen on the server", |s| {
        s.state == PublishState::Published && s.server.state == ServerState::InSync
    })
    .await;
    let published = server.resource_slices();
    assert_eq!(st.server.slices, published.len());
    assert_eq!(st.server.devices, devices(&published).len());
    assert_eq!(st.server.devices, st.devices);
    assert_eq!(st.server.generation, Some(st.generation));
    assert!(st.server.checked_unix.is_some());
    let rounds = st.rounds;

    // The kubelet starts: it deletes the node's slices of every driver (deletecollection).
    let wiped = server.delete_collection(&RESOURCE_SLICES, &format!("spec.nodeName={NODE}"));
    assert_eq!(wiped, published.len());
    assert!(server.resource_slices().is_empty());

    // The watch sees it, the difference is judged missing and repaired: no resync involved.
    let st = until(&side, "the wiped slices republished", |s| {
        s.repairs >= 1 && s.rounds > rounds && s.server.state == ServerState::InSync
    })
    .await;
    assert_eq!(st.state, PublishState::Published);
    assert_eq!(st.registrations, 0);
    let again = server.resource_slices();
    assert_eq!(devices(&again).len(), devices(&published).len());
    assert_no_double_booking(&again);
    assert_eq!(st.server.devices, devices(&again).len());
    // Created anew, nothing else rewritten.
    let w = server.writes(&RESOURCE_SLICES);
    assert_eq!(w.creates, 2 * published.len() as u64, "{w:?}");
    assert_eq!(w.deletes, published.len() as u64, "{w:?}");
}

#[tokio::test]
async fn the_kubelet_registering_the_driver_republishes_at_once() {
    let server = server().await;
    // A difference would be judged only after an hour: what republishes here is the
    // registration.
    let side = side_with(&server, NO_RESYNC);
    let st = until(&side, "published and seen on the server", |s| {
        s.state == PublishState::Published && s.server.state == ServerState::InSync
    })
    .await;
    let n = server.resource_slices().len();
    server.delete_collection(&RESOURCE_SLICES, &format!("spec.nodeName={NODE}"));
    // The server's copy is gone; it is not judged yet (the settle is an hour), so nothing is
    // written and status keeps the state it had.
    let seen = until(&side, "the watch to see the wipe", |s| s.server.slices == 0).await;
    assert_eq!(seen.server.missing, n);
    assert_eq!(seen.repairs, 0);

    side.registration_signal().registered();
    let st = until(&side, "republished after the registration", |s| {
        s.registrations == 1 && s.rounds > st.rounds && s.server.state == ServerState::InSync
    })
    .await;
    assert_eq!(st.repairs, 0);
    assert_eq!(server.resource_slices().len(), n);

    // A registration with everything in place lists once and writes nothing.
    server.reset_writes();
    side.registration_signal().registered();
    until(&side, "a second registration's round", |s| {
        s.registrations == 2 && s.rounds > st.rounds
    })
    .await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 0);
}

#[tokio::test]
async fn a_slice_changed_or_added_behind_our_back_is_put_right() {
    let server = server().await;
    let side = side_with(&server, Duration::from_millis(50));
    let st = until(&side, "published", |s| {
        s.state == PublishState::Published && s.server.state == ServerState::InSync
    })
    .await;
    let name = st.slices[0].name.clone();
    let mut changed = server.get(&RESOURCE_SLICES, "", &name).unwrap();
    changed["spec"]["devices"] = json!([]);
    server.insert(&RESOURCE_SLICES, changed);
    let st = until(&side, "the changed slice repaired", |s| {
        s.repairs >= 1 && s.server.state == ServerState::InSync
    })
    .await;
    assert_eq!(st.server.devices, st.devices);
    assert_no_double_booking(&server.resource_slices());

    // A stranger's slice of our driver on our node: the pool is rewritten without it.
    let foreign = json!({"metadata": {"name": "not-ours"}, "spec": {
        "driver": DRIVER, "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": []}});
    server.insert(&RESOURCE_SLICES, foreign);
    let repairs = st.repairs;
    let st = until(&side, "the extra slice removed", |s| {
        s.repairs > repairs && s.server.state == ServerState::InSync
    })
    .await;
    assert!(server.get(&RESOURCE_SLICES, "", "not-ours").is_none());
    assert_eq!(st.server.slices, server.resource_slices().len());
}

#[tokio::test]
async fn the_watch_failing_makes_the_servers_copy_unknown_not_in_sync() {
    let server = server().await;
    let side = side_with(&server, Duration::from_millis(50));
    until(&side, "published", |s| {
        s.server.state == ServerState::InSync
    })
    .await;
    server.go_down().await;
    let st = until(&side, "the watch's failure", |s| {
        s.server.state == ServerState::Unknown
    })
    .await;
    assert!(
        st.server
            .error
            .as_deref()
            .unwrap_or("")
            .contains("unavailable"),
        "{st:?}"
    );
    // Deleted while nobody watched: seen when the watch resumes, and repaired.
    server.delete_collection(&RESOURCE_SLICES, &format!("spec.nodeName={NODE}"));
    server.come_back().await.unwrap();
    let st = until(&side, "back in sync", |s| {
        s.repairs >= 1 && s.server.state == ServerState::InSync
    })
    .await;
    assert!(st.server.error.is_none());
    assert!(!server.resource_slices().is_empty());
}
