//! Commits (group commit: one leader writes and syncs every queued commit)
//! and compaction of the log into a new snapshot.

use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, PoisonError};

use cdi::Dir;
use serde::Serialize;

use super::error::CheckpointError;
use super::files::write_synced;
use super::format::{Header, MAX_ENTRY_BYTES, SNAPSHOT_MAGIC, WAL_MAGIC, encode_entry, framed_len};
use super::{
    BatchError, Change, Checkpoint, CheckpointStep, Payload, Queued, SNAPSHOT_FILE, State,
    TEMP_SUFFIX, Ticket, WAL_FILE, Wal, lock,
};

/// An entry of the snapshot file, as written (borrowing the state): each record with the
/// sequence of the commit that put it, and the end marker with the last sequence folded in.
#[derive(Serialize)]
pub(super) enum SnapshotEntryRef<'a, R, U> {
    Record(&'a str, u64, &'a R),
    Pending(&'a str, &'a U),
    End {
        records: u64,
        pending: u64,
        seq: u64,
    },
}

/// Bytes a log entry's payload adds around the changes: `{"seq":<u64>,"changes":` and `}`.
const ENTRY_WRAP: usize = 40;

/// The payload of the log entry of commit `seq` with the changes `json`.
fn entry_payload(seq: u64, json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + ENTRY_WRAP);
    out.extend_from_slice(b"{\"seq\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"changes\":");
    out.extend_from_slice(json);
    out.push(b'}');
    out
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
    for (uid, (seq, record)) in &state.records {
        put(SnapshotEntryRef::Record(uid, *seq, record))?;
    }
    for (id, update) in &state.pending {
        put(SnapshotEntryRef::Pending(id, update))?;
    }
    put(SnapshotEntryRef::End {
        records: state.records.len() as u64,
        pending: state.pending.len() as u64,
        seq: state.seq,
    })?;
    Ok(out)
}

/// The temp name of a checkpoint file.
pub(super) fn temp_name(name: &str) -> String {
    format!("{name}{TEMP_SUFFIX}")
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
    /// into one write and one fdatasync by whichever of them leads. Answers the
    /// commit's sequence number (an empty commit writes nothing and answers the
    /// current high-water mark).
    pub fn commit(&self, changes: Vec<Change<R, U>>) -> Result<u64, CheckpointError> {
        match self.enqueue(changes, false)? {
            Some(ticket) => self.wait(ticket),
            None => Ok(self.high_water()),
        }
    }

    /// Queues `changes` as the next commit without waiting for it: commits are
    /// written in the order they were queued, so a caller that queues while it
    /// holds its own lock orders its commit before any that others queue after
    /// it. [`Checkpoint::wait`] makes it durable. `None` for no changes.
    ///
    /// A `critical` commit is one later commits depend on (a release, whose units
    /// others may take once it is queued): if it fails, the checkpoint refuses
    /// every later commit until it is opened again, so nothing queued after it
    /// can become durable without it.
    pub fn enqueue(
        &self,
        changes: Vec<Change<R, U>>,
        critical: bool,
    ) -> Result<Option<Ticket>, CheckpointError> {
        if changes.is_empty() {
            return Ok(None);
        }
        let json = serde_json::to_vec(&changes).map_err(CheckpointError::Encode)?;
        if json.len() + ENTRY_WRAP > MAX_ENTRY_BYTES {
            return Err(CheckpointError::EntryTooLarge {
                size: json.len() + ENTRY_WRAP,
                max: MAX_ENTRY_BYTES,
            });
        }
        let mut queue = lock(&self.queue);
        if let Some(cause) = &queue.poisoned {
            return Err(self.poisoned(cause.clone()));
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push(Queued {
            ticket,
            json,
            changes,
            critical,
        });
        Ok(Some(Ticket(ticket)))
    }

    /// Waits until the queued commit `ticket` is durable (leading a batch when no
    /// one else does) and answers its sequence number, or why it is not durable.
    pub fn wait(&self, ticket: Ticket) -> Result<u64, CheckpointError> {
        let ticket = ticket.0;
        let mut queue = lock(&self.queue);
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
            match result {
                Ok(seqs) => {
                    queue.stats.batches += 1;
                    queue.stats.commits += tickets.len() as u64;
                    for (t, seq) in tickets.into_iter().zip(seqs) {
                        queue.results.insert(t, Ok(seq));
                    }
                }
                Err(e) => {
                    for t in tickets {
                        queue.results.insert(t, Err(e.clone()));
                    }
                }
            }
            self.written.notify_all();
        }
    }

    /// Makes the checkpoint refuse every later commit until it is opened again; for a caller
    /// whose memory went ahead of what is durable (see [`Checkpoint::enqueue`]).
    pub fn poison(&self, cause: String) {
        let mut queue = lock(&self.queue);
        queue.poisoned.get_or_insert(cause);
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

    /// Numbers, appends and syncs a batch, applies it, and compacts when due.
    /// Returns the sequence number of each commit (or the batch failure) and,
    /// separately, a reason to refuse later commits. A failed batch uses up no
    /// sequence number: nothing of it is durable.
    #[allow(clippy::type_complexity)]
    fn write_batch(
        &self,
        batch: Vec<Queued<R, U>>,
    ) -> (Result<Vec<u64>, BatchError>, Option<String>) {
        let mut wal = lock(&self.wal);
        let at = wal.len;
        let first = wal.last_seq + 1;
        let seqs: Vec<u64> = (first..first + batch.len() as u64).collect();
        let mut bytes = Vec::with_capacity(
            batch
                .iter()
                .map(|q| framed_len(q.json.len() + ENTRY_WRAP))
                .sum(),
        );
        for (queued, seq) in batch.iter().zip(&seqs) {
            encode_entry(&entry_payload(*seq, &queued.json), &mut bytes);
        }
        let critical = batch.iter().any(|q| q.critical);
        let injected = lock(&self.fault).as_ref().and_then(|f| f());
        let written = match injected {
            Some(e) => Err(e),
            None => wal.file.write_all_at(&bytes, at),
        };
        if let Err(e) = written {
            // Cut off what may have been written, or refuse further appends
            // (they would follow garbage and read back as corruption).
            let poison = match wal.file.set_len(at) {
                Err(cut) => Some(format!(
                    "appending to {} failed ({e}) and cutting it back failed ({cut})",
                    self.wal_path.display()
                )),
                Ok(()) if critical => Some(format!(
                    "a release could not be committed to {} ({e}); later commits could depend on it",
                    self.wal_path.display()
                )),
                Ok(()) => None,
            };
            let err = BatchError::Io {
                op: "appending to",
                source: Arc::new(e),
            };
            return (Err(err), poison);
        }
        self.step(CheckpointStep::WalAppended);
        let synced = match lock(&self.sync_fault).as_ref().and_then(|f| f()) {
            Some(e) => Err(e),
            None => wal.file.sync_data(),
        };
        if let Err(e) = synced {
            // (Every batch is critical here: the checkpoint refuses commits from now on.)
            // After a failed fsync the page cache cannot be trusted.
            let cause = format!("syncing {} failed: {e}", self.wal_path.display());
            let err = BatchError::Io {
                op: "syncing",
                source: Arc::new(e),
            };
            return (Err(err), Some(cause));
        }
        wal.len = at + bytes.len() as u64;
        wal.last_seq = first + batch.len() as u64 - 1;
        self.step(CheckpointStep::WalSynced);
        {
            let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
            for (queued, seq) in batch.into_iter().zip(&seqs) {
                for change in queued.changes {
                    state.apply(change, *seq);
                }
            }
        }
        let due = wal.len >= self.options.compact_min_bytes.max(wal.snapshot_len);
        if due && let Err(e) = self.compact_locked(&mut wal) {
            tracing::error!(dir = %self.dir.display(), error = %e.message, "checkpoint compaction failed");
            if e.fatal {
                return (Ok(seqs), Some(e.message));
            }
        }
        (Ok(seqs), None)
    }

    /// Folds the state into a snapshot of the next generation with an empty
    /// log, and switches to that log.
    fn compact_locked(&self, wal: &mut Wal) -> Result<(), CompactError> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let new = install_generation(
            &self.handle,
            &state,
            &Header {
                generation: wal.generation + 1,
                boot_id: self.boot_id.clone(),
                version: super::FORMAT_VERSION,
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
/// (an old log is then recognised as stale by its generation). Every file
/// operation goes through the directory handle `dir`.
pub(super) fn install_generation<R: Serialize, U: Serialize>(
    dir: &Dir,
    state: &State<R, U>,
    header: &Header,
    step: &dyn Fn(CheckpointStep),
) -> Result<Wal, CompactError> {
    let soft = |message: String| CompactError {
        fatal: false,
        message,
    };
    let snapshot = encode_snapshot(state, header).map_err(soft)?;
    let snap_tmp = temp_name(SNAPSHOT_FILE);
    let wal_tmp = temp_name(WAL_FILE);
    let shown = |name: &str| dir.display(name).display().to_string();
    let cleanup = || {
        let _ = dir.unlink(&snap_tmp);
        let _ = dir.unlink(&wal_tmp);
    };
    if let Err(e) = write_synced(dir, &snap_tmp, &snapshot) {
        cleanup();
        return Err(soft(format!("writing {}: {e}", shown(&snap_tmp))));
    }
    step(CheckpointStep::SnapshotWritten);
    let new_header = header.encode(&WAL_MAGIC);
    let new_file = match write_synced(dir, &wal_tmp, &new_header) {
        Ok(file) => file,
        Err(e) => {
            cleanup();
            return Err(soft(format!("writing {}: {e}", shown(&wal_tmp))));
        }
    };
    step(CheckpointStep::NewWalWritten);
    if let Err(e) = dir.rename(&snap_tmp, SNAPSHOT_FILE) {
        cleanup();
        return Err(soft(format!(
            "renaming {} to {}: {e}",
            shown(&snap_tmp),
            shown(SNAPSHOT_FILE)
        )));
    }
    step(CheckpointStep::SnapshotRenamed);
    // From here the snapshot on disk may be newer than the open log, so
    // appending to the old log could lose commits: failures are fatal.
    let fatal = |message: String| CompactError {
        fatal: true,
        message,
    };
    let path = dir.path().display().to_string();
    dir.sync()
        .map_err(|e| fatal(format!("syncing {path}: {e}")))?;
    dir.rename(&wal_tmp, WAL_FILE).map_err(|e| {
        fatal(format!(
            "renaming {} to {}: {e}",
            shown(&wal_tmp),
            shown(WAL_FILE)
        ))
    })?;
    step(CheckpointStep::WalRenamed);
    dir.sync()
        .map_err(|e| fatal(format!("syncing {path}: {e}")))?;
    step(CheckpointStep::Compacted);
    tracing::debug!(dir = %path, generation = header.generation, bytes = snapshot.len(), "checkpoint compacted");
    Ok(Wal {
        file: new_file,
        len: new_header.len() as u64,
        generation: header.generation,
        snapshot_len: snapshot.len() as u64,
        last_seq: state.seq,
    })
}
