//! End to end, the NRI side under faults (issue 14), through the real binary and the fake
//! runtime speaking as NRI before v0.12.1 does: an UpdateContainers call waits until every event
//! request outstanding when it arrived has been answered (containerd#13733, nri#301).
//!
//! - A removal whose release frees CPUs is answered at once, the plugin stays connected, and the
//!   freed CPUs reach the other containers in the next CreateContainer's reply (a push would
//!   hang such a runtime).
//! - Containers found at Synchronize on devices without a record: two or three on one whole
//!   device hold it until the last goes; k on a shared device hold a share each.
//! - The gate closes when the runtime goes away: a prepare (or unprepare) between the loss and
//!   the next Synchronize is refused as UNAVAILABLE, and status, /healthz and the metrics say so.
//! - A device found at Synchronize is adopted before any claim (claims API or annotation) can
//!   take it.

mod e2e_common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use e2e_common::*;
use fake_runtime::{FakeRuntime, RuntimeConfig};
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, CountAsk, Family, Selector};
use nri_proto::api::{Container, Event, LinuxContainer, LinuxDevice, PodSandbox};
use nri_proto::protobuf::MessageField;
use serde_json::Value;

const KEY: &str = "accel.nri.io/container.app";

/// containerd 1.7.26+/2.0/2.1 (NRI v0.8.0): no CDI names in containers, StateChange only, and
/// UpdateContainers waits for the events in flight. The request timeout is the 5 s of the issue.
fn older_runtime() -> RuntimeConfig {
    RuntimeConfig {
        nri_version: "v0.8.0".into(),
        runtime_name: "containerd".into(),
        runtime_version: "2.0.5".into(),
        request_timeout: Duration::from_secs(5),
        updates_wait_for_events: true,
        ..RuntimeConfig::default()
    }
}

async fn start(node: &TestNode) -> (FakeRuntime, DaemonProc) {
    start_with(node, older_runtime()).await
}

/// A running container of `pod` with the device node of GPU `minor` (major 195), as a runtime
/// before NRI v0.10 reports it: no CDI names.
fn with_gpu_node(id: &str, pod: &PodSandbox, minor: i64) -> Container {
    let mut c = container(id, pod, "app", &[]);
    let mut d = LinuxDevice::new();
    d.path = format!("/dev/nvidia{minor}");
    d.type_ = "c".into();
    d.major = 195;
    d.minor = minor;
    let mut linux = LinuxContainer::new();
    linux.devices.push(d);
    c.linux = MessageField::some(linux);
    c
}

/// The device `id` of a status document.
fn device<'a>(doc: &'a Value, id: &str) -> &'a Value {
    doc["policy"]["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["devices"].as_array().into_iter().flatten())
        .find(|d| d["id"] == id)
        .unwrap_or_else(|| panic!("no device {id} in {doc:#}"))
}

fn units_used(doc: &Value, id: &str) -> u64 {
    device(doc, id)["units_used"].as_u64().expect("units_used")
}

/// The CPUs of the last UpdateContainers update the runtime got for `container`.
fn last_pushed_cpus(fake: &FakeRuntime, container: &str) -> Option<String> {
    fake.updates()
        .iter()
        .flat_map(|r| r.update.iter())
        .filter(|u| u.container_id == container)
        .filter_map(|u| {
            let cpu = u.linux.as_ref()?.resources.as_ref()?.cpu.as_ref()?;
            Some(cpu.cpus.clone())
        })
        .next_back()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_frees_cpus_is_answered_at_once_and_the_cpus_reach_the_others() {
    let node = TestNode::new(Shape::default(), "");
    let (fake, daemon) = start(&node).await;

    // A container without claims: its cpuset follows the shared CPUs.
    let pb = pod("bystander", &[]);
    fake.add_pod(pb.clone());
    let b = container("c-bystander", &pb, "app", &[]);
    fake.create_container(&pb, &b)
        .await
        .expect("create bystander");
    fake.add_container(b);

    for round in 0..3 {
        // A GPU of the whole pool comes with two accelerator-local CPUs, taken from the others.
        let p = pod(
            &format!("trainer-{round}"),
            &[(KEY, "count=1,family=exclusive")],
        );
        fake.add_pod(p.clone());
        let c = container(&format!("c-trainer-{round}"), &p, "app", &[]);
        let created = fake.create_container(&p, &c).await.expect("create");
        let shrunk = created
            .update
            .iter()
            .find(|u| u.container_id == "c-bystander")
            .expect("the bystander's cpuset shrinks, answered in CreateContainer's reply");
        let shrunk = shrunk.linux.resources.cpu.cpus.clone();
        assert_ne!(shrunk, "0-15");
        fake.add_container(c.clone());

        // The removal releases the claim and frees the CPUs; the engine must not wait for its
        // own UpdateContainers here, which this runtime holds until the removal is answered.
        let started = Instant::now();
        fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}; log:\n{}", daemon.log_text()));
        let took = started.elapsed();
        fake.forget_container(&c.id);
        eprintln!("round {round}: RemoveContainer answered in {took:?}");
        assert!(fake.plugin().is_some(), "the plugin stays connected");
        assert!(fake.errors().is_empty(), "{:?}", fake.errors());
        assert!(
            node.spec_uids().is_empty(),
            "released: {:?}",
            node.cdi_entries()
        );

        // This runtime hangs on any UpdateContainers that meets an event in progress: the freed
        // CPUs wait, pending, for the next reply that can carry them.
        assert_eq!(last_pushed_cpus(&fake, "c-bystander"), None);
        assert_eq!(node.status_json().await["pending_updates"], 1);
    }
    // The next container event's reply gives the bystander its CPUs back.
    let pq = pod("plain", &[]);
    fake.add_pod(pq.clone());
    let created = fake
        .create_container(&pq, &container("c-plain", &pq, "app", &[]))
        .await
        .expect("create");
    let grown = created
        .update
        .iter()
        .find(|u| u.container_id == "c-bystander")
        .expect("the freed CPUs travel in CreateContainer's reply");
    assert_eq!(grown.linux.resources.cpu.cpus, "0-15");
    assert!(
        fake.updates().is_empty(),
        "never pushed: {:?}",
        fake.updates()
    );
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert_eq!(doc["pending_updates"], 0, "{doc:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_on_devices_without_a_record_hold_them_until_the_last_goes() {
    let node = TestNode::new(Shape::default(), "");
    let fake = FakeRuntime::start_with(&node.nri_socket, older_runtime())
        .await
        .expect("fake runtime");
    // Before nri-accel starts (its checkpoint was lost): three containers of one pod run on
    // gpu0 (whole), three on gpu2 (shared four ways).
    let pw = pod("whole-users", &[]);
    let ps = pod("share-users", &[]);
    fake.add_pod(pw.clone());
    fake.add_pod(ps.clone());
    let whole: Vec<Container> = (1..=3)
        .map(|i| with_gpu_node(&format!("c-whole-{i}"), &pw, 0))
        .collect();
    let shared: Vec<Container> = (1..=3)
        .map(|i| with_gpu_node(&format!("c-share-{i}"), &ps, 2))
        .collect();
    whole
        .iter()
        .chain(&shared)
        .for_each(|c| fake.add_container(c.clone()));
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    let doc = node.status_json().await;
    assert_eq!(units_used(&doc, "gpu0"), 1, "{doc:#}");
    assert_eq!(
        units_used(&doc, "gpu2"),
        3,
        "a share per container: {doc:#}"
    );
    assert_no_unit_granted_twice(&doc);

    // The whole device stays held while any of the three runs.
    for (i, c) in whole.iter().enumerate() {
        let r = client
            .prepare(vec![count_claim("thief", Family::Exclusive, None)])
            .await
            .expect("prepare call");
        let granted: Vec<&str> = match r.get("thief") {
            Some(Ok(devices)) => devices.iter().map(|d| d.device.as_str()).collect(),
            _ => Vec::new(),
        };
        assert!(
            !granted.iter().any(|d| d.contains("gpu0")),
            "{i} removed: gpu0 granted to a claim while a container uses it"
        );
        if !granted.is_empty() {
            client.unprepare(vec![claim_ref("thief")]).await.unwrap();
        }
        fake.notify(Event::REMOVE_CONTAINER, &pw, Some(c))
            .await
            .expect("remove");
        fake.forget_container(&c.id);
        let used = units_used(&node.status_json().await, "gpu0");
        assert_eq!(
            used,
            u64::from(i + 1 < whole.len()),
            "after removing {}",
            c.id
        );
    }
    // Each shared user gives back its own share only.
    for (i, c) in shared.iter().enumerate() {
        fake.notify(Event::REMOVE_CONTAINER, &ps, Some(c))
            .await
            .expect("remove");
        let used = units_used(&node.status_json().await, "gpu2");
        assert_eq!(
            used,
            (shared.len() - i - 1) as u64,
            "after removing {}",
            c.id
        );
    }
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert!(node.spec_uids().is_empty());
    assert!(fake.errors().is_empty(), "{:?}", fake.errors());
}

/// What status, /healthz and the gate gauge say: (gate open in status, healthz code, gauge).
async fn gate_seen(node: &TestNode, addr: SocketAddr) -> (bool, u16, String) {
    let doc = node.status_json().await;
    let open = doc["gate"]["open"].as_bool().expect("gate.open");
    let (code, _) = http_get_async(addr, "/healthz").await.expect("healthz");
    let (_, metrics) = http_get_async(addr, "/metrics").await.expect("metrics");
    let gauge = metrics
        .lines()
        .find_map(|l| l.strip_prefix("nri_accel_gate_open "))
        .unwrap_or("absent")
        .to_string();
    (open, code, gauge)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_between_a_runtime_disconnect_and_the_next_synchronize_is_unavailable() {
    let (node, addr) = TestNode::with_metrics(Shape::default());
    let (fake, _daemon) = start(&node).await;
    let client = node.client().await;
    prepare_ok(&client, count_claim("before", Family::Shared, None)).await;
    assert_eq!(gate_seen(&node, addr).await, (true, 200, "1".into()));

    // The runtime restarts and holds the next Synchronize: the daemon reconnects and registers,
    // but does not know yet which containers run.
    fake.hold_synchronize(true);
    fake.restart().await.expect("restart");
    wait_for("the daemon to register again", || async {
        fake.plugin().is_some().then_some(())
    })
    .await;
    assert_eq!(gate_seen(&node, addr).await, (false, 503, "0".into()));
    let err = client
        .prepare(vec![count_claim("during", Family::Shared, None)])
        .await
        .expect_err("refused while the gate is closed");
    assert!(err.is_unavailable(), "{err}");
    let err = client
        .unprepare(vec![claim_ref("before")])
        .await
        .expect_err("unprepare is refused too");
    assert!(err.is_unavailable(), "{err}");
    // Reading is still served.
    assert_eq!(list_uids(&client).await, ["before".to_string()].into());

    fake.hold_synchronize(false);
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("synchronized again");
    node.client_gate_open().await;
    assert_eq!(gate_seen(&node, addr).await, (true, 200, "1".into()));
    prepare_ok(&client, count_claim("after", Family::Shared, None)).await;
    let held = status_claims(&node.status_json().await);
    assert!(
        held.contains("before") && held.contains("after"),
        "{held:?}"
    );
    assert!(!held.contains("during"));
}

fn exclusive_claim(uid: &str, count: u32) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: uid.into(),
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpu".into(),
            count,
            family: Family::Exclusive,
            selector: Selector::default(),
            profile: None,
            shares: None,
        }]),
        env: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_found_at_synchronize_is_adopted_before_any_claim_can_take_it() {
    let node = TestNode::new(Shape::default(), "");
    let (fake, daemon) = start(&node).await;
    let client = node.client().await;

    // While nri-accel is away, a container starts on gpu0 (with its device node, no record).
    fake.hold_synchronize(true);
    fake.restart().await.expect("restart");
    let p = pod("rogue", &[]);
    fake.add_pod(p.clone());
    fake.add_container(with_gpu_node("c-rogue", &p, 0));
    wait_for("the daemon to register again", || async {
        fake.plugin().is_some().then_some(())
    })
    .await;

    // A caller asks for both whole GPUs over and over from now on.
    let hammer = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut refused_whole = 0u32;
            loop {
                match client.prepare(vec![exclusive_claim("greedy", 2)]).await {
                    Err(e) if e.is_unavailable() => refused_whole += 1,
                    Err(e) => panic!("prepare call failed: {e}"),
                    Ok(answer) => return (refused_whole, answer),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    fake.hold_synchronize(false);
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("synchronized again");

    // Right after the Synchronize, an annotation container asking for both is refused too.
    let pa = pod("wants-two", &[(KEY, "count=2,family=exclusive")]);
    fake.add_pod(pa.clone());
    let err = fake
        .create_container(&pa, &container("c-two", &pa, "app", &[]))
        .await
        .expect_err("only one whole GPU is free");
    match &err {
        fake_runtime::FakeError::Status { message, .. } => {
            assert!(message.contains("pod e2e/wants-two"), "{message}")
        }
        other => panic!("expected a refusal, got {other}"),
    }

    let (refused_whole, answer) = hammer.await.unwrap();
    assert!(
        refused_whole > 0,
        "the caller was held off while the gate was closed"
    );
    assert!(
        answer.get("greedy").is_some_and(|r| r.is_err()),
        "gpu0 was granted although a running container uses it: {answer:?}"
    );
    let one = prepare_ok(&client, exclusive_claim("one", 1)).await;
    assert_eq!(one.len(), 1);
    let doc = node.status_json().await;
    let gpu0 = &device(&doc, "gpu0")["held"][0]["claim"];
    assert!(
        gpu0.as_str().is_some_and(|c| c.starts_with("adopted-")),
        "gpu0 is held by the adopted claim: {doc:#}"
    );
    assert_eq!(units_used(&doc, "gpu1"), 1);
    assert_no_unit_granted_twice(&doc);
    assert!(
        daemon
            .log_text()
            .contains("adopted a device held by a running container"),
        "the adoption is reported"
    );
}
