//! Loading the checkpoint: read both files, check them and replay the log, changing nothing.
//! What a crash left to repair is noted in the [`Loaded`] result and done by [`Loaded::open`].

use std::path::{Path, PathBuf};

use cdi::{Dir, DirError};
use serde::Deserialize;

use super::commit::temp_name;
use super::error::CheckpointError;
use super::files::read_bounded;
use super::format::{
    FORMAT_VERSION, Header, HeaderError, MAX_HEADER_BOOT_ID, SNAPSHOT_MAGIC, WAL_MAGIC,
    scan_entries,
};
use super::loaded::{History, Loaded, Repair};
use super::{
    Change, Checkpoint, OpenReport, Payload, SNAPSHOT_FILE, State, TornTailReport, WAL_FILE,
};

/// An entry of a version 2 snapshot, as read.
#[derive(Deserialize)]
enum SnapshotEntry<R, U> {
    Record(String, u64, R),
    Pending(String, U),
    End {
        records: u64,
        pending: u64,
        seq: u64,
    },
}

/// An entry of a version 1 snapshot (no sequence numbers), as read.
#[derive(Deserialize)]
enum SnapshotEntryV1<R, U> {
    Record(String, R),
    Pending(String, U),
    End { records: u64, pending: u64 },
}

/// A version 2 log entry: one numbered commit.
#[derive(Deserialize)]
struct WalEntry<R, U> {
    seq: u64,
    changes: Vec<Change<R, U>>,
}

/// Builds the errors of one load, naming the file and the directory.
struct Errors<'a> {
    dir: &'a Path,
}

impl Errors<'_> {
    fn corrupt(&self, name: &str, reason: String) -> CheckpointError {
        CheckpointError::Corrupt {
            path: self.dir.join(name),
            dir: self.dir.to_owned(),
            reason,
        }
    }

    fn header(&self, name: &str, e: HeaderError) -> CheckpointError {
        match e {
            HeaderError::Invalid(reason) => self.corrupt(name, reason),
            HeaderError::Version(found) => CheckpointError::UnsupportedVersion {
                path: self.dir.join(name),
                dir: self.dir.to_owned(),
                found,
                supported: FORMAT_VERSION,
            },
        }
    }
}

fn check_boot_id(boot_id: &str) -> Result<(), CheckpointError> {
    let reason = if boot_id.is_empty() {
        "it is empty"
    } else if boot_id.len() > MAX_HEADER_BOOT_ID {
        "it is longer than 128 bytes"
    } else if !boot_id.chars().all(|c| c.is_ascii_graphic()) {
        "it holds characters other than printable ASCII"
    } else {
        return Ok(());
    };
    Err(CheckpointError::InvalidBootId {
        boot_id: boot_id.chars().take(200).collect(),
        reason,
    })
}

fn load_snapshot<R: Payload, U: Payload>(
    bytes: &[u8],
    errors: &Errors<'_>,
    state: &mut State<R, U>,
) -> Result<Header, CheckpointError> {
    let name = SNAPSHOT_FILE;
    let (header, start) =
        Header::decode(&SNAPSHOT_MAGIC, bytes).map_err(|e| errors.header(name, e))?;
    let scan = scan_entries(bytes, start)
        .map_err(|d| errors.corrupt(name, format!("at byte {}: {}", d.offset, d.reason)))?;
    if let Some(torn) = scan.torn {
        return Err(errors.corrupt(
            name,
            format!(
                "it ends in a damaged entry at byte {}: {}",
                torn.offset, torn.reason
            ),
        ));
    }
    let mut ended = false;
    for (offset, payload) in scan.entries {
        if ended {
            return Err(errors.corrupt(
                name,
                format!("an entry at byte {offset} follows the end marker"),
            ));
        }
        let undecodable = |e: serde_json::Error| {
            errors.corrupt(
                name,
                format!("the entry at byte {offset} does not decode: {e}"),
            )
        };
        let entry = if header.version == 1 {
            match serde_json::from_slice(payload).map_err(undecodable)? {
                SnapshotEntryV1::Record(uid, r) => SnapshotEntry::Record(uid, 0, r),
                SnapshotEntryV1::Pending(id, u) => SnapshotEntry::Pending(id, u),
                SnapshotEntryV1::End { records, pending } => SnapshotEntry::End {
                    records,
                    pending,
                    seq: 0,
                },
            }
        } else {
            serde_json::from_slice(payload).map_err(undecodable)?
        };
        match entry {
            SnapshotEntry::Record(uid, seq, record) => {
                state.records.insert(uid, (seq, record));
            }
            SnapshotEntry::Pending(id, update) => {
                state.pending.insert(id, update);
            }
            SnapshotEntry::End {
                records,
                pending,
                seq,
            } => {
                if records != state.records.len() as u64 || pending != state.pending.len() as u64 {
                    return Err(errors.corrupt(
                        name,
                        format!(
                            "the end marker counts {records} records and {pending} pending updates, the file holds {} and {}",
                            state.records.len(),
                            state.pending.len()
                        ),
                    ));
                }
                if let Some((uid, (newer, _))) = state.records.iter().find(|(_, (s, _))| *s > seq) {
                    return Err(errors.corrupt(
                        name,
                        format!(
                            "the record of {uid} comes from commit {newer}, after the last commit {seq} the snapshot says it holds"
                        ),
                    ));
                }
                state.seq = seq;
                ended = true;
            }
        }
    }
    if !ended {
        return Err(errors.corrupt(name, "it has no end marker (it was cut short)".into()));
    }
    Ok(header)
}

/// Replays the entries of a log of the snapshot's generation onto `state`; answers where the
/// good entries end and the torn tail, if any.
fn replay_wal<R: Payload, U: Payload>(
    bytes: &[u8],
    header: &Header,
    start: usize,
    errors: &Errors<'_>,
    state: &mut State<R, U>,
) -> Result<(u64, Option<TornTailReport>), CheckpointError> {
    let name = WAL_FILE;
    let scan = scan_entries(bytes, start)
        .map_err(|d| errors.corrupt(name, format!("at byte {}: {}", d.offset, d.reason)))?;
    for (offset, payload) in scan.entries {
        let undecodable = |e: serde_json::Error| {
            errors.corrupt(
                name,
                format!("the entry at byte {offset} does not decode: {e}"),
            )
        };
        let expected = state.seq + 1;
        let (seq, changes) = if header.version == 1 {
            let changes: Vec<Change<R, U>> =
                serde_json::from_slice(payload).map_err(undecodable)?;
            (expected, changes)
        } else {
            let entry: WalEntry<R, U> = serde_json::from_slice(payload).map_err(undecodable)?;
            (entry.seq, entry.changes)
        };
        if seq != expected {
            return Err(errors.corrupt(
                name,
                format!(
                    "the entry at byte {offset} is commit {seq} where commit {expected} belongs: commits are missing, repeated or out of order"
                ),
            ));
        }
        for change in changes {
            state.apply(change, seq);
        }
        state.seq = seq;
    }
    let good = scan.torn.as_ref().map_or(bytes.len(), |t| t.offset) as u64;
    let torn = scan.torn.map(|t| TornTailReport {
        offset: t.offset as u64,
        bytes: bytes.len() as u64 - t.offset as u64,
        entries: u64::from(!bytes[t.offset..].iter().all(|b| *b == 0)),
        kept_seq: state.seq,
        reason: t.reason,
    });
    Ok((good, torn))
}

/// Why the checkpoint directory at `path` could not be opened: one the kernel refused to open
/// (permissions, I/O) is unreadable, like a file that cannot be read; a link or a file in its
/// place is a wrong directory.
fn dir_error(path: PathBuf, e: DirError) -> CheckpointError {
    match e {
        DirError::Io { source, .. } => CheckpointError::Unreadable {
            what: "directory",
            path,
            source,
        },
        other => CheckpointError::Dir {
            path,
            reason: other.to_string(),
        },
    }
}

impl<R: Payload, U: Payload> Checkpoint<R, U> {
    /// Reads and checks the checkpoint in the directory `dir` without changing anything: a
    /// missing directory or missing files load as an empty checkpoint (`created` in the
    /// report). A symbolic link as the directory is refused. See [`Checkpoint::load_in`].
    pub fn load(dir: &Path, boot_id: &str) -> Result<Loaded<R, U>, CheckpointError> {
        match Dir::open(dir) {
            Ok(d) => Self::load_in(d, boot_id),
            Err(DirError::Missing { .. }) => {
                check_boot_id(boot_id)?;
                Ok(Loaded::empty(Err(dir.to_owned()), boot_id))
            }
            Err(e) => Err(dir_error(dir.to_owned(), e)),
        }
    }

    /// [`Checkpoint::load_in`] of the directory `name` inside `parent`, opened through the
    /// parent's handle; a missing directory loads as an empty checkpoint and is created only by
    /// [`Loaded::open`], so a start refused after the load leaves nothing behind.
    pub fn load_child(
        parent: &Dir,
        name: &str,
        boot_id: &str,
    ) -> Result<Loaded<R, U>, CheckpointError> {
        match parent.child(name, None) {
            Ok((d, _)) => Self::load_in(d, boot_id),
            Err(DirError::Missing { .. }) => {
                check_boot_id(boot_id)?;
                Ok(Loaded::empty(Err(parent.display(name)), boot_id))
            }
            Err(e) => Err(dir_error(parent.display(name), e)),
        }
    }

    /// Reads and checks the checkpoint in the opened directory `dir` for the boot `boot_id`,
    /// changing nothing.
    ///
    /// - A partially written last log entry (a crash during a commit) is noted as a torn tail
    ///   (cut off by [`Loaded::open`]); earlier entries are kept.
    /// - Files written under another boot id load as an empty state (the containers the records
    ///   describe are gone); the dropped records and pending updates are counted, and the
    ///   history (last sequence number) carries over.
    /// - A corrupt file (bad magic, header, snapshot, an entry in the middle of the log, a
    ///   commit missing from the numbering) or one of another format version is an error
    ///   naming the file and the way out.
    /// - A file that cannot be read is an error.
    ///
    /// The caller holds the [node lock](crate::nodelock) around load, open and every
    /// read-modify-write.
    pub fn load_in(dir: Dir, boot_id: &str) -> Result<Loaded<R, U>, CheckpointError> {
        check_boot_id(boot_id)?;
        let dir_path = dir.path().to_owned();
        let errors = Errors { dir: &dir_path };
        let mut report = OpenReport::default();
        let snap_bytes = read_bounded(&dir, SNAPSHOT_FILE)?;
        let wal_bytes = read_bounded(&dir, WAL_FILE)?;
        let mut state = State::<R, U>::default();
        let snap_header = match &snap_bytes {
            Some(bytes) => Some(load_snapshot(bytes, &errors, &mut state)?),
            None => None,
        };
        let mut keep_wal: Option<(u64, u64)> = None;
        let mut file_boot: Option<String> = None;
        let mut last_generation = 0;
        match (&snap_header, &wal_bytes) {
            (None, None) => report.created = true,
            (None, Some(_)) => {
                return Err(errors.corrupt(
                    SNAPSHOT_FILE,
                    format!(
                        "it is missing while the log {} exists, so the records written before the log began are lost",
                        dir_path.join(WAL_FILE).display()
                    ),
                ));
            }
            (Some(snap), None) => {
                report.wal_missing = true;
                file_boot = Some(snap.boot_id.clone());
                last_generation = snap.generation;
            }
            (Some(snap), Some(bytes)) => {
                let (wal, start) =
                    Header::decode(&WAL_MAGIC, bytes).map_err(|e| errors.header(WAL_FILE, e))?;
                file_boot = Some(snap.boot_id.clone());
                last_generation = snap.generation.max(wal.generation);
                if wal.generation > snap.generation {
                    return Err(errors.corrupt(
                        WAL_FILE,
                        format!(
                            "its generation {} is newer than the generation {} of the snapshot {}",
                            wal.generation,
                            snap.generation,
                            dir_path.join(SNAPSHOT_FILE).display()
                        ),
                    ));
                } else if wal.generation < snap.generation {
                    // A crash during compaction: the snapshot holds all of it.
                    report.stale_wal_replaced = true;
                } else {
                    if wal.boot_id != snap.boot_id {
                        return Err(errors.corrupt(
                            WAL_FILE,
                            format!(
                                "its boot id {:?} differs from the boot id {:?} of the snapshot of the same generation",
                                wal.boot_id, snap.boot_id
                            ),
                        ));
                    }
                    if wal.version != snap.version {
                        return Err(errors.corrupt(
                            WAL_FILE,
                            format!(
                                "its format version {} differs from the version {} of the snapshot of the same generation",
                                wal.version, snap.version
                            ),
                        ));
                    }
                    let (good, torn) = replay_wal(bytes, &wal, start, &errors, &mut state)?;
                    report.torn_tail = torn;
                    keep_wal = Some((wal.generation, good));
                }
            }
        }
        let history = History {
            boot_id: file_boot.clone(),
            seq: state.seq,
        };
        if let Some(snap) = &snap_header
            && snap.version < FORMAT_VERSION
        {
            report.upgraded_from = Some(snap.version);
            keep_wal = None;
        }
        if let Some(previous) = file_boot.filter(|b| b != boot_id) {
            report.dropped_records = state.records.len();
            report.dropped_pending = state.pending.len();
            report.previous_boot_id = Some(previous);
            let seq = state.seq;
            state = State::default();
            state.seq = seq;
            keep_wal = None;
        }
        let mut temps = Vec::new();
        for name in [temp_name(SNAPSHOT_FILE), temp_name(WAL_FILE)] {
            match dir.stat(&name) {
                Ok(Some(_)) => temps.push(name),
                Ok(None) => {}
                Err(source) => {
                    return Err(CheckpointError::Unreadable {
                        what: "file",
                        path: dir.display(&name),
                        source,
                    });
                }
            }
        }
        report.records = state.records.len();
        report.pending = state.pending.len();
        let repair = Repair {
            keep_wal,
            last_generation,
            snapshot_len: snap_bytes.as_ref().map_or(0, |b| b.len() as u64),
            temps,
        };
        Ok(Loaded::new(
            Ok(dir),
            boot_id,
            state,
            report,
            history,
            repair,
        ))
    }
}
