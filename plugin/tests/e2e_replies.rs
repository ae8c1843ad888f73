//! End to end, what real containerd and CRI-O exposed (issue 25), each at the lowest layer that
//! shows it with the fake runtime:
//! - before NRI v0.12.1 nri-accel never pushes UpdateContainers (a push that meets an event in
//!   progress hangs those runtimes for good): CPU moves travel in CreateContainer and
//!   StopContainer replies; from v0.12.1 releases are pushed between events, and nothing a reply
//!   carried is pushed again;
//! - an unprepare never releases a claim a running container uses, and a container naming a
//!   released claim's CDI devices is refused;
//! - grants of containers that never came to exist (the runtime's create failed after nri-accel
//!   answered) are released when the pod retries the container or goes away; a stopped
//!   container's annotation claim is released at StopContainer;
//! - a refusal names each matching device and its holder;
//! - a container the runtime reports without a name is said to get nothing.

mod e2e_common;

use std::time::Duration;

use e2e_common::*;
use fake_runtime::{FakeError, FakeRuntime, RuntimeConfig};
use nri_accel::claims_api::Family;
use nri_proto::api::{Container, Event, PodSandbox};

const KEY: &str = "accel.nri.io/container.app";

/// One whole GPU with two local CPUs (0-1 of NUMA node 0), nothing else.
fn one_gpu() -> Shape {
    Shape {
        exclusive: 1,
        shared: 0,
        sliced: 0,
        cpus_per_device: 2,
    }
}

/// `n` whole GPUs, no local CPUs, nothing else.
fn one_gpu_of(n: usize) -> Shape {
    Shape {
        exclusive: n,
        shared: 0,
        sliced: 0,
        cpus_per_device: 0,
    }
}

/// A runtime of `config` with a running bystander container (`c-by`, unpinned), and the daemon
/// started against it with the gate open.
async fn with_bystander(
    node: &TestNode,
    config: RuntimeConfig,
) -> (FakeRuntime, DaemonProc, PodSandbox, Container) {
    let fake = FakeRuntime::start_with(&node.nri_socket, config)
        .await
        .expect("fake runtime");
    let bp = pod("bystander", &[]);
    let by = container("c-by", &bp, "by", &[]);
    fake.add_pod(bp.clone());
    fake.add_container(by.clone());
    let daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    (fake, daemon, bp, by)
}

/// The cpuset the fake runtime holds for container `id`.
fn cpus_of(fake: &FakeRuntime, id: &str) -> String {
    fake.containers()
        .iter()
        .find(|c| c.id == id)
        .and_then(|c| c.linux.as_ref())
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|c| c.cpus.clone())
        .unwrap_or_default()
}

/// Creates `c` in `pod` as a runtime does whose create succeeds: CreateContainer, then the
/// container exists and PostCreateContainer reports it, which confirms its grant.
async fn create_confirmed(fake: &FakeRuntime, pod: &PodSandbox, c: &Container) {
    fake.create_container(pod, c).await.expect("create");
    fake.add_container(c.clone());
    fake.notify(Event::POST_CREATE_CONTAINER, pod, Some(c))
        .await
        .expect("post-create");
}

async fn pending_updates(node: &TestNode) -> u64 {
    node.status_json().await["pending_updates"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_nri_0_12_1_cpu_moves_travel_in_replies_and_nothing_is_pushed() {
    let node = TestNode::new(one_gpu(), "");
    let (fake, daemon, _, _) = with_bystander(&node, RuntimeConfig::default()).await;

    // A grant with local CPUs: the reply moves the bystander off them.
    let p = pod("train", &[(KEY, "count=1,family=exclusive")]);
    let c = container("c-train-0001", &p, "app", &[]);
    let cpu = create_with_cpuset(&fake, &p, &c).await;
    assert_eq!(cpu.cpus, "0-1");
    let carried = fake.reply_updates();
    assert!(
        carried.iter().any(|u| u.container_id == "c-by"),
        "{carried:?}"
    );
    // A reply's update never fails the event it rides on (the container may have exited).
    assert!(carried.iter().all(|u| u.ignore_failure), "{carried:?}");
    assert_eq!(
        expand_cpus(&cpus_of(&fake, "c-by")),
        (2..16).collect::<Vec<_>>()
    );

    // The removal gives the CPUs back: pending, not pushed, even well after the answer.
    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    fake.forget_container(&c.id);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pending_updates(&node).await, 1);
    assert!(fake.updates().is_empty(), "{:?}", fake.updates());

    // The next create's reply carries them, once.
    let q = pod("plain", &[]);
    let plain = container("c-plain-0001", &q, "plain", &[]);
    fake.add_pod(q.clone());
    fake.create_container(&q, &plain).await.expect("create");
    assert_eq!(
        expand_cpus(&cpus_of(&fake, "c-by")),
        (0..16).collect::<Vec<_>>()
    );
    assert_eq!(pending_updates(&node).await, 0);
    fake.add_container(plain.clone());
    // A stop's reply is a carrier too: nothing is left to carry now.
    fake.stop_container(&q, &plain).await.expect("stop");

    assert!(
        fake.updates().is_empty(),
        "never pushed: {:?}",
        fake.updates()
    );
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
    assert!(
        daemon.log_text().contains("updates=event-replies"),
        "{}",
        daemon.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_nri_0_12_1_releases_are_pushed_and_replies_are_not_pushed_again() {
    let node = TestNode::new(one_gpu(), "");
    let config = RuntimeConfig {
        nri_version: "v0.12.1".into(),
        ..RuntimeConfig::default()
    };
    let (fake, daemon, _, _) = with_bystander(&node, config).await;
    let p = pod("train", &[(KEY, "count=1,family=exclusive")]);
    let c = container("c-train-0001", &p, "app", &[]);
    create_with_cpuset(&fake, &p, &c).await;
    assert!(
        fake.reply_updates()
            .iter()
            .any(|u| u.container_id == "c-by")
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        fake.updates().is_empty(),
        "what the reply carried is not pushed: {:?}",
        fake.updates()
    );

    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    fake.forget_container(&c.id);
    let pushed = wait_for("the release's update to be pushed", || {
        let updates = fake.updates();
        async move { (!updates.is_empty()).then_some(updates) }
    })
    .await;
    assert_eq!(pushed[0].update[0].container_id, "c-by");
    assert!(daemon.log_text().contains("updates=push"));
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprepare_never_releases_a_claim_a_running_container_uses() {
    let node = TestNode::new(one_gpu(), "");
    let (fake, _daemon) = start_with(&node, RuntimeConfig::default()).await;
    let client = node.client_gate_open().await;
    let ids = prepare_ok(&client, count_claim("u1", Family::Exclusive, None)).await;
    // The runtime's own CDI injection gave the container the claim's devices.
    let p = pod("user", &[]);
    let c = container("c-user-0001", &p, "main", &ids);
    fake.add_pod(p.clone());
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());

    let answer = client.unprepare(vec![claim_ref("u1")]).await.expect("call");
    let err = answer["u1"].clone().expect_err("refused while in use");
    assert!(err.contains("in use by container"), "{err}");
    assert!(err.contains("c-user-0001 (e2e/user/main)"), "{err}");
    assert_eq!(node.spec_uids(), ["u1".to_string()].into());
    // The device stays held: another claim cannot take it.
    let other = client
        .prepare(vec![count_claim("u2", Family::Exclusive, None)])
        .await
        .expect("call");
    assert!(other["u2"].is_err(), "{other:?}");

    // Once the container stopped, the unprepare goes through.
    fake.stop_container(&p, &c).await.expect("stop");
    let answer = client.unprepare(vec![claim_ref("u1")]).await.expect("call");
    assert!(answer["u1"].is_ok(), "{answer:?}");
    assert!(node.spec_uids().is_empty());

    // A container created afterwards with the released claim's names is refused.
    let late = container("c-user-0002", &p, "main", &ids);
    match fake.create_container(&p, &late).await {
        Err(FakeError::Status { message, .. }) => {
            assert!(
                message.contains("claim u1, which is not prepared"),
                "{message}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_of_containers_that_never_came_to_exist_are_released() {
    let node = TestNode::new(one_gpu(), "");
    let (fake, daemon) = start_with(&node, RuntimeConfig::default()).await;
    let p = pod("flaky", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    // The runtime's create fails after nri-accel answered: no PostCreateContainer, no event.
    let first = container("c-flaky-0001", &p, "app", &[]);
    fake.create_container(&p, &first).await.expect("create");
    // The pod retries the same container: the first attempt's grant goes, the retry gets it.
    let retry = container("c-flaky-0002", &p, "app", &[]);
    fake.create_container(&p, &retry)
        .await
        .expect("the retry is granted");
    assert!(
        daemon.log_text().contains("whose creation failed"),
        "{}",
        daemon.log_text()
    );
    assert_eq!(
        status_claims(&node.status_json().await),
        ["ctr-cflaky0002".to_string()].into()
    );

    // The retry fails too and the pod goes away: its grant goes with it.
    fake.notify(Event::STOP_POD_SANDBOX, &p, None)
        .await
        .expect("stop pod");
    assert!(status_claims(&node.status_json().await).is_empty());
    assert!(node.spec_uids().is_empty());

    // A container that did come to exist keeps its grant when another of its pod's names is
    // created, and loses it when it stops.
    let q = pod("steady", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(q.clone());
    let ok = container("c-steady-0001", &q, "app", &[]);
    create_confirmed(&fake, &q, &ok).await;
    let sidecar = container("c-steady-0002", &q, "sidecar", &[]);
    fake.create_container(&q, &sidecar).await.expect("create");
    assert_eq!(
        status_claims(&node.status_json().await),
        ["ctr-csteady0001".to_string()].into()
    );
    fake.stop_container(&q, &ok).await.expect("stop");
    assert!(status_claims(&node.status_json().await).is_empty());
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
}

/// Issue 39 item 4: with no retry and the pod still there, a grant whose container the runtime
/// never reported created is released once `nri.unconfirmed_grant_secs` (1 s here) has passed,
/// and another pod then gets the device; a container the runtime did report keeps its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_runtime_never_confirmed_is_released_after_the_bound() {
    let node = TestNode::new(one_gpu_of(2), "");
    let text = std::fs::read_to_string(&node.config).unwrap();
    std::fs::write(
        &node.config,
        text.replacen("nri:\n", "nri:\n  unconfirmed_grant_secs: 1\n", 1),
    )
    .unwrap();
    let (fake, daemon) = start_with(&node, RuntimeConfig::default()).await;
    // First a container the runtime creates (PostCreateContainer), then one whose create fails
    // after nri-accel answered (no event, the pod stays).
    let q = pod("steady", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(q.clone());
    let ok = container("c-steady-0001", &q, "app", &[]);
    create_confirmed(&fake, &q, &ok).await;
    let p = pod("broken", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    let failed = container("c-broken-0001", &p, "app", &[]);
    fake.create_container(&p, &failed).await.expect("create");
    // (No assertion that the grant is held meanwhile: a loaded machine may take the whole
    // second before the next call.)
    // The failed create's grant goes by itself (spec and all); the steady container, created
    // before it and so past the bound at the same sweep, keeps its own.
    wait_for("the unconfirmed grant to be released", || async {
        let claims = status_claims(&node.status_json().await);
        (!claims.contains("ctr-cbroken0001")).then_some(())
    })
    .await;
    assert_eq!(
        status_claims(&node.status_json().await),
        ["ctr-csteady0001".to_string()].into()
    );
    assert_eq!(node.spec_uids().len(), 1);
    assert!(
        daemon.log_text().contains("never reported created"),
        "{}",
        daemon.log_text()
    );
    // The next pod gets the device.
    let r = pod("next", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(r.clone());
    let next = container("c-next-0001", &r, "app", &[]);
    create_confirmed(&fake, &r, &next).await;
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_device_and_who_holds_it() {
    let node = TestNode::new(one_gpu(), "");
    let (fake, daemon) = start_with(&node, RuntimeConfig::default()).await;
    let p = pod("first", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    fake.create_container(&p, &container("c-first-0001", &p, "app", &[]))
        .await
        .expect("create");
    let q = pod("second", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(q.clone());
    let message = match fake
        .create_container(&q, &container("c-second-0001", &q, "app", &[]))
        .await
    {
        Err(FakeError::Status { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        message.contains("gpu0 is held by claim ctr-cfirst0001 (e2e/first/app)"),
        "{message}"
    );
    assert!(message.contains("no matching device is free"), "{message}");

    // A container the runtime reports without a name gets nothing, and the log says why.
    let r = pod("unlabelled", &[(KEY, "count=1")]);
    fake.add_pod(r.clone());
    fake.create_container(&r, &container("c-nameless-0001", &r, "", &[]))
        .await
        .expect("created without a device");
    let log = daemon.log_text();
    assert!(log.contains("io.kubernetes.container.name"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_created_while_nri_accel_was_down_is_reported_at_synchronize() {
    let node = TestNode::new(one_gpu(), "");
    let fake = FakeRuntime::start_with(&node.nri_socket, RuntimeConfig::default())
        .await
        .expect("fake runtime");
    // Created while no plugin listened: it runs without the device its pod asks for.
    let p = pod("early", &[(KEY, "count=1,family=exclusive")]);
    let c = container("c-early-0001", &p, "app", &[]);
    fake.add_pod(p.clone());
    fake.add_container(c.clone());
    let daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    let doc = node.status_json().await;
    assert_eq!(
        doc["unmet_asks"]["c-early-0001"], "e2e/early/app: accel.nri.io/container.app",
        "{doc:#}"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("does not have: it was created while nri-accel was not connected"),
        "{log}"
    );
    // Its stop clears it.
    fake.stop_container(&p, &c).await.expect("stop");
    let doc = node.status_json().await;
    assert_eq!(doc["unmet_asks"], serde_json::json!({}), "{doc:#}");
}
