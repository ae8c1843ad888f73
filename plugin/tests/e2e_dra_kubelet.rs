//! The DRA driver's kubelet side through the real `nri-accel` binary and the simulated kubelet:
//! registration and its verdict in `status`, UNAVAILABLE until the runtime synchronizes (and
//! again while it is away), a
//! kubelet restart, wiped kubelet directories, a refusal the operator sees, device health from a
//! sysfs fixture whose driver link disappears, and sockets unlinked on SIGTERM.

mod e2e_common;

use std::path::{Path, PathBuf};

use e2e_common::*;
use kube_sim::apiserver::ApiServer;
use kube_sim::kubelet::wire::dra::Claim;
use kube_sim::kubelet::{DraClient, HealthApi, HealthWatch, PluginWatcher};
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, DraResult};

const DRIVER: &str = "accel.nri.io";
const NODE: &str = "node-1";

/// The kubelet's directories of a test node.
struct KubeletDirs {
    registry: PathBuf,
    plugins: PathBuf,
}

impl KubeletDirs {
    fn endpoint(&self) -> PathBuf {
        self.plugins.join(DRIVER).join("dra.sock")
    }
    fn registration(&self) -> PathBuf {
        self.registry.join(format!("{DRIVER}-reg.sock"))
    }
}

/// Turns the DRA driver on in `node`'s config, with a test API server that knows the node.
async fn enable_dra(node: &TestNode) -> (KubeletDirs, ApiServer) {
    let server = ApiServer::start().await.expect("api server");
    server.add_node(NODE);
    let kubeconfig = node.dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    node.enable_dra(NODE, &kubeconfig);
    let (registry, plugins) = node.kubelet_dirs();
    (KubeletDirs { registry, plugins }, server)
}

fn kube_claim(uid: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: format!("{uid}-claim"),
    }
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_gate_restart_refusal_and_shutdown() {
    let node = TestNode::new(Shape::default(), "");
    let (dirs, _api) = enable_dra(&node).await;
    // A runtime socket that never answers: the daemon starts and the gate stays closed.
    let silent = std::os::unix::net::UnixListener::bind(&node.nri_socket).unwrap();
    let mut daemon = node.spawn(&[]);

    // The kubelet finds the plugin in its registry directory and registers it.
    let mut kubelet = PluginWatcher::new(&dirs.registry);
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.expect("registered");
    assert_eq!(plugin.endpoint, dirs.endpoint());
    let client = DraClient::for_plugin(&plugin).await.unwrap();
    let doc = wait_for("the registration in status", || async {
        let doc = node.status_json().await;
        (doc["kubelet"]["dra"]["registration"] == "registered").then_some(doc)
    })
    .await;
    assert_eq!(doc["kubelet"]["dra"]["driver"], DRIVER);
    assert_eq!(doc["kubelet"]["dra"]["pool"], NODE);

    // Until the runtime's Synchronize the whole call is UNAVAILABLE.
    let err = client.prepare(&[kube_claim("uid-1")]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    let err = client.unprepare(&[kube_claim("uid-1")]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");

    // The runtime comes: the plugin reconnects, synchronizes, and the gate opens.
    drop(silent);
    std::fs::remove_file(&node.nri_socket).unwrap();
    let fake = runtime(&node).await;
    let claims = node.client_gate_open().await;
    // A claim the node holds (prepared here through the claims API's results path) is answered
    // over the DRA socket from the node's record, and released by NodeUnprepareResources.
    let spec = ClaimSpec {
        uid: "uid-1".into(),
        namespace: "default".into(),
        name: "uid-1-claim".into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: DRIVER.into(),
            pool: "whole".into(),
            device: "whole-gpu0".into(),
            share_id: None,
        }]),
        env: Default::default(),
    };
    let ids = prepare_ok(&claims, spec).await;
    let answer = client.prepare(&[kube_claim("uid-1")]).await.unwrap();
    let devices = answer["uid-1"].as_ref().expect("answered from the record");
    assert_eq!(devices[0].cdi_device_ids, ids);
    assert_eq!(devices[0].pool_name, NODE);
    assert_eq!(devices[0].device_name, "whole-gpu0");
    let released = client
        .unprepare(&[kube_claim("uid-1"), kube_claim("uid-unknown")])
        .await
        .unwrap();
    assert!(released.values().all(Result::is_ok), "{released:?}");
    assert!(node.spec_uids().is_empty());

    // The runtime goes away: the gate closes and the kubelet's calls are UNAVAILABLE again until
    // the runtime is back and synchronized.
    fake.stop().await;
    wait_for("UNAVAILABLE after the runtime left", || async {
        let r = client.unprepare(&[kube_claim("uid-1")]).await;
        matches!(r, Err(e) if e.code() == Some(tonic::Code::Unavailable)).then_some(())
    })
    .await;
    fake.restart().await.unwrap();
    wait_for("answers after the runtime came back", || async {
        client.unprepare(&[kube_claim("uid-1")]).await.ok()
    })
    .await;

    // The kubelet restarts: it reads its registry directory again and registers the plugin.
    kubelet.restart();
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    assert_eq!(plugin.endpoint, dirs.endpoint());

    // A kubelet that speaks none of our versions refuses: an error in the log and in status.
    let mut alien = PluginWatcher::speaking(&dirs.registry, &["v9.DRAPlugin"]);
    alien.scan().await;
    assert_eq!(alien.refused().len(), 1);
    let doc = wait_for("the refusal in status", || async {
        let doc = node.status_json().await;
        (doc["kubelet"]["dra"]["registration"] == "refused").then_some(doc)
    })
    .await;
    let reason = doc["kubelet"]["dra"]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("v9.DRAPlugin"), "{reason}");
    let (st, text, _) = node.cli(&["status"]).await;
    assert!(st.success());
    assert!(text.contains("REFUSED by the kubelet"), "{text}");
    assert!(text.contains(&reason), "{text}");
    let log = daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("refused to register")),
        "{log}"
    );

    // Both kubelet directories are wiped: the sockets are served again and registered anew.
    std::fs::remove_dir_all(dirs.registry.parent().unwrap()).unwrap();
    let mut kubelet = PluginWatcher::new(&dirs.registry);
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    let client = DraClient::for_plugin(&plugin).await.unwrap();
    assert!(client.unprepare(&[kube_claim("uid-2")]).await.unwrap()["uid-2"].is_ok());
    wait_for("registered again", || async {
        let doc = node.status_json().await;
        (doc["kubelet"]["dra"]["registration"] == "registered").then_some(())
    })
    .await;
    let (_, text, _) = node.cli(&["status"]).await;
    assert!(text.contains("registered by the kubelet"), "{text}");

    // SIGTERM: a clean exit that leaves no socket behind.
    assert!(daemon.terminate().await.success());
    assert!(!exists(&dirs.endpoint()));
    assert!(!exists(&dirs.registration()));
}

/// Issue 39 item 0: a starting kubelet deletes every driver's ResourceSlices of its node, then
/// registers the drivers again. The daemon (with its default 10-minute resync) must publish them
/// again at once, and `status` must say what the server holds, not what was last sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_kubelets_wipe_is_republished_at_once_and_status_says_what_the_server_holds() {
    let node = TestNode::new(Shape::default(), "");
    let (dirs, api) = enable_dra(&node).await;
    let _fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    let mut kubelet = PluginWatcher::new(&dirs.registry);
    kubelet.wait_for(DRIVER, WAIT).await.expect("registered");
    let in_sync = |doc: &serde_json::Value| {
        let r = &doc["kubernetes"]["resource_slices"];
        r["state"] == "published"
            && r["server"]["state"] == "in-sync"
            && r["server"]["missing"] == 0
            && r["server"]["devices"].as_u64() > Some(0)
    };
    let doc = wait_for("the slices in sync on the server", || async {
        let doc = node.status_json().await;
        in_sync(&doc).then_some(doc)
    })
    .await;
    let held = api.resource_slices();
    let devices: usize = held
        .iter()
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum();
    let server = &doc["kubernetes"]["resource_slices"]["server"];
    assert_eq!(server["slices"], held.len(), "{doc:#}");
    assert_eq!(server["devices"], devices, "{doc:#}");
    let (_, text, _) = node.cli(&["status"]).await;
    let line = format!("resource slices on the server: {} slice", held.len());
    assert!(text.contains(&line), "{text}");
    assert!(
        text.contains(&format!("{devices} devices (generation 1, checked ")),
        "{text}"
    );

    // The kubelet restarts: it wipes the node's slices and registers the driver again.
    let wiped = api.delete_collection(
        &kube_sim::apiserver::RESOURCE_SLICES,
        &format!("spec.nodeName={NODE}"),
    );
    assert_eq!(wiped, held.len());
    kubelet.restart();
    kubelet
        .wait_for(DRIVER, WAIT)
        .await
        .expect("registered again");
    // WAIT is a tenth of the resync: what brings them back is the registration or the watch.
    let doc = wait_for("the slices back on the server", || async {
        let doc = node.status_json().await;
        let n: usize = api
            .resource_slices()
            .iter()
            .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
            .sum();
        (n == devices && in_sync(&doc)).then_some(doc)
    })
    .await;
    let r = &doc["kubernetes"]["resource_slices"];
    let republished = r["registrations"].as_u64().unwrap_or(0) + r["repairs"].as_u64().unwrap_or(0);
    assert!(
        republished >= 2,
        "the start's registration and the restart's: {r:#}"
    );
    assert_eq!(r["server"]["devices"], devices, "{r:#}");
}

/// Copies a sysfs fixture tree, links kept as links.
fn copy_fixture(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/dgx-8xh100/.");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_losing_its_driver_goes_unhealthy_on_the_kubelets_stream_and_back() {
    const GPU_DIR: &str = "sys/devices/pci0000:18/0000:18:01.0/0000:18:00.0";
    let root = tempfile::tempdir().unwrap();
    copy_fixture(root.path());
    let node = TestNode::with_sections(
        &format!(
            "discovery:\n  sysfs: true\n  root: {}\n  health_check_secs: 1\n",
            root.path().display()
        ),
        "",
    );
    let (dirs, _api) = enable_dra(&node).await;
    let _fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    let mut kubelet = PluginWatcher::new(&dirs.registry);
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    let api = HealthApi::of(&plugin).expect("the plugin lists a health service");
    assert_eq!(api, HealthApi::V1);
    let mut watch = HealthWatch::start(&plugin.endpoint, api).await.unwrap();
    let first = watch.next(WAIT).await.unwrap();
    assert_eq!(first.len(), 8, "{first:?}");
    assert!(first.iter().all(|d| d.is_healthy() && d.pool == NODE));
    let gpu = first
        .iter()
        .find(|d| d.device.contains("18-00-0"))
        .expect("the GPU at 0000:18:00.0 is published")
        .device
        .clone();

    // Its driver is unbound: the kubelet hears it is unhealthy, and why.
    let link = root.path().join(GPU_DIR).join("driver");
    let target = std::fs::read_link(&link).unwrap();
    std::fs::remove_file(&link).unwrap();
    let now = watch
        .wait_for(WAIT, |d| d.iter().any(|e| !e.is_healthy()))
        .await
        .unwrap();
    let sick: Vec<_> = now.iter().filter(|d| !d.is_healthy()).collect();
    assert_eq!(sick.len(), 1, "{sick:?}");
    assert_eq!(sick[0].device, gpu);
    assert!(
        sick[0].message.contains("unbound from its driver"),
        "{}",
        sick[0].message
    );

    // Bound again: healthy again.
    std::os::unix::fs::symlink(&target, &link).unwrap();
    watch
        .wait_for(WAIT, |d| d.iter().all(|e| e.is_healthy()))
        .await
        .unwrap();
    let doc = node.status_json().await;
    assert_eq!(doc["device_health"]["unhealthy"], serde_json::json!({}));
}
