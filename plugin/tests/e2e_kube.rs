//! End to end through the `nri-accel` binary with `dra.enabled`: the daemon publishes the node's
//! devices to the (simulated) API server without waiting for it, `status` shows the pool,
//! `cleanup` refuses while the daemon runs and deletes our slices once it stopped.

mod e2e_common;

use e2e_common::*;
use kube_sim::apiserver::{ApiServer, RESOURCE_SLICES};

const NODE: &str = "node-e2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_publishes_its_devices_and_cleanup_removes_them() {
    let server = ApiServer::start().await.expect("api server");
    server.add_node(NODE);
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let node = TestNode::new(Shape::default(), "");
    node.enable_dra(NODE, &kubeconfig);
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");

    // 2 whole GPUs, 1 shared, 1 sliced (whole + 8 1g + 2 4g partitions): 14 devices.
    let slices = wait_for("the slices", || async {
        let s = server.resource_slices();
        let n: usize = s
            .iter()
            .map(|x| x["spec"]["devices"].as_array().map_or(0, Vec::len))
            .sum();
        (n == 14).then_some(s)
    })
    .await;
    assert!(slices.iter().all(|s| s["spec"]["nodeName"] == NODE));

    let doc = wait_for("status to show the pool", || async {
        let doc = node.status_json().await;
        (doc["kubernetes"]["resource_slices"]["state"] == "published").then_some(doc)
    })
    .await;
    // Every write done: the devices' slice may show before the counter sets' slice does (the
    // unprivileged CI run caught 1 slice here and 2 at the end).
    let slices = server.resource_slices();
    assert_eq!(
        slices.len(),
        doc["kubernetes"]["resource_slices"]["slices"]
            .as_array()
            .map_or(0, Vec::len),
        "{doc:#}"
    );
    let k = &doc["kubernetes"];
    assert_eq!(k["driver"], "accel.nri.io");
    assert_eq!(k["pool"], NODE);
    assert_eq!(k["resource_slices"]["devices"], 14);
    assert_eq!(k["resource_slices"]["missing_gates"], serde_json::json!([]));
    let (st, text, _) = node.cli(&["status"]).await;
    assert!(st.success());
    assert!(
        text.contains("kubernetes: driver accel.nri.io on node node-e2e"),
        "{text}"
    );

    let (st, _, err) = node.cli(&["cleanup"]).await;
    assert!(!st.success(), "cleanup must refuse while the daemon runs");
    assert!(err.contains("is running on this node"), "{err}");
    assert!(!server.resource_slices().is_empty());

    assert!(daemon.terminate().await.success());
    // Stopping the daemon leaves the pool published: the devices are still there.
    assert_eq!(server.resource_slices().len(), slices.len());
    let (st, out, err) = node.cli(&["cleanup"]).await;
    assert!(st.success(), "cleanup: {err}");
    assert!(
        out.contains(&format!("deleted {} ResourceSlice(s)", slices.len())),
        "{out}"
    );
    assert!(server.resource_slices().is_empty());
    assert_eq!(server.writes(&RESOURCE_SLICES).deletes, slices.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_starts_while_the_api_server_is_down() {
    let server = ApiServer::start().await.expect("api server");
    server.add_node(NODE);
    server.go_down().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let node = TestNode::new(Shape::default(), "");
    node.enable_dra(NODE, &kubeconfig);
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    // The NRI side and the claims API work without the API server.
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let _ = node.client_gate_open().await;
    let doc = wait_for("the failure in status", || async {
        let doc = node.status_json().await;
        let r = &doc["kubernetes"]["resource_slices"];
        (r["state"] == "retrying").then(|| r.clone())
    })
    .await;
    assert!(
        doc["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("unavailable"),
        "{doc}"
    );
    server.come_back().await.expect("back");
    wait_for("the slices after the server came back", || async {
        (!server.resource_slices().is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn cleanup_without_dra_touches_nothing() {
    let node = TestNode::new(Shape::default(), "");
    let (st, out, _) = node.cli(&["cleanup"]).await;
    assert!(st.success());
    assert!(out.contains("dra.enabled is false"), "{out}");
}

/// `dra.pools` (issue 37): the DRA driver publishes only the pools listed, so a node can serve
/// its other pools through the device plugin without the scheduler counting a device twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_pools_dra_serves_are_published() {
    let server = ApiServer::start().await.expect("api server");
    server.add_node(NODE);
    let node = TestNode::new(Shape::default(), "");
    let kubeconfig = node.dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    node.enable_dra(NODE, &kubeconfig);
    let config = std::fs::read_to_string(&node.config).unwrap();
    let config = config.replacen(
        "dra:\n  enabled: true\n",
        "dra:\n  enabled: true\n  pools: [whole, shared]\n",
        1,
    );
    std::fs::write(&node.config, config).unwrap();
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");

    let doc = wait_for("status to show the pool published", || async {
        let doc = node.status_json().await;
        (doc["kubernetes"]["resource_slices"]["state"] == "published").then_some(doc)
    })
    .await;
    // 2 whole GPUs and 1 shared; the sliced pool's GPU and its partitions are left out.
    assert_eq!(
        doc["kubernetes"]["resource_slices"]["devices"], 3,
        "{doc:#}"
    );
    let names: Vec<String> = server
        .resource_slices()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names.iter().all(|n| !n.contains("1g") && !n.contains("4g")),
        "a partition of the sliced pool was published: {names:?}"
    );
    fake.stop().await;
}
