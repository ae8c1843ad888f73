//! End to end, two nri-accel processes on one node (issue 5): a second daemon started on the
//! same state dir waits for the node lock without serving anything (it neither binds the claims
//! socket nor dials the runtime); when the first is killed (-9) or stopped (SIGTERM) it takes
//! over with the first's claims, including those prepared while it waited.

mod e2e_common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;

use e2e_common::*;
use nri_accel::claims_api::Family;

const WAITING: &str = "another nri-accel holds the node lock";

/// Waits until `d` logs that it waits for the node lock, then checks it serves nothing.
async fn assert_waiting(node: &TestNode, d: &mut DaemonProc, socket_ino: u64) {
    wait_for("the second daemon to wait for the node lock", || {
        let text = d.log_text();
        async move { text.contains(WAITING).then_some(()) }
    })
    .await;
    assert!(d.try_exit().is_none(), "it waits, it does not exit");
    let log = d.log_text();
    assert!(!log.contains("claims API listening"), "{log}");
    assert!(!log.contains("configured by the runtime"), "{log}");
    let ino = std::fs::metadata(&node.claims_socket)
        .expect("socket")
        .ino();
    assert_eq!(ino, socket_ino, "the first daemon's socket was replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_waits_for_the_lock_then_takes_over() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut first = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let a = prepare_ok(&client, count_claim("before-a", Family::Exclusive, None)).await;

    let ino = std::fs::metadata(&node.claims_socket).unwrap().ino();
    let mut second = node.spawn(&[]);
    assert_waiting(&node, &mut second, ino).await;
    // The first daemon keeps serving while the second waits; the second has read nothing yet.
    let b = prepare_ok(&client, count_claim("while-b", Family::Shared, None)).await;
    assert_eq!(fake.plugin().map(|p| p.name), Some("accel".into()));

    // kill -9 the first: the second takes the lock, reads the state, binds and synchronizes.
    first.kill9().await;
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("second synchronized");
    let client = node.client_gate_open().await;
    let held: BTreeSet<String> = ["before-a", "while-b"].map(String::from).into();
    assert_eq!(list_uids(&client).await, held);
    assert_eq!(node.spec_uids(), held);
    assert_eq!(
        prepare_ok(&client, count_claim("before-a", Family::Exclusive, None)).await,
        a
    );
    assert_eq!(
        prepare_ok(&client, count_claim("while-b", Family::Shared, None)).await,
        b
    );
    assert!(second.log_text().contains("claims API listening"));

    // A third one waits for the second; SIGTERM hands over cleanly and the third's socket
    // is not removed by the second's exit.
    let ino = std::fs::metadata(&node.claims_socket).unwrap().ino();
    let mut third = node.spawn(&[]);
    assert_waiting(&node, &mut third, ino).await;
    let st = second.terminate().await;
    assert!(st.success(), "{st:?}");
    fake.wait_synchronized(3, WAIT)
        .await
        .expect("third synchronized");
    let client = node.client_gate_open().await;
    assert_eq!(list_uids(&client).await, held);
    let doc = node.status_json().await;
    assert_eq!(status_claims(&doc), held);
    assert_no_unit_granted_twice(&doc);
    assert!(third.try_exit().is_none());
    assert!(node.claims_socket.exists());
}

/// SIGTERM while waiting for the node lock stops the waiter at once: it never takes the lock,
/// binds the claims socket or registers with the runtime once the first daemon goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_stopped_while_waiting_for_the_lock_never_serves() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut first = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let ino = std::fs::metadata(&node.claims_socket).unwrap().ino();
    let mut waiter = node.spawn(&[]);
    assert_waiting(&node, &mut waiter, ino).await;
    waiter.signal(nix::sys::signal::Signal::SIGTERM);
    let st = tokio::time::timeout(WAIT, waiter.wait_exit())
        .await
        .expect("the waiter stops at once, without waiting for the lock");
    assert!(st.success(), "{st:?}");
    assert!(
        waiter.log_text().contains("stopped while starting"),
        "{}",
        waiter.log_text()
    );
    // The first goes: nobody takes over behind the stopped waiter's back.
    let st = first.terminate().await;
    assert!(st.success(), "{st:?}");
    assert!(
        fake.wait_synchronized(2, std::time::Duration::from_secs(1))
            .await
            .is_err(),
        "nobody registered after the first left"
    );
    let log = waiter.log_text();
    assert!(!log.contains("claims API listening"), "{log}");
    assert!(!log.contains("configured by the runtime"), "{log}");
}
