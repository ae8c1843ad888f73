//! End to end, crashes at named steps through the real binary: `NRI_ACCEL_TEST_CRASH_AT=<step>`
//! makes the daemon abort there; started again without it, the node is consistent (records and
//! specs agree, no temp file left, no unit held twice), the claim is prepared exactly when its
//! spec was in place, and the retried call succeeds. The NRI side's release paths (RemoveContainer
//! of an annotation container, the claims of a container found gone at Synchronize) die at every
//! release step too, with the runtime speaking as NRI before v0.12.1.

mod e2e_common;

use e2e_common::*;
use nri_accel::claims_api::{ClaimsClient, Family};
use nri_accel::engine::CRASH_ENV;

/// Which call dies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Prepare,
    Unprepare,
}

async fn consistent(node: &TestNode, client: &ClaimsClient) -> Vec<String> {
    let doc = node.status_json().await;
    let records = status_claims(&doc);
    let specs = node.spec_uids();
    assert_eq!(records, specs, "records and specs disagree");
    assert_eq!(
        node.cdi_entries().len(),
        specs.len(),
        "a temp file was left: {:?}",
        node.cdi_entries()
    );
    assert_no_unit_granted_twice(&doc);
    let listed = list_uids(client).await;
    assert_eq!(listed, records);
    listed.into_iter().collect()
}

/// Dies at `step` during `call` of claim `victim` (a neighbour claim is prepared first and must
/// survive untouched); after the restart the victim is prepared iff `survives`.
async fn crash_at(step: &str, call: Call, survives: bool) {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut dying = node.spawn(&[(CRASH_ENV, step)]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    // A neighbour prepared before the crash (in the prepare case it dies on its own prepare).
    if call == Call::Unprepare {
        prepare_ok(&client, count_claim("neighbour", Family::Shared, None)).await;
        prepare_ok(&client, count_claim("victim", Family::Exclusive, None)).await;
        let r = client.unprepare(vec![claim_ref("victim")]).await;
        assert!(
            r.is_err(),
            "{step}: the daemon answered {r:?} instead of dying"
        );
    } else {
        let r = client
            .prepare(vec![count_claim("victim", Family::Exclusive, None)])
            .await;
        assert!(
            r.is_err(),
            "{step}: the daemon answered {r:?} instead of dying"
        );
    }
    assert_died_at(&mut dying, step).await;

    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let held = consistent(&node, &client).await;
    assert_eq!(
        held.contains(&"victim".to_string()),
        survives,
        "{step}: claims after restart {held:?}"
    );
    if call == Call::Unprepare {
        assert!(held.contains(&"neighbour".to_string()), "{held:?}");
    }

    // The retried call completes.
    match call {
        Call::Prepare => {
            let ids = prepare_ok(&client, count_claim("victim", Family::Exclusive, None)).await;
            assert_eq!(ids, vec![format!("{CDI_KIND}=claim-victim-0")]);
            let held = consistent(&node, &client).await;
            assert!(held.contains(&"victim".to_string()));
        }
        Call::Unprepare => {
            let r = client.unprepare(vec![claim_ref("victim")]).await.unwrap();
            assert_eq!(r["victim"], Ok(()));
            let held = consistent(&node, &client).await;
            assert_eq!(held, vec!["neighbour".to_string()]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_allocate() {
    crash_at("after-allocate", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_checkpoint() {
    crash_at("after-checkpoint", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_update_push() {
    crash_at("after-update-push", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_spec_temp() {
    crash_at("after-spec-temp", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_spec_rename() {
    crash_at("after-spec-rename", Call::Prepare, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_dies_after_release() {
    crash_at("after-release", Call::Unprepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_dies_after_spec_remove() {
    crash_at("after-spec-remove", Call::Unprepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_crash_step_is_refused_at_startup() {
    let node = TestNode::new(Shape::default(), "");
    let _fake = runtime(&node).await;
    let mut d = node.spawn(&[(CRASH_ENV, "after-lunch")]);
    let st = d.wait_exit().await;
    assert!(!st.success());
    assert!(d.log_text().contains("after-allocate"), "{}", d.log_text());
}

/// The CPUs the runtime was told container `id` should run on, in Synchronize answers and in
/// UpdateContainers calls after the first `since` of each; the newest of each kind.
fn cpus_told(fake: &fake_runtime::FakeRuntime, id: &str, since: (usize, usize)) -> Vec<String> {
    let cpus = |u: &nri_proto::api::ContainerUpdate| {
        Some(
            u.linux
                .as_ref()?
                .resources
                .as_ref()?
                .cpu
                .as_ref()?
                .cpus
                .clone(),
        )
    };
    let from_sync = fake.sync_updates()[since.0..]
        .iter()
        .filter(|u| u.container_id == id)
        .filter_map(cpus)
        .next_back();
    let pushed = fake.updates()[since.1..]
        .iter()
        .flat_map(|r| r.update.iter())
        .filter(|u| u.container_id == id)
        .filter_map(cpus)
        .next_back();
    from_sync.into_iter().chain(pushed).collect()
}

/// The NRI side's release paths die at `step`: RemoveContainer of an annotation container whose
/// claim holds accelerator-local CPUs (`at_sync` false), or the release of that claim when the
/// next Synchronize finds its container gone (`at_sync` true). The runtime speaks as NRI before
/// v0.12.1. Started again, the node is consistent, the claim is released, and the other
/// container is told it has every shared CPU again.
async fn crash_in_release(step: &str, at_sync: bool) {
    use nri_proto::api::Event;
    let node = TestNode::new(Shape::default(), "");
    let cfg = fake_runtime::RuntimeConfig {
        nri_version: "v0.8.0".into(),
        updates_wait_for_events: true,
        ..Default::default()
    };
    let fake = fake_runtime::FakeRuntime::start_with(&node.nri_socket, cfg)
        .await
        .unwrap();
    // First, without a crash step (a prepare passes some of the same steps): a bystander and an
    // annotation container on the whole pool (two local CPUs with the GPU).
    let mut first = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    let pb = pod("bystander", &[]);
    let b = container("c-bystander", &pb, "app", &[]);
    let p = pod(
        "trainer",
        &[("accel.nri.io/container.app", "count=1,family=exclusive")],
    );
    let c = container("c-trainer", &p, "app", &[]);
    let mut told = Vec::new();
    for (pd, ct) in [(&pb, &b), (&p, &c)] {
        fake.add_pod(pd.clone());
        let created = fake.create_container(pd, ct).await.expect("create");
        told.extend(created.update.iter().cloned());
        fake.add_container(ct.clone());
    }
    assert_eq!(node.spec_uids().len(), 1);
    first.kill9().await;
    // The runtime wrote what it was told to the cgroups: it reports the bystander without the
    // trainer's CPUs from now on (an update only goes where a cpuset changes).
    told.extend(fake.updates().iter().flat_map(|r| r.update.iter().cloned()));
    assert!(
        told.iter().any(|u| u.container_id == "c-bystander"),
        "the bystander gave the trainer's CPUs up: {told:?}"
    );
    fake.apply_updates(&told);

    if at_sync {
        // The container goes while nri-accel is away.
        fake.forget_container(&c.id);
    }
    let mut dying = node.spawn(&[(CRASH_ENV, step)]);
    if !at_sync {
        fake.wait_synchronized(2, WAIT).await.expect("synchronized");
        node.client_gate_open().await;
        let r = fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c)).await;
        assert!(
            r.is_err(),
            "{step}: the daemon answered {r:?} instead of dying"
        );
        fake.forget_container(&c.id);
    }
    assert_died_at(&mut dying, step).await;

    let since = (fake.sync_updates().len(), fake.updates().len());
    let _daemon = node.spawn(&[]);
    let client = node.client_gate_open().await;
    let held = consistent(&node, &client).await;
    assert!(
        held.is_empty(),
        "{step} (at sync {at_sync}): released, got {held:?}"
    );
    // Told in the Synchronize answer, or pushed after it; nothing older is told after.
    wait_for(
        "the bystander to be told it has every CPU again",
        || async {
            let told = cpus_told(&fake, "c-bystander", since);
            (!told.is_empty() && told.iter().all(|c| c == "0-15")).then_some(())
        },
    )
    .await;
    assert!(node.spec_uids().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_container_dies_at_every_release_step() {
    for step in [
        "after-checkpoint",
        "after-release",
        "after-update-push",
        "after-spec-remove",
    ] {
        crash_in_release(step, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_of_a_container_gone_at_synchronize_dies_at_every_step() {
    for step in [
        "after-checkpoint",
        "after-release",
        "after-update-push",
        "after-spec-remove",
    ] {
        crash_in_release(step, true).await;
    }
}
