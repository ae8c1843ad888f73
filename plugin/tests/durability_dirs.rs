//! Directories are opened once (issue 13): a CDI dir or state dir that is a symbolic link is
//! refused with a message, and a directory swapped for a link (or renamed away) while the
//! engine runs never redirects a write or an unlink: everything lands in the directory opened
//! at startup, and the swapped-in target stays byte-identical.

mod engine_common;

use std::collections::BTreeMap;
use std::path::Path;

use engine_common::*;
use nri_accel::checkpoint::{Checkpoint, CheckpointOptions};
use nri_accel::engine::{ClaimRecord, Engine, PendingUpdate};

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

    engine.prepare(claim_for("after", "gpu1")).await.unwrap();
    engine.unprepare("before").await.unwrap();
    engine.reconcile().await.unwrap();
    engine.unprepare("after").await.unwrap();
    engine.prepare(claim_for("last", "gpu2")).await.unwrap();

    assert_eq!(listing(&outside), outside_before, "nothing landed outside");
    let in_moved: Vec<String> = listing(&moved).into_keys().collect();
    assert_eq!(in_moved, vec!["accel.nri.io-device_last.yaml"]);
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
