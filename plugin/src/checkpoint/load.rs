//! Opening the checkpoint: read both files, check them, replay the log, and
//! only then repair what a crash may have left (a torn tail, a stale log,
//! temp files). Nothing is changed when a file cannot be read or is corrupt.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, RwLock};

use serde::Deserialize;

use super::commit::{install_generation, temp_path};
use super::error::CheckpointError;
use super::files::{ensure_dir, read_bounded};
use super::format::{
    FORMAT_VERSION, Header, HeaderError, MAX_HEADER_BOOT_ID, SNAPSHOT_MAGIC, WAL_MAGIC,
    scan_entries,
};
use super::{
    Change, Checkpoint, CheckpointOptions, OpenReport, Payload, Queue, SNAPSHOT_FILE, State,
    TornTailReport, WAL_FILE, Wal,
};

/// An entry of the snapshot file, as read.
#[derive(Deserialize)]
enum SnapshotEntry<R, U> {
    Record(String, R),
    Pending(String, U),
    End { records: u64, pending: u64 },
}

/// Builds the errors of one open, naming the file and the directory.
struct Errors<'a> {
    dir: &'a Path,
}

impl Errors<'_> {
    fn corrupt(&self, path: &Path, reason: String) -> CheckpointError {
        CheckpointError::Corrupt {
            path: path.to_owned(),
            dir: self.dir.to_owned(),
            reason,
        }
    }

    fn header(&self, path: &Path, e: HeaderError) -> CheckpointError {
        match e {
            HeaderError::Invalid(reason) => self.corrupt(path, reason),
            HeaderError::Version(found) => CheckpointError::UnsupportedVersion {
                path: path.to_owned(),
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
    path: &Path,
    errors: &Errors<'_>,
    state: &mut State<R, U>,
) -> Result<Header, CheckpointError> {
    let (header, start) =
        Header::decode(&SNAPSHOT_MAGIC, bytes).map_err(|e| errors.header(path, e))?;
    let scan = scan_entries(bytes, start)
        .map_err(|d| errors.corrupt(path, format!("at byte {}: {}", d.offset, d.reason)))?;
    if let Some(torn) = scan.torn {
        return Err(errors.corrupt(
            path,
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
                path,
                format!("an entry at byte {offset} follows the end marker"),
            ));
        }
        let entry: SnapshotEntry<R, U> = serde_json::from_slice(payload).map_err(|e| {
            errors.corrupt(
                path,
                format!("the entry at byte {offset} does not decode: {e}"),
            )
        })?;
        match entry {
            SnapshotEntry::Record(uid, record) => {
                state.records.insert(uid, record);
            }
            SnapshotEntry::Pending(id, update) => {
                state.pending.insert(id, update);
            }
            SnapshotEntry::End { records, pending } => {
                if records != state.records.len() as u64 || pending != state.pending.len() as u64 {
                    return Err(errors.corrupt(
                        path,
                        format!(
                            "the end marker counts {records} records and {pending} pending updates, the file holds {} and {}",
                            state.records.len(),
                            state.pending.len()
                        ),
                    ));
                }
                ended = true;
            }
        }
    }
    if !ended {
        return Err(errors.corrupt(path, "it has no end marker (it was cut short)".into()));
    }
    Ok(header)
}

impl<R: Payload, U: Payload> Checkpoint<R, U> {
    /// Opens (or creates) the checkpoint in `dir` for the boot `boot_id`.
    ///
    /// - A partially written last log entry (a crash during a commit) is cut
    ///   off and reported; earlier entries are kept.
    /// - Files written under another boot id are replaced by an empty state;
    ///   the dropped records and pending updates are counted in the report.
    /// - A corrupt file (bad magic, header, snapshot or an entry in the middle
    ///   of the log) or one of another format version is an error naming the
    ///   file and the way out; nothing is changed.
    /// - A file that cannot be read is an error; nothing is changed or deleted.
    ///
    /// The caller holds the [node lock](crate::nodelock) around open and every
    /// read-modify-write.
    pub fn open_with(
        dir: &Path,
        boot_id: &str,
        options: CheckpointOptions,
    ) -> Result<(Self, OpenReport), CheckpointError> {
        check_boot_id(boot_id)?;
        let errors = Errors { dir };
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let wal_path = dir.join(WAL_FILE);
        let mut report = OpenReport::default();
        ensure_dir(dir)?;

        // Read everything before changing anything.
        let snap_bytes = read_bounded(&snapshot_path, dir)?;
        let wal_bytes = read_bounded(&wal_path, dir)?;
        let mut state = State::<R, U>::default();
        let snap_header = match &snap_bytes {
            Some(bytes) => Some(load_snapshot(bytes, &snapshot_path, &errors, &mut state)?),
            None => None,
        };
        // (generation, length of the good entries, torn tail) of a log to keep.
        let mut keep_wal: Option<(u64, u64)> = None;
        let mut file_boot: Option<String> = None;
        let mut last_generation = 0;
        match (&snap_header, &wal_bytes) {
            (None, None) => report.created = true,
            (None, Some(_)) => {
                return Err(errors.corrupt(
                    &snapshot_path,
                    format!(
                        "it is missing while the log {} exists, so the records written before the log began are lost",
                        wal_path.display()
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
                    Header::decode(&WAL_MAGIC, bytes).map_err(|e| errors.header(&wal_path, e))?;
                file_boot = Some(snap.boot_id.clone());
                last_generation = snap.generation.max(wal.generation);
                if wal.generation > snap.generation {
                    return Err(errors.corrupt(
                        &wal_path,
                        format!(
                            "its generation {} is newer than the generation {} of the snapshot {}",
                            wal.generation,
                            snap.generation,
                            snapshot_path.display()
                        ),
                    ));
                } else if wal.generation < snap.generation {
                    // A crash during compaction: the snapshot holds all of it.
                    report.stale_wal_replaced = true;
                } else {
                    if wal.boot_id != snap.boot_id {
                        return Err(errors.corrupt(
                            &wal_path,
                            format!(
                                "its boot id {:?} differs from the boot id {:?} of the snapshot of the same generation",
                                wal.boot_id, snap.boot_id
                            ),
                        ));
                    }
                    let scan = scan_entries(bytes, start).map_err(|d| {
                        errors.corrupt(&wal_path, format!("at byte {}: {}", d.offset, d.reason))
                    })?;
                    for (offset, payload) in scan.entries {
                        let changes: Vec<Change<R, U>> =
                            serde_json::from_slice(payload).map_err(|e| {
                                errors.corrupt(
                                    &wal_path,
                                    format!("the entry at byte {offset} does not decode: {e}"),
                                )
                            })?;
                        for change in changes {
                            state.apply(change);
                        }
                    }
                    let good = scan.torn.as_ref().map_or(bytes.len(), |t| t.offset) as u64;
                    if let Some(torn) = scan.torn {
                        report.torn_tail = Some(TornTailReport {
                            offset: torn.offset as u64,
                            bytes: bytes.len() as u64 - torn.offset as u64,
                            reason: torn.reason,
                        });
                    }
                    keep_wal = Some((wal.generation, good));
                }
            }
        }
        if let Some(previous) = file_boot.filter(|b| b != boot_id) {
            report.dropped_records = state.records.len();
            report.dropped_pending = state.pending.len();
            tracing::warn!(
                dir = %dir.display(),
                previous_boot_id = %previous,
                boot_id,
                dropped_records = report.dropped_records,
                dropped_pending = report.dropped_pending,
                "the node rebooted since the checkpoint was written: its records and pending container updates describe containers that are gone and are dropped"
            );
            report.previous_boot_id = Some(previous);
            state = State::default();
            keep_wal = None;
        }

        // Repair: only now is anything written or removed.
        for temp in [temp_path(&snapshot_path), temp_path(&wal_path)] {
            match fs::remove_file(&temp) {
                Ok(()) => {
                    tracing::warn!(file = %temp.display(), "removed the temp file of an interrupted checkpoint compaction");
                    report.removed_temp_files.push(temp);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CheckpointError::Io {
                        op: "removing",
                        path: temp,
                        source,
                    });
                }
            }
        }
        let io = |op, path: &PathBuf| {
            let path = path.clone();
            move |source| CheckpointError::Io { op, path, source }
        };
        let wal = match keep_wal {
            Some((generation, good)) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&wal_path)
                    .map_err(io("opening", &wal_path))?;
                if let Some(torn) = &report.torn_tail {
                    tracing::warn!(
                        file = %wal_path.display(),
                        offset = torn.offset,
                        bytes = torn.bytes,
                        reason = %torn.reason,
                        "cut off the partially written last entry of the checkpoint log (a crash during a commit that had not returned)"
                    );
                    file.set_len(good).map_err(io("truncating", &wal_path))?;
                    file.sync_data().map_err(io("syncing", &wal_path))?;
                }
                Wal {
                    file,
                    len: good,
                    generation,
                    snapshot_len: snap_bytes.as_ref().map_or(0, |b| b.len() as u64),
                }
            }
            None => {
                if report.stale_wal_replaced {
                    tracing::warn!(file = %wal_path.display(), "replacing a checkpoint log older than the snapshot (a crash during compaction); the snapshot holds its entries");
                }
                if report.wal_missing {
                    tracing::warn!(file = %wal_path.display(), "the checkpoint log is missing; starting a new one after the snapshot");
                }
                let header = Header {
                    generation: last_generation + 1,
                    boot_id: boot_id.to_owned(),
                };
                install_generation(dir, &snapshot_path, &wal_path, &state, &header, &|_| {})
                    .map_err(|e| CheckpointError::Io {
                        op: "writing a new generation of the checkpoint in",
                        path: dir.to_owned(),
                        source: std::io::Error::other(e.message),
                    })?
            }
        };
        report.records = state.records.len();
        report.pending = state.pending.len();
        let checkpoint = Checkpoint {
            dir: dir.to_owned(),
            snapshot_path,
            wal_path,
            boot_id: boot_id.to_owned(),
            options,
            state: RwLock::new(state),
            wal: Mutex::new(wal),
            queue: Mutex::new(Queue {
                next_ticket: 0,
                waiting: Vec::new(),
                leader: false,
                results: Default::default(),
                poisoned: None,
                stats: Default::default(),
            }),
            written: Condvar::new(),
            hook: Mutex::new(None),
        };
        Ok((checkpoint, report))
    }
}
