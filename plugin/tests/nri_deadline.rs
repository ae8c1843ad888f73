//! A CreateContainer whose handler is cut at the runtime's deadline (issue 14): the daemon runs in
//! this process so a hook can hold the annotation claim's prepare after the policy allocated and
//! before the commit, until the fake runtime has given up on the request and dropped the plugin.
//! A handler cut there used to drop the rest of the prepare at its next wait (the commit): the
//! record landed without its origin in memory and without a spec. The prepare must complete
//! (record with its annotation origin, then the spec), nothing leaks, and the claim is released
//! when the container is removed.

mod e2e_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use e2e_common::*;
use fake_runtime::{FakeError, FakeRuntime, RuntimeConfig};
use nri_accel::config::Config;
use nri_accel::daemon::{Daemon, DaemonOptions};
use nri_accel::engine::{CrashHook, CrashPoint, HookAction, Origin};
use nri_proto::api::Event;

const KEY: &str = "accel.nri.io/container.app";

/// Holds the first step `at` reached after `armed` is set, until `go` receives.
struct Holder {
    armed: AtomicBool,
    reached: Mutex<mpsc::Sender<()>>,
    go: Mutex<mpsc::Receiver<()>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_cut_at_its_deadline_completes_and_is_released_at_remove() {
    let node = TestNode::new(Shape::default(), "");
    let cfg = RuntimeConfig {
        request_timeout: Duration::from_millis(300),
        ..RuntimeConfig::default()
    };
    let fake = FakeRuntime::start_with(&node.nri_socket, cfg)
        .await
        .expect("fake runtime");
    let (reached_tx, reached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let holder = Arc::new(Holder {
        armed: AtomicBool::new(false),
        reached: Mutex::new(reached_tx),
        go: Mutex::new(go_rx),
    });
    let h = holder.clone();
    // Blocks the engine's task (and its worker thread) at the step: a commit that takes as long
    // as the test wants.
    let hook: CrashHook = Arc::new(move |step| {
        if step == CrashPoint::AfterAllocate && h.armed.swap(false, Ordering::SeqCst) {
            let _ = h.reached.lock().unwrap().send(());
            let _ = h.go.lock().unwrap().recv();
        }
        HookAction::Continue
    });
    let config = Config::load(&node.config).expect("config");
    let daemon = Daemon::start(
        &config,
        DaemonOptions {
            crash: Some(hook),
            boot_id: Some("boot-deadline".into()),
            ..DaemonOptions::default()
        },
    )
    .await
    .expect("daemon");
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    daemon.gate().wait_open().await;

    let p = pod("slow", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    let c = container("c-slow-0001", &p, "app", &[]);
    let uid = "ctr-cslow0001";
    holder.armed.store(true, Ordering::SeqCst);
    // The reconnect's Synchronize waits until the runtime has created the container below:
    // under load the plugin reconnected before, and that Synchronize, finding no such
    // container, rightly released the claim the test then expected kept.
    fake.hold_synchronize(true);
    let create = {
        let (fake, p, c) = (fake.clone(), p.clone(), c.clone());
        tokio::spawn(async move { fake.create_container(&p, &c).await })
    };
    tokio::task::spawn_blocking(move || reached_rx.recv_timeout(WAIT))
        .await
        .unwrap()
        .expect("the prepare reached its allocation");
    // The runtime gives up on the request and drops the plugin, as NRI does.
    let r = create.await.unwrap();
    assert!(matches!(r, Err(FakeError::Timeout(_))), "{r:?}");
    let engine = daemon.agent().engine().clone();
    assert!(node.spec_uids().is_empty());
    go_tx.send(()).unwrap();
    // The handler is gone, the work is not: the commit and the spec follow.
    wait_for("the cut prepare to finish", || async {
        node.spec_uids().contains(uid).then_some(())
    })
    .await;
    assert_eq!(
        engine.origin_of(uid),
        Some(Origin::Annotation {
            container_id: c.id.clone()
        })
    );

    // The runtime created the container without the plugin's adjustment and goes on; the
    // plugin reconnects and the next Synchronize finds the container holding its claim.
    fake.add_container(c.clone());
    fake.hold_synchronize(false);
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("synchronized again");
    daemon.gate().wait_open().await;
    assert_eq!(
        engine.claims().len(),
        1,
        "kept while its container runs (not released, not leaked elsewhere)"
    );
    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    assert!(engine.claims().is_empty(), "released at RemoveContainer");
    assert!(node.spec_uids().is_empty(), "{:?}", node.cdi_entries());
    // Nothing is held anywhere.
    assert!(engine.with_node(|n| {
        ["gpu0", "gpu1", "gpu2", "gpu3"]
            .iter()
            .all(|d| n.holder_of(d).is_empty())
    }));
    daemon.shutdown().await;
}
