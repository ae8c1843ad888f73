//! End to end, the kubelet device plugin path through the real `nri-accel` binary: the simulated
//! kubelet (kube-sim) registers every pool's resource, follows ListAndWatch (NUMA nodes, a
//! device node vanishing and coming back), admits a container (GetPreferredAllocation, then
//! Allocate), the fake runtime creates it over NRI with the answered CDI names and gets the
//! accelerator-local cpuset, an Allocate of the held device is refused naming the container,
//! and removing the container frees the device. A kubelet restart wiping its directory gets
//! every resource registered again.

mod e2e_common;

use std::path::{Path, PathBuf};

use e2e_common::*;
use fake_runtime::FakeRuntime;
use kube_sim::kubelet::DevicePluginKubelet;
use nri_proto::api::Event;

const WHOLE: &str = "accel.nri.io/whole";
const SHARED: &str = "accel.nri.io/shared";
const SLICED: &str = "accel.nri.io/sliced";

/// The device plugin section for a node whose kubelet directory is `dir`.
fn section(dir: &Path) -> String {
    format!(
        "device_plugin:\n  enabled: true\n  dir: {}\n  slice_layouts:\n    sliced:\n      - {{ profile: 4g, start: 0 }}\n      - {{ profile: 4g, start: 4 }}\n",
        dir.display()
    )
}

struct Node {
    node: TestNode,
    dp_dir: PathBuf,
    root: PathBuf,
}

/// A node whose device nodes exist under a fixture root, health checked every second.
fn test_node() -> Node {
    let sections = node_yaml(Shape::default());
    // The node's temp dir is known only once it exists: the config is rewritten after.
    let node = TestNode::with_sections(&sections, "");
    let dp_dir = node.dir.path().join("device-plugins");
    let root = node.dir.path().join("root");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for i in 0..4 {
        std::fs::write(root.join(format!("dev/nvidia{i}")), b"").unwrap();
    }
    std::fs::write(root.join("dev/nvidiactl"), b"").unwrap();
    let with_root = sections.replacen(
        "discovery:\n  sysfs: false\n",
        &format!(
            "discovery:\n  sysfs: false\n  root: {}\n  health_check_secs: 1\n",
            root.display()
        ),
        1,
    );
    let text = std::fs::read_to_string(&node.config).unwrap();
    let text = text.replace(&sections, &with_root) + &section(&dp_dir);
    std::fs::write(&node.config, text).unwrap();
    Node { node, dp_dir, root }
}

async fn start(n: &Node) -> (FakeRuntime, DevicePluginKubelet, DaemonProc) {
    let fake = runtime(&n.node).await;
    let kubelet = DevicePluginKubelet::start(&n.dp_dir).unwrap();
    let daemon = n.node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    for r in [WHOLE, SHARED, SLICED] {
        kubelet
            .wait_registered(r, WAIT)
            .await
            .unwrap_or_else(|e| panic!("{r}: {e}\n{}", daemon.log_text()));
    }
    (fake, kubelet, daemon)
}

fn resource<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["device_plugins"]["resources"]
        .as_array()
        .and_then(|v| v.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no resource {name}: {doc:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_create_over_nri_remove_and_the_device_is_free_again() {
    let n = test_node();
    let (fake, kubelet, _daemon) = start(&n).await;
    let whole = kubelet.plugin(WHOLE).unwrap();
    let numa: Vec<(String, Vec<i64>)> = whole
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.numa.clone()))
        .collect();
    assert_eq!(
        numa,
        [("gpu0".to_string(), vec![0]), ("gpu1".to_string(), vec![1])]
    );
    assert_eq!(kubelet.plugin(SLICED).unwrap().devices.len(), 2);

    // The kubelet admits a container asking one whole GPU.
    let (ids, answer) = kubelet.admit("train/app", WHOLE, 1).await.unwrap();
    let cdi: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(cdi.len(), 1);
    assert!(
        cdi[0].starts_with(&format!("{CDI_KIND}=claim-dp-")),
        "{cdi:?}"
    );
    assert_eq!(
        n.node.spec_uids().len(),
        1,
        "the spec is the proof of the grant"
    );

    // The runtime creates it over NRI with those CDI names: it gets the GPU's local CPUs.
    let p = pod("train", &[]);
    fake.add_pod(p.clone());
    let c = container("c-train-0001", &p, "app", &cdi);
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());
    let adj = last_adjustment(&fake, "c-train-0001");
    let cpus = adj
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|c| c.cpus.clone())
        .expect("cpuset");
    let cpus: policies::CpuSet = cpus.parse().unwrap();
    let local: policies::CpuSet = if ids[0] == "gpu0" { "0-7" } else { "8-15" }
        .parse()
        .unwrap();
    assert_eq!(cpus.len(), 2, "{cpus}");
    assert!(cpus.is_subset(&local), "{cpus} not local to {}", ids[0]);

    let doc = n.node.status_json().await;
    let r = resource(&doc, WHOLE);
    assert_eq!(r["registration"]["state"], "registered");
    assert_eq!(r["held"][0]["id"], ids[0]);
    assert_eq!(r["held"][0]["containers"][0], "c-train-0001");
    assert_eq!(r["held"][0]["pod"], "e2e/train");
    assert_no_unit_granted_twice(&doc);
    let (st, text, _) = n.node.cli(&["status"]).await;
    assert!(st.success());
    assert!(
        text.contains("device plugins") && text.contains(WHOLE) && text.contains("registered"),
        "{text}"
    );

    // A confused kubelet hands the same GPU to another container: refused, naming the holder.
    let client = kubelet.client(WHOLE).await.unwrap();
    let err = client.allocate(&ids).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));
    assert!(
        err.to_string()
            .contains("still held by container c-train-0001 of pod e2e/train"),
        "{err}"
    );

    // The container is removed: the claim goes, and the GPU with it.
    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    fake.forget_container("c-train-0001");
    assert!(n.node.spec_uids().is_empty(), "{:?}", n.node.cdi_entries());
    let doc = n.node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert!(resource(&doc, WHOLE)["held"].as_array().unwrap().is_empty());
    kubelet.forget("train/app");
    let again = client.allocate(&ids).await.expect("free again");
    assert_eq!(again.cdi_devices.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_device_node_streams_unhealthy_and_back() {
    let n = test_node();
    let (_fake, kubelet, _daemon) = start(&n).await;
    std::fs::rename(n.root.join("dev/nvidia1"), n.root.join("dev/gone")).unwrap();
    let p = kubelet
        .wait_plugin(WHOLE, WAIT, |p| !p.unhealthy().is_empty())
        .await
        .expect("gpu1 unhealthy");
    assert_eq!(p.unhealthy(), ["gpu1"]);
    let doc = n.node.status_json().await;
    let why = resource(&doc, WHOLE)["unhealthy"][0]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("/dev/nvidia1"), "{why}");
    std::fs::rename(n.root.join("dev/gone"), n.root.join("dev/nvidia1")).unwrap();
    kubelet
        .wait_plugin(WHOLE, WAIT, |p| p.devices.iter().all(|d| d.healthy))
        .await
        .expect("healthy again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_wiping_its_directory_is_followed_by_a_new_registration() {
    let n = test_node();
    let (_fake, mut kubelet, daemon) = start(&n).await;
    let (ids, answer) = kubelet.admit("a/app", SHARED, 1).await.unwrap();
    kubelet.restart().await.unwrap();
    for r in [WHOLE, SHARED, SLICED] {
        kubelet
            .wait_plugin(r, WAIT, |p| p.updates > 0)
            .await
            .unwrap_or_else(|e| panic!("{r} not registered again: {e}\n{}", daemon.log_text()));
        assert_eq!(kubelet.registrations(r), 2);
    }
    // Its Allocate of the same device again is answered with the same CDI names.
    let client = kubelet.client(SHARED).await.unwrap();
    assert_eq!(client.allocate(&ids).await.unwrap(), answer);
    assert!(
        daemon.log_text().contains("serving it again"),
        "{}",
        daemon.log_text()
    );
}

/// What a real kubelet does when the pod holding a device is deleted while another pod waits
/// for it (found by tests/cluster, scenario e): it stops the holder's container, frees the
/// device in its device manager and admits the waiting pod at once, with an Allocate of the same
/// device; the stopped container is removed only later, by the kubelet's garbage collection.
/// A stopped container runs nothing: the Allocate must be answered (refusing it made the kubelet
/// fail the waiting pod for good, UnexpectedAdmissionError). The new allocation has the same
/// claim UID (same resource and IDs), so the stopped container's later removal must not release
/// it before the new pod's container exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocate_after_the_holder_stopped_and_before_its_removal_is_answered() {
    let n = test_node();
    let (fake, kubelet, daemon) = start(&n).await;
    let (ids, answer) = kubelet.admit("first/app", WHOLE, 1).await.unwrap();
    let cdi: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let p = pod("first", &[]);
    fake.add_pod(p.clone());
    let c = container("c-first-0001", &p, "app", &cdi);
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());

    // The holder's pod is deleted: its container stops (not yet removed).
    fake.stop_container(&p, &c).await.expect("stop");

    // The kubelet hands the device to the waiting pod.
    let client = kubelet.client(WHOLE).await.unwrap();
    let again = client.allocate(&ids).await.unwrap_or_else(|e| {
        panic!(
            "Allocate after the holder stopped: {e}\n{}",
            daemon.log_text()
        )
    });
    assert_eq!(again.cdi_devices.len(), 1);
    assert_eq!(n.node.spec_uids().len(), 1, "{:?}", n.node.cdi_entries());

    // The garbage collection removes the stopped container before the new pod's container is
    // created: the new allocation stays.
    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    fake.forget_container("c-first-0001");
    assert_eq!(
        n.node.spec_uids().len(),
        1,
        "the new allocation went with the stopped container's removal: {:?}\n{}",
        n.node.cdi_entries(),
        daemon.log_text()
    );
    let doc = n.node.status_json().await;
    assert_eq!(status_claims(&doc).len(), 1, "{doc:#}");

    // The new pod's container starts with it and gets the device's local CPUs.
    let p2 = pod("second", &[]);
    fake.add_pod(p2.clone());
    let cdi2: Vec<String> = again.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let c2 = container("c-second-0001", &p2, "app", &cdi2);
    fake.create_container(&p2, &c2)
        .await
        .expect("create the second");
    fake.add_container(c2.clone());
    let doc = n.node.status_json().await;
    assert_eq!(
        resource(&doc, WHOLE)["held"][0]["containers"][0],
        "c-second-0001",
        "{doc:#}"
    );
    assert_no_unit_granted_twice(&doc);
}
