//! A checkpoint read and checked but not yet opened for commits: what read-only commands use,
//! and what startup decides on before anything is repaired.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, RwLock};

use cdi::Dir;
use nix::fcntl::OFlag;

use super::commit::install_generation;
use super::error::CheckpointError;
use super::format::{FORMAT_VERSION, Header};
use super::{Checkpoint, CheckpointOptions, OpenReport, Payload, Queue, State, WAL_FILE, Wal};

/// What the checkpoint's files prove about the commits made: every commit of the boot
/// `boot_id` numbered up to `seq` is in them. A commit stamp of that boot with a higher number,
/// found anywhere, proves the files lost commits (an older copy, a cut log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// The boot the files were written under; `None` when there were no files.
    pub boot_id: Option<String>,
    /// The sequence number of the last commit in the files (0 when none).
    pub seq: u64,
}

impl History {
    /// Whether the files hold the commit `seq` made in the boot `boot_id`, or prove it was
    /// superseded (a commit of another boot than the files' cannot be told apart, and is
    /// `false`).
    pub fn covers(&self, boot_id: &str, seq: u64) -> bool {
        self.boot_id.as_deref() == Some(boot_id) && seq <= self.seq
    }
}

/// Repairs [`Loaded::open`] makes.
#[derive(Debug, Clone, Default)]
pub(super) struct Repair {
    /// (generation, length of the good entries) of a log to keep appending to; `None`: write a
    /// new generation.
    pub keep_wal: Option<(u64, u64)>,
    pub last_generation: u64,
    pub snapshot_len: u64,
    /// Temp files of an interrupted compaction to remove.
    pub temps: Vec<String>,
}

/// A checkpoint loaded by [`Checkpoint::load`]: its state as it will be after open, what
/// the files prove ([`History`]) and what open will repair. Loading changes nothing on disk.
pub struct Loaded<R, U> {
    dir: Result<Dir, PathBuf>,
    boot_id: String,
    state: State<R, U>,
    report: OpenReport,
    history: History,
    repair: Repair,
}

impl<R, U> std::fmt::Debug for Loaded<R, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("history", &self.history)
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl<R: Payload, U: Payload> Loaded<R, U> {
    pub(super) fn new(
        dir: Result<Dir, PathBuf>,
        boot_id: &str,
        state: State<R, U>,
        report: OpenReport,
        history: History,
        repair: Repair,
    ) -> Self {
        Loaded {
            dir,
            boot_id: boot_id.to_owned(),
            state,
            report,
            history,
            repair,
        }
    }

    /// A directory that does not exist: empty, created at open.
    pub(super) fn empty(dir: Result<Dir, PathBuf>, boot_id: &str) -> Self {
        let report = OpenReport {
            created: true,
            ..OpenReport::default()
        };
        let history = History {
            boot_id: None,
            seq: 0,
        };
        Self::new(
            dir,
            boot_id,
            State::default(),
            report,
            history,
            Repair::default(),
        )
    }

    /// The records as they will be after open (none after a reboot), with the sequence number
    /// of the commit that put each.
    pub fn records(&self) -> impl Iterator<Item = (&String, u64, &R)> {
        self.state.records.iter().map(|(k, (s, r))| (k, *s, r))
    }

    /// The record of one claim and the sequence of the commit that put it.
    pub fn record(&self, uid: &str) -> Option<(u64, &R)> {
        self.state.records.get(uid).map(|(s, r)| (*s, r))
    }

    /// The pending updates as they will be after open.
    pub fn pending(&self) -> &BTreeMap<String, U> {
        &self.state.pending
    }

    /// What the files prove about the commits made.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// What the load found (and open will repair).
    pub fn report(&self) -> &OpenReport {
        &self.report
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &std::path::Path {
        match &self.dir {
            Ok(d) => d.path(),
            Err(p) => p,
        }
    }

    /// The boot id the checkpoint will write under.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Repairs what a crash left and opens the checkpoint for commits: removes temp files of
    /// an interrupted compaction, cuts a torn tail off the log (logged with its size in bytes
    /// and entries), and writes a new generation when the log is stale or missing, the node
    /// rebooted, or the files are of an older format. Creates the directory when missing.
    pub fn open(
        self,
        options: CheckpointOptions,
    ) -> Result<(Checkpoint<R, U>, OpenReport), CheckpointError> {
        let Loaded {
            dir,
            boot_id,
            state,
            mut report,
            history,
            repair,
        } = self;
        let dir = match dir {
            Ok(d) => d,
            Err(path) => {
                Dir::open_or_create(&path, 0o700)
                    .map_err(|e| CheckpointError::Dir {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?
                    .0
            }
        };
        let dir_path = dir.path().to_owned();
        if let Some(previous) = &report.previous_boot_id {
            tracing::warn!(
                dir = %dir_path.display(),
                previous_boot_id = %previous,
                boot_id,
                dropped_records = report.dropped_records,
                dropped_pending = report.dropped_pending,
                last_commit = history.seq,
                "the node rebooted since the checkpoint was written: its records and pending container updates describe containers that are gone and are dropped"
            );
        }
        for temp in &repair.temps {
            let path = dir.display(temp);
            match dir.unlink(temp) {
                Ok(true) => {
                    tracing::warn!(file = %path.display(), "removed the temp file of an interrupted checkpoint compaction");
                    report.removed_temp_files.push(path);
                }
                Ok(false) => {}
                Err(source) => {
                    return Err(CheckpointError::Io {
                        op: "removing",
                        path,
                        source,
                    });
                }
            }
        }
        let wal_path = dir.display(WAL_FILE);
        let io = |op, path: &PathBuf| {
            let path = path.clone();
            move |source| CheckpointError::Io { op, path, source }
        };
        let wal = match repair.keep_wal {
            Some((generation, good)) => {
                let file = dir
                    .open_file(WAL_FILE, OFlag::O_RDWR, 0)
                    .map_err(io("opening", &wal_path))?;
                // Checked again on the handle written from now on (load checked the name).
                let meta = file.metadata().map_err(io("checking", &wal_path))?;
                super::files::check_single_link(&wal_path, &meta)?;
                if let Some(torn) = &report.torn_tail {
                    tracing::warn!(
                        file = %wal_path.display(),
                        offset = torn.offset,
                        bytes = torn.bytes,
                        entries = torn.entries,
                        last_commit_kept = torn.kept_seq,
                        reason = %torn.reason,
                        "cut {} bytes ({} partial entry) off the end of the checkpoint log; the last commit kept is {} (a crash during a commit that had not returned)",
                        torn.bytes, torn.entries, torn.kept_seq
                    );
                    file.set_len(good).map_err(io("truncating", &wal_path))?;
                    file.sync_data().map_err(io("syncing", &wal_path))?;
                }
                Wal {
                    file,
                    len: good,
                    generation,
                    snapshot_len: repair.snapshot_len,
                    last_seq: state.seq,
                }
            }
            None => {
                if report.stale_wal_replaced {
                    tracing::warn!(file = %wal_path.display(), "replacing a checkpoint log older than the snapshot (a crash during compaction); the snapshot holds its entries");
                }
                if report.wal_missing {
                    tracing::warn!(file = %wal_path.display(), "the checkpoint log is missing; starting a new one after the snapshot");
                }
                if let Some(v) = report.upgraded_from {
                    tracing::info!(dir = %dir_path.display(), from = v, to = FORMAT_VERSION, "writing the checkpoint in the current format version");
                }
                let header = Header {
                    generation: repair.last_generation + 1,
                    boot_id: boot_id.clone(),
                    version: FORMAT_VERSION,
                };
                install_generation(&dir, &state, &header, &|_| {}).map_err(|e| {
                    CheckpointError::Io {
                        op: "writing a new generation of the checkpoint in",
                        path: dir_path.clone(),
                        source: std::io::Error::other(e.message),
                    }
                })?
            }
        };
        let checkpoint = Checkpoint {
            wal_path,
            dir: dir_path,
            handle: dir,
            boot_id,
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
            fault: Mutex::new(None),
            sync_fault: Mutex::new(None),
        };
        Ok((checkpoint, report))
    }
}
