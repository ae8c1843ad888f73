//! Crashes at every named step of a commit and of a compaction lose nothing
//! that was committed: a child process aborts at the step, the parent reopens.

mod checkpoint_common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use checkpoint_common::*;
use nri_accel::checkpoint::{Change, CheckpointError, CheckpointStep};

const STEPS: [CheckpointStep; 7] = [
    CheckpointStep::WalAppended,
    CheckpointStep::WalSynced,
    CheckpointStep::SnapshotWritten,
    CheckpointStep::NewWalWritten,
    CheckpointStep::SnapshotRenamed,
    CheckpointStep::WalRenamed,
    CheckpointStep::Compacted,
];

const DIR_ENV: &str = "NRI_ACCEL_CRASH_DIR";
const STEP_ENV: &str = "NRI_ACCEL_CRASH_STEP";

fn is_commit_step(step: CheckpointStep) -> bool {
    matches!(
        step,
        CheckpointStep::WalAppended | CheckpointStep::WalSynced
    )
}

/// Commits one record, then (for compaction steps) compacts; `at` is told
/// of every step and ends the run there.
fn crash_run(cp: &Cp, step: CheckpointStep, at: Arc<dyn Fn() + Send + Sync>) {
    let hook = move |s| {
        if s == step {
            at()
        }
    };
    if is_commit_step(step) {
        cp.set_step_hook(Some(Arc::new(hook)));
        let _ = cp.commit(vec![Change::PutRecord("claim-crash".into(), rec(42))]);
    } else {
        cp.commit(vec![Change::PutRecord("claim-crash".into(), rec(42))])
            .unwrap();
        cp.set_step_hook(Some(Arc::new(hook)));
        let _ = cp.compact();
    }
}

/// The child half: `process_crash_at_every_step_loses_nothing` re-executes this binary to run
/// it (ignored otherwise: on its own it has nothing to crash).
#[test]
#[ignore = "the child half of process_crash_at_every_step_loses_nothing, which runs it"]
fn crash_child() {
    let (Ok(dir), Ok(step)) = (std::env::var(DIR_ENV), std::env::var(STEP_ENV)) else {
        panic!(
            "run by process_crash_at_every_step_loses_nothing, which sets {DIR_ENV} and {STEP_ENV}"
        );
    };
    let step = STEPS
        .into_iter()
        .find(|s| format!("{s:?}") == step)
        .expect("known step");
    let (cp, _) = open(Path::new(&dir));
    crash_run(&cp, step, Arc::new(|| std::process::abort()));
    unreachable!("the child should have aborted at {step:?}");
}

fn prepare(dir: &Path) -> std::collections::BTreeMap<String, Rec> {
    let (cp, _) = open(dir);
    let (mut records, _) = fill(&cp, 5);
    cp.compact().unwrap();
    cp.commit(vec![Change::PutRecord("claim-5".into(), rec(5))])
        .unwrap();
    records.insert("claim-5".into(), rec(5));
    records.insert("claim-crash".into(), rec(42));
    records
}

fn check_after_crash(
    dir: &Path,
    step: CheckpointStep,
    expected: &std::collections::BTreeMap<String, Rec>,
) {
    let (cp, report) = open(dir);
    assert_eq!(&cp.records(), expected, "after a crash at {step:?}");
    assert_eq!(cp.pending().len(), 3, "after a crash at {step:?}");
    match step {
        CheckpointStep::SnapshotWritten | CheckpointStep::NewWalWritten => {
            assert!(
                !report.removed_temp_files.is_empty(),
                "{step:?}: {report:?}"
            )
        }
        CheckpointStep::SnapshotRenamed => {
            assert!(report.stale_wal_replaced, "{step:?}: {report:?}")
        }
        _ => assert!(
            report.removed_temp_files.is_empty() && !report.stale_wal_replaced,
            "{step:?}: {report:?}"
        ),
    }
    // The repaired checkpoint takes commits and reads them back.
    cp.commit(vec![Change::PutRecord("claim-later".into(), rec(8))])
        .unwrap();
    drop(cp);
    let (cp, report) = open(dir);
    assert_eq!(report.torn_tail, None);
    assert_eq!(cp.record_count(), expected.len() + 1, "{step:?}");
    assert_eq!(cp.record("claim-later"), Some(rec(8)));
}

#[test]
fn process_crash_at_every_step_loses_nothing() {
    let exe = std::env::current_exe().unwrap();
    for step in STEPS {
        let tmp = tempfile::tempdir().unwrap();
        let expected = prepare(tmp.path());
        let status = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, tmp.path())
            .env(STEP_ENV, format!("{step:?}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the child did not crash at {step:?}");
        check_after_crash(tmp.path(), step, &expected);
    }
}

#[test]
fn panic_at_every_step_poisons_until_reopen_and_loses_nothing() {
    for step in STEPS {
        let tmp = tempfile::tempdir().unwrap();
        let expected = prepare(tmp.path());
        let (cp, _) = open(tmp.path());
        let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crash_run(&cp, step, Arc::new(|| panic!("crash")))
        }));
        assert!(crashed.is_err(), "no panic at {step:?}");
        cp.set_step_hook(None);
        let err = cp
            .commit(vec![Change::PutRecord("claim-refused".into(), rec(1))])
            .unwrap_err();
        assert!(matches!(err, CheckpointError::Poisoned { .. }), "{err}");
        drop(cp);
        check_after_crash(tmp.path(), step, &expected);
    }
}
