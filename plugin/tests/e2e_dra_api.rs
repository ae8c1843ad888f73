//! The whole DRA path through the real `nri-accel` binary: the daemon publishes its ResourceSlices
//! to kube-sim's API server, kube-sim's scheduler allocates claims from them, the claims are
//! stored on the API server, kube-sim's kubelet calls NodePrepareResources over the DRA socket,
//! the daemon reads each claim from the API server and prepares it through the engine (CDI spec
//! written, ids answered), and the fake runtime creates the container with those CDI ids and is
//! told its accelerator-local CPUs. Then the refusals, one claim at a time, and the API server
//! going away and coming back.

mod dra_common;
mod e2e_common;

use dra_common::*;
use e2e_common::*;
use kube_sim::apiserver::RESOURCE_CLAIMS;
use kube_sim::kubelet::wire::dra::Claim;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_scheduler_allocated_is_prepared_and_its_container_gets_local_cpus() {
    let n = DraNode::new().await;
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    // The scheduler picks a whole GPU from the published slices.
    let train = n.schedule("uid-train", "train", "exclusive");
    let alloc = n.allocation("train");
    let device = alloc["devices"]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    let answer = client.prepare(std::slice::from_ref(&train)).await.unwrap();
    let prepared = devices(&answer, "uid-train").to_vec();
    assert_eq!(prepared.len(), 1);
    assert_eq!(prepared[0].pool_name, NODE);
    assert_eq!(prepared[0].device_name, device);
    assert_eq!(prepared[0].request_names, ["gpu"]);
    assert_eq!(prepared[0].share_id, None);
    let ids = prepared[0].cdi_device_ids.clone();
    assert_eq!(ids, [format!("{CDI_KIND}=claim-uid-train-0")]);
    let spec = std::fs::read_to_string(n.node.cdi_dir.join(format!("{SPEC_PREFIX}uid-train.yaml")))
        .expect("the claim's spec file");
    assert!(spec.contains("claim-uid-train-0"), "{spec}");
    assert!(spec.contains("/dev/nvidia"), "{spec}");

    // The kubelet repeats the call: the same answer, nothing new written.
    let again = client.prepare(std::slice::from_ref(&train)).await.unwrap();
    assert_eq!(devices(&again, "uid-train"), prepared.as_slice());
    assert_eq!(n.consistent().await, ["uid-train"]);

    // The runtime creates the pod's container with the claim's CDI ids: it gets two CPUs local
    // to the GPU the scheduler chose.
    let p = pod("train", &[]);
    let c = container("c-train", &p, "trainer", &ids);
    let cpu = create_with_cpuset(&n.fake, &p, &c).await;
    let doc = n.node.status_json().await;
    let record = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == "uid-train")
        .expect("the claim's record")
        .clone();
    let gpu: u32 = record["results"][0]["device_id"]
        .as_str()
        .unwrap()
        .trim_start_matches("gpu")
        .parse()
        .unwrap();
    assert!(device.ends_with(&format!("gpu{gpu}")), "{device} {record}");
    let cpus = expand_cpus(&cpu.cpus);
    assert_eq!(cpus.len(), 2, "cpus {}", cpu.cpus);
    let local = if gpu.is_multiple_of(2) { 0..8 } else { 8..16 };
    assert!(cpus.iter().all(|c| local.contains(c)), "{cpus:?} gpu{gpu}");
    assert_eq!(cpu.mems, if gpu.is_multiple_of(2) { "0" } else { "1" });
    assert_eq!(record["containers"], json!(["c-train"]));

    // Two claims on the shared GPU: each result carries the share ID the scheduler gave it, and
    // the answer carries it back.
    let s1 = n.schedule("uid-s1", "s1", "shared");
    let s2 = n.schedule("uid-s2", "s2", "shared");
    let answer = client.prepare(&[s1.clone(), s2.clone()]).await.unwrap();
    for (uid, name) in [("uid-s1", "s1"), ("uid-s2", "s2")] {
        let share = n.allocation(name)["devices"]["results"][0]["shareID"].clone();
        assert!(share.is_string(), "{share}");
        assert_eq!(
            devices(&answer, uid)[0].share_id.as_deref(),
            share.as_str(),
            "{uid}"
        );
    }
    assert_ne!(
        devices(&answer, "uid-s1")[0].share_id,
        devices(&answer, "uid-s2")[0].share_id
    );
    assert_eq!(n.consistent().await, ["uid-s1", "uid-s2", "uid-train"]);

    // The pod goes; the kubelet unprepares its claims: records and specs are gone.
    n.fake
        .notify(nri_proto::api::Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    let gone = client.unprepare(&[train, s1, s2]).await.unwrap();
    assert!(gone.values().all(Result::is_ok), "{gone:?}");
    assert!(n.consistent().await.is_empty());
    assert!(
        n.node.cdi_entries().is_empty(),
        "{:?}",
        n.node.cdi_entries()
    );
    assert!(n.fake.errors().is_empty(), "{:?}", n.fake.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_claim_is_refused_alone_and_nothing_is_written_for_it() {
    let n = DraNode::new().await;
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    let good = n.schedule("uid-good", "good", "exclusive");
    // Stored but not allocated yet.
    n.put_claim("uid-unalloc", "unalloc", Value::Null);
    // Deleted and recreated under the same name: the kubelet still asks for the old UID.
    n.put_claim("uid-new", "recreated", allocation_of("whole-gpu1"));
    // Allocated a device this node does not publish, or one of another node's pool.
    n.put_claim("uid-unknown", "unknown", allocation_of("whole-gpu9"));
    let mut foreign = allocation_of("whole-gpu1");
    foreign["devices"]["results"][0]["pool"] = json!("node-2");
    n.put_claim("uid-pool", "pool", foreign);
    let bad_ns = Claim {
        namespace: "Not_A_Label".into(),
        ..kube_claim("uid-ns", "x")
    };
    let all = [
        good,
        kube_claim("uid-unalloc", "unalloc"),
        kube_claim("uid-old", "recreated"),
        kube_claim("uid-unknown", "unknown"),
        kube_claim("uid-pool", "pool"),
        kube_claim("uid-missing", "missing"),
        bad_ns,
        kube_claim("uid-name", "../../etc/passwd"),
    ];
    let answer = client.prepare(&all).await.unwrap();
    assert_eq!(answer.len(), all.len(), "every claim is answered");
    assert_eq!(
        cdi_ids(&answer, "uid-good"),
        [format!("{CDI_KIND}=claim-uid-good-0")]
    );
    let expect = [
        ("uid-unalloc", "is not allocated"),
        ("uid-old", "has UID uid-new"),
        ("uid-unknown", "which this node does not publish"),
        ("uid-pool", "not this node's pool node-1"),
        ("uid-missing", "does not exist on the API server"),
        ("uid-ns", "is not a DNS label"),
        ("uid-name", "is not a DNS subdomain"),
    ];
    for (uid, words) in expect {
        let e = refusal(&answer, uid);
        assert!(e.contains(words), "{uid}: {e}");
        assert!(!e.contains("Some(") && !e.contains("Ok("), "{uid}: {e}");
    }
    // Nothing was written for a refused claim, and the good one holds one GPU.
    assert_eq!(n.consistent().await, ["uid-good"]);

    // Asked again, the refusals stand and the good claim is answered as before.
    let again = client.prepare(&all).await.unwrap();
    assert_eq!(cdi_ids(&again, "uid-good"), cdi_ids(&answer, "uid-good"));
    for (uid, words) in expect {
        assert!(refusal(&again, uid).contains(words), "{uid}");
    }
    assert_eq!(n.consistent().await, ["uid-good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_waits_for_the_api_server_and_unprepare_never_needs_it() {
    let n = DraNode::new().await;
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    let held = n.schedule("uid-held", "held", "exclusive");
    let shared = n.schedule("uid-shared", "shared", "shared");
    let first = client
        .prepare(&[held.clone(), shared.clone()])
        .await
        .unwrap();
    let held_ids = cdi_ids(&first, "uid-held");
    let fresh = n.schedule("uid-fresh", "fresh", "exclusive");

    n.api.go_down().await;
    // A claim the node holds is answered from its record; a new one is refused for now, alone.
    let answer = client
        .prepare(&[held.clone(), fresh.clone()])
        .await
        .unwrap();
    assert_eq!(cdi_ids(&answer, "uid-held"), held_ids);
    let e = refusal(&answer, "uid-fresh");
    assert!(e.contains("default/fresh"), "{e}");
    assert!(e.contains("the kubelet retries"), "{e}");
    assert_eq!(n.consistent().await, ["uid-held", "uid-shared"]);

    // Unprepare while the API server is down, and of a claim already deleted from it.
    n.api
        .remove(&RESOURCE_CLAIMS, NS, "shared")
        .expect("stored");
    let gone = client.unprepare(&[held, shared]).await.unwrap();
    assert!(gone.values().all(Result::is_ok), "{gone:?}");
    assert!(n.consistent().await.is_empty());

    // The API server comes back: the kubelet's retry of the refused claim succeeds.
    n.api.come_back().await.expect("back");
    let answer = wait_for("the retried prepare", || async {
        let answer = client.prepare(std::slice::from_ref(&fresh)).await.unwrap();
        match &answer["uid-fresh"] {
            Ok(_) => Some(answer),
            Err(e) => {
                assert!(e.contains("the kubelet retries"), "{e}");
                None
            }
        }
    })
    .await;
    assert_eq!(
        cdi_ids(&answer, "uid-fresh"),
        [format!("{CDI_KIND}=claim-uid-fresh-0")]
    );
    assert_eq!(n.consistent().await, ["uid-fresh"]);

    // Deleted from the API server while held: unprepare still releases it.
    n.api.remove(&RESOURCE_CLAIMS, NS, "fresh").expect("stored");
    let gone = client.unprepare(&[fresh]).await.unwrap();
    assert!(gone["uid-fresh"].is_ok(), "{gone:?}");
    assert!(n.consistent().await.is_empty());
}
