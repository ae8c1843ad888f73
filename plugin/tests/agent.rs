//! The agent's container logic over a real engine: adoption of devices held
//! without records, the annotation path, and refusals that fail a creation.

mod engine_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use engine_common::*;
use nri_accel::daemon::{Agent, AgentSettings, ContainerView};

/// `agent` as after the runtime's first (empty) Synchronize: before it nothing is granted.
fn synchronized(agent: Agent) -> Agent {
    drop(agent.sync_started());
    agent
}

fn agent(d: &Dirs, cpus_per_device: u32) -> Agent {
    let (engine, _) = open_with(d, 4, cpus_per_device, None).unwrap();
    synchronized(Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    ))
}

fn view(id: &str, name: &str, annotations: &[(&str, &str)], nodes: &[(u32, u32)]) -> ContainerView {
    ContainerView {
        id: id.into(),
        name: name.into(),
        pod_namespace: "ns".into(),
        pod_name: "pod".into(),
        pod_uid: "pod-uid".into(),
        pod_id: "pod-sandbox".into(),
        stopped: false,
        pod_annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        cdi_devices: Vec::new(),
        device_nodes: nodes.to_vec(),
        placement: policies::Placement::unpinned(),
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
async fn nothing_is_granted_before_the_runtime_synchronized() {
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 0, None).unwrap();
    let agent = Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    );
    let asks = view(
        "c-early",
        "app",
        &[("accel.nri.io/container.app", "count=1")],
        &[],
    );
    let err = agent.create_container(&asks).await.unwrap_err();
    assert!(err.contains("has not synchronized"), "{err}");
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
    // A container asking nothing is created as usual.
    agent
        .create_container(&view("c-plain", "plain", &[], &[]))
        .await
        .unwrap();
    let agent = synchronized(agent);
    agent.create_container(&asks).await.unwrap();
    assert_eq!(agent.engine().claims().len(), 1);
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
    let (grant, _) = agent.create_container(&c).await.unwrap();
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

    // Device nodes always: the spec written inside the create is never named in its reply (a
    // runtime's CDI cache may not have seen it yet).
    let (second, _) = agent
        .create_container(&view(
            "c-ann-2",
            "other",
            &[("accel.nri.io/container.other", "count=1")],
            &[],
        ))
        .await
        .unwrap();
    assert!(
        second
            .device_nodes
            .iter()
            .any(|n| n.path.starts_with("/dev/nvidia") && n.path != "/dev/nvidiactl"),
        "{second:?}"
    );
    assert_eq!(spec_uids(&d).len(), 2);

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
    let err = agent.create_container(&mixed).await.unwrap_err();
    assert!(err.contains("two vendors"), "{err}");
    let greedy = view(
        "c-greedy",
        "g",
        &[("accel.nri.io/container.g", "count=9")],
        &[],
    );
    let err = agent.create_container(&greedy).await.unwrap_err();
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
    assert!(agent.create_container(&bad).await.is_err());
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
}

/// An agent over a node with two whole GPUs (gpu0, gpu1, pool `gpus`) and two GPUs shared three
/// ways (gpu2, gpu3, pool `shared`).
fn mixed_agent(d: &Dirs) -> Agent {
    use policies::{DeviceSelector, FamilyConfig, PoolConfig, Registry};
    let ids = |v: &[&str]| DeviceSelector {
        ids: v.iter().map(|s| s.to_string()).collect(),
        ..DeviceSelector::default()
    };
    let pools = vec![
        PoolConfig {
            name: "gpus".into(),
            select: ids(&["gpu0", "gpu1"]),
            family: FamilyConfig::Exclusive,
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        },
        PoolConfig {
            name: "shared".into(),
            select: ids(&["gpu2", "gpu3"]),
            family: FamilyConfig::Shared {
                replicas: 3,
                memory_mib_per_share: 0,
                compute_percent_per_share: 0,
            },
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        },
    ];
    let node = policies::Node::new(inventory(4), &pools, &Registry::with_builtins()).unwrap();
    let journal =
        nri_accel::checkpoint::Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let (engine, _) = nri_accel::engine::Engine::start(node, journal, store(d), None).unwrap();
    synchronized(Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    ))
}

/// Units of `device` held, by claim.
fn holders(agent: &Agent, device: &str) -> Vec<String> {
    agent.engine().with_node(|n| n.holder_of(device))
}

#[tokio::test]
async fn two_and_three_containers_on_one_adopted_device_hold_it_until_the_last_goes() {
    for n in [2usize, 3] {
        let d = dirs();
        let agent = agent(&d, 0);
        let ids: Vec<String> = (1..=n).map(|i| format!("c-{i}")).collect();
        let views: Vec<ContainerView> = ids
            .iter()
            .map(|id| view(id, "app", &[], &[(195, 1)]))
            .collect();
        agent.synchronize(&views).await;
        let held = holders(&agent, "gpu1");
        assert_eq!(held.len(), 1, "{n} containers: one adopted claim, {held:?}");
        let engine = agent.engine().clone();
        for (i, id) in ids.iter().enumerate() {
            assert!(
                engine.prepare(claim_for("thief", "gpu1")).await.is_err(),
                "{n} containers, {i} removed: gpu1 must stay held"
            );
            agent.remove_container(id).await.unwrap();
            let still = holders(&agent, "gpu1");
            if i + 1 < n {
                assert_eq!(still, held, "{n} containers: released after {id} went");
                // The claim is handed to a container that still runs, durably.
                let owner = engine
                    .origin_of(&held[0])
                    .and_then(|o| o.container().map(str::to_string));
                assert!(
                    owner.as_ref().is_some_and(|o| ids[i + 1..].contains(o)),
                    "owner {owner:?} after {id} went"
                );
            } else {
                assert!(still.is_empty(), "{n} containers: released after the last");
            }
        }
        engine.prepare(claim_for("next", "gpu1")).await.unwrap();
        assert_eq!(spec_uids(&d), vec!["next".to_string()]);
    }
}

#[tokio::test]
async fn a_handed_over_claim_survives_a_restart_and_is_released_when_its_last_user_is_gone() {
    let d = dirs();
    {
        let agent = agent(&d, 0);
        let views: Vec<ContainerView> = ["c-1", "c-2", "c-3"]
            .iter()
            .map(|id| view(id, "app", &[], &[(195, 1)]))
            .collect();
        agent.synchronize(&views).await;
        agent.remove_container("c-1").await.unwrap();
        assert_eq!(holders(&agent, "gpu1").len(), 1);
    }
    // A restart: the record names its new owner, and the runtime still runs c-2 and c-3.
    let agent = agent(&d, 0);
    assert_eq!(holders(&agent, "gpu1").len(), 1);
    let remaining: Vec<ContainerView> = ["c-2", "c-3"]
        .iter()
        .map(|id| view(id, "app", &[], &[(195, 1)]))
        .collect();
    let synced = agent.synchronize(&remaining).await;
    agent.release_gone(&synced.gone).await;
    assert_eq!(
        holders(&agent, "gpu1").len(),
        1,
        "no second adoption, no release"
    );
    // The runtime comes back with c-3 only (c-2 went while nri-accel was away): still held.
    let synced = agent.synchronize(&remaining[1..]).await;
    agent.release_gone(&synced.gone).await;
    assert_eq!(holders(&agent, "gpu1").len(), 1);
    // And with none: released.
    let synced = agent.synchronize(&[]).await;
    agent.release_gone(&synced.gone).await;
    assert!(holders(&agent, "gpu1").is_empty());
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
}

#[tokio::test]
async fn k_containers_on_a_shared_device_each_hold_a_share() {
    // Three shares per device; four containers leave one counted with the holders.
    for k in [1usize, 2, 3, 4] {
        let d = dirs();
        let agent = mixed_agent(&d);
        let ids: Vec<String> = (1..=k).map(|i| format!("s-{i}")).collect();
        // /dev/nvidia2 (195:2) is gpu2, a shared device.
        let views: Vec<ContainerView> = ids
            .iter()
            .map(|id| view(id, "app", &[], &[(195, 2)]))
            .collect();
        agent.synchronize(&views).await;
        let held = holders(&agent, "gpu2").len();
        assert_eq!(held, k.min(3), "{k} containers on a 3-share device");
        // A later Synchronize adopts nothing more.
        agent.synchronize(&views).await;
        assert_eq!(holders(&agent, "gpu2").len(), k.min(3));
        // Each container that goes gives back at most its own share, and the device keeps one
        // share per container still running (up to what it has).
        for (i, id) in ids.iter().enumerate() {
            agent.remove_container(id).await.unwrap();
            let running = k - i - 1;
            assert_eq!(
                holders(&agent, "gpu2").len(),
                running.min(3),
                "{k} containers, {id} removed"
            );
        }
        assert!(agent.engine().claims().is_empty(), "{k}");
    }
}

#[tokio::test]
async fn the_claims_of_containers_gone_while_away_are_released_after_the_answer() {
    let d = dirs();
    let agent = agent(&d, 2);
    agent
        .engine()
        .container_started("bystander", &[], &policies::Placement::unpinned());
    let ann = view(
        "c-ann",
        "app",
        &[("accel.nri.io/container.app", "count=1,family=exclusive")],
        &[],
    );
    agent.create_container(&ann).await.unwrap();
    assert_eq!(agent.engine().claims().len(), 1);
    // The runtime comes back without c-ann: the answer is computed first, the release follows.
    let synced = agent.synchronize(&[view("bystander", "b", &[], &[])]).await;
    assert_eq!(synced.gone, vec!["c-ann".to_string()]);
    assert_eq!(
        agent.engine().claims().len(),
        1,
        "not released before the answer"
    );
    agent.release_gone(&synced.gone).await;
    assert!(agent.engine().claims().is_empty());
    assert!(spec_uids(&d).is_empty());
    // The bystander gets its CPUs back through a pending update.
    assert_eq!(agent.engine().pending_updates(), 1);
}

/// Two containers created with the CDI devices of a claim whose record was lost (the way out of
/// a refused start) run on gpu1, which nothing holds: it is adopted for the first, and the second
/// counts among the adopted claim's users, so the claim is handed over to it, not released, when
/// the first goes (issue 25; the model found the release).
#[tokio::test]
async fn containers_naming_a_lost_claim_hold_its_adopted_device_until_the_last_goes() {
    let d = dirs();
    let agent = agent(&d, 0);
    let views: Vec<ContainerView> = ["c-1", "c-2"]
        .iter()
        .map(|id| ContainerView {
            cdi_devices: vec!["accel.nri.io/device=claim-lost-0".into()],
            ..view(id, "app", &[], &[(195, 1)])
        })
        .collect();
    agent.synchronize(&views).await;
    let held = holders(&agent, "gpu1");
    assert_eq!(held.len(), 1, "adopted once: {held:?}");
    let engine = agent.engine().clone();
    agent.remove_container("c-1").await.unwrap();
    assert_eq!(holders(&agent, "gpu1"), held, "c-2 still uses gpu1");
    let owner = engine
        .origin_of(&held[0])
        .and_then(|o| o.container().map(str::to_string));
    assert_eq!(owner.as_deref(), Some("c-2"));
    let err = engine
        .prepare(claim_for("thief", "gpu1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gpu1"), "{err}");
    agent.remove_container("c-2").await.unwrap();
    assert!(holders(&agent, "gpu1").is_empty());
    engine.prepare(claim_for("next", "gpu1")).await.unwrap();
}

/// An Unprepare that found no user races the Synchronize that brings a container started from
/// the claim's spec while nri-accel was away: the Synchronize waits for the claim's lock, so the
/// device the release frees is adopted for the container, never left free under it for the next
/// claim (issue 25; the model found the release between the adoption and the mapping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronize_during_an_unprepare_adopts_what_the_release_frees() {
    use std::sync::Mutex;
    use std::time::Duration;
    let d = dirs();
    let agent = Arc::new(agent(&d, 0));
    let engine = agent.engine().clone();
    engine.prepare(claim_for("c1", "gpu1")).await.unwrap();
    let started = ContainerView {
        cdi_devices: vec!["accel.nri.io/device=claim-c1-0".into()],
        ..view("ctr", "app", &[], &[(195, 1)])
    };
    let sync = Arc::new(Mutex::new(None));
    let (a, s) = (agent.clone(), sync.clone());
    engine
        .unprepare_unused(
            "c1",
            nri_accel::engine::ClaimName::default(),
            || true,
            move || {
                // No user known: now the runtime comes back and synchronizes.
                let (done, finished) = std::sync::mpsc::channel();
                let task = tokio::runtime::Handle::current().spawn(async move {
                    a.synchronize(&[started]).await;
                    let _ = done.send(());
                });
                *s.lock().unwrap() = Some(task);
                // Unless it waits for the claim's lock, the Synchronize ends before the release.
                let _ = finished.recv_timeout(Duration::from_millis(500));
                Vec::new()
            },
        )
        .await
        .unwrap();
    let task = sync.lock().unwrap().take().unwrap();
    task.await.unwrap();
    let held = holders(&agent, "gpu1");
    assert_eq!(
        held.len(),
        1,
        "gpu1 held for the running container: {held:?}"
    );
    assert!(held[0].starts_with("adopted-"), "{held:?}");
    let err = engine
        .prepare(claim_for("thief", "gpu1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("gpu1"), "{err}");
}

fn claims_api_spec(uid: &str, device: &str) -> nri_accel::claims_api::ClaimSpec {
    use nri_accel::claims_api::{ClaimAsk, ClaimSpec, DraResult};
    ClaimSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "accel.nri.io".into(),
            pool: "gpus".into(),
            device: format!("gpus-{device}"),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

/// A Prepare or Unprepare the claims API admitted while the gate was open that reaches its claim
/// after the gate closed (the NRI connection was lost) changes nothing: nri-accel no longer knows
/// the running containers, one of which may use a device nothing holds until the next
/// Synchronize adopts it (issue 25; the model found a Prepare admitted before a disconnect taking
/// a device an Unprepare had freed under a container started meanwhile).
#[tokio::test]
async fn claims_api_requests_reaching_their_claim_after_the_gate_closed_change_nothing() {
    use nri_accel::claims_api::{ClaimRef, ClaimService};
    use nri_accel::daemon::ClaimsFacade;
    use nri_accel::gate::Gate;
    use nri_accel::metrics::Metrics;
    let d = dirs();
    let agent = Arc::new(agent(&d, 0));
    let gate = Gate::new();
    gate.open();
    let facade = ClaimsFacade::new(agent.clone(), Arc::new(Metrics::new())).with_gate(gate.clone());
    let held = facade.prepare(vec![claims_api_spec("kept", "gpu0")]).await;
    assert!(held["kept"].is_ok(), "{held:?}");
    // The API admitted these before the gate closed; they reach the engine after.
    gate.close();
    let prepared = facade.prepare(vec![claims_api_spec("late", "gpu1")]).await;
    let err = prepared["late"].as_ref().unwrap_err();
    assert!(
        err.contains("connection to the container runtime was lost"),
        "{err}"
    );
    let unprepared = facade
        .unprepare(vec![ClaimRef {
            uid: "kept".into(),
            namespace: "ns".into(),
            name: "kept".into(),
        }])
        .await;
    let err = unprepared["kept"].as_ref().unwrap_err();
    assert!(err.contains("nothing was changed: retry"), "{err}");
    let claims: Vec<String> = agent
        .engine()
        .claims()
        .into_iter()
        .map(|(a, _)| a.claim_uid)
        .collect();
    assert_eq!(claims, vec!["kept"]);
    assert_eq!(spec_uids(&d), vec!["kept"]);
    // Once the runtime synchronized the retries go through.
    gate.open();
    assert!(facade.prepare(vec![claims_api_spec("late", "gpu1")]).await["late"].is_ok());
}
