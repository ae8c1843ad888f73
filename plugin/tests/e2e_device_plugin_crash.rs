//! End to end, the device plugin path survives the real `nri-accel` being killed: between the
//! kubelet's Allocate and the container's creation (the kubelet's repeated Allocate gets the same
//! grant, another container cannot get the device, the container then holds it), and between
//! the container's removal and the release (the claim is released after the restart, the device
//! granted once again). After every restart records and specs agree and no unit is held twice.

mod e2e_common;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use e2e_common::*;
use fake_runtime::FakeRuntime;
use kube_sim::kubelet::DevicePluginKubelet;
use nri_accel::engine::CRASH_ENV;
use nri_proto::api::Event;

const WHOLE: &str = "accel.nri.io/whole";

fn test_node() -> (TestNode, PathBuf) {
    let node = TestNode::new(Shape::default(), "");
    let dp_dir = node.dir.path().join("device-plugins");
    let mut text = std::fs::read_to_string(&node.config).unwrap();
    text.push_str(&format!(
        "device_plugin:\n  enabled: true\n  dir: {}\n",
        dp_dir.display()
    ));
    std::fs::write(&node.config, text).unwrap();
    (node, dp_dir)
}

/// Records and specs agree, no temp file, no unit twice; answers the status document.
async fn consistent(node: &TestNode) -> serde_json::Value {
    let doc = node.status_json().await;
    assert_eq!(
        status_claims(&doc),
        node.spec_uids(),
        "records and specs disagree"
    );
    assert_eq!(
        node.cdi_entries().len(),
        node.spec_uids().len(),
        "{:?}",
        node.cdi_entries()
    );
    assert_no_unit_granted_twice(&doc);
    doc
}

async fn start(
    node: &TestNode,
    fake: &FakeRuntime,
    kubelet: &DevicePluginKubelet,
    syncs: usize,
    env: &[(&str, &str)],
) -> DaemonProc {
    let daemon = node.spawn(env);
    fake.wait_synchronized(syncs, WAIT)
        .await
        .expect("synchronized");
    kubelet
        .wait_plugin(WHOLE, WAIT, |p| p.streaming && p.updates > 0)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    daemon
}

/// The runtime creates container `c-train-0001` of pod `train` with the CDI names of `answer`.
async fn create_train(
    fake: &FakeRuntime,
    answer: &kube_sim::kubelet::deviceplugin_wire::ContainerAllocateResponse,
) -> (nri_proto::api::PodSandbox, nri_proto::api::Container) {
    let cdi: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let p = pod("train", &[]);
    fake.add_pod(p.clone());
    let c = container("c-train-0001", &p, "app", &cdi);
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());
    (p, c)
}

/// A node, its runtime and kubelet, and the daemon started with `env`, registered.
async fn first_start(
    env: &[(&str, &str)],
) -> (TestNode, FakeRuntime, DevicePluginKubelet, DaemonProc) {
    let (node, dp_dir) = test_node();
    let fake = runtime(&node).await;
    let kubelet = DevicePluginKubelet::start(&dp_dir).unwrap();
    let daemon = start(&node, &fake, &kubelet, 1, env).await;
    (node, fake, kubelet, daemon)
}

async fn wait_registrations(kubelet: &DevicePluginKubelet, n: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    while kubelet.registrations(WHOLE) < n || !kubelet.plugin(WHOLE).is_some_and(|p| p.streaming) {
        assert!(std::time::Instant::now() < deadline, "no registration {n}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_allocate_and_create_container() {
    let (node, fake, kubelet, mut daemon) = first_start(&[]).await;
    let (ids, answer) = kubelet.admit("train/app", WHOLE, 1).await.unwrap();
    daemon.kill9().await;

    // Restarted: it serves its socket again (the old one is stale) and registers again.
    let _daemon = start(&node, &fake, &kubelet, 2, &[]).await;
    wait_registrations(&kubelet, 2).await;
    let doc = consistent(&node).await;
    assert_eq!(status_claims(&doc).len(), 1, "the grant survived: {doc:#}");
    // The kubelet repeats its Allocate: the same grant.
    let client = kubelet.client(WHOLE).await.unwrap();
    assert_eq!(client.allocate(&ids).await.unwrap(), answer);
    // Another container asking that GPU with another one is refused (no double grant).
    let both: Vec<String> = kubelet
        .plugin(WHOLE)
        .unwrap()
        .devices
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let err = client.allocate(&both).await.unwrap_err();
    assert!(err.to_string().contains("has not started yet"), "{err}");

    // The container is created with the names from before the crash: it holds the claim.
    create_train(&fake, &answer).await;
    let doc = consistent(&node).await;
    let held = &doc["device_plugins"]["resources"][0]["held"][0];
    assert_eq!(held["containers"][0], "c-train-0001", "{doc:#}");
}

/// The container is removed while nri-accel is dead (its RemoveContainer never arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_then_the_container_and_pod_go_before_the_release() {
    let (node, fake, kubelet, mut daemon) = first_start(&[]).await;
    let (ids, answer) = kubelet.admit("train/app", WHOLE, 1).await.unwrap();
    let (p, _c) = create_train(&fake, &answer).await;
    daemon.kill9().await;
    fake.forget_container("c-train-0001");
    fake.forget_pod(&p.id);
    kubelet.forget("train/app");

    let _daemon = start(&node, &fake, &kubelet, 2, &[]).await;
    let doc = consistent(&node).await;
    assert!(status_claims(&doc).is_empty(), "no leak: {doc:#}");
    // The GPU is granted once again, to the next container.
    let (again, _) = kubelet.admit("next/app", WHOLE, 1).await.unwrap();
    assert_eq!(again, ids, "the policy prefers the same (free, NUMA 0) GPU");
    assert_eq!(status_claims(&consistent(&node).await).len(), 1);
}

/// The daemon dies inside RemoveContainer, after the record's removal and before the release
/// finished (its spec is still there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_inside_remove_container_before_the_release_finished() {
    let (node, fake, kubelet, mut dying) = first_start(&[(CRASH_ENV, "after-release")]).await;
    let (ids, answer) = kubelet.admit("train/app", WHOLE, 1).await.unwrap();
    let (p, c) = create_train(&fake, &answer).await;
    let r = fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c)).await;
    assert!(r.is_err(), "the daemon answered {r:?} instead of dying");
    let st = dying.wait_exit().await;
    assert_eq!(
        st.signal(),
        Some(nix::sys::signal::Signal::SIGABRT as i32),
        "{}",
        dying.log_text()
    );
    fake.forget_container("c-train-0001");
    fake.forget_pod(&p.id);
    kubelet.forget("train/app");

    let _daemon = start(&node, &fake, &kubelet, 2, &[]).await;
    let doc = consistent(&node).await;
    assert!(status_claims(&doc).is_empty(), "no leak: {doc:#}");
    assert!(node.spec_uids().is_empty());
    let client = kubelet.client(WHOLE).await.unwrap();
    let again = client.allocate(&ids).await.expect("granted once again");
    assert_eq!(again.cdi_devices.len(), 1);
    assert_eq!(status_claims(&consistent(&node).await).len(), 1);
}
