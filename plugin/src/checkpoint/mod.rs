//! The checkpoint: the durable record of which claims hold which allocation,
//! and of the container updates not yet delivered.
//!
//! It is a write-ahead log with compaction in one directory
//! (`<state dir>/checkpoint/`):
//! - `snapshot`: the whole state as of a generation, replaced atomically
//!   (temp file, fsync, rename, fsync dir);
//! - `wal`: one checksummed entry per commit since that snapshot, appended and
//!   fdatasync'd before the commit returns.
//!
//! Every commit gets the next **sequence number**; the log's entries carry it, the snapshot
//! keeps the highest one folded in and, per record, the sequence of the commit that put it.
//! Sequence numbers only grow, across compactions and reboots, so a caller that wrote the
//! sequence of its commit somewhere else (the claim engine stamps CDI specs with it) can tell
//! a checkpoint that lost commits from one that never had them (see [`History`]).
//!
//! The directory is opened once ([`cdi::Dir`]); every file operation goes through that handle.
//! [`Checkpoint::load`] reads and checks the files without changing anything (read-only
//! commands stop there); [`Loaded::open`] then repairs what a crash left (a torn tail, a
//! stale log, temp files, a reboot) and starts taking commits.
//!
//! A commit costs one append and one sync whatever the number of records held;
//! concurrent commits share both (group commit). When the log outgrows the
//! snapshot it is folded into a new snapshot of the next generation. The
//! checkpoint knows nothing of policies: records and pending updates are any
//! serde types. Callers serialize read-modify-write cycles across processes
//! with the [node lock](crate::nodelock). The on-disk format and the
//! operator's way out of a corrupt file are in `docs/state.md`.

mod commit;
mod error;
mod files;
mod format;
mod load;
mod loaded;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use cdi::Dir;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use error::CheckpointError;
pub use format::{FORMAT_VERSION, MAX_ENTRY_BYTES, MAX_FILE_BYTES};
pub use loaded::{History, Loaded};

/// The name of the checkpoint directory inside the state dir.
pub const CHECKPOINT_DIR: &str = "checkpoint";

/// Name of the snapshot file in the checkpoint directory.
pub const SNAPSHOT_FILE: &str = "snapshot";
/// Name of the write-ahead log in the checkpoint directory.
pub const WAL_FILE: &str = "wal";
/// Suffix of files being written; left over only by a crash, removed at open.
pub const TEMP_SUFFIX: &str = ".tmp";

/// What a record or a pending update must be to be stored.
pub trait Payload: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Payload for T {}

/// One change of a commit. The changes of one commit are durable together or
/// not at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change<R, U> {
    /// Sets the record of a claim (by claim UID).
    PutRecord(String, R),
    /// Removes the record of a claim; unknown UIDs are ignored.
    DeleteRecord(String),
    /// Sets the pending update of a container (by container id).
    PutPending(String, U),
    /// Removes the pending update of a container; unknown ids are ignored.
    DeletePending(String),
}

/// Named points of a commit and of a compaction, for crash tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointStep {
    /// A batch was written to the log but not yet synced.
    WalAppended,
    /// The batch is durable; the in-memory state is updated next.
    WalSynced,
    /// Compaction: the new snapshot is written and synced under its temp name.
    SnapshotWritten,
    /// Compaction: the new, empty log is written and synced under its temp name.
    NewWalWritten,
    /// Compaction: the snapshot was renamed into place (directory not synced yet).
    SnapshotRenamed,
    /// Compaction: the new log was renamed into place (directory not synced yet).
    WalRenamed,
    /// Compaction finished; the directory is synced.
    Compacted,
}

/// A callback told of every [`CheckpointStep`]; tests use it to crash there.
pub type StepHook = Arc<dyn Fn(CheckpointStep) + Send + Sync>;

/// Tuning of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// The log is compacted once it holds this many bytes and at least as many
    /// as the last snapshot (so compaction work per commit stays constant).
    pub compact_min_bytes: u64,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        Self {
            compact_min_bytes: 4 << 20,
        }
    }
}

/// A torn tail found at load and cut off at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTailReport {
    /// Where the good entries end (the new length of the log).
    pub offset: u64,
    /// How many bytes are cut off.
    pub bytes: u64,
    /// How many (partial) entries they held: 1, or 0 for a zero-filled tail.
    pub entries: u64,
    /// The sequence number of the last commit kept.
    pub kept_seq: u64,
    /// What was wrong with them.
    pub reason: String,
}

/// What [`Checkpoint::open`] found and did; the daemon logs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// No checkpoint existed: an empty one was created.
    pub created: bool,
    /// Records loaded (after any drop).
    pub records: usize,
    /// Pending container updates loaded (after any drop).
    pub pending: usize,
    /// A partially written last entry (a crash during a commit) was cut off.
    pub torn_tail: Option<TornTailReport>,
    /// The boot id the files were written under, when it differs from this boot.
    pub previous_boot_id: Option<String>,
    /// Records dropped because they belong to another boot.
    pub dropped_records: usize,
    /// Pending updates dropped because they belong to another boot.
    pub dropped_pending: usize,
    /// A log older than the snapshot (a crash during compaction) was replaced;
    /// its entries are all in the snapshot.
    pub stale_wal_replaced: bool,
    /// The snapshot existed without a log (for example moved aside by an
    /// operator); a new, empty log was started.
    pub wal_missing: bool,
    /// Temp files of an interrupted compaction that were removed.
    pub removed_temp_files: Vec<PathBuf>,
    /// The files were of this older format version; a new generation was written in the
    /// current one.
    pub upgraded_from: Option<u32>,
}

/// The current records (each with the sequence of the commit that put it), pending updates
/// and the sequence of the last commit applied.
#[derive(Debug, Clone)]
pub(crate) struct State<R, U> {
    records: BTreeMap<String, (u64, R)>,
    pending: BTreeMap<String, U>,
    seq: u64,
}

impl<R, U> Default for State<R, U> {
    fn default() -> Self {
        Self {
            records: BTreeMap::new(),
            pending: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<R, U> State<R, U> {
    /// Applies one change of the commit numbered `seq`.
    fn apply(&mut self, change: Change<R, U>, seq: u64) {
        self.seq = self.seq.max(seq);
        match change {
            Change::PutRecord(uid, record) => {
                self.records.insert(uid, (seq, record));
            }
            Change::DeleteRecord(uid) => {
                self.records.remove(&uid);
            }
            Change::PutPending(id, update) => {
                self.pending.insert(id, update);
            }
            Change::DeletePending(id) => {
                self.pending.remove(&id);
            }
        }
    }
}

/// The open log: the leader of a group commit appends to it.
struct Wal {
    file: File,
    len: u64,
    generation: u64,
    snapshot_len: u64,
    /// Sequence number of the last commit in the log (or folded into the snapshot).
    last_seq: u64,
}

/// A commit waiting for a leader to write it.
struct Queued<R, U> {
    ticket: u64,
    /// The changes as JSON; the leader wraps them with the sequence number.
    json: Vec<u8>,
    changes: Vec<Change<R, U>>,
    /// A failure of this commit must stop every later one (see [`Checkpoint::enqueue`]).
    critical: bool,
}

/// A commit queued by [`Checkpoint::enqueue`], to be waited for with [`Checkpoint::wait`].
#[derive(Debug)]
#[must_use = "a queued commit is durable only once waited for"]
pub struct Ticket(u64);

/// A test hook consulted before each append to the log ([`Checkpoint::set_fault_hook`]: an
/// error it answers fails that append as a full disk would; the append is cut back and reported
/// to its callers) or before each sync of the log ([`Checkpoint::set_sync_fault_hook`]: the sync
/// fails as a dying disk's would, and the checkpoint refuses later commits).
pub type FaultHook = Arc<dyn Fn() -> Option<std::io::Error> + Send + Sync>;

/// A batch failure, shared by every commit of the batch.
#[derive(Debug, Clone)]
enum BatchError {
    Io {
        op: &'static str,
        source: Arc<std::io::Error>,
    },
    Poisoned(String),
}

/// Group commit bookkeeping, under one mutex.
struct Queue<R, U> {
    next_ticket: u64,
    waiting: Vec<Queued<R, U>>,
    leader: bool,
    results: HashMap<u64, Result<u64, BatchError>>,
    poisoned: Option<String>,
    stats: CommitStats,
}

/// Counters of the group commit, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Commits made durable since open.
    pub commits: u64,
    /// Batches written (one write and one fdatasync each).
    pub batches: u64,
    /// Commits queued now, waiting for a leader.
    pub waiting: usize,
}

/// A durable, thread-safe store of records (by claim UID) and pending container
/// updates (by container id). See the module docs.
pub struct Checkpoint<R, U> {
    dir: PathBuf,
    handle: Dir,
    wal_path: PathBuf,
    boot_id: String,
    options: CheckpointOptions,
    state: RwLock<State<R, U>>,
    wal: Mutex<Wal>,
    queue: Mutex<Queue<R, U>>,
    written: Condvar,
    hook: Mutex<Option<StepHook>>,
    fault: Mutex<Option<FaultHook>>,
    sync_fault: Mutex<Option<FaultHook>>,
}

impl<R, U> std::fmt::Debug for Checkpoint<R, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("boot_id", &self.boot_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<R: Payload, U: Payload> Checkpoint<R, U> {
    /// Opens (or creates) the checkpoint in `dir` for the boot `boot_id`, with
    /// default options. See [`Checkpoint::open_with`].
    pub fn open(dir: &Path, boot_id: &str) -> Result<(Self, OpenReport), CheckpointError> {
        Self::open_with(dir, boot_id, CheckpointOptions::default())
    }

    /// [`Checkpoint::load`] then [`Loaded::open`]: opens (or creates) the checkpoint in `dir`
    /// and repairs what a crash left.
    pub fn open_with(
        dir: &Path,
        boot_id: &str,
        options: CheckpointOptions,
    ) -> Result<(Self, OpenReport), CheckpointError> {
        Self::load(dir, boot_id)?.open(options)
    }

    /// The current records, by claim UID.
    pub fn records(&self) -> BTreeMap<String, R> {
        self.read_state()
            .records
            .iter()
            .map(|(k, (_, r))| (k.clone(), r.clone()))
            .collect()
    }

    /// The record of one claim.
    pub fn record(&self, uid: &str) -> Option<R> {
        self.read_state().records.get(uid).map(|(_, r)| r.clone())
    }

    /// The sequence number of the commit that put the claim's record.
    pub fn record_seq(&self, uid: &str) -> Option<u64> {
        self.read_state().records.get(uid).map(|(seq, _)| *seq)
    }

    /// The sequence number of the last commit: every commit up to it is in the checkpoint.
    pub fn high_water(&self) -> u64 {
        self.read_state().seq
    }

    /// The number of records held.
    pub fn record_count(&self) -> usize {
        self.read_state().records.len()
    }

    /// The number of pending container updates.
    pub fn pending_count(&self) -> usize {
        self.read_state().pending.len()
    }

    /// The pending container updates, by container id.
    pub fn pending(&self) -> BTreeMap<String, U> {
        self.read_state().pending.clone()
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State<R, U>> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<R, U> Checkpoint<R, U> {
    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The boot id this checkpoint writes under.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Group commit counters: commits per batch is `commits / batches`.
    pub fn stats(&self) -> CommitStats {
        let queue = lock(&self.queue);
        CommitStats {
            waiting: queue.waiting.len(),
            ..queue.stats
        }
    }

    /// Installs (or removes) the step callback; for crash tests.
    pub fn set_step_hook(&self, hook: Option<StepHook>) {
        *lock(&self.hook) = hook;
    }

    /// Installs (or removes) the append fault hook; for failure tests.
    pub fn set_fault_hook(&self, hook: Option<FaultHook>) {
        *lock(&self.fault) = hook;
    }

    /// Installs (or removes) the hook asked before each sync of the log; for failure tests.
    pub fn set_sync_fault_hook(&self, hook: Option<FaultHook>) {
        *lock(&self.sync_fault) = hook;
    }

    fn step(&self, step: CheckpointStep) {
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook(step);
        }
    }
}
