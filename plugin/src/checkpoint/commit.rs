//! Commits (group commit: one leader writes and syncs every queued commit)
//! and compaction of the log into a new snapshot.

use std::fs;
use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::Path;
use std::sync::{Arc, PoisonError};

use serde::Serialize;

use super::error::CheckpointError;
use super::files::{sync_dir, write_synced};
use super::format::{Header, MAX_ENTRY_BYTES, SNAPSHOT_MAGIC, WAL_MAGIC, encode_entry, framed_len};
use super::{
    BatchError, Change, Checkpoint, CheckpointStep, Payload, Queued, State, TEMP_SUFFIX, Wal, lock,
};

/// An entry of the snapshot file, as written (borrowing the state).
#[derive(Serialize)]
pub(super) enum SnapshotEntryRef<'a, R, U> {
    Record(&'a str, &'a R),
    Pending(&'a str, &'a U),
    End { records: u64, pending: u64 },
}

/// Encodes the whole state as a snapshot file of `header`.
pub(super) fn encode_snapshot<R: Serialize, U: Serialize>(
    state: &State<R, U>,
    header: &Header,
) -> Result<Vec<u8>, String> {
    let mut out = header.encode(&SNAPSHOT_MAGIC);
    let mut put = |entry: SnapshotEntryRef<'_, R, U>| -> Result<(), String> {
        let payload = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
        if payload.len() > MAX_ENTRY_BYTES {
            return Err(format!(
                "a snapshot entry encodes to {} bytes, over the cap",
                payload.len()
            ));
        }
        encode_entry(&payload, &mut out);
        Ok(())
    };
    for (uid, record) in &state.records {
        put(SnapshotEntryRef::Record(uid, record))?;
    }
    for (id, update) in &state.pending {
        put(SnapshotEntryRef::Pending(id, update))?;
    }
    put(SnapshotEntryRef::End {
        records: state.records.len() as u64,
        pending: state.pending.len() as u64,
    })?;
    Ok(out)
}

pub(super) fn temp_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(TEMP_SUFFIX);
    name.into()
}

/// A compaction failure: `fatal` when the files on disk no longer match the
/// open log, so further appends could be lost.
pub(super) struct CompactError {
    pub fatal: bool,
    pub message: String,
}

impl<R: Payload, U: Payload> Checkpoint<R, U> {
    /// Saves `changes` durably and applies them to the state; when it returns
    /// `Ok` they survive a crash. Thread-safe: concurrent callers are batched
    /// into one write and one fdatasync by whichever of them leads.
    pub fn commit(&self, changes: Vec<Change<R, U>>) -> Result<(), CheckpointError> {
        if changes.is_empty() {
            return Ok(());
        }
        let payload = serde_json::to_vec(&changes).map_err(CheckpointError::Encode)?;
        if payload.len() > MAX_ENTRY_BYTES {
            return Err(CheckpointError::EntryTooLarge {
                size: payload.len(),
                max: MAX_ENTRY_BYTES,
            });
        }
        let mut frame = Vec::with_capacity(framed_len(payload.len()));
        encode_entry(&payload, &mut frame);

        let mut queue = lock(&self.queue);
        if let Some(cause) = &queue.poisoned {
            return Err(self.poisoned(cause.clone()));
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push(Queued {
            ticket,
            frame,
            changes,
        });
        loop {
            if let Some(result) = queue.results.remove(&ticket) {
                return result.map_err(|e| self.batch_error(e));
            }
            if queue.leader {
                queue = self
                    .written
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Lead: write everything queued so far, ours included.
            queue.leader = true;
            let batch = std::mem::take(&mut queue.waiting);
            let poisoned = queue.poisoned.clone();
            drop(queue);
            let tickets: Vec<u64> = batch.iter().map(|q| q.ticket).collect();
            let outcome = catch_unwind(AssertUnwindSafe(|| match poisoned {
                Some(cause) => (Err(BatchError::Poisoned(cause)), None),
                None => self.write_batch(batch),
            }));
            queue = lock(&self.queue);
            queue.leader = false;
            let (result, poison) = match outcome {
                Ok(done) => done,
                Err(panic) => {
                    let cause = "a commit panicked".to_owned();
                    queue.poisoned.get_or_insert(cause.clone());
                    for t in tickets {
                        queue
                            .results
                            .insert(t, Err(BatchError::Poisoned(cause.clone())));
                    }
                    self.written.notify_all();
                    drop(queue);
                    resume_unwind(panic);
                }
            };
            if let Some(cause) = poison {
                queue.poisoned.get_or_insert(cause);
            }
            if result.is_ok() {
                queue.stats.batches += 1;
                queue.stats.commits += tickets.len() as u64;
            }
            for t in tickets {
                queue.results.insert(t, result.clone());
            }
            self.written.notify_all();
        }
    }

    /// Writes the log now into a new snapshot (normally done by commits once
    /// the log is large enough).
    pub fn compact(&self) -> Result<(), CheckpointError> {
        // Take the leader role so no batch is written meanwhile.
        let mut queue = lock(&self.queue);
        while queue.leader {
            queue = self
                .written
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(cause) = &queue.poisoned {
            return Err(self.poisoned(cause.clone()));
        }
        queue.leader = true;
        drop(queue);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut wal = lock(&self.wal);
            self.compact_locked(&mut wal)
        }));
        let mut queue = lock(&self.queue);
        queue.leader = false;
        self.written.notify_all();
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                if e.fatal {
                    queue.poisoned.get_or_insert(e.message.clone());
                }
                Err(CheckpointError::Io {
                    op: "compacting",
                    path: self.dir.clone(),
                    source: std::io::Error::other(e.message),
                })
            }
            Err(panic) => {
                queue
                    .poisoned
                    .get_or_insert("a compaction panicked".to_owned());
                drop(queue);
                resume_unwind(panic)
            }
        }
    }

    /// Appends and syncs a batch, applies it, and compacts when due. Returns
    /// the batch result and, separately, a reason to refuse later commits.
    fn write_batch(&self, batch: Vec<Queued<R, U>>) -> (Result<(), BatchError>, Option<String>) {
        let mut wal = lock(&self.wal);
        let at = wal.len;
        let mut bytes = Vec::with_capacity(batch.iter().map(|q| q.frame.len()).sum());
        for queued in &batch {
            bytes.extend_from_slice(&queued.frame);
        }
        if let Err(e) = wal.file.write_all_at(&bytes, at) {
            // Cut off what may have been written, or refuse further appends
            // (they would follow garbage and read back as corruption).
            let poison = wal.file.set_len(at).err().map(|cut| {
                format!(
                    "appending to {} failed ({e}) and cutting it back failed ({cut})",
                    self.wal_path.display()
                )
            });
            let err = BatchError::Io {
                op: "appending to",
                source: Arc::new(e),
            };
            return (Err(err), poison);
        }
        self.step(CheckpointStep::WalAppended);
        if let Err(e) = wal.file.sync_data() {
            // After a failed fsync the page cache cannot be trusted.
            let cause = format!("syncing {} failed: {e}", self.wal_path.display());
            let err = BatchError::Io {
                op: "syncing",
                source: Arc::new(e),
            };
            return (Err(err), Some(cause));
        }
        wal.len = at + bytes.len() as u64;
        self.step(CheckpointStep::WalSynced);
        {
            let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
            for queued in batch {
                for change in queued.changes {
                    state.apply(change);
                }
            }
        }
        let due = wal.len >= self.options.compact_min_bytes.max(wal.snapshot_len);
        if due && let Err(e) = self.compact_locked(&mut wal) {
            tracing::error!(dir = %self.dir.display(), error = %e.message, "checkpoint compaction failed");
            if e.fatal {
                return (Ok(()), Some(e.message));
            }
        }
        (Ok(()), None)
    }

    /// Folds the state into a snapshot of the next generation with an empty
    /// log, and switches to that log.
    fn compact_locked(&self, wal: &mut Wal) -> Result<(), CompactError> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let new = install_generation(
            &self.dir,
            &self.snapshot_path,
            &self.wal_path,
            &state,
            &Header {
                generation: wal.generation + 1,
                boot_id: self.boot_id.clone(),
            },
            &|step| self.step(step),
        )?;
        drop(state);
        *wal = new;
        Ok(())
    }

    fn poisoned(&self, cause: String) -> CheckpointError {
        CheckpointError::Poisoned {
            path: self.wal_path.clone(),
            cause,
        }
    }

    fn batch_error(&self, e: BatchError) -> CheckpointError {
        match e {
            BatchError::Io { op, source } => CheckpointError::Commit {
                op,
                path: self.wal_path.clone(),
                source,
            },
            BatchError::Poisoned(cause) => self.poisoned(cause),
        }
    }
}

/// Writes `state` as the snapshot of `header`'s generation with an empty log of
/// the same generation, and returns that log opened. A crash at any point leaves
/// either the old snapshot with the old log, or the new snapshot with either log
/// (an old log is then recognised as stale by its generation).
pub(super) fn install_generation<R: Serialize, U: Serialize>(
    dir: &Path,
    snapshot_path: &Path,
    wal_path: &Path,
    state: &State<R, U>,
    header: &Header,
    step: &dyn Fn(CheckpointStep),
) -> Result<Wal, CompactError> {
    let soft = |message: String| CompactError {
        fatal: false,
        message,
    };
    let snapshot = encode_snapshot(state, header).map_err(soft)?;
    let snap_tmp = temp_path(snapshot_path);
    let wal_tmp = temp_path(wal_path);
    let cleanup = || {
        let _ = fs::remove_file(&snap_tmp);
        let _ = fs::remove_file(&wal_tmp);
    };
    if let Err(e) = write_synced(&snap_tmp, &snapshot) {
        cleanup();
        return Err(soft(format!("writing {}: {e}", snap_tmp.display())));
    }
    step(CheckpointStep::SnapshotWritten);
    let new_header = header.encode(&WAL_MAGIC);
    let new_file = match write_synced(&wal_tmp, &new_header) {
        Ok(file) => file,
        Err(e) => {
            cleanup();
            return Err(soft(format!("writing {}: {e}", wal_tmp.display())));
        }
    };
    step(CheckpointStep::NewWalWritten);
    if let Err(e) = fs::rename(&snap_tmp, snapshot_path) {
        cleanup();
        return Err(soft(format!(
            "renaming {} to {}: {e}",
            snap_tmp.display(),
            snapshot_path.display()
        )));
    }
    step(CheckpointStep::SnapshotRenamed);
    // From here the snapshot on disk may be newer than the open log, so
    // appending to the old log could lose commits: failures are fatal.
    let fatal = |message: String| CompactError {
        fatal: true,
        message,
    };
    sync_dir(dir).map_err(|e| fatal(format!("syncing {}: {e}", dir.display())))?;
    fs::rename(&wal_tmp, wal_path).map_err(|e| {
        fatal(format!(
            "renaming {} to {}: {e}",
            wal_tmp.display(),
            wal_path.display()
        ))
    })?;
    step(CheckpointStep::WalRenamed);
    sync_dir(dir).map_err(|e| fatal(format!("syncing {}: {e}", dir.display())))?;
    step(CheckpointStep::Compacted);
    tracing::debug!(dir = %dir.display(), generation = header.generation, bytes = snapshot.len(), "checkpoint compacted");
    Ok(Wal {
        file: new_file,
        len: new_header.len() as u64,
        generation: header.generation,
        snapshot_len: snapshot.len() as u64,
    })
}
