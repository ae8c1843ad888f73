//! End to end, what an operator relies on: systemd readiness (READY=1 only once the gate is
//! open, STOPPING=1 on SIGTERM), the claims socket's mode, and a corrupt checkpoint stopping
//! startup loudly with the file named and kept.

mod e2e_common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use e2e_common::*;
use nri_accel::claims_api::Family;
use tokio::net::UnixListener;

fn drain(sock: &UnixDatagram) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_after_synchronize_and_stopping_on_sigterm() {
    let node = TestNode::new(Shape::default(), "");
    let notify_path = node.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_nonblocking(true).unwrap();

    let silent = UnixListener::bind(&node.nri_socket).unwrap();
    let mut daemon = node.spawn(&[("NOTIFY_SOCKET", notify_path.to_str().unwrap())]);
    let (held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("dials")
        .unwrap();
    // The claims API is up (gate closed) and no READY was sent.
    let client = node.client().await;
    assert!(!client.status().await.unwrap().gate_open);
    let early = drain(&notify);
    assert!(
        early.iter().all(|m| !m.contains("READY=1")),
        "READY before Synchronize: {early:?}"
    );
    let mode = std::fs::metadata(&node.claims_socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "claims socket mode {mode:o}");

    drop(held);
    drop(silent);
    let fake = runtime(&node).await;
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    let mut seen = Vec::new();
    wait_for("READY=1", || {
        seen.extend(drain(&notify));
        let ready = seen.iter().any(|m| m.contains("READY=1"));
        async move { ready.then_some(()) }
    })
    .await;

    let st = daemon.terminate().await;
    assert!(st.success());
    let mut last = drain(&notify);
    if last.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
        last = drain(&notify);
    }
    assert!(
        last.iter().any(|m| m.contains("STOPPING=1")),
        "no STOPPING=1: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_stops_startup_naming_the_file_and_keeps_it() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    for i in 0..3 {
        prepare_ok(
            &client,
            count_claim(&format!("keep-{i}"), Family::Shared, None),
        )
        .await;
    }
    assert!(daemon.terminate().await.success());

    // Flip bytes inside the first committed entry of whichever files hold the records.
    let dir = node.state_dir.join("checkpoint");
    let mut corrupted = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if bytes.len() < 64 {
            continue;
        }
        let at = bytes.len() / 3;
        for b in &mut bytes[at..at + 8] {
            *b ^= 0x5a;
        }
        std::fs::write(&path, &bytes).unwrap();
        corrupted.push((path, bytes));
    }
    assert!(
        !corrupted.is_empty(),
        "no checkpoint file in {}",
        dir.display()
    );
    let specs_before = node.spec_uids();

    let mut broken = node.spawn(&[]);
    let st = broken.wait_exit().await;
    let log = broken.log_text();
    let last = log.lines().last().unwrap_or_default();
    println!("corrupt checkpoint: {last}");
    assert_eq!(
        last.matches("is corrupt").count(),
        1,
        "the reason is said once: {last}"
    );
    assert!(
        !st.success(),
        "started on a corrupt checkpoint; log:\n{log}"
    );
    assert!(
        corrupted
            .iter()
            .any(|(p, _)| log.contains(&p.display().to_string())),
        "the error names the file: {log}"
    );
    // Nothing was reset or deleted.
    for (path, bytes) in &corrupted {
        assert_eq!(
            &std::fs::read(path).unwrap(),
            bytes,
            "{} changed",
            path.display()
        );
    }
    assert_eq!(node.spec_uids(), specs_before);
}
