//! Errors of the checkpoint. Every one names the file; corruption says the file
//! was kept and what the operator does next.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong opening or committing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A checkpoint file, or the checkpoint directory, exists but cannot be read; nothing was
    /// changed.
    #[error(
        "cannot read the checkpoint {what} {path}: {source}. Nothing was changed or deleted; fix the cause (permissions, disk) and start nri-accel again"
    )]
    Unreadable {
        /// `file` or `directory`.
        what: &'static str,
        /// The file or directory that could not be read.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// A checkpoint file is damaged (not a torn tail): startup must stop.
    #[error(
        "the checkpoint file {path} is corrupt: {reason}. The file was kept as it is. Way out: stop nri-accel, move the checkpoint directory aside (mv {dir} {dir}.corrupt) and start again; nri-accel then starts without records and adopts the devices that running containers hold"
    )]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// The checkpoint directory to move aside.
        dir: PathBuf,
        /// What is wrong, with the byte offset where known.
        reason: String,
    },
    /// A checkpoint file written by a newer format version.
    #[error(
        "the checkpoint file {path} has format version {found}; this nri-accel reads version {supported} (a newer nri-accel wrote it, or its header is damaged). The file was kept. Run the nri-accel that wrote it, or move {dir} aside (mv {dir} {dir}.old) and start again; running containers' devices are then adopted"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The checkpoint directory.
        dir: PathBuf,
        /// Version found in the header.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// A checkpoint file has more than one name (a hard link): nri-accel writes it in place.
    #[error(
        "the checkpoint file {path} has {links} names on its file system (a hard link): nri-accel appends to it in place and would change the other names' file too. Nothing was changed. Find the other names (find / -xdev -samefile {path}), remove them, and start again"
    )]
    HardLinked {
        /// The file.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// The checkpoint directory cannot be used (a symbolic link, not a directory).
    #[error("checkpoint directory {path}: {reason}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file operation failed while opening or compacting.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("creating", "syncing", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// Writing or syncing a commit failed; the commit is not durable.
    #[error("commit not saved: {op} {path}: {source}")]
    Commit {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What the kernel said (shared by every commit of the batch).
        source: Arc<io::Error>,
    },
    /// An earlier sync failed, so what is on disk is unknown: commits are
    /// refused until a restart reads back the durable state.
    #[error(
        "the checkpoint {path} refuses commits because an earlier write failed ({cause}); restart nri-accel to continue from the last durable state"
    )]
    Poisoned {
        /// The write-ahead log.
        path: PathBuf,
        /// The first failure.
        cause: String,
    },
    /// One commit encodes to more than the per-entry cap.
    #[error(
        "commit refused: its changes encode to {size} bytes, more than the cap of {max} bytes per commit; commit fewer changes at a time"
    )]
    EntryTooLarge {
        /// Encoded size.
        size: usize,
        /// The cap.
        max: usize,
    },
    /// A change could not be encoded as JSON.
    #[error("cannot encode a checkpoint change: {0}")]
    Encode(#[source] serde_json::Error),
    /// The boot id given to open is unusable.
    #[error("invalid boot id {boot_id:?}: {reason}")]
    InvalidBootId {
        /// The boot id given.
        boot_id: String,
        /// Why it is refused.
        reason: &'static str,
    },
}
