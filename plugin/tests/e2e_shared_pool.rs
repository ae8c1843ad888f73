//! End to end, updates only where a container's cpuset changes: with a pool giving
//! accelerator-local CPUs and no CPU held, a Synchronize of containers already in the shared pool
//! (unpinned, or pinned to every CPU) answers no update and a container created there gets no
//! cpuset; each claim that takes one CPU then pushes an update to exactly the containers whose
//! cpuset, as the runtime reports it, held that CPU; and once the runtime has applied them, a
//! Synchronize answers no update again.

mod e2e_common;

use std::collections::BTreeSet;

use e2e_common::*;
use nri_accel::claims_api::Family;
use nri_proto::api::{Container, LinuxCPU, LinuxContainer, LinuxResources};
use nri_proto::protobuf::MessageField;
use policies::CpuSet;

/// Every CPU of the simulated node (`discovery.cpus`).
const ALL: &str = "0-15";

/// `c` as the runtime reports it once its cpuset (and memory nodes, if given) are set.
fn with_cpus(c: Container, cpus: &str) -> Container {
    placed(c, cpus, "")
}

fn placed(mut c: Container, cpus: &str, mems: &str) -> Container {
    let mut cpu = LinuxCPU::new();
    cpu.cpus = cpus.into();
    cpu.mems = mems.into();
    let mut r = LinuxResources::new();
    r.cpu = MessageField::some(cpu);
    let mut l = LinuxContainer::new();
    l.resources = MessageField::some(r);
    c.linux = MessageField::some(l);
    c
}

/// The cpuset the runtime reports for each container; an unpinned one runs on every CPU.
fn cpusets(fake: &fake_runtime::FakeRuntime) -> Vec<(String, CpuSet)> {
    fake.containers()
        .iter()
        .map(|c| {
            let reported = c.linux.resources.cpu.cpus.clone();
            let list = if reported.is_empty() { ALL } else { &reported };
            (c.id.clone(), list.parse().expect("a cpuset"))
        })
        .collect()
}

/// The cpuset a CreateContainer adjustment sets, if any.
fn adjusted_cpus(resp: &nri_proto::api::CreateContainerResponse) -> Option<String> {
    let cpus = resp.adjust.linux.resources.cpu.cpus.clone();
    (!cpus.is_empty()).then_some(cpus)
}

/// The memory nodes a CreateContainer adjustment sets ("" when none).
fn adjusted_mems(resp: &nri_proto::api::CreateContainerResponse) -> String {
    resp.adjust.linux.resources.cpu.mems.clone()
}

/// Prepares `uid` (one whole GPU, one local CPU), waits until its pushes reached the runtime,
/// applies them there, and answers (the CPU taken, the containers updated).
async fn take_one_cpu(
    node: &TestNode,
    fake: &fake_runtime::FakeRuntime,
    uid: &str,
) -> (u32, BTreeSet<String>, Vec<String>) {
    let client = node.client().await;
    let pushed_before = fake.updates().len();
    let cdi = prepare_ok(&client, count_claim(uid, Family::Exclusive, None)).await;
    let doc = wait_for("the claim's pushes", || async {
        let doc = node.status_json().await;
        (doc["pending_updates"] == 0).then_some(doc)
    })
    .await;
    let claim = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == uid)
        .unwrap_or_else(|| panic!("{uid} in {doc:#}"));
    let taken: CpuSet = claim["cpus"].as_str().unwrap().parse().unwrap();
    assert_eq!(taken.len(), 1, "one CPU per whole GPU: {doc:#}");
    let cpu = taken.iter().next().unwrap();
    let pushed: Vec<_> = fake.updates()[pushed_before..]
        .iter()
        .flat_map(|r| r.update.iter().cloned())
        .collect();
    let updated: Vec<String> = pushed.iter().map(|u| u.container_id.clone()).collect();
    let unique: BTreeSet<String> = updated.iter().cloned().collect();
    assert_eq!(unique.len(), updated.len(), "one update per container");
    fake.apply_updates(&pushed);
    (cpu, unique, cdi)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_containers_whose_cpuset_changes_are_updated() {
    let node = TestNode::new(
        Shape {
            cpus_per_device: 1,
            ..Shape::default()
        },
        "",
    );
    // Which containers a claim moves, as pushed by a runtime that takes pushes (NRI v0.12.1+).
    let config = fake_runtime::RuntimeConfig {
        nri_version: "v0.12.1".into(),
        ..fake_runtime::RuntimeConfig::default()
    };
    let fake = fake_runtime::FakeRuntime::start_with(&node.nri_socket, config)
        .await
        .expect("fake runtime");
    let p = pod("web", &[]);
    fake.add_pod(p.clone());
    fake.add_container(container("c-unpinned", &p, "a", &[]));
    fake.add_container(with_cpus(container("c-all", &p, "b", &[]), ALL));
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let doc = node.status_json().await;
    assert_eq!(doc["policy"]["shared_cpus"], ALL, "{doc:#}");
    assert!(
        fake.sync_updates().is_empty(),
        "containers already in the shared pool: {:?}",
        fake.sync_updates()
    );

    // Created in the shared pool: the adjustment leaves the cpuset alone.
    let late = container("c-late", &p, "c", &[]);
    let resp = fake.create_container(&p, &late).await.unwrap();
    assert_eq!(adjusted_cpus(&resp), None);
    fake.add_container(late);
    // A shared claim on gpu2 (local CPUs 0-7) places its container there: set, as it changes.
    let near_cdi = prepare_ok(&client, count_claim("near", Family::Shared, None)).await;
    let near = container("c-near", &p, "d", &near_cdi);
    let resp = fake.create_container(&p, &near).await.unwrap();
    let near_cpus = adjusted_cpus(&resp).expect("moved next to its device");
    assert_eq!(near_cpus, "0-7");
    fake.add_container(placed(near, &near_cpus, &adjusted_mems(&resp)));
    assert!(fake.updates().is_empty(), "no CPU moved yet");

    // Two claims take one CPU each (one on each NUMA node's GPU): each updates exactly the
    // containers whose cpuset held its CPU.
    let mut owner: Option<String> = None;
    let mut near_updated = 0;
    for uid in ["first", "second"] {
        let before = cpusets(&fake);
        let (cpu, updated, cdi) = take_one_cpu(&node, &fake, uid).await;
        let had: BTreeSet<String> = before
            .iter()
            .filter(|(_, set)| set.contains(cpu))
            .map(|(id, _)| id.clone())
            .collect();
        assert_eq!(
            updated, had,
            "{uid} took CPU {cpu}; cpusets before: {before:?}"
        );
        assert!(updated.contains("c-unpinned") && updated.contains("c-all"));
        near_updated += usize::from(updated.contains("c-near"));
        for (id, set) in cpusets(&fake) {
            assert!(!set.contains(cpu), "{id} still has CPU {cpu}");
        }
        if owner.is_none() {
            // The claim's own container runs on its CPU: a later claim leaves it alone.
            let c = container("c-owner", &p, "e", &cdi);
            let resp = fake.create_container(&p, &c).await.unwrap();
            let cpus = adjusted_cpus(&resp).expect("pinned to the claim's CPU");
            assert_eq!(cpus, cpu.to_string());
            fake.add_container(placed(c, &cpus, &adjusted_mems(&resp)));
            owner = Some(cpus);
        }
    }
    assert_eq!(
        near_updated, 1,
        "only the claim on c-near's NUMA node moves it"
    );

    // Everything is where it belongs: a Synchronize answers nothing.
    let answered = fake.sync_updates().len();
    fake.resynchronize().await.unwrap();
    let answer = fake.sync_updates().split_off(answered);
    assert!(
        answer.is_empty(),
        "nothing changes after the runtime applied the updates: {answer:?}"
    );
}
