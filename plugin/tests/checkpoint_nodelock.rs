//! The node lock excludes a second holder in this process and in another
//! process, and the kernel releases it when the holding process dies. Its lock
//! file removed or replaced lets nobody in, and the engine of a holder that
//! finds it so changes nothing more (issue 39).

mod engine_common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engine_common::*;
use nri_accel::engine::{CrashHook, CrashPoint, HookAction};

use nri_accel::nodelock::{NODE_LOCK_FILE, NodeLock, NodeLockError};

const HOLD_ENV: &str = "NRI_ACCEL_HOLD_NODE_LOCK";

#[test]
fn a_second_holder_in_the_same_process_is_refused_until_the_first_drops() {
    let tmp = tempfile::tempdir().unwrap();
    let lock = NodeLock::open(tmp.path()).unwrap();
    assert_eq!(lock.path(), tmp.path().join(NODE_LOCK_FILE));
    let other = NodeLock::open(tmp.path()).unwrap();
    let guard = lock.lock(Duration::ZERO).unwrap();
    let err = other.lock(Duration::from_millis(30)).unwrap_err();
    assert!(matches!(err, NodeLockError::Busy { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&lock.path().display().to_string()),
        "{message}"
    );
    assert!(message.contains("another nri-accel process"), "{message}");
    // The same NodeLock cannot be taken twice either.
    assert!(lock.lock(Duration::ZERO).is_err());
    drop(guard);
    let again = other.lock(Duration::ZERO).unwrap();
    assert_eq!(again.path(), lock.path());
}

#[test]
fn a_waiting_holder_gets_the_lock_when_it_is_released() {
    let tmp = tempfile::tempdir().unwrap();
    let lock = NodeLock::open(tmp.path()).unwrap();
    let guard = lock.lock(Duration::ZERO).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            lock.lock(Duration::from_secs(60)).map(|_| ())
        })
    };
    rx.recv().unwrap();
    drop(guard);
    waiter.join().unwrap().unwrap();
}

#[test]
fn open_fails_naming_the_file_when_the_state_dir_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("absent");
    let err = NodeLock::open(&missing).unwrap_err();
    assert!(matches!(err, NodeLockError::Open { .. }), "{err}");
    assert!(err.to_string().contains("absent/node.lock"), "{err}");
}

/// The child half of the cross-process test: holds the lock until killed (ignored otherwise:
/// on its own it would hold nothing for no one).
#[test]
#[ignore = "the child half of another_process_is_excluded_and_its_death_releases_the_lock, which runs it"]
fn hold_node_lock_child() {
    let Ok(dir) = std::env::var(HOLD_ENV) else {
        panic!(
            "run by another_process_is_excluded_and_its_death_releases_the_lock, which sets {HOLD_ENV}"
        );
    };
    let lock = NodeLock::open(Path::new(&dir)).unwrap();
    let _guard = lock.lock(Duration::ZERO).unwrap();
    println!("LOCKED");
    loop {
        std::thread::park();
    }
}

#[test]
fn another_process_is_excluded_and_its_death_releases_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hold_node_lock_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLD_ENV, tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let locked = lines.any(|l| l.map(|l| l.contains("LOCKED")).unwrap_or(false));
    if !locked {
        let _ = child.kill();
        panic!("the child never took the lock");
    }
    let lock = NodeLock::open(tmp.path()).unwrap();
    let err = lock.lock(Duration::from_millis(30));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(matches!(err, Err(NodeLockError::Busy { .. })), "{err:?}");
    lock.lock(Duration::ZERO).unwrap();
}

/// Issue 39: the lock file removed (or replaced) under its holder. flock locks an inode, not a
/// name, so a new `node.lock` is a new lock: a second daemon took it and both granted the same
/// devices. The lock is on the state dir itself now, which a removed file does not change.
#[test]
fn a_removed_or_replaced_lock_file_lets_no_second_holder_in() {
    let tmp = tempfile::tempdir().unwrap();
    let lock = NodeLock::open(tmp.path()).unwrap();
    let _guard = lock.lock(Duration::ZERO).unwrap();

    std::fs::remove_file(tmp.path().join(NODE_LOCK_FILE)).unwrap();
    // A second process opens the lock afresh: it creates a new node.lock.
    let other = NodeLock::open(tmp.path()).unwrap();
    assert!(tmp.path().join(NODE_LOCK_FILE).exists());
    let err = other.lock(Duration::from_millis(30)).unwrap_err();
    assert!(matches!(err, NodeLockError::Busy { .. }), "{err}");

    // Replaced by another file of that name: the same.
    let stray = tmp.path().join("stray");
    std::fs::write(&stray, b"").unwrap();
    std::fs::rename(&stray, tmp.path().join(NODE_LOCK_FILE)).unwrap();
    let err = NodeLock::open(tmp.path())
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap_err();
    assert!(matches!(err, NodeLockError::Busy { .. }), "{err}");
}

/// The holder can tell that its lock was taken from under it: the lock file removed, replaced by
/// another file, or the state dir itself renamed away. The first change found is what it says.
#[test]
fn the_holder_sees_its_lock_file_removed_or_replaced_and_its_state_dir_moved() {
    use nri_accel::nodelock::LockLost;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let guard = NodeLock::open(&state)
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap();
    let watch = guard.watch();
    watch.check().unwrap();
    let file = state.join(NODE_LOCK_FILE);

    std::fs::remove_file(&file).unwrap();
    let err = watch.check().unwrap_err();
    assert!(matches!(err, LockLost::Removed { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("the node lock {} was removed", file.display())
    );

    std::fs::write(&file, b"").unwrap();
    let err = watch.check().unwrap_err();
    assert!(matches!(err, LockLost::Replaced { .. }), "{err}");

    let moved = tmp.path().join("state.moved");
    std::fs::rename(&state, &moved).unwrap();
    std::fs::create_dir(&state).unwrap();
    let err = watch.check().unwrap_err();
    assert!(matches!(err, LockLost::StateDir(_)), "{err}");
    assert!(err.to_string().contains("another directory"), "{err}");
    drop(guard);
}

/// The read-only probe (`reconcile --dry-run`) creates no file and still sees a holder whose lock
/// file was removed: it locks the state dir too.
#[test]
fn the_read_only_probe_sees_a_holder_without_its_lock_file() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = NodeLock::open_existing(tmp.path())
        .unwrap()
        .expect("the dir exists");
    drop(empty.lock(Duration::ZERO).unwrap());
    assert!(
        !tmp.path().join(NODE_LOCK_FILE).exists(),
        "the probe created nothing"
    );

    let _guard = NodeLock::open(tmp.path())
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap();
    std::fs::remove_file(tmp.path().join(NODE_LOCK_FILE)).unwrap();
    let probe = NodeLock::open_existing(tmp.path())
        .unwrap()
        .expect("the dir exists");
    let err = probe.lock(Duration::ZERO).unwrap_err();
    assert!(matches!(err, NodeLockError::Busy { .. }), "{err}");
    assert!(
        !tmp.path().join(NODE_LOCK_FILE).exists(),
        "the probe created nothing"
    );
    assert!(
        NodeLock::open_existing(&tmp.path().join("absent"))
            .unwrap()
            .is_none()
    );
}

/// A daemon's engine whose lock file is removed: it refuses prepares and unprepares with a
/// sentence naming the file, repairs nothing (a spec without a record may be another daemon's
/// fresh grant now), and its state is intact for the next start.
#[tokio::test]
async fn an_engine_whose_lock_file_was_removed_changes_nothing_more() {
    let d = dirs();
    let guard = NodeLock::open(&d.state)
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap();
    let (engine, _) = open_with(&d, 4, 0, None).unwrap();
    engine.watch_node_lock(guard.watch());
    engine.prepare(claim_for("a", "gpu0")).await.unwrap();
    assert!(engine.node_lock_status().unwrap().held);

    let file = d.state.join(NODE_LOCK_FILE);
    std::fs::remove_file(&file).unwrap();
    let err = engine
        .prepare(claim_for("b", "gpu1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("claim b not prepared: "), "{err}");
    assert!(
        err.contains(&format!("the node lock {} was removed", file.display())),
        "{err}"
    );
    assert!(err.contains("nothing was granted"), "{err}");
    let err = engine.unprepare("a").await.unwrap_err().to_string();
    assert!(err.starts_with("claim a not unprepared: "), "{err}");
    // A repeat of a held claim keeps its grant.
    let err = engine
        .prepare(claim_for("a", "gpu0"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stays prepared"), "{err}");
    // A spec another daemon may have written (for a commit this checkpoint holds, so without
    // the fence reconciliation would take it for a released claim's and remove it).
    let stamp = cdi::Stamp {
        seq: 1,
        boot_id: BOOT.into(),
    };
    let edits = cdi::DeviceEdits {
        env: vec![("X".into(), "1".into())],
        ..Default::default()
    };
    store(&d).write_stamped("other", &stamp, &[edits]).unwrap();
    let plan = engine.reconcile().await.unwrap();
    assert!(plan.remove_specs.is_empty(), "{plan:?}");
    // Put back, the file is still not the one locked: lost for good.
    std::fs::write(&file, b"").unwrap();
    let status = engine.node_lock_status().unwrap();
    assert!(!status.held);
    assert!(status.problem.unwrap().contains("was removed"));
    engine.prepare(claim_for("b", "gpu1")).await.unwrap_err();

    assert_eq!(spec_uids(&d), vec!["a", "other"]);
    assert_eq!(record_uids(&d.state), vec!["a"]);
}

/// The race: the lock file removed after the check before a prepare and after its spec was
/// written. The spec is removed and the prepare refused; its record cannot be rolled back (no
/// commit is made without the lock), so the next start rolls it back as half-prepared.
#[tokio::test]
async fn a_lock_file_removed_between_the_spec_write_and_the_answer_grants_nothing() {
    let d = dirs();
    let guard = NodeLock::open(&d.state)
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap();
    let removed = Arc::new(AtomicBool::new(false));
    let hook: CrashHook = {
        let (file, removed) = (d.state.join(NODE_LOCK_FILE), removed.clone());
        Arc::new(move |step| {
            if step == CrashPoint::AfterSpecRename && !removed.swap(true, Ordering::SeqCst) {
                std::fs::remove_file(&file).unwrap();
            }
            HookAction::Continue
        })
    };
    let (engine, _) = open_with(&d, 2, 0, Some(hook)).unwrap();
    engine.watch_node_lock(guard.watch());
    let err = engine
        .prepare(claim_for("x", "gpu1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(removed.load(Ordering::SeqCst), "the hook ran");
    assert!(err.contains("was removed"), "{err}");
    assert!(err.contains("nothing was granted"), "{err}");
    assert!(spec_uids(&d).is_empty());
    drop(engine);
    drop(guard);

    let guard = NodeLock::open(&d.state)
        .unwrap()
        .lock(Duration::ZERO)
        .unwrap();
    let (engine, report) = open_with(&d, 2, 0, None).unwrap();
    engine.watch_node_lock(guard.watch());
    assert_eq!(report.plan.roll_back, vec!["x"]);
    engine.prepare(claim_for("x", "gpu1")).await.unwrap();
}
