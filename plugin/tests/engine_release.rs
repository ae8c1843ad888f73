//! An unprepare's container updates are committed with the record's removal (issue 13): a
//! commit failure injected at the release, or right after it, never leaves the claim released
//! on disk with the updates its release made lost. The spec goes before the release (issue 25).

mod engine_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use engine_common::*;
use nri_accel::engine::EngineError;

/// A fault hook that fails the `n`-th append from now (0 = the next one), once.
fn fail_append(n: usize) -> nri_accel::checkpoint::FaultHook {
    let count = Arc::new(AtomicUsize::new(0));
    Arc::new(move || {
        (count.fetch_add(1, Ordering::SeqCst) == n)
            .then(|| std::io::Error::other("injected: no space left on device"))
    })
}

/// A node where releasing `victim` grows the cpuset of a running container: the release makes
/// a container update.
async fn setup(d: &Dirs) -> nri_accel::engine::Engine {
    let (engine, _) = open_with(d, 2, 2, None).unwrap();
    engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    let sink = Arc::new(FlakySink::default());
    *sink.failing.lock().unwrap() = true;
    engine.set_update_sink(Some(sink));
    engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
    // The prepare's own update stays pending (the sink fails); make it look delivered.
    engine
}

#[tokio::test]
async fn a_failed_release_commit_changes_nothing_durable_and_stops_later_commits() {
    let d = dirs();
    let engine = setup(&d).await;
    let pending_before = engine.checkpoint().pending();
    engine.checkpoint().set_fault_hook(Some(fail_append(0)));
    let err = engine.unprepare("victim").await.unwrap_err();
    assert!(matches!(err, EngineError::Checkpoint { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the claim stays prepared as it was"),
        "{err}"
    );
    // Nothing durable changed: the record is there, the pending updates are those of before,
    // and the spec, which went first, is written back (issue 39, item 7).
    assert_eq!(record_uids(&d.state), vec!["victim"]);
    assert_eq!(spec_uids(&d), vec!["victim"]);
    // Later commits are refused (the release is in memory only) until a restart, and so is a
    // retried Unprepare, which leaves the spec alone.
    let err = engine
        .prepare(claim_for("later", "gpu1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refuses commits"), "{err}");
    let err = engine.unprepare("victim").await.unwrap_err();
    assert!(err.to_string().contains("refuses commits"), "{err}");
    assert_eq!(spec_uids(&d), vec!["victim"]);
    drop(engine);
    // The restart finds the claim prepared, as it was; the running containers' cpusets come
    // with the runtime's Synchronize, which recomputes them all.
    let (engine, _) = open_with(&d, 2, 2, None).unwrap();
    let held: Vec<String> = engine
        .claims()
        .into_iter()
        .map(|(a, _)| a.claim_uid)
        .collect();
    assert_eq!(held, vec!["victim"]);
    assert_eq!(engine.checkpoint().pending(), pending_before);
    // The retry finishes.
    engine.unprepare("victim").await.unwrap();
    assert!(engine.claims().is_empty());
    assert!(spec_uids(&d).is_empty());
    drop(engine);
    assert!(record_uids(&d.state).is_empty());
}

/// No spec outlives its claim's release: a runtime not connected to nri-accel starts containers
/// from any spec on disk, and one started from a released claim's spec would share its devices
/// with the next claim (issue 25, found by the model). When the release's commit is durable the
/// spec is gone already.
#[tokio::test]
async fn an_unprepare_removes_the_spec_before_it_releases_the_claim() {
    let d = dirs();
    setup(&d).await;
    let cdi = d.cdi.clone();
    let at_release: Arc<std::sync::Mutex<Option<usize>>> = Arc::default();
    let seen = at_release.clone();
    let hook: nri_accel::engine::CrashHook = Arc::new(move |p| {
        if p == nri_accel::engine::CrashPoint::AfterCheckpoint {
            let specs = std::fs::read_dir(&cdi).unwrap().count();
            *seen.lock().unwrap() = Some(specs);
        }
        nri_accel::engine::HookAction::Continue
    });
    let (engine, _) = open_with(&d, 2, 2, Some(hook)).unwrap();
    assert_eq!(spec_uids(&d), vec!["victim"]);
    engine.unprepare("victim").await.unwrap();
    assert_eq!(
        *at_release.lock().unwrap(),
        Some(0),
        "spec files at the release"
    );
    assert!(engine.claims().is_empty());
}

#[tokio::test]
async fn a_commit_failure_right_after_the_release_loses_none_of_its_updates() {
    let d = dirs();
    let engine = setup(&d).await;
    // The release commits; the next commit (whatever it is) fails.
    engine.checkpoint().set_fault_hook(Some(fail_append(1)));
    engine.unprepare("victim").await.unwrap();
    let _ = engine.prepare(claim_for("next", "gpu1")).await;
    drop(engine);
    // On disk: the claim is released and the update its release made is pending.
    assert!(record_uids(&d.state).is_empty());
    let (engine, _) = open_with(&d, 2, 2, None).unwrap();
    assert!(engine.claims().is_empty());
    let pending = engine.checkpoint().pending();
    let update = pending
        .get("ctr-shared")
        .expect("the release's update survived");
    assert_eq!(
        update.cpus.to_string(),
        "0-7",
        "the whole shared pool again"
    );
}
