//! Directories are opened once (issue 13): a CDI dir or state dir that is a symbolic link is
//! refused with a message, and a directory swapped for a link (or renamed away) while the
//! engine runs never redirects a write or an unlink: everything lands in the directory opened
//! at startup, and the swapped-in target stays byte-identical. A CDI dir that is no longer at
//! its path refuses prepares (issue 39): the runtime reads the path, so a spec written through
//! the old handle would be a grant nobody can use.

mod engine_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use engine_common::*;
use nri_accel::checkpoint::{Checkpoint, CheckpointOptions};
use nri_accel::engine::{ClaimRecord, CrashHook, CrashPoint, Engine, HookAction, PendingUpdate};

fn listing(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = if e.file_type().unwrap().is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                b"<dir>".to_vec()
            };
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

#[test]
fn a_cdi_dir_or_checkpoint_dir_that_is_a_symlink_is_refused_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("etc");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("cdi");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = cdi::SpecStore::open(cdi::StoreConfig::new(&link)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("is a symbolic link"), "{msg}");
    assert!(msg.contains(&target.display().to_string()), "{msg}");
    let err = cdi::SpecStore::open_read_only(cdi::StoreConfig::new(&link)).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    // A link higher up the path is normal.
    let via = tmp.path().join("run");
    std::os::unix::fs::symlink(tmp.path(), &via).unwrap();
    cdi::SpecStore::open(cdi::StoreConfig::new(via.join("etc"))).unwrap();
    // The checkpoint directory likewise.
    let cp_link = tmp.path().join("checkpoint");
    std::os::unix::fs::symlink(&target, &cp_link).unwrap();
    let err = Checkpoint::<ClaimRecord, PendingUpdate>::load(&cp_link, BOOT).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    // Nothing was written in the target.
    assert!(listing(&target).is_empty());
    // The preflight check says the same before anything is created.
    let err = nri_accel::preflight::run(&nri_accel::preflight::PreflightPaths {
        nri_socket: None,
        state_dir: tmp.path().join("state"),
        cdi_dir: link.clone(),
        claims_socket_dir: tmp.path().join("sock"),
    })
    .unwrap_err();
    assert!(err.to_string().contains("CDI spec dir"), "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(
        !tmp.path().join("state").exists(),
        "a refused start creates nothing"
    );
    assert!(
        !tmp.path().join("sock").exists(),
        "a refused start creates nothing"
    );
}

#[tokio::test]
async fn a_cdi_dir_swapped_while_running_never_redirects_a_write_or_an_unlink() {
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 0, None).unwrap();
    engine.prepare(claim_for("before", "gpu0")).await.unwrap();
    // Someone moves the CDI dir away and puts a link to another directory in its place, which
    // holds a file named like one of ours.
    let outside = d._tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("accel.nri.io-device_before.yaml"), b"not ours").unwrap();
    std::fs::write(outside.join("accel.nri.io-device_stray.yaml"), b"not ours").unwrap();
    let moved = d._tmp.path().join("cdi.moved");
    std::fs::rename(&d.cdi, &moved).unwrap();
    std::os::unix::fs::symlink(&outside, &d.cdi).unwrap();
    let outside_before = listing(&outside);

    // Prepares are refused (issue 39); unprepares and reconciliation go on in the opened dir.
    engine
        .prepare(claim_for("after", "gpu1"))
        .await
        .unwrap_err();
    engine.unprepare("before").await.unwrap();
    engine.reconcile().await.unwrap();
    engine.unprepare("after").await.unwrap();
    engine.prepare(claim_for("last", "gpu2")).await.unwrap_err();

    assert_eq!(listing(&outside), outside_before, "nothing landed outside");
    assert!(listing(&moved).is_empty(), "{:?}", listing(&moved));
    assert!(engine.checkpoint().records().is_empty());
}

/// What an operator (or an adversary) can put at the CDI dir's path after moving it away.
#[derive(Clone, Copy, Debug)]
enum PutInstead {
    Nothing,
    File,
    LinkToTheMovedDir,
    AnotherDir,
}

impl PutInstead {
    const ALL: [PutInstead; 4] = [
        PutInstead::Nothing,
        PutInstead::File,
        PutInstead::LinkToTheMovedDir,
        PutInstead::AnotherDir,
    ];

    fn put(self, path: &Path, moved: &Path) {
        match self {
            PutInstead::Nothing => {}
            PutInstead::File => std::fs::write(path, b"not a dir").unwrap(),
            PutInstead::LinkToTheMovedDir => std::os::unix::fs::symlink(moved, path).unwrap(),
            PutInstead::AnotherDir => std::fs::create_dir(path).unwrap(),
        }
    }

    fn take_away(self, path: &Path) {
        match self {
            PutInstead::Nothing => {}
            PutInstead::File | PutInstead::LinkToTheMovedDir => std::fs::remove_file(path).unwrap(),
            PutInstead::AnotherDir => std::fs::remove_dir(path).unwrap(),
        }
    }

    /// Words the refusal uses for it.
    fn said(self) -> &'static str {
        match self {
            PutInstead::Nothing => "nothing is at that path",
            PutInstead::File => "not a directory",
            PutInstead::LinkToTheMovedDir => "symbolic link",
            PutInstead::AnotherDir => "another directory",
        }
    }
}

/// Issue 39: the CDI dir moved away and something else put at its path while the engine runs.
/// Prepares succeeded, writing specs through the handle opened at start into the moved dir, where
/// the runtime (which reads the path) never looks. Now a prepare is refused with a sentence and
/// leaves no record, no spec and no unit held; a repeat of a prepared claim is refused and keeps
/// its grant; once the dir is back, prepares are served again.
#[tokio::test]
async fn a_prepare_is_refused_while_the_cdi_dir_is_not_at_its_path_and_leaves_nothing() {
    for instead in PutInstead::ALL {
        let d = dirs();
        let (engine, _) = open_with(&d, 2, 0, None).unwrap();
        engine.prepare(claim_for("before", "gpu0")).await.unwrap();
        let moved = d._tmp.path().join("cdi.moved");
        std::fs::rename(&d.cdi, &moved).unwrap();
        instead.put(&d.cdi, &moved);
        let moved_before = listing(&moved);

        let err = engine
            .prepare(claim_for("x", "gpu1"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("claim x"), "{instead:?}: {err}");
        assert!(
            err.contains(&d.cdi.display().to_string()),
            "{instead:?}: {err}"
        );
        assert!(err.contains(instead.said()), "{instead:?}: {err}");
        assert!(err.contains("nothing was granted"), "{instead:?}: {err}");
        assert!(engine.checkpoint().record("x").is_none(), "{instead:?}");
        assert_eq!(listing(&moved), moved_before, "{instead:?}");
        // A count ask is refused the same way (the policy would choose the free gpu1).
        engine.prepare(claim_count("y", 1)).await.unwrap_err();
        assert!(engine.checkpoint().record("y").is_none(), "{instead:?}");

        // A repeat of a prepared claim: its spec is where the runtime cannot see it either.
        let err = engine
            .prepare(claim_for("before", "gpu0"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("stays prepared"), "{instead:?}: {err}");
        assert!(engine.checkpoint().record("before").is_some());
        assert_eq!(listing(&moved), moved_before, "{instead:?}");

        // Back in place: gpu1 was never held, so x gets it now.
        instead.take_away(&d.cdi);
        std::fs::rename(&moved, &d.cdi).unwrap();
        engine.prepare(claim_for("x", "gpu1")).await.unwrap();
        assert_eq!(spec_uids(&d), vec!["before", "x"], "{instead:?}");
        assert_eq!(record_uids(&d.state), vec!["before", "x"], "{instead:?}");
    }
}

/// The race: the dir is swapped after the check before a prepare and after its spec was written,
/// before the answer. The claim is rolled back as a failed prepare: no spec in the moved dir, no
/// record, its device free; a restart finds nothing of it.
#[tokio::test]
async fn a_cdi_dir_swapped_between_the_spec_write_and_the_answer_rolls_the_claim_back() {
    let d = dirs();
    let moved = d._tmp.path().join("cdi.moved");
    let swapped = Arc::new(AtomicBool::new(false));
    let hook: CrashHook = {
        let (cdi, moved, swapped) = (d.cdi.clone(), moved.clone(), swapped.clone());
        Arc::new(move |step| {
            if step == CrashPoint::AfterSpecRename && !swapped.swap(true, Ordering::SeqCst) {
                std::fs::rename(&cdi, &moved).unwrap();
                std::os::unix::fs::symlink(&moved, &cdi).unwrap();
            }
            HookAction::Continue
        })
    };
    let (engine, _) = open_with(&d, 2, 0, Some(hook)).unwrap();
    let err = engine
        .prepare(claim_for("x", "gpu1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(swapped.load(Ordering::SeqCst), "the hook ran");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(err.contains("nothing was granted"), "{err}");
    assert!(listing(&moved).is_empty(), "{:?}", listing(&moved));
    assert!(engine.checkpoint().record("x").is_none());
    assert!(engine.claims().is_empty(), "no unit is held");
    drop(engine);

    std::fs::remove_file(&d.cdi).unwrap();
    std::fs::rename(&moved, &d.cdi).unwrap();
    let (engine, report) = open_with(&d, 2, 0, None).unwrap();
    assert!(report.plan.restore.is_empty(), "{:?}", report.plan);
    assert!(report.plan.roll_back.is_empty(), "{:?}", report.plan);
    engine.prepare(claim_for("x", "gpu1")).await.unwrap();
}

#[tokio::test]
async fn a_state_dir_swapped_while_running_never_redirects_a_commit() {
    let d = dirs();
    let cp = d.state.join("checkpoint");
    let journal = Checkpoint::load(&cp, BOOT).unwrap();
    // Compact often, so renames and new files happen after the swap too.
    let options = CheckpointOptions {
        compact_min_bytes: 1,
    };
    let (engine, _) = Engine::start_with(node(4, 0), journal, store(&d), None, options).unwrap();
    engine.prepare(claim_for("a", "gpu0")).await.unwrap();
    let outside = d._tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("wal"), b"decoy").unwrap();
    let moved = d._tmp.path().join("checkpoint.moved");
    std::fs::rename(&cp, &moved).unwrap();
    std::os::unix::fs::symlink(&outside, &cp).unwrap();
    let outside_before = listing(&outside);
    for (i, uid) in ["b", "c", "d"].iter().enumerate() {
        engine
            .prepare(claim_for(uid, &format!("gpu{}", i + 1)))
            .await
            .unwrap();
    }
    engine.unprepare("a").await.unwrap();
    drop(engine);
    assert_eq!(listing(&outside), outside_before, "nothing landed outside");
    // The moved directory holds every commit.
    let (journal, _) = Checkpoint::<ClaimRecord, PendingUpdate>::open(&moved, BOOT).unwrap();
    let held: Vec<String> = journal.records().into_keys().collect();
    assert_eq!(held, vec!["b", "c", "d"]);
}

/// An adoption is not refused while the CDI dir is away: its spec is only the record that a
/// running container holds the device (the runtime never reads it), and refusing it would leave
/// the device free to grant once the dir is back.
#[tokio::test]
async fn an_adoption_is_recorded_while_the_cdi_dir_is_away() {
    let d = dirs();
    let (engine, _) = open_with(&d, 2, 0, None).unwrap();
    let moved = d._tmp.path().join("cdi.moved");
    std::fs::rename(&d.cdi, &moved).unwrap();
    let adopted = engine.adopt("ctr-1", "gpu1").await.unwrap();
    std::fs::rename(&moved, &d.cdi).unwrap();
    assert_eq!(spec_uids(&d), vec![adopted.uid.clone()]);
    let err = engine.prepare(claim_for("x", "gpu1")).await.unwrap_err();
    assert!(err.to_string().contains(&adopted.uid), "{err}");
}
