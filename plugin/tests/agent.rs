//! The agent's container logic over a real engine: adoption of devices held
//! without records, the annotation path, and refusals that fail a creation.

mod engine_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use engine_common::*;
use nri_accel::daemon::{Agent, AgentSettings, ContainerView, Injection};

fn agent(d: &Dirs, cpus_per_device: u32) -> Agent {
    let (engine, _) = open_with(d, 4, cpus_per_device, None).unwrap();
    Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
            manage_shared_cpus: cpus_per_device > 0,
        },
    )
}

fn view(id: &str, name: &str, annotations: &[(&str, &str)], nodes: &[(u32, u32)]) -> ContainerView {
    ContainerView {
        id: id.into(),
        name: name.into(),
        pod_namespace: "ns".into(),
        pod_name: "pod".into(),
        pod_uid: "pod-uid".into(),
        pod_annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        cdi_devices: Vec::new(),
        device_nodes: nodes.to_vec(),
        cpus: None,
    }
}

#[tokio::test]
async fn a_running_container_holding_a_device_without_a_record_is_adopted_until_removed() {
    let d = dirs();
    let agent = agent(&d, 0);
    // /dev/nvidia1 is 195:1 in the test inventory.
    agent
        .synchronize(&[view("c-old", "legacy", &[], &[(195, 1)])])
        .await;
    let engine = agent.engine();
    let claims = engine.claims();
    assert_eq!(claims.len(), 1, "adopted under a record of its own");
    assert!(claims[0].0.claim_uid.starts_with("adopted-"));
    assert_eq!(spec_uids(&d), vec![claims[0].0.claim_uid.clone()]);
    // Nobody else gets gpu1 while the container lives.
    let err = engine
        .prepare(claim_for("thief", "gpu1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gpu1"), "{err}");
    // A second Synchronize does not adopt twice.
    agent
        .synchronize(&[view("c-old", "legacy", &[], &[(195, 1)])])
        .await;
    assert_eq!(engine.claims().len(), 1);
    // The container goes: the device is free again.
    agent.remove_container("c-old").await.unwrap();
    assert!(engine.claims().is_empty());
    engine.prepare(claim_for("next", "gpu1")).await.unwrap();
}

#[tokio::test]
async fn the_annotation_path_grants_on_create_and_releases_on_remove() {
    let d = dirs();
    let agent = agent(&d, 0);
    let c = view(
        "c-ann-1",
        "trainer",
        &[("accel.nri.io/container.trainer", "count=2,family=exclusive")],
        &[],
    );
    let (grant, _) = agent
        .create_container(&c, Injection::DeviceNodes)
        .await
        .unwrap();
    let nodes: Vec<&str> = grant.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        nodes
            .iter()
            .filter(|p| p.starts_with("/dev/nvidia") && **p != "/dev/nvidiactl")
            .count(),
        2,
        "{nodes:?}"
    );
    assert!(nodes.contains(&"/dev/nvidiactl"));
    assert_eq!(spec_uids(&d).len(), 1, "the spec is the proof of the grant");

    let (cdi_grant, _) = agent
        .create_container(
            &view(
                "c-ann-2",
                "other",
                &[("accel.nri.io/container.other", "count=1")],
                &[],
            ),
            Injection::Cdi,
        )
        .await
        .unwrap();
    assert_eq!(cdi_grant.cdi_devices.len(), 1);
    assert!(cdi_grant.cdi_devices[0].starts_with("accel.nri.io/device=claim-ctr-"));

    agent.remove_container("c-ann-1").await.unwrap();
    agent.remove_container("c-ann-2").await.unwrap();
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
}

#[tokio::test]
async fn requests_nothing_downstream_models_fail_the_creation_and_write_nothing() {
    let d = dirs();
    let agent = agent(&d, 0);
    let mixed = view(
        "c-mixed",
        "a",
        &[
            ("accel.nri.io/container.a", "vendor=nvidia"),
            ("accel.nri.io/container.b", "vendor=amd"),
        ],
        &[],
    );
    let err = agent
        .create_container(&mixed, Injection::Cdi)
        .await
        .unwrap_err();
    assert!(err.contains("two vendors"), "{err}");
    let greedy = view(
        "c-greedy",
        "g",
        &[("accel.nri.io/container.g", "count=9")],
        &[],
    );
    let err = agent
        .create_container(&greedy, Injection::Cdi)
        .await
        .unwrap_err();
    assert!(
        err.contains("c-greedy") || err.contains("g of pod"),
        "{err}"
    );
    let bad = view(
        "c-bad",
        "b",
        &[("accel.nri.io/container.b", "count=two")],
        &[],
    );
    assert!(agent.create_container(&bad, Injection::Cdi).await.is_err());
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
}
