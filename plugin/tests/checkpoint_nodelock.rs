//! The node lock excludes a second holder in this process and in another
//! process, and the kernel releases it when the holding process dies.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

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
