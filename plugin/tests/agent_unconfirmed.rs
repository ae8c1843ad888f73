//! Grants of containers the runtime never reported as existing (issue 39 item 4): CRI-O sends no
//! event when its create fails after nri-accel answered CreateContainer, so a grant the runtime
//! has not confirmed (PostCreateContainer, StartContainer, a Synchronize listing) within
//! `nri.unconfirmed_grant_secs` is released. Each test drives the interleaving by hand, with the
//! age given to [`Agent::release_unconfirmed`] (zero: every unconfirmed grant is past it).

mod engine_common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine_common::*;
use nri_accel::daemon::{Agent, AgentSettings, ContainerView};

const KEY: &str = "accel.nri.io/container.app";

fn agent(d: &Dirs) -> Agent {
    let (engine, _) = open_with(d, 4, 0, None).unwrap();
    let agent = Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    );
    // As after the runtime's first (empty) Synchronize.
    drop(agent.sync_started());
    agent
}

/// Container `id` of its own pod, asking `ask` by annotation, with `nodes` as its device nodes.
fn view(id: &str, ask: &str, nodes: &[(u32, u32)]) -> ContainerView {
    ContainerView {
        id: id.into(),
        name: "app".into(),
        pod_namespace: "ns".into(),
        pod_name: format!("pod-{id}"),
        pod_uid: format!("uid-{id}"),
        pod_id: format!("sandbox-{id}"),
        stopped: false,
        pod_annotations: [(KEY.to_string(), ask.to_string())]
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        cdi_devices: Vec::new(),
        device_nodes: nodes.to_vec(),
        placement: policies::Placement::unpinned(),
    }
}

/// The GPU nodes (195:n, not nvidiactl) a grant gave.
async fn gpu_nodes(agent: &Agent, c: &ContainerView) -> Vec<(u32, u32)> {
    let (grant, _) = agent.create_container(c).await.expect("granted");
    grant
        .device_nodes
        .iter()
        .filter(|n| n.path != "/dev/nvidiactl" && n.path.starts_with("/dev/nvidia"))
        .map(|n| (n.major, n.minor))
        .collect()
}

fn claim_uids(agent: &Agent) -> Vec<String> {
    agent
        .engine()
        .claims()
        .into_iter()
        .map(|(a, _)| a.claim_uid)
        .collect()
}

#[tokio::test]
async fn an_unconfirmed_grant_past_its_age_is_released_and_confirmed_ones_are_kept() {
    let d = dirs();
    let agent = agent(&d);
    // Three containers take the four GPUs: one the runtime created (PostCreateContainer), one
    // a Synchronize listed, and one whose create failed after the answer (no event at all).
    let created = view("c-created", "count=1,family=exclusive", &[]);
    let listed = view("c-listed", "count=1,family=exclusive", &[]);
    let failed = view("c-failed", "count=2,family=exclusive", &[]);
    gpu_nodes(&agent, &created).await;
    agent.container_exists(&created).await;
    let listed_nodes = gpu_nodes(&agent, &listed).await;
    // A Synchronize (a reconnect) lists the running containers.
    let running = [
        view("c-created", "count=1,family=exclusive", &[]),
        view("c-listed", "count=1,family=exclusive", &listed_nodes),
    ];
    agent.synchronize(&running).await;
    gpu_nodes(&agent, &failed).await;

    // Younger than the age: nothing goes.
    assert_eq!(
        agent.release_unconfirmed(Duration::from_secs(3600)).await,
        0
    );
    assert_eq!(claim_uids(&agent).len(), 3);
    let other = view("c-other", "count=1,family=exclusive", &[]);
    let refused = agent.create_container(&other).await.unwrap_err();
    assert!(refused.contains("ctr-cfailed"), "{refused}");

    // Past it: only the grant whose container never came to exist goes, spec and all.
    assert_eq!(agent.release_unconfirmed(Duration::ZERO).await, 1);
    let mut left = claim_uids(&agent);
    left.sort();
    assert_eq!(left, ["ctr-ccreated", "ctr-clisted"]);
    assert_eq!(spec_uids(&d).len(), 2);
    assert!(!agent.container_claims().contains_key("c-failed"));
    // Its devices serve the next container.
    let next = view("c-next", "count=2,family=exclusive", &[]);
    gpu_nodes(&agent, &next).await;
    agent.container_exists(&next).await;
    assert_eq!(agent.release_unconfirmed(Duration::ZERO).await, 0);
    assert_eq!(claim_uids(&agent).len(), 3);
}

#[tokio::test]
async fn a_container_confirmed_after_its_grant_was_released_holds_its_device_again() {
    let d = dirs();
    let agent = agent(&d);
    // The create outlived the age (CRI-O kept it for the kubelet's retry): released.
    let slow = view("c-slow", "count=1,family=exclusive", &[]);
    let nodes = gpu_nodes(&agent, &slow).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(agent.release_unconfirmed(Duration::ZERO).await, 1);
    assert!(claim_uids(&agent).is_empty());

    // Its StartContainer comes: it exists after all, with the device node it was given; the
    // device is held for it again and nobody else gets it.
    let started = view("c-slow", "count=1,family=exclusive", &nodes);
    agent.container_exists(&started).await;
    let held = claim_uids(&agent);
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].starts_with("adopted-"), "{held:?}");
    let thief = view("c-thief", "count=4,family=exclusive", &[]);
    assert!(agent.create_container(&thief).await.is_err());
    // A second confirmation (its PostStart, a Synchronize) changes nothing.
    agent.container_exists(&started).await;
    assert_eq!(claim_uids(&agent), held);
    // It goes: so does the device.
    agent.remove_container("c-slow").await.unwrap();
    assert!(claim_uids(&agent).is_empty());
    assert!(spec_uids(&d).is_empty());
}

#[tokio::test]
async fn a_late_container_never_takes_a_device_another_claim_holds_meanwhile() {
    let d = dirs();
    let agent = agent(&d);
    let slow = view("c-slow", "count=1,family=exclusive", &[]);
    let nodes = gpu_nodes(&agent, &slow).await;
    assert_eq!(agent.release_unconfirmed(Duration::ZERO).await, 1);
    // Every GPU goes to another container before the slow one shows up.
    let taker = view("c-taker", "count=4,family=exclusive", &[]);
    gpu_nodes(&agent, &taker).await;
    agent.container_exists(&taker).await;
    agent
        .container_exists(&view("c-slow", "count=1,family=exclusive", &nodes))
        .await;
    // The taker keeps its grant and no second claim holds the device (the slow container is
    // reported: two containers may use it).
    assert_eq!(claim_uids(&agent), ["ctr-ctaker"]);
}
