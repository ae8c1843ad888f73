//! An I/O error at every sync point of Prepare and Unprepare (issue 27, item 2): an error
//! answer to a Prepare means nothing was granted, in memory, on disk and after a restart, and
//! a retried Prepare is a fresh one; an Unprepare answered with an error leaves the claim as it
//! was (spec in place), and one that removed the spec finishes (issue 39, item 7).

mod engine_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cdi::SyncPoint;
use engine_common::*;

/// Where a fault is injected.
#[derive(Clone, Copy, Debug)]
enum At {
    WalAppend,
    WalSync,
    Spec(SyncPoint),
}

/// Injects one I/O error at `at` (every time when `always`).
fn inject(engine: &nri_accel::engine::Engine, at: At, always: bool) {
    let fired = Arc::new(AtomicBool::new(false));
    let fire = move || {
        (always || !fired.swap(true, Ordering::SeqCst))
            .then(|| std::io::Error::from_raw_os_error(libc::EIO))
    };
    match at {
        At::WalAppend => engine.checkpoint().set_fault_hook(Some(Arc::new(fire))),
        At::WalSync => engine
            .checkpoint()
            .set_sync_fault_hook(Some(Arc::new(fire))),
        At::Spec(point) => engine.spec_store().set_fault_hook(Some(Arc::new(move |p| {
            if p == point { fire() } else { None }
        }))),
    }
}

const PREPARE_POINTS: [At; 4] = [
    At::WalAppend,
    At::WalSync,
    At::Spec(SyncPoint::TempFile),
    At::Spec(SyncPoint::DirAfterRename),
];

/// Nothing held in memory, no spec, and after a restart nothing held and a fresh grant on
/// retry (a record a failed log sync may have left is rolled back by the start: it has no spec).
async fn assert_nothing_granted(d: &Dirs, engine: nri_accel::engine::Engine, at: At) {
    assert!(engine.claims().is_empty(), "{at:?}: held in memory");
    assert!(spec_uids(d).is_empty(), "{at:?}: a spec is left");
    drop(engine);
    let engine = open(d);
    assert!(engine.claims().is_empty(), "{at:?}: held after a restart");
    assert!(spec_uids(d).is_empty(), "{at:?}: a spec after a restart");
    let again = engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    assert!(!again.already, "{at:?}: the retry must be a fresh prepare");
    drop(engine);
    assert_eq!(spec_uids(d), vec!["c1"]);
    assert_eq!(record_uids(&d.state), vec!["c1"]);
}

#[tokio::test]
async fn a_prepare_answered_with_an_error_granted_nothing_at_every_sync_point() {
    for always in [false, true] {
        for at in PREPARE_POINTS {
            let d = dirs();
            let engine = open(&d);
            inject(&engine, at, always);
            let err = engine
                .prepare(claim_for("c1", "gpu0"))
                .await
                .expect_err(&format!("{at:?}"));
            let text = err.to_string();
            assert!(text.contains("c1"), "{at:?}: {text}");
            assert!(text.contains("nothing was granted"), "{at:?}: {text}");
            // The failed write is counted as what it was (nri_accel_*_write_errors_total).
            let tally = engine.tally();
            let (checkpoint, spec) = match at {
                At::WalAppend | At::WalSync => (1, 0),
                At::Spec(_) => (0, 1),
            };
            assert_eq!(
                (tally.checkpoint_write_failures, tally.spec_write_failures),
                (checkpoint, spec),
                "{at:?}"
            );
            assert_nothing_granted(&d, engine, at).await;
        }
    }
}

/// A checkpoint that cannot commit the release (its append or its sync fails): the answer is an
/// error, and the claim is left as it was: its spec is back in place (issue 39, item 7: it used
/// to stay deleted under a record that still says PREPARED). The checkpoint refuses commits
/// until a restart, which finds the claim prepared (record and spec), or released for good when
/// the failed sync's entry reached the disk anyway (its spec is then an orphan the start
/// removes); never half removed. The Unprepare retried after the restart finishes.
#[tokio::test]
async fn an_unprepare_answered_with_an_error_leaves_the_claim_as_it_was() {
    for at in [At::WalAppend, At::WalSync] {
        let d = dirs();
        let engine = open(&d);
        engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
        let spec_before = std::fs::read(store(&d).spec_path("c1").unwrap()).unwrap();
        inject(&engine, at, false);
        let err = engine.unprepare("c1").await.expect_err(&format!("{at:?}"));
        let text = err.to_string();
        assert!(!text.contains("nothing was granted"), "{at:?}: {text}");
        assert!(text.contains("retry the Unprepare"), "{at:?}: {text}");
        assert_eq!(spec_uids(&d), vec!["c1"], "{at:?}: the spec is back");
        assert_eq!(
            std::fs::read(store(&d).spec_path("c1").unwrap()).unwrap(),
            spec_before,
            "{at:?}: the same spec, with the same stamp"
        );
        drop(engine);
        let records = record_uids(&d.state);
        let engine = open(&d);
        let held: Vec<String> = engine
            .claims()
            .into_iter()
            .map(|(a, _)| a.claim_uid)
            .collect();
        match at {
            At::WalAppend => assert_eq!(records, vec!["c1"], "{at:?}: the record stayed"),
            _ => assert!(records.len() <= 1, "{at:?}: {records:?}"),
        }
        assert_eq!(
            held, records,
            "{at:?}: prepared as before, or released for good"
        );
        assert_eq!(spec_uids(&d), records, "{at:?}: no half-removed claim");
        engine.unprepare("c1").await.unwrap();
        assert!(engine.claims().is_empty(), "{at:?}");
        assert!(spec_uids(&d).is_empty(), "{at:?}");
        drop(engine);
        assert!(record_uids(&d.state).is_empty(), "{at:?}");
    }
}

/// The CDI directory's sync fails after the spec was unlinked (issue 39, item 7): every reader
/// already sees the spec gone, and only a power loss could bring it back, after which the boot
/// id has changed and the start removes it as another boot's orphan. The Unprepare finishes
/// (record removed, units released) and answers success, once or every time it is tried.
#[tokio::test]
async fn an_unprepare_whose_directory_sync_fails_after_the_unlink_finishes() {
    for always in [false, true] {
        let d = dirs();
        let engine = open(&d);
        engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
        inject(&engine, At::Spec(SyncPoint::DirAfterRemove), always);
        engine.unprepare("c1").await.unwrap();
        assert!(engine.claims().is_empty(), "always {always}: still held");
        assert!(spec_uids(&d).is_empty());
        assert_eq!(
            engine.tally().spec_write_failures,
            1,
            "counted as a failed write"
        );
        // The device is free at once.
        engine.prepare(claim_for("c2", "gpu0")).await.unwrap();
        drop(engine);
        assert_eq!(record_uids(&d.state), vec!["c2"]);
        let engine = open(&d);
        let held: Vec<String> = engine
            .claims()
            .into_iter()
            .map(|(a, _)| a.claim_uid)
            .collect();
        assert_eq!(held, vec!["c2"]);
    }
}
