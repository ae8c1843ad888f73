//! The checkpoint on real files: round trips, group commit, torn tails,
//! corruption, boot id changes, unreadable files and size caps.

mod checkpoint_common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Barrier};

use checkpoint_common::*;
use nri_accel::checkpoint::{
    Change, CheckpointError, CheckpointStep, MAX_ENTRY_BYTES, SNAPSHOT_FILE, WAL_FILE,
};

#[test]
fn round_trip_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoint");
    let (cp, report) = open(&dir);
    assert!(report.created);
    assert_eq!((report.records, report.pending), (0, 0));
    let (mut records, mut pending) = fill(&cp, 10);
    cp.commit(vec![
        Change::DeleteRecord("claim-3".into()),
        Change::DeletePending("ctr-4".into()),
        Change::DeleteRecord("never-there".into()),
        Change::PutRecord("claim-5".into(), rec(55)),
    ])
    .unwrap();
    records.remove("claim-3");
    pending.remove("ctr-4");
    records.insert("claim-5".into(), rec(55));
    assert_eq!(cp.records(), records);
    assert_eq!(cp.pending(), pending);
    assert_eq!(cp.record("claim-5"), Some(rec(55)));
    drop(cp);

    let (cp, report) = open(&dir);
    assert!(!report.created);
    assert_eq!(report.records, 9);
    assert_eq!(report.pending, 4);
    assert_eq!(report.torn_tail, None);
    assert_eq!(cp.records(), records);
    assert_eq!(cp.pending(), pending);
}

#[test]
fn group_commit_batches_waiting_callers_into_one_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    let cp = Arc::new(cp);
    // The first leader stops after appending until 63 others are queued.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(Some((entered_tx, release_rx)));
    cp.set_step_hook(Some(Arc::new(move |step| {
        if step == CheckpointStep::WalAppended
            && let Some((entered, release)) = gate.lock().unwrap().take()
        {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
    })));
    let leader = {
        let cp = cp.clone();
        std::thread::spawn(move || cp.commit(vec![Change::PutRecord("claim-0".into(), rec(0))]))
    };
    entered_rx.recv().unwrap();
    let others: Vec<_> = (1..64)
        .map(|i| {
            let cp = cp.clone();
            std::thread::spawn(move || {
                cp.commit(vec![Change::PutRecord(format!("claim-{i}"), rec(i))])
            })
        })
        .collect();
    while cp.stats().waiting < 63 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    release_tx.send(()).unwrap();
    leader.join().unwrap().unwrap();
    for t in others {
        t.join().unwrap().unwrap();
    }
    let stats = cp.stats();
    assert_eq!((stats.commits, stats.batches), (64, 2));
    drop(cp);
    let (cp, _) = open(tmp.path());
    assert_eq!(cp.record_count(), 64);
}

#[test]
fn group_commit_from_64_threads_keeps_every_change() {
    let tmp = tempfile::tempdir().unwrap();
    // A small compaction threshold so compactions run among the commits.
    let (cp, _) = open_with(tmp.path(), 16 << 10);
    let cp = Arc::new(cp);
    let barrier = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64u32)
        .map(|t| {
            let (cp, barrier) = (cp.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..20u32 {
                    let n = t * 100 + i;
                    cp.commit(vec![
                        Change::PutRecord(format!("claim-{n}"), rec(n)),
                        Change::PutPending(format!("ctr-{t}"), upd(n)),
                    ])
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = cp.stats();
    assert_eq!(stats.commits, 64 * 20);
    assert!(stats.batches <= stats.commits);
    let expected_records = cp.records();
    let expected_pending = cp.pending();
    assert_eq!(expected_records.len(), 64 * 20);
    for t in 0..64u32 {
        assert_eq!(expected_pending[&format!("ctr-{t}")], upd(t * 100 + 19));
    }
    drop(cp);
    let (cp, _) = open(tmp.path());
    assert_eq!(cp.records(), expected_records);
    assert_eq!(cp.pending(), expected_pending);
}

#[test]
fn torn_tail_at_every_offset_of_the_last_entry_drops_only_that_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("source");
    let (cp, _) = open(&dir);
    let (records, pending) = fill(&cp, 2);
    let good_len = fs::metadata(dir.join(WAL_FILE)).unwrap().len();
    cp.commit(vec![Change::PutRecord("claim-last".into(), rec(99))])
        .unwrap();
    drop(cp);
    let source = files(&dir);
    let full = source[WAL_FILE].clone();
    assert!(full.len() as u64 > good_len + 12);
    for cut in good_len..full.len() as u64 {
        let dir = tmp.path().join(format!("cut-{cut}"));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(SNAPSHOT_FILE), &source[SNAPSHOT_FILE]).unwrap();
        fs::write(dir.join(WAL_FILE), &full[..cut as usize]).unwrap();
        let (cp, report) = open(&dir);
        assert_eq!(cp.records(), records, "cut at {cut}");
        assert_eq!(cp.pending(), pending, "cut at {cut}");
        match &report.torn_tail {
            None => assert_eq!(cut, good_len),
            Some(torn) => {
                assert_eq!(torn.offset, good_len, "cut at {cut}");
                assert_eq!(torn.bytes, cut - good_len);
            }
        }
        assert_eq!(fs::metadata(dir.join(WAL_FILE)).unwrap().len(), good_len);
        // Appending continues cleanly after the cut.
        cp.commit(vec![Change::PutRecord("claim-after".into(), rec(7))])
            .unwrap();
        drop(cp);
        let (cp, report) = open(&dir);
        assert_eq!(report.torn_tail, None);
        assert_eq!(cp.record("claim-after"), Some(rec(7)));
        assert_eq!(cp.record_count(), records.len() + 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn zero_filled_tail_is_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    let (records, _) = fill(&cp, 3);
    drop(cp);
    let wal = tmp.path().join(WAL_FILE);
    let mut bytes = fs::read(&wal).unwrap();
    let good = bytes.len() as u64;
    bytes.extend_from_slice(&[0; 4096]);
    fs::write(&wal, &bytes).unwrap();
    let (cp, report) = open(tmp.path());
    assert_eq!(report.torn_tail.unwrap().offset, good);
    assert_eq!(cp.records(), records);
}

/// Opens `dir` expecting an error; asserts nothing in it changed.
fn open_fails_keeping_files(dir: &std::path::Path) -> CheckpointError {
    let before = files(dir);
    let err = Cp::open(dir, BOOT).unwrap_err();
    assert_eq!(files(dir), before, "the files were changed: {err}");
    err
}

#[test]
fn damaged_entry_in_the_middle_stops_open_naming_the_file_and_keeping_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 3);
    drop(cp);
    let wal = tmp.path().join(WAL_FILE);
    let mut bytes = fs::read(&wal).unwrap();
    // The first entry's payload starts after the header and the 12-byte frame.
    let header_len = 8 + 4 + 8 + 1 + BOOT.len() + 4;
    bytes[header_len + 12 + 3] ^= 0x20;
    fs::write(&wal, &bytes).unwrap();
    let err = open_fails_keeping_files(tmp.path());
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains(&wal.display().to_string()), "{message}");
    assert!(message.contains("kept"), "{message}");
    assert!(message.contains("mv "), "{message}");
    assert!(message.contains("adopt"), "{message}");
}

#[test]
fn bad_magic_or_newer_version_stops_open_and_keeps_the_file() {
    for (file, offset, value) in [
        (WAL_FILE, 0, b'X'),
        (SNAPSHOT_FILE, 0, b'X'),
        (WAL_FILE, 8, 9),
        (SNAPSHOT_FILE, 8, 9),
        (SNAPSHOT_FILE, 30, 0xff),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (cp, _) = open(tmp.path());
        fill(&cp, 2);
        cp.compact().unwrap();
        fill(&cp, 1);
        drop(cp);
        let path = tmp.path().join(file);
        let mut bytes = fs::read(&path).unwrap();
        bytes[offset] = value;
        fs::write(&path, &bytes).unwrap();
        let err = open_fails_keeping_files(tmp.path());
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        if offset == 8 {
            assert!(
                matches!(err, CheckpointError::UnsupportedVersion { found: 9, .. }),
                "{err}"
            );
        } else {
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        }
    }
}

#[test]
fn truncated_snapshot_is_corruption_not_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 5);
    cp.compact().unwrap();
    drop(cp);
    let path = tmp.path().join(SNAPSHOT_FILE);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let err = open_fails_keeping_files(tmp.path());
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    // Cut exactly at an entry boundary: the missing end marker is caught.
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    cp.compact().unwrap();
    drop(cp);
    let path = tmp.path().join(SNAPSHOT_FILE);
    let bytes = fs::read(&path).unwrap();
    let header = 8 + 4 + 8 + 1 + BOOT.len() + 4;
    fs::write(&path, &bytes[..header]).unwrap();
    let err = open_fails_keeping_files(tmp.path());
    assert!(err.to_string().contains("end marker"), "{err}");
}

#[test]
fn missing_snapshot_beside_a_log_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 2);
    drop(cp);
    fs::remove_file(tmp.path().join(SNAPSHOT_FILE)).unwrap();
    let err = open_fails_keeping_files(tmp.path());
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn changed_boot_id_drops_records_and_pending_updates_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 6);
    cp.compact().unwrap();
    cp.commit(vec![Change::PutRecord("claim-wal".into(), rec(1))])
        .unwrap();
    drop(cp);
    let (cp, report) = Cp::open(tmp.path(), "another-boot").unwrap();
    assert_eq!(report.previous_boot_id.as_deref(), Some(BOOT));
    assert_eq!(report.dropped_records, 7);
    assert_eq!(report.dropped_pending, 3);
    assert_eq!((report.records, report.pending), (0, 0));
    assert!(cp.records().is_empty() && cp.pending().is_empty());
    cp.commit(vec![Change::PutRecord("claim-new".into(), rec(2))])
        .unwrap();
    drop(cp);
    let (cp, report) = Cp::open(tmp.path(), "another-boot").unwrap();
    assert_eq!(report.previous_boot_id, None);
    assert_eq!(report.dropped_records, 0);
    assert_eq!(
        cp.records(),
        BTreeMap::from([("claim-new".to_owned(), rec(2))])
    );
}

/// Runs `f` on a thread of its own that holds no capability: permission bits then hold for it
/// whoever runs the tests. Root without `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` is refused a
/// file of mode 000 like anyone else, and capabilities are per thread, so the other tests keep
/// theirs.
fn without_capabilities<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let report = nri_accel::privileges::drop_to(&Default::default()).expect("drop");
            assert!(report.kept.is_empty(), "{report:?}");
            f()
        })
        .join()
        .expect("the test thread")
    })
}

/// An unreadable checkpoint file, or directory, stops the open with `Unreadable`, naming it, and
/// changes nothing. As root, too: the open runs without capabilities.
#[test]
fn unreadable_checkpoint_fails_loudly_and_deletes_nothing() {
    without_capabilities(unreadable_checkpoint)
}

fn unreadable_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    let (records, _) = fill(&cp, 4);
    drop(cp);
    let before = files(tmp.path());
    let wal = tmp.path().join(WAL_FILE);
    fs::set_permissions(&wal, fs::Permissions::from_mode(0o000)).unwrap();
    let err = Cp::open(tmp.path(), BOOT).unwrap_err();
    assert!(matches!(err, CheckpointError::Unreadable { .. }), "{err}");
    assert!(
        err.to_string().contains(&wal.display().to_string()),
        "{err}"
    );
    fs::set_permissions(&wal, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(files(tmp.path()), before);

    let dir = tmp.path();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o000)).unwrap();
    let err = Cp::open(dir, "another-boot").unwrap_err();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
    assert!(matches!(err, CheckpointError::Unreadable { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "cannot read the checkpoint directory {}: ",
            dir.display()
        )),
        "{err}"
    );
    assert!(
        err.to_string().contains("Nothing was changed or deleted"),
        "{err}"
    );
    assert_eq!(files(tmp.path()), before);
    let (cp, _) = open(tmp.path());
    assert_eq!(cp.records(), records);
}

#[test]
fn oversized_commit_is_refused_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 1);
    let before = files(tmp.path());
    let huge = Rec {
        devices: vec!["x".repeat(MAX_ENTRY_BYTES)],
        units: 0,
    };
    let err = cp
        .commit(vec![Change::PutRecord("claim-huge".into(), huge)])
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::EntryTooLarge { .. }),
        "{err}"
    );
    assert_eq!(files(tmp.path()), before);
    assert_eq!(cp.record_count(), 1);
}

#[test]
fn oversized_file_is_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    drop(cp);
    let wal = fs::OpenOptions::new()
        .write(true)
        .open(tmp.path().join(WAL_FILE))
        .unwrap();
    // Sparse: no disk space is used.
    wal.set_len(nri_accel::checkpoint::MAX_FILE_BYTES + 1)
        .unwrap();
    drop(wal);
    let err = Cp::open(tmp.path(), BOOT).unwrap_err();
    assert!(err.to_string().contains("cap"), "{err}");
    assert_eq!(
        fs::metadata(tmp.path().join(WAL_FILE)).unwrap().len(),
        nri_accel::checkpoint::MAX_FILE_BYTES + 1
    );
}

#[test]
fn commits_compact_the_log_once_it_outgrows_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open_with(tmp.path(), 2048);
    let (records, pending) = fill(&cp, 200);
    let wal_len = fs::metadata(tmp.path().join(WAL_FILE)).unwrap().len();
    let snap_len = fs::metadata(tmp.path().join(SNAPSHOT_FILE)).unwrap().len();
    assert!(
        wal_len < snap_len.max(2048) + 200,
        "wal {wal_len} snapshot {snap_len}"
    );
    drop(cp);
    let (cp, _) = open(tmp.path());
    assert_eq!(cp.records(), records);
    assert_eq!(cp.pending(), pending);
}

#[test]
fn invalid_boot_id_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["", "with space", &"x".repeat(200)] {
        let err = Cp::open(tmp.path(), bad).unwrap_err();
        assert!(
            matches!(err, CheckpointError::InvalidBootId { .. }),
            "{err}"
        );
    }
}

#[test]
fn commits_are_numbered_across_compactions_and_records_keep_their_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open_with(tmp.path(), 1);
    let mut last = 0;
    for i in 0..20 {
        let seq = cp
            .commit(vec![Change::PutRecord(format!("claim-{i}"), rec(i))])
            .unwrap();
        assert_eq!(seq, last + 1);
        last = seq;
    }
    assert_eq!(cp.high_water(), 20);
    assert_eq!(cp.record_seq("claim-4"), Some(5));
    drop(cp);
    // A reopen (snapshot + log) and a reboot keep the numbering.
    let (cp, _) = open(tmp.path());
    assert_eq!((cp.high_water(), cp.record_seq("claim-4")), (20, Some(5)));
    drop(cp);
    let (cp, report) = Cp::open(tmp.path(), "another-boot").unwrap();
    assert_eq!(report.dropped_records, 20);
    assert_eq!(cp.high_water(), 20);
    assert_eq!(
        cp.commit(vec![Change::DeleteRecord("x".into())]).unwrap(),
        21
    );
}

#[test]
fn a_missing_commit_in_the_middle_of_the_log_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let (cp, _) = open(tmp.path());
    fill(&cp, 4);
    drop(cp);
    // Cut the second entry out: the log's numbering has a hole.
    let wal = tmp.path().join(WAL_FILE);
    let bytes = fs::read(&wal).unwrap();
    let header = 8 + 4 + 8 + 1 + bytes[20] as usize + 4;
    let entry = |at: usize| 12 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let second = header + entry(header);
    let third = second + entry(second);
    let mut holed = bytes[..second].to_vec();
    holed.extend_from_slice(&bytes[third..]);
    fs::write(&wal, &holed).unwrap();
    let err = Cp::open(tmp.path(), BOOT).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("commit 3 where commit 2 belongs"),
        "{err}"
    );
    assert_eq!(fs::read(&wal).unwrap(), holed, "nothing changed");
}

#[test]
fn version_1_files_are_read_and_rewritten_in_the_current_version() {
    // A version 1 checkpoint as the previous release wrote it: no commit numbers.
    let tmp = tempfile::tempdir().unwrap();
    let header = |magic: &[u8; 8]| {
        let mut out = magic.to_vec();
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&3u64.to_le_bytes());
        out.push(BOOT.len() as u8);
        out.extend_from_slice(BOOT.as_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    };
    let entry = |payload: &str, out: &mut Vec<u8>| {
        let len = (payload.len() as u32).to_le_bytes();
        out.extend_from_slice(&len);
        out.extend_from_slice(&crc32fast::hash(&len).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload.as_bytes()).to_le_bytes());
        out.extend_from_slice(payload.as_bytes());
    };
    let mut snap = header(b"NRIACSNP");
    entry(
        r#"{"Record":["claim-a",{"devices":["gpu0"],"units":1}]}"#,
        &mut snap,
    );
    entry(r#"{"End":{"records":1,"pending":0}}"#, &mut snap);
    let mut wal = header(b"NRIACWAL");
    entry(
        r#"[{"PutRecord":["claim-b",{"devices":["gpu1"],"units":2}]}]"#,
        &mut wal,
    );
    fs::write(tmp.path().join(SNAPSHOT_FILE), &snap).unwrap();
    fs::write(tmp.path().join(WAL_FILE), &wal).unwrap();
    let (cp, report) = open(tmp.path());
    assert_eq!(report.upgraded_from, Some(1));
    assert_eq!(cp.record_count(), 2);
    assert_eq!(cp.high_water(), 1);
    assert_eq!(
        cp.commit(vec![Change::DeleteRecord("claim-a".into())])
            .unwrap(),
        2
    );
    drop(cp);
    let version = u32::from_le_bytes(
        fs::read(tmp.path().join(WAL_FILE)).unwrap()[8..12]
            .try_into()
            .unwrap(),
    );
    assert_eq!(version, nri_accel::checkpoint::FORMAT_VERSION);
    let (cp, report) = open(tmp.path());
    assert_eq!(report.upgraded_from, None);
    let held: Vec<String> = cp.records().into_keys().collect();
    assert_eq!(held, vec!["claim-b"]);
}
