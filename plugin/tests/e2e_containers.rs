//! End to end, containers the daemon finds or loses while it is down: a running container holding
//! one of our devices without a record is adopted (and the device refused to others, naming both
//! claims, until the container goes); annotation claims of containers removed while the daemon
//! was down are released at the next Synchronize, those of live containers kept; cpusets of
//! containers without claims give up a claim's CPUs through UpdateContainers, failed pushes stay
//! pending, and a restart in between still brings the container to the right cpuset.

mod e2e_common;

use e2e_common::*;
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, DraResult, Family};
use nri_proto::api::{
    Container, Event, LinuxCPU, LinuxContainer, LinuxDevice, LinuxResources, PodSandbox,
};
use nri_proto::protobuf::MessageField;

fn with_device(mut c: Container, major: i64, minor: i64) -> Container {
    let mut d = LinuxDevice::new();
    d.path = format!("/dev/nvidia{minor}");
    d.type_ = "c".into();
    d.major = major;
    d.minor = minor;
    let mut l = LinuxContainer::new();
    l.devices.push(d);
    c.linux = MessageField::some(l);
    c
}

fn with_cpus(mut c: Container, cpus: &str) -> Container {
    let mut cpu = LinuxCPU::new();
    cpu.cpus = cpus.into();
    let mut r = LinuxResources::new();
    r.cpu = MessageField::some(cpu);
    let mut l = LinuxContainer::new();
    l.resources = MessageField::some(r);
    c.linux = MessageField::some(l);
    c
}

fn named(uid: &str, pool: &str, device: &str) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: uid.into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "accel.nri.io".into(),
            pool: pool.into(),
            device: device.into(),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_held_without_a_record_is_adopted_until_its_container_goes() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let legacy_pod = pod("legacy", &[]);
    fake.add_pod(legacy_pod.clone());
    let legacy = with_device(container("c-legacy", &legacy_pod, "old", &[]), 195, 0);
    fake.add_container(legacy.clone());

    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    let doc = node.status_json().await;
    let adopted: Vec<&serde_json::Value> = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["origin"]["kind"] == "adopted")
        .collect();
    assert_eq!(adopted.len(), 1, "{doc:#}");
    let adopted_uid = adopted[0]["uid"].as_str().unwrap().to_string();
    assert_eq!(adopted[0]["results"][0]["device_id"], "gpu0");
    assert_eq!(adopted[0]["origin"]["container_id"], "c-legacy");
    let published = adopted[0]["results"][0]["device"]
        .as_str()
        .unwrap()
        .to_string();
    // The adoption is proved like any grant: record and spec.
    assert_eq!(node.spec_uids(), [adopted_uid.clone()].into());
    let listed = client.list().await.unwrap();
    assert_eq!(
        listed[0].state,
        nri_accel::claims_api::ClaimState::Adopted,
        "{listed:?}"
    );

    // A DRA claim naming that device is refused, naming both claims; a count claim gets gpu1.
    let answer = client
        .prepare(vec![named("early", "whole", &published)])
        .await
        .unwrap();
    let why = answer["early"].as_ref().expect_err("held by the container");
    assert!(why.contains("early") && why.contains(&adopted_uid), "{why}");
    prepare_ok(&client, count_claim("other", Family::Exclusive, None)).await;
    let doc = node.status_json().await;
    let other = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == "other")
        .unwrap();
    assert_eq!(other["results"][0]["device_id"], "gpu1");
    assert_no_unit_granted_twice(&doc);

    // The container goes: the adopted claim is released and the retry succeeds.
    fake.notify(Event::REMOVE_CONTAINER, &legacy_pod, Some(&legacy))
        .await
        .expect("remove");
    fake.forget_container("c-legacy");
    let doc = node.status_json().await;
    assert!(!status_claims(&doc).contains(&adopted_uid), "{doc:#}");
    prepare_ok(&client, named("early", "whole", &published)).await;
    assert_eq!(
        node.spec_uids(),
        ["early".to_string(), "other".to_string()].into()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_claims_follow_their_containers_across_a_restart() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;

    let key = "accel.nri.io/container.app";
    let pods: Vec<PodSandbox> = ["stays", "goes"]
        .iter()
        .map(|n| pod(n, &[(key, "count=1,family=exclusive")]))
        .collect();
    for (i, p) in pods.iter().enumerate() {
        fake.add_pod(p.clone());
        let c = container(&format!("c-app-{i}"), p, "app", &[]);
        fake.create_container(p, &c).await.expect("create");
        fake.add_container(c);
    }
    assert_eq!(node.spec_uids().len(), 2);

    // The daemon dies; one container is removed while it is down.
    daemon.kill9().await;
    fake.forget_pod(&pods[1].id);
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let doc = node.status_json().await;
    assert_eq!(
        status_claims(&doc),
        ["ctr-capp0".to_string()].into(),
        "{doc:#}"
    );
    assert_eq!(node.spec_uids(), ["ctr-capp0".to_string()].into());
    assert_eq!(
        doc["containers"]["c-app-0"],
        serde_json::json!(["ctr-capp0"])
    );
    assert_no_unit_granted_twice(&doc);
    // The released GPU is free again: two whole GPUs, one held.
    prepare_ok(&client, count_claim("dra", Family::Exclusive, None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpusets_give_way_to_claims_even_when_pushes_fail_and_the_daemon_restarts() {
    let node = TestNode::new(Shape::default(), "");
    // A runtime that takes pushes (NRI v0.12.1+); before that nothing is pushed at all.
    let config = fake_runtime::RuntimeConfig {
        nri_version: "v0.12.1".into(),
        ..fake_runtime::RuntimeConfig::default()
    };
    let fake = fake_runtime::FakeRuntime::start_with(&node.nri_socket, config)
        .await
        .expect("fake runtime");
    let idle_pod = pod("idle", &[]);
    fake.add_pod(idle_pod.clone());
    let idle = with_cpus(container("c-idle", &idle_pod, "idle", &[]), "0-15");
    fake.add_container(idle);
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    // The runtime refuses every update for now.
    fake.fail_next_updates(usize::MAX);
    prepare_ok(&client, count_claim("hungry", Family::Exclusive, None)).await;
    let doc = node.status_json().await;
    let taken = doc["claims"][0]["cpus"].as_str().unwrap().to_string();
    let shared = doc["policy"]["shared_cpus"].as_str().unwrap().to_string();
    assert!(!taken.is_empty() && !shared.is_empty(), "{doc:#}");
    wait_for("a failed push of the idle container's cpuset", || {
        let ups = fake.updates();
        async move {
            ups.iter()
                .flat_map(|r| r.update.iter())
                .any(|u| u.container_id == "c-idle")
                .then_some(())
        }
    })
    .await;
    let pushed = fake
        .updates()
        .iter()
        .flat_map(|r| r.update.iter())
        .find(|u| u.container_id == "c-idle")
        .map(|u| u.linux.resources.cpu.cpus.clone())
        .unwrap();
    assert_eq!(
        pushed, shared,
        "the idle container gives the claim's CPUs up"
    );
    let doc = node.status_json().await;
    assert_eq!(doc["pending_updates"], 1, "a failed push stays pending");

    // kill -9 with the update pending; the runtime accepts updates again.
    daemon.kill9().await;
    fake.fail_next_updates(0);
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    // The runtime still reports 0-15 for the container: the new Synchronize answers the fix.
    let sync = fake.sync_updates();
    let fixed = sync
        .iter()
        .find(|u| u.container_id == "c-idle")
        .unwrap_or_else(|| panic!("no update for c-idle in {sync:?}"));
    assert_eq!(fixed.linux.resources.cpu.cpus, shared);
    let doc = node.status_json().await;
    assert_eq!(doc["pending_updates"], 0, "{doc:#}");
    assert_eq!(doc["policy"]["shared_cpus"], shared.as_str());
}
