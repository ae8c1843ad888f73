//! KEP-4817 per-device status through the real `nri-accel` binary and kube-sim's API server:
//! a prepared claim gets nri-accel's `status.devices` entries (server-side applied to the
//! `status` subresource), unprepare removes them, and an API server that refuses writes or is
//! down never fails a prepare or unprepare: the entries are written, or cleared, once it answers
//! again, and a claim unprepared meanwhile is left with none.

mod dra_common;
mod e2e_common;

use dra_common::*;
use e2e_common::*;
use kube_sim::apiserver::RESOURCE_CLAIMS;
use serde_json::Value;

/// The claim's `status.devices` as the API server holds it.
fn entries(n: &DraNode, name: &str) -> Vec<Value> {
    n.api.get(&RESOURCE_CLAIMS, NS, name).expect("stored claim")["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until the claim's `status.devices` has `count` entries.
async fn wait_entries(n: &DraNode, name: &str, count: usize) -> Vec<Value> {
    wait_for(
        &format!("claim {name} to have {count} status.devices entries"),
        || async {
            let e = entries(n, name);
            (e.len() == count).then_some(e)
        },
    )
    .await
}

/// The `kubernetes.claim_status` member of `status`.
async fn report(n: &DraNode) -> Value {
    n.node.status_json().await["kubernetes"]["claim_status"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_devices_are_shown_in_the_claim_and_removed_at_unprepare() {
    let n = DraNode::new().await;
    let port = free_port();
    let mut config = std::fs::read_to_string(&n.node.config).expect("config");
    config.push_str(&format!("metrics:\n  listen: \"127.0.0.1:{port}\"\n"));
    std::fs::write(&n.node.config, config).expect("config");
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    let train = n.schedule("uid-train", "train", "exclusive");
    let shared = n.schedule("uid-shared", "shared", "shared");
    let answer = client
        .prepare(&[train.clone(), shared.clone()])
        .await
        .unwrap();
    let ids = cdi_ids(&answer, "uid-train");

    let e = wait_entries(&n, "train", 1).await;
    let result = &n.allocation("train")["devices"]["results"][0];
    assert_eq!(e[0]["driver"], DRIVER);
    assert_eq!(e[0]["pool"], NODE);
    assert_eq!(e[0]["device"], result["device"]);
    assert!(e[0].get("shareID").is_none(), "{e:?}");
    let ready = &e[0]["conditions"][0];
    assert_eq!(ready["type"], "Ready");
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["reason"], "Prepared");
    assert!(ready["lastTransitionTime"].is_string(), "{ready}");
    assert_eq!(e[0]["data"]["cdiDeviceIDs"], serde_json::json!(ids));
    assert!(e[0]["data"]["numaNode"].is_u64(), "{e:?}");

    // A share of the shared device: its entry is keyed by the share the scheduler gave it.
    let e = wait_entries(&n, "shared", 1).await;
    let share = n.allocation("shared")["devices"]["results"][0]["shareID"].clone();
    assert!(share.is_string(), "{share}");
    assert_eq!(e[0]["shareID"], share);

    // The kubelet repeats the prepare: nothing new is written.
    let writes = n.api.writes_to(&RESOURCE_CLAIMS, NS, "train");
    client.prepare(std::slice::from_ref(&train)).await.unwrap();
    let r = wait_for("the writer to be idle", || async {
        let r = report(&n).await;
        (r["pending"] == 0).then_some(r)
    })
    .await;
    assert_eq!(r["enabled"], true);
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(n.api.writes_to(&RESOURCE_CLAIMS, NS, "train"), writes);

    // Unprepared: both claims' entries go; the metric shows nothing pending.
    let gone = client.unprepare(&[train, shared]).await.unwrap();
    assert!(gone.values().all(Result::is_ok), "{gone:?}");
    wait_entries(&n, "train", 0).await;
    wait_entries(&n, "shared", 0).await;
    let r = wait_for("both claims cleared", || async {
        let r = report(&n).await;
        (r["cleared"] == 2).then_some(r)
    })
    .await;
    assert_eq!(r["pending"], 0, "{r}");
    let (_, text, _) = n.node.cli(&["status"]).await;
    assert!(
        text.contains("claims' status.devices: 0 pending, 2 written, 2 cleared, 0 failed"),
        "{text}"
    );
    assert!(
        text.contains("resource.kubernetes.io/numaNode published as: list"),
        "{text}"
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (_, metrics) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert!(
        metrics.contains("nri_accel_claim_status_pending 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nri_accel_claim_status_failed_total 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_fails_writes_or_is_down_never_fails_prepare() {
    let n = DraNode::new().await;
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    // Every write refused (503): both prepares succeed, their entries wait.
    let a = n.schedule("uid-a", "a", "exclusive");
    let b = n.schedule("uid-b", "b", "exclusive");
    n.api.fail_next_writes(u64::MAX, 503);
    let answer = client.prepare(&[a.clone(), b.clone()]).await.unwrap();
    assert!(answer.values().all(Result::is_ok), "{answer:?}");
    let r = wait_for("two claims pending", || async {
        let r = report(&n).await;
        (r["pending"] == 2 && r["last_error"].is_string()).then_some(r)
    })
    .await;
    assert!(
        r["last_error"].as_str().unwrap().contains("claim default/"),
        "{r}"
    );
    // Claim b is unprepared before its entries could be written: it must never get them.
    let gone = client.unprepare(std::slice::from_ref(&b)).await.unwrap();
    assert!(gone["uid-b"].is_ok(), "{gone:?}");
    // Then down altogether: the writes wait on (connection refused), and go through once it is
    // back and answers.
    n.api.go_down().await;
    wait_for("a write refused by a server that is down", || async {
        let r = report(&n).await;
        let e = r["last_error"].as_str().unwrap_or("").to_string();
        (r["pending"] == 2 && !e.contains("injected")).then_some(())
    })
    .await;
    assert!(entries(&n, "a").is_empty());
    n.api.heal();
    n.api.come_back().await.expect("back");
    wait_entries(&n, "a", 1).await;
    wait_for("nothing pending", || async {
        (report(&n).await["pending"] == 0).then_some(())
    })
    .await;
    assert!(entries(&n, "b").is_empty());
    assert_eq!(n.api.writes_to(&RESOURCE_CLAIMS, NS, "b").updates, 0);

    // Down altogether: the unprepare of a succeeds, and its entry goes once the server is back.
    n.api.go_down().await;
    let gone = client.unprepare(std::slice::from_ref(&a)).await.unwrap();
    assert!(gone["uid-a"].is_ok(), "{gone:?}");
    wait_for("the clear to wait for the server", || async {
        (report(&n).await["pending"] == 1).then_some(())
    })
    .await;
    n.api.come_back().await.expect("back");
    wait_entries(&n, "a", 0).await;
    let r = wait_for("nothing pending", || async {
        let r = report(&n).await;
        (r["pending"] == 0).then_some(r)
    })
    .await;
    assert_eq!(r["failed"], 0, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_can_turn_it_off() {
    let n = DraNode::new().await;
    let config = std::fs::read_to_string(&n.node.config).expect("config");
    std::fs::write(
        &n.node.config,
        config.replace("dra:\n", "dra:\n  claim_status: false\n"),
    )
    .expect("config");
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;
    let c = n.schedule("uid-c", "c", "exclusive");
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert!(answer["uid-c"].is_ok(), "{answer:?}");
    assert_eq!(report(&n).await, serde_json::json!({"enabled": false}));
    let (_, text, _) = n.node.cli(&["status"]).await;
    assert!(
        text.contains("not written (dra.claim_status is off)"),
        "{text}"
    );
    assert!(entries(&n, "c").is_empty());
    assert_eq!(n.api.writes_to(&RESOURCE_CLAIMS, NS, "c").total(), 0);
}
