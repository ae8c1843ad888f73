//! End to end, restarts with containers running: the daemon stopped (SIGTERM) or killed (-9)
//! and started again keeps the gate closed until the runtime's new Synchronize, rebuilds its
//! claims from the checkpoint and the specs, answers the same CDI ids on a re-prepare and maps
//! the running containers back to their claims; a runtime restart is followed by a reconnect
//! and a new Synchronize.

mod e2e_common;

use std::collections::BTreeSet;

use e2e_common::*;
use nri_accel::claims_api::Family;
use tokio::net::UnixListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_and_runtime_restarts_lose_nothing() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    let whole = prepare_ok(&client, count_claim("whole-a", Family::Exclusive, None)).await;
    let share = prepare_ok(&client, count_claim("share-b", Family::Shared, None)).await;
    let slice = prepare_ok(&client, count_claim("slice-c", Family::Sliced, Some("1g"))).await;
    let p = pod("train", &[]);
    fake.add_pod(p.clone());
    let ca = container("c-a", &p, "a", &whole);
    let cb = container("c-b", &p, "b", &share);
    for c in [&ca, &cb] {
        fake.create_container(&p, c).await.expect("create");
        fake.add_container(c.clone());
    }
    let before = node.status_json().await;
    let claims: BTreeSet<String> = ["whole-a", "share-b", "slice-c"].map(String::from).into();
    assert_eq!(status_claims(&before), claims);
    let whole_cpus = before["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == "whole-a")
        .unwrap()["cpus"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!whole_cpus.is_empty());

    // 1. SIGTERM: a clean exit; the runtime is held back so the new daemon cannot synchronize.
    let st = daemon.terminate().await;
    assert!(st.success(), "exit {st:?}; log:\n{}", daemon.log_text());
    assert!(
        !node.claims_socket.exists(),
        "the socket is unlinked on exit"
    );
    fake.stop().await;
    let silent = UnixListener::bind(&node.nri_socket).expect("silent runtime");
    let _daemon2 = node.spawn(&[]);
    // The daemon connects and waits for a registration answer that does not come.
    let (held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("the daemon dials the runtime")
        .expect("accept");
    let client = node.client().await;
    let err = client
        .prepare(vec![count_claim("early", Family::Exclusive, None)])
        .await
        .expect_err("the gate is closed before Synchronize");
    assert!(err.is_unavailable(), "{err}");
    let err = client
        .unprepare(vec![claim_ref("whole-a")])
        .await
        .expect_err("closed");
    assert!(err.is_unavailable(), "{err}");
    // The state is rebuilt already: List and Status answer while the gate is closed.
    assert_eq!(list_uids(&client).await, claims);
    let status = client.status().await.expect("status");
    assert!(!status.gate_open);
    assert_eq!(node.spec_uids(), claims);

    // The runtime comes back: the daemon reconnects, synchronizes, the gate opens.
    drop(held);
    drop(silent);
    fake.listen(&node.nri_socket).expect("listen again");
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("resynchronized");
    let client = node.client_gate_open().await;
    assert_eq!(
        prepare_ok(&client, count_claim("whole-a", Family::Exclusive, None)).await,
        whole
    );
    assert_eq!(
        prepare_ok(&client, count_claim("share-b", Family::Shared, None)).await,
        share
    );
    assert_eq!(
        prepare_ok(&client, count_claim("slice-c", Family::Sliced, Some("1g"))).await,
        slice
    );
    let after = node.status_json().await;
    assert_eq!(status_claims(&after), claims);
    assert_eq!(
        after["policy"], before["policy"],
        "the policy state is rebuilt"
    );
    assert_eq!(
        after["containers"]["c-a"],
        serde_json::json!(["whole-a"]),
        "{after:#}"
    );
    assert_eq!(after["containers"]["c-b"], serde_json::json!(["share-b"]));
    // Synchronize brought the running container's cpuset back to its claim's CPUs.
    let sync = fake.sync_updates();
    let up = sync
        .iter()
        .find(|u| u.container_id == "c-a")
        .unwrap_or_else(|| panic!("no sync update for c-a: {sync:?}"));
    let cpus = &up.linux.resources.cpu.cpus;
    assert_eq!(*cpus, whole_cpus);
    assert_no_unit_granted_twice(&after);
    drop(_daemon2);

    // 2. kill -9 with the runtime up: the new daemon synchronizes at once.
    let mut daemon3 = node.spawn(&[]);
    fake.wait_synchronized(3, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    daemon3.kill9().await;
    let _daemon4 = node.spawn(&[]);
    fake.wait_synchronized(4, WAIT).await.expect("synchronized");
    let client2 = node.client_gate_open().await;
    drop(client);
    assert_eq!(list_uids(&client2).await, claims);
    assert_eq!(
        prepare_ok(&client2, count_claim("whole-a", Family::Exclusive, None)).await,
        whole
    );
    assert_eq!(node.spec_uids(), claims);

    // 3. The runtime restarts: the daemon reconnects and synchronizes again; the gate stays open.
    fake.restart().await.expect("runtime restart");
    fake.wait_synchronized(5, WAIT)
        .await
        .expect("resynchronized");
    let status = client2.status().await.expect("status");
    assert!(status.gate_open);
    let d = prepare_ok(&client2, count_claim("after-restart", Family::Shared, None)).await;
    assert_eq!(d.len(), 1);
    let last = node.status_json().await;
    assert_eq!(last["containers"]["c-a"], serde_json::json!(["whole-a"]));
    assert_eq!(status_claims(&last).len(), 4);
    assert_no_unit_granted_twice(&last);
    let gone = client2
        .unprepare(vec![claim_ref("after-restart")])
        .await
        .unwrap();
    assert_eq!(gone["after-restart"], Ok(()));
    assert_eq!(node.spec_uids(), claims);
}
