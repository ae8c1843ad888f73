//! The periodic reconciliation racing an ordinary Unprepare (issue 27, item 9): the held claim
//! it listed without a spec is the Unprepare's own, whose spec goes before its release (issue
//! 25); the pass repairs nothing and reports nothing.

mod engine_common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_common::*;
use nri_accel::engine::{CrashPoint, HookAction};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reconciliation_during_an_unprepare_repairs_nothing() {
    let d = dirs();
    // The hook stops the Unprepare after its spec is removed, before its release.
    let (reached_tx, reached_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let gates = Arc::new(Mutex::new(Some((reached_tx, go_rx))));
    let hook: nri_accel::engine::CrashHook = Arc::new(move |p| {
        if p == CrashPoint::AfterSpecRemove
            && let Some((reached, go)) = gates.lock().unwrap().take()
        {
            reached.send(()).unwrap();
            go.recv().unwrap();
        }
        HookAction::Continue
    });
    let (engine, _) = open_with(&d, 4, 0, Some(hook)).unwrap();
    let engine = Arc::new(engine);
    engine.prepare(claim_for("c1", "gpu0")).await.unwrap();

    let e = Arc::clone(&engine);
    let unprepare = tokio::spawn(async move { e.unprepare("c1").await });
    tokio::task::spawn_blocking(move || reached_rx.recv().unwrap())
        .await
        .unwrap();
    // Now c1 is held without a spec: the reconciliation lists it to roll back and waits for the
    // claim's lock, which the Unprepare holds.
    assert!(spec_uids(&d).is_empty());
    assert_eq!(engine.claims().len(), 1);
    let e = Arc::clone(&engine);
    let reconcile = tokio::spawn(async move { e.reconcile().await });
    // Time for the pass to list the specs (if it has not, it finds nothing either way).
    tokio::time::sleep(Duration::from_millis(200)).await;
    go_tx.send(()).unwrap();
    unprepare.await.unwrap().unwrap();
    let plan = reconcile.await.unwrap().unwrap();
    assert!(
        plan.remove_specs.is_empty() && plan.roll_back.is_empty(),
        "an ordinary unprepare is no repair: {plan:?}"
    );
    assert!(plan.is_noop());
    assert!(spec_uids(&d).is_empty());
}
