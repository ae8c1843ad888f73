//! End to end, the DRA path: the real daemon registers with a runtime, a DRA driver prepares a
//! claim through the claims API, the runtime creates the container with the claim's CDI devices
//! and gets the accelerator-local cpuset, and Unprepare removes the record and the spec.

mod e2e_common;

use e2e_common::*;
use nri_accel::claims_api::Family;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claim_prepare_container_adjust_unprepare() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);

    let info = fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    assert_eq!(info.name, "accel");
    assert_eq!(info.index, "10");
    let client = node.client_gate_open().await;

    let cdi = prepare_ok(&client, count_claim("dra-1", Family::Exclusive, None)).await;
    assert_eq!(cdi, vec![format!("{CDI_KIND}=claim-dra-1-0")]);
    assert_eq!(
        node.spec_uids(),
        ["dra-1".to_string()].into(),
        "{:?}",
        node.cdi_entries()
    );
    // The spec names the device node of the GPU the claim got.
    let spec = std::fs::read_to_string(node.cdi_dir.join(format!("{SPEC_PREFIX}dra-1.yaml")))
        .expect("spec");
    assert!(spec.contains("claim-dra-1-0"), "{spec}");
    assert!(spec.contains("/dev/nvidia"), "{spec}");

    // Preparing again answers the same CDI ids.
    let again = prepare_ok(&client, count_claim("dra-1", Family::Exclusive, None)).await;
    assert_eq!(again, cdi);

    // The runtime creates the claim's container carrying the CDI names.
    let p = pod("train", &[]);
    let c = container("c-train-1", &p, "trainer", &cdi);
    let cpu = create_with_cpuset(&fake, &p, &c).await;
    // Two exclusive CPUs of the GPU's NUMA node (0-7 or 8-15).
    let doc = node.status_json().await;
    let claim = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == "dra-1")
        .expect("claim in status")
        .clone();
    let claim_cpus = claim["cpus"].as_str().unwrap().to_string();
    assert_eq!(cpu.cpus, claim_cpus, "{doc:#}");
    let cpus: Vec<u32> = expand_cpus(&cpu.cpus);
    assert_eq!(cpus.len(), 2, "cpus {}", cpu.cpus);
    let device = claim["results"][0]["device_id"].as_str().unwrap();
    let gpu: u32 = device.trim_start_matches("gpu").parse().unwrap();
    let local = if gpu.is_multiple_of(2) { 0..8 } else { 8..16 };
    assert!(cpus.iter().all(|c| local.contains(c)), "{cpus:?} {device}");
    assert_eq!(cpu.mems, if gpu.is_multiple_of(2) { "0" } else { "1" });
    // The status knows which container holds the claim.
    assert_eq!(claim["containers"], serde_json::json!(["c-train-1"]));
    assert_eq!(doc["gate"]["open"], true);
    assert_no_unit_granted_twice(&doc);

    // The pod goes away; the driver unprepares the claim.
    fake.notify(nri_proto::api::Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    let gone = client.unprepare(vec![claim_ref("dra-1")]).await.unwrap();
    assert_eq!(gone["dra-1"], Ok(()));
    assert!(node.spec_uids().is_empty(), "{:?}", node.cdi_entries());
    assert!(client.list().await.unwrap().is_empty());
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert_eq!(assert_no_unit_granted_twice(&doc), 0);
    // An unknown claim is success.
    let again = client.unprepare(vec![claim_ref("dra-1")]).await.unwrap();
    assert_eq!(again["dra-1"], Ok(()));
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
}
