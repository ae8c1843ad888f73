//! What the disk hands back (issue 13): a populated state dir whose checkpoint log is cut at
//! every entry boundary and in the middle of every entry, replaced by an older copy, or whose
//! snapshot is from before the last claims. Each either starts with every acknowledged grant
//! intact or refuses to start naming the spec files and the checkpoint, and never removes a
//! spec of an acknowledged claim. A torn last entry (a crash during a commit) still starts, and
//! the refusal's way out (moving the named specs aside) works.

mod engine_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use engine_common::*;
use nri_accel::checkpoint::{Checkpoint, CheckpointOptions};
use nri_accel::engine::{ClaimRecord, Engine, EngineError, PendingUpdate};

const DEVICES: usize = 16;
const HELD: usize = 12;

/// Bytes of every file under `dir`, by relative path.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in tree(from) {
        let p = to.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

/// A node with `HELD` acknowledged claims (14 prepared, 2 of them unprepared again).
async fn populate(d: &Dirs, options: CheckpointOptions) -> BTreeSet<String> {
    let journal = Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let (engine, _) =
        Engine::start_with(node(DEVICES, 0), journal, store(d), None, options).unwrap();
    let mut held = BTreeSet::new();
    for i in 0..HELD + 2 {
        let uid = format!("claim-{i:02}");
        engine
            .prepare(claim_for(&uid, &format!("gpu{i}")))
            .await
            .unwrap();
        held.insert(uid);
        if i == 3 || i == 8 {
            let gone = format!("claim-{:02}", i - 1);
            engine.unprepare(&gone).await.unwrap();
            held.remove(&gone);
        }
    }
    assert_eq!(held.len(), HELD);
    held
}

/// Offsets where the log's entries start, and its length.
fn entry_starts(wal: &[u8]) -> Vec<usize> {
    let header = 8 + 4 + 8 + 1 + wal[20] as usize + 4;
    let mut starts = Vec::new();
    let mut pos = header;
    while pos < wal.len() {
        starts.push(pos);
        let len = u32::from_le_bytes(wal[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 12 + len;
    }
    starts.push(wal.len());
    starts
}

/// Starts on a copy of the populated dirs after `damage`; checks the outcome against `held`.
/// Returns whether startup refused.
fn start_after(
    populated: &Dirs,
    held: &BTreeSet<String>,
    what: &str,
    damage: impl FnOnce(&Dirs),
) -> bool {
    let d = dirs();
    copy_tree(&populated.state, &d.state);
    copy_tree(&populated.cdi, &d.cdi);
    damage(&d);
    let state_before = tree(&d.state);
    let specs_before = spec_uids(&d);
    let journal = match Checkpoint::load(&d.state.join("checkpoint"), BOOT) {
        Ok(j) => j,
        Err(e) => {
            // A corrupt file: refused with the checkpoint's own message; nothing changed.
            assert!(e.to_string().contains("Way out"), "{what}: {e}");
            assert_eq!(spec_uids(&d), specs_before, "{what}");
            return true;
        }
    };
    match Engine::start(node(DEVICES, 0), journal, store(&d), None) {
        Ok((engine, _)) => {
            let restored: BTreeSet<String> = engine
                .claims()
                .into_iter()
                .map(|(a, _)| a.claim_uid)
                .collect();
            assert_eq!(
                &restored, held,
                "{what}: every acknowledged grant is intact"
            );
            let specs: BTreeSet<String> = spec_uids(&d).into_iter().collect();
            assert_eq!(
                &specs, held,
                "{what}: the specs of acknowledged claims stay"
            );
            false
        }
        Err(e) => {
            assert!(matches!(e, EngineError::LostHistory { .. }), "{what}: {e}");
            let msg = e.to_string();
            assert!(msg.contains("refusing to start"), "{what}: {msg}");
            assert!(msg.contains(&d.cdi.display().to_string()), "{what}: {msg}");
            assert!(
                msg.contains(&d.state.join("checkpoint").display().to_string()),
                "{what}: {msg}"
            );
            assert!(msg.contains("accel.nri.io-device_"), "{what}: {msg}");
            assert_eq!(spec_uids(&d), specs_before, "{what}: no spec removed");
            assert_eq!(tree(&d.state), state_before, "{what}: nothing changed");
            true
        }
    }
}

#[tokio::test]
async fn a_log_cut_at_every_boundary_and_inside_every_entry_never_loses_a_grant() {
    let populated = dirs();
    let held = populate(&populated, CheckpointOptions::default()).await;
    let wal_path = populated.state.join("checkpoint/wal");
    let wal = std::fs::read(&wal_path).unwrap();
    let starts = entry_starts(&wal);
    let (mut refused, mut started) = (0, 0);
    let mut cuts: Vec<usize> = Vec::new();
    for w in starts.windows(2) {
        cuts.push(w[0]); // at the boundary
        cuts.push(w[0] + 5); // inside the entry header
        cuts.push((w[0] + w[1]) / 2); // inside the payload
    }
    cuts.push(20); // inside the header
    for cut in cuts {
        let what = format!("log cut at byte {cut} of {}", wal.len());
        if start_after(&populated, &held, &what, |d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.state.join("checkpoint/wal"))
                .unwrap();
            f.set_len(cut as u64).unwrap();
        }) {
            refused += 1;
        } else {
            started += 1;
        }
    }
    // Cutting only the last entry (the last unprepare came before the last prepare, so every
    // cut loses a prepare whose spec exists): everything refuses except the intact log.
    assert!(refused > 30, "refused {refused}, started {started}");
    assert!(!start_after(&populated, &held, "intact", |_| {}));
}

#[tokio::test]
async fn a_log_replaced_by_an_older_copy_refuses_naming_the_newer_specs() {
    let populated = dirs();
    let journal = Checkpoint::load(&populated.state.join("checkpoint"), BOOT).unwrap();
    let (engine, _) = Engine::start(node(DEVICES, 0), journal, store(&populated), None).unwrap();
    for i in 0..6 {
        engine
            .prepare(claim_for(&format!("early-{i}"), &format!("gpu{i}")))
            .await
            .unwrap();
    }
    let old = std::fs::read(populated.state.join("checkpoint/wal")).unwrap();
    for i in 6..12 {
        engine
            .prepare(claim_for(&format!("late-{i}"), &format!("gpu{i}")))
            .await
            .unwrap();
    }
    drop(engine);
    let held: BTreeSet<String> = spec_uids(&populated).into_iter().collect();
    let d = dirs();
    copy_tree(&populated.state, &d.state);
    copy_tree(&populated.cdi, &d.cdi);
    std::fs::write(d.state.join("checkpoint/wal"), &old).unwrap();
    let journal = Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let err = Engine::start(node(DEVICES, 0), journal, store(&d), None)
        .err()
        .expect("refused");
    let msg = err.to_string();
    for i in 6..12 {
        assert!(msg.contains(&format!("late-{i}")), "{msg}");
    }
    assert!(!msg.contains("early-"), "{msg}");
    assert!(msg.contains("6 CDI spec file(s)"), "{msg}");
    assert_eq!(spec_uids(&d).into_iter().collect::<BTreeSet<_>>(), held);
    // The same through the generic check.
    assert!(start_after(&populated, &held, "older log", |d| {
        std::fs::write(d.state.join("checkpoint/wal"), &old).unwrap();
    }));
}

#[tokio::test]
async fn a_snapshot_from_before_the_last_claims_never_loses_a_grant() {
    let populated = dirs();
    // Compact after every few commits, so snapshots and logs change generations.
    let options = CheckpointOptions {
        compact_min_bytes: 1,
    };
    let mut saved = Vec::new();
    let journal = Checkpoint::load(&populated.state.join("checkpoint"), BOOT).unwrap();
    let (engine, _) =
        Engine::start_with(node(DEVICES, 0), journal, store(&populated), None, options).unwrap();
    for i in 0..HELD {
        engine
            .prepare(claim_for(&format!("claim-{i:02}"), &format!("gpu{i}")))
            .await
            .unwrap();
        saved.push(tree(&populated.state.join("checkpoint")));
    }
    drop(engine);
    let held: BTreeSet<String> = spec_uids(&populated).into_iter().collect();
    for (i, old) in saved.iter().enumerate().take(HELD - 1) {
        // Both files from before the last claims.
        assert!(start_after(
            &populated,
            &held,
            &format!("state after claim {i}"),
            |d| {
                for (rel, bytes) in old {
                    std::fs::write(d.state.join("checkpoint").join(rel), bytes).unwrap();
                }
            }
        ));
        // Only the snapshot from before (the log is the current one).
        let snap = old.get(Path::new("snapshot")).unwrap().clone();
        start_after(
            &populated,
            &held,
            &format!("snapshot after claim {i}"),
            |d| {
                std::fs::write(d.state.join("checkpoint/snapshot"), &snap).unwrap();
            },
        );
    }
}

#[tokio::test]
async fn a_torn_last_entry_from_a_crash_still_starts_and_says_how_much_was_cut() {
    let d = dirs();
    let held = populate(&d, CheckpointOptions::default()).await;
    let wal = d.state.join("checkpoint/wal");
    // A commit that never returned: half of an entry at the end (no spec can carry it).
    let bytes = std::fs::read(&wal).unwrap();
    let starts = entry_starts(&bytes);
    let last = &bytes[starts[starts.len() - 2]..];
    let mut torn = bytes.clone();
    torn.extend_from_slice(&last[..last.len() / 2]);
    std::fs::write(&wal, &torn).unwrap();
    let loaded =
        Checkpoint::<ClaimRecord, PendingUpdate>::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let t = loaded.report().torn_tail.clone().expect("torn tail found");
    assert_eq!(t.bytes, (last.len() / 2) as u64);
    assert_eq!(t.entries, 1);
    assert_eq!(t.kept_seq, loaded.history().seq);
    // Loading changed nothing; starting cuts it and keeps every grant.
    assert_eq!(std::fs::read(&wal).unwrap(), torn);
    let (engine, _) = Engine::start(node(DEVICES, 0), loaded, store(&d), None).unwrap();
    let restored: BTreeSet<String> = engine
        .claims()
        .into_iter()
        .map(|(a, _)| a.claim_uid)
        .collect();
    assert_eq!(restored, held);
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        bytes,
        "the torn bytes were cut"
    );
}

#[tokio::test]
async fn a_lost_checkpoint_refuses_and_moving_the_named_specs_aside_is_the_way_out() {
    let d = dirs();
    let held = populate(&d, CheckpointOptions::default()).await;
    std::fs::rename(
        d.state.join("checkpoint"),
        d.state.join("checkpoint.corrupt"),
    )
    .unwrap();
    let err = open_with(&d, DEVICES, 0, None).err().expect("refused");
    assert!(err.to_string().contains("the checkpoint is empty"), "{err}");
    assert!(!d.state.join("checkpoint").exists(), "nothing created");
    assert_eq!(spec_uids(&d).len(), held.len());
    // The way out: the listed specs moved aside (kept), then a clean start.
    let aside = d.state.join("lost-specs");
    std::fs::create_dir(&aside).unwrap();
    for e in std::fs::read_dir(&d.cdi).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), aside.join(e.file_name())).unwrap();
    }
    let (engine, _) = open_with(&d, DEVICES, 0, None).unwrap();
    assert!(engine.claims().is_empty());
}

#[tokio::test]
async fn a_reboot_voids_specs_of_the_old_boot_but_never_specs_of_this_one() {
    let d = dirs();
    populate(&d, CheckpointOptions::default()).await;
    // The CDI dir survived a reboot (a persistent directory): the old boot's specs are void.
    let journal = Checkpoint::load(&d.state.join("checkpoint"), "boot-2").unwrap();
    let (engine, report) = Engine::start(node(DEVICES, 0), journal, store(&d), None).unwrap();
    assert!(engine.claims().is_empty());
    assert_eq!(report.plan.remove_specs.len(), HELD);
    assert!(spec_uids(&d).is_empty());
    // A spec of this boot that the checkpoint (of this boot now) does not hold refuses.
    let high = 1_000;
    store(&d)
        .write_stamped(
            "late",
            &cdi::Stamp {
                seq: high,
                boot_id: "boot-2".into(),
            },
            &[cdi::DeviceEdits {
                env: vec![("A".into(), "1".into())],
                ..Default::default()
            }],
        )
        .unwrap();
    drop(engine);
    let journal = Checkpoint::load(&d.state.join("checkpoint"), "boot-2").unwrap();
    let err = Engine::start(node(DEVICES, 0), journal, store(&d), None)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("commit 1000"), "{err}");
}
