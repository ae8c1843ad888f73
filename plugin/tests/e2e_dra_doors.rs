//! Devices held through another door than this node's DRA claims, through the real `nri-accel`
//! binary with its DRA driver on against kube-sim's API server, scheduler and kubelet: a device
//! held through the annotation path or the claims API leaves the published slices while held
//! (the scheduler cannot allocate it, so no DRA pod waits on refused prepares), comes back when
//! released, stays withdrawn across a restart; a device a DRA claim holds stays published.

mod dra_common;
mod e2e_common;

use dra_common::*;
use e2e_common::*;
use kube_sim::scheduler::{self, DeviceRequest};
use nri_accel::claims_api::Family;
use nri_proto::api::Event;
use serde_json::Value;

const KEY: &str = "accel.nri.io/container.app";

/// The names of every device the server holds.
fn names(slices: &[Value]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

/// Waits until the server's devices satisfy `ok`, and answers them.
async fn server_devices(n: &DraNode, what: &str, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    wait_for(what, || async {
        let now = names(&n.api.resource_slices());
        ok(&now).then_some(now)
    })
    .await
}

/// What the simulated scheduler answers for one exclusive device now.
fn try_schedule(n: &DraNode, uid: &str) -> Result<Value, String> {
    let matches = |d: &Value| scheduler::attribute(d, "family") == Some("exclusive");
    scheduler::allocate(
        &n.api.resource_slices(),
        &n.api.all(&kube_sim::apiserver::RESOURCE_CLAIMS),
        DRIVER,
        NODE,
        uid,
        &[DeviceRequest {
            name: "gpu",
            matches: &matches,
        }],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_held_through_another_door_is_not_published_until_released() {
    let n = DraNode::new().await;
    let _daemon = n.start(&[], 1).await;
    let all = names(&n.published().await);
    assert!(all.contains(&"whole-gpu0".to_string()), "{all:?}");
    let (_kubelet, client) = n.kubelet().await;

    // The annotation path takes one whole GPU: it leaves the slices at once.
    let p = pod("annotated", &[(KEY, "count=1,family=exclusive")]);
    let c = container("c-annotated", &p, "app", &[]);
    n.fake.add_pod(p.clone());
    n.fake.create_container(&p, &c).await.expect("create");
    n.fake.add_container(c.clone());
    let doc = n.node.status_json().await;
    let held: Vec<String> = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["results"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["device_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(held.len(), 1, "{doc:#}");
    let by_annotation = format!("whole-{}", held[0]);
    server_devices(&n, "the annotation's device withdrawn", |d| {
        !d.contains(&by_annotation)
    })
    .await;
    let doc = n.node.status_json().await;
    let withdrawn = &doc["kubernetes"]["resource_slices"]["withdrawn"];
    assert!(
        withdrawn
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["reason"] == "held-elsewhere" && w["device"] == held[0].as_str()),
        "{withdrawn:#}"
    );

    // The claims API takes the other one: nothing exclusive is left for the scheduler, which
    // says so instead of allocating a device whose prepare would be refused.
    let cli = n.node.client_gate_open().await;
    prepare_ok(&cli, count_claim("api-1", Family::Exclusive, None)).await;
    server_devices(&n, "both whole GPUs withdrawn", |d| {
        !d.iter().any(|x| x.starts_with("whole-"))
    })
    .await;
    let e = try_schedule(&n, "uid-dra").unwrap_err();
    assert!(e.contains("no device"), "{e}");

    // Released through the claims API: published again, and a DRA claim gets it and is
    // prepared. The device a DRA claim holds stays published (the scheduler knows that holder).
    let gone = cli.unprepare(vec![claim_ref("api-1")]).await.unwrap();
    assert_eq!(gone.get("api-1"), Some(&Ok(())));
    server_devices(&n, "the released GPU published again", |d| {
        d.iter().filter(|x| x.starts_with("whole-")).count() == 1
    })
    .await;
    let claim = n.schedule("uid-dra", "dra", "exclusive");
    let answer = client.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let device = devices(&answer, "uid-dra")[0].device_name.clone();
    assert_ne!(device, by_annotation);
    let doc = n.node.status_json().await;
    let origin = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == "uid-dra")
        .map(|c| c["origin"]["kind"].clone());
    // Recorded as any claims-API claim (an older nri-accel reads the record): its DRA results
    // are what keep its device published.
    assert_eq!(origin, Some(Value::from("claims-api")), "{doc:#}");
    let now = server_devices(&n, "the DRA claim's device still published", |d| {
        d.contains(&device)
    })
    .await;
    assert!(!now.contains(&by_annotation));

    // The annotated container removed: its GPU is published again.
    n.fake
        .notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    n.fake.forget_container("c-annotated");
    server_devices(&n, "the annotation's device published again", |d| {
        d.contains(&by_annotation)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_survives_a_restart_and_the_device_stays_withdrawn() {
    let n = DraNode::new().await;
    let mut daemon = n.start(&[], 1).await;
    n.published().await;
    let cli = n.node.client_gate_open().await;
    prepare_ok(&cli, count_claim("api-1", Family::Exclusive, None)).await;
    let doc = n.node.status_json().await;
    let id = doc["claims"][0]["results"][0]["device_id"]
        .as_str()
        .unwrap()
        .to_string();
    let name = format!("whole-{id}");
    server_devices(&n, "the held GPU withdrawn", |d| !d.contains(&name)).await;
    drop(cli);

    daemon.kill9().await;
    let daemon = n.start(&[], 2).await;
    // A new process: the hold comes from its records; the device is never published again.
    let doc = wait_for("the restarted daemon's pool published", || async {
        let doc = n.node.status_json().await;
        let r = &doc["kubernetes"]["resource_slices"];
        (r["state"] == "published" && r["rounds"].as_u64() >= Some(1)).then_some(doc)
    })
    .await;
    assert!(!names(&n.api.resource_slices()).contains(&name));
    let withdrawn = doc["kubernetes"]["resource_slices"]["withdrawn"].clone();
    assert!(
        withdrawn.as_array().unwrap().iter().any(|w| {
            w["reason"] == "held-elsewhere" && w["claims"] == serde_json::json!(["api-1"])
        }),
        "{withdrawn:#}"
    );
    let (st, text, _) = n.node.cli(&["status"]).await;
    assert!(st.success());
    assert!(
        text.contains(&format!(
            "withdrawn: device {id} (held by claim api-1 through another door than DRA)"
        )),
        "{text}"
    );
    let cli = n.node.client_gate_open().await;
    let gone = cli.unprepare(vec![claim_ref("api-1")]).await.unwrap();
    assert_eq!(gone.get("api-1"), Some(&Ok(())));
    server_devices(&n, "the GPU published again", |d| d.contains(&name)).await;
    drop(daemon);
}
