//! Hard links planted in the checkpoint directory (issue 27, item 1): a file linked at a temp
//! name is never written through, and a log with a second name is refused, not appended to.

mod checkpoint_common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use checkpoint_common::*;
use nri_accel::checkpoint::{Change, CheckpointError, SNAPSHOT_FILE, WAL_FILE};

const PRECIOUS: &[u8] = b"a file elsewhere on the same file system\n";

#[test]
fn compaction_never_writes_through_a_hard_link_planted_at_a_temp_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoint");
    let elsewhere = tmp.path().join("precious");
    fs::write(&elsewhere, PRECIOUS).unwrap();
    let (cp, _) = open(&dir);
    let (records, _) = fill(&cp, 5);
    for temp in ["snapshot.tmp", "wal.tmp"] {
        fs::hard_link(&elsewhere, dir.join(temp)).unwrap();
    }
    assert_eq!(fs::metadata(&elsewhere).unwrap().nlink(), 3);
    cp.compact().unwrap();
    assert_eq!(
        fs::read(&elsewhere).unwrap(),
        PRECIOUS,
        "the linked file is untouched"
    );
    assert_eq!(
        fs::metadata(&elsewhere).unwrap().nlink(),
        1,
        "the planted names were unlinked, not written"
    );
    for name in [SNAPSHOT_FILE, WAL_FILE] {
        assert_eq!(fs::metadata(dir.join(name)).unwrap().nlink(), 1, "{name}");
    }
    cp.commit(vec![Change::PutRecord("after".into(), rec(9))])
        .unwrap();
    drop(cp);
    let (cp, _) = open(&dir);
    let mut expected = records;
    expected.insert("after".into(), rec(9));
    assert_eq!(cp.records(), expected);
}

#[test]
fn a_log_with_a_second_name_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoint");
    let (cp, _) = open(&dir);
    fill(&cp, 3);
    drop(cp);
    let other = tmp.path().join("other-name");
    fs::hard_link(dir.join(WAL_FILE), &other).unwrap();
    let before = files(&dir);
    let err = Cp::open(&dir, BOOT).unwrap_err();
    assert!(
        matches!(err, CheckpointError::HardLinked { links: 2, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&dir.join(WAL_FILE).display().to_string()),
        "{text}"
    );
    assert!(text.contains("samefile"), "{text}");
    assert_eq!(files(&dir), before, "nothing changed");
    // Once the other name is gone the checkpoint opens as before.
    fs::remove_file(&other).unwrap();
    let (cp, _) = open(&dir);
    assert_eq!(cp.record_count(), 3);
}
