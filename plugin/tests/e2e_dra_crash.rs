//! Crashes on the DRA path through the real binary: `NRI_ACCEL_TEST_CRASH_AT=<step>` makes the
//! daemon abort at that engine step while it serves the kubelet's NodePrepareResources (or
//! NodeUnprepareResources) of a claim the scheduler allocated from the published slices. Started
//! again, the kubelet finds the plugin registered anew and retries: the node is consistent (one
//! spec per record, no temp file, no unit granted twice), the claim is prepared exactly when its
//! spec was in place, the retry answers the device the scheduler chose, and the next claim the
//! scheduler allocates gets another GPU, never the victim's.

mod dra_common;
mod e2e_common;

use dra_common::*;
use e2e_common::*;
use nri_accel::engine::CRASH_ENV;

/// Dies at `step` during the DRA prepare of claim `victim`; after the restart the victim is
/// prepared iff `survives`.
async fn prepare_dies_at(step: &str, survives: bool) {
    let n = DraNode::new().await;
    let mut dying = n.start(&[(CRASH_ENV, step)], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;
    let victim = n.schedule("uid-victim", "victim", "exclusive");
    let device = n.allocation("victim")["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    let r = client.prepare(std::slice::from_ref(&victim)).await;
    assert!(
        r.is_err(),
        "{step}: the daemon answered {r:?} instead of dying"
    );
    assert_died_at(&mut dying, step).await;

    let _daemon = n.start(&[], 2).await;
    let (_kubelet, client) = n.kubelet().await;
    let held = n.consistent().await;
    assert_eq!(
        held.contains(&"uid-victim".to_string()),
        survives,
        "{step}: claims after restart {held:?}"
    );

    // The kubelet's retry: the device the scheduler chose, once.
    let answer = client.prepare(std::slice::from_ref(&victim)).await.unwrap();
    let got = devices(&answer, "uid-victim");
    assert_eq!(got[0].device_name, device, "{step}");
    assert_eq!(
        got[0].cdi_device_ids,
        [format!("{CDI_KIND}=claim-uid-victim-0")]
    );
    assert_eq!(n.consistent().await, ["uid-victim"], "{step}");

    // No double grant: the next whole-GPU claim is another GPU.
    let next = n.schedule("uid-next", "next", "exclusive");
    let answer = client.prepare(&[next]).await.unwrap();
    assert_ne!(
        devices(&answer, "uid-next")[0].device_name,
        device,
        "{step}"
    );
    assert_eq!(n.consistent().await, ["uid-next", "uid-victim"], "{step}");
}

/// Dies at `step` during the DRA unprepare of claim `victim` while a neighbour is held; after
/// the restart the victim is gone, the neighbour untouched, and the retried unprepare succeeds.
async fn unprepare_dies_at(step: &str) {
    let n = DraNode::new().await;
    let mut dying = n.start(&[(CRASH_ENV, step)], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;
    let neighbour = n.schedule("uid-neighbour", "neighbour", "shared");
    let victim = n.schedule("uid-victim", "victim", "exclusive");
    let answer = client.prepare(&[neighbour, victim.clone()]).await.unwrap();
    devices(&answer, "uid-neighbour");
    devices(&answer, "uid-victim");
    let r = client.unprepare(std::slice::from_ref(&victim)).await;
    assert!(
        r.is_err(),
        "{step}: the daemon answered {r:?} instead of dying"
    );
    assert_died_at(&mut dying, step).await;

    let _daemon = n.start(&[], 2).await;
    let (_kubelet, client) = n.kubelet().await;
    assert_eq!(n.consistent().await, ["uid-neighbour"], "{step}");
    let gone = client.unprepare(&[victim]).await.unwrap();
    assert!(gone["uid-victim"].is_ok(), "{step}: {gone:?}");
    assert_eq!(n.consistent().await, ["uid-neighbour"], "{step}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_prepare_dies_after_allocate() {
    prepare_dies_at("after-allocate", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_prepare_dies_after_checkpoint() {
    prepare_dies_at("after-checkpoint", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_prepare_dies_after_update_push() {
    prepare_dies_at("after-update-push", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_prepare_dies_after_spec_temp() {
    prepare_dies_at("after-spec-temp", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_prepare_dies_after_spec_rename() {
    prepare_dies_at("after-spec-rename", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_unprepare_dies_after_release() {
    unprepare_dies_at("after-release").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_unprepare_dies_after_spec_remove() {
    unprepare_dies_at("after-spec-remove").await;
}
