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

/// Issue 39: with the first daemon running, `rm <state dir>/node.lock` and a second daemon on the
/// same state and CDI dirs (its own claims socket) opened its gate without a word, and both
/// granted the same devices. Now the second waits for the lock as if the file were there, and
/// the first notices at once (without any request) that its lock file is gone: it refuses
/// prepares and unprepares with a sentence naming the file, and says so in /healthz, `status`, a
/// metric and its log (once). Killed, it hands the node over to the waiting one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_lock_file_lets_no_second_daemon_in_and_stops_the_first() {
    let (node, addr) = TestNode::with_metrics(Shape::default());
    let fake = runtime(&node).await;
    let mut first = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    prepare_ok(&client, count_claim("before-a", Family::Exclusive, None)).await;

    let lock_file = node.state_dir.join("node.lock");
    std::fs::remove_file(&lock_file).unwrap();

    // The first notices by itself: no request has come since.
    let (_, body) = wait_for("/healthz 503 after the lock file was removed", || async {
        http_get_async(addr, "/healthz")
            .await
            .filter(|(c, _)| *c == 503)
    })
    .await;
    let lock_path = lock_file.display().to_string();
    assert!(body.contains(&lock_path), "{body}");
    assert!(body.contains("was removed"), "{body}");
    let (_, metrics) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert_eq!(
        sample(&metrics, "nri_accel_node_lock_lost"),
        Some(1.0),
        "{metrics}"
    );

    // A second daemon on the same state and CDI dirs, with a claims socket of its own.
    let second_socket = node.dir.path().join("run2").join("claims.sock");
    let second_config = node.dir.path().join("config2.yaml");
    let text = std::fs::read_to_string(&node.config).unwrap().replace(
        &node.claims_socket.display().to_string(),
        &second_socket.display().to_string(),
    );
    std::fs::write(&second_config, text).unwrap();
    let (cmd, log) = node.run_command_with(&second_config);
    let mut second = DaemonProc::spawn(cmd, log);
    wait_for("the second daemon to wait for the node lock", || {
        let text = second.log_text();
        async move { text.contains(WAITING).then_some(()) }
    })
    .await;
    assert!(second.try_exit().is_none(), "it waits, it does not exit");
    assert!(!second_socket.exists(), "{}", second.log_text());
    assert_eq!(fake.plugin().map(|p| p.name), Some("accel".into()));

    // The first grants and releases nothing more, and says why.
    let answer = client
        .prepare(vec![count_claim("after-b", Family::Exclusive, None)])
        .await
        .unwrap();
    let err = answer["after-b"].as_ref().unwrap_err();
    assert!(err.contains(&lock_path), "{err}");
    assert!(err.contains("was removed"), "{err}");
    assert!(err.contains("stop every nri-accel"), "{err}");
    let answer = client.unprepare(vec![claim_ref("before-a")]).await.unwrap();
    let err = answer["before-a"].as_ref().unwrap_err();
    assert!(err.contains(&lock_path), "{err}");
    let doc = node.status_json().await;
    assert_eq!(doc["node_lock"]["held"], false, "{doc}");
    let problem = doc["node_lock"]["problem"].as_str().unwrap_or_default();
    assert!(problem.contains(&lock_path), "{doc}");
    let (_, out, _) = node.cli(&["status"]).await;
    assert!(out.contains("was removed"), "{out}");
    let held: BTreeSet<String> = ["before-a"].map(String::from).into();
    assert_eq!(node.spec_uids(), held);
    assert_eq!(
        first
            .log_text()
            .matches("stops granting and releasing claims")
            .count(),
        1,
        "said once: {}",
        first.log_text()
    );

    // The first goes: the second takes the node with the first's claims and serves.
    first.kill9().await;
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("second synchronized");
    let path = second_socket.clone();
    let client = wait_for("the second daemon's gate", || {
        let path = path.clone();
        async move {
            let c = nri_accel::claims_api::ClaimsClient::connect(&path)
                .await
                .ok()?;
            c.status().await.ok()?.gate_open.then_some(c)
        }
    })
    .await;
    assert_eq!(list_uids(&client).await, held);
    prepare_ok(&client, count_claim("after-b", Family::Exclusive, None)).await;
    assert_no_unit_granted_twice(&client.status().await.unwrap().document);
}
