//! Durable, atomic file replacement in one directory, and recognition of stray temp files.
//!
//! A write goes to `.<target>.<pid>-<seq>.tmp` in the same directory (CDI scanners read only
//! `*.yaml` and `*.json`, and the leading dot hides it from `ls`), created exclusively with mode
//! 0644 set explicitly, written, fsynced, renamed over the target, and then the directory is
//! fsynced. A reader sees the old file or the new one, never a partial one; after a power loss
//! the rename is either persisted or not.
//!
//! While a temp file exists its writer holds an exclusive `flock` on it, and in-process writers
//! also register it in [`IN_FLIGHT`]. The cleaner removes a temp file only if it is not in
//! flight here and its lock can be taken, i.e. its writer has died.

use std::collections::HashSet;
use std::fs::Permissions;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg, OFlag};

use crate::CdiError;
use crate::dir::Dir;

/// Mode of every spec file: world-readable, as runtimes and other agents read the directory.
pub const SPEC_MODE: u32 = 0o644;

/// Temp files of in-process writers, so a concurrent cleaner never removes them.
static IN_FLIGHT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Steps of a durable write or remove, reported to a [`crate::StepHook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStep {
    /// The temp file is written and fsynced; the target is unchanged.
    TempWritten,
    /// The temp file has been renamed over the target and the directory fsynced.
    Renamed,
    /// The spec has been unlinked and the directory fsynced.
    Removed,
}

/// The syncs of a durable write or remove, where a [`crate::FaultHook`] can make one fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPoint {
    /// The fsync of the written temp file (before the rename).
    TempFile,
    /// The fsync of the directory after the temp file was renamed over the spec.
    DirAfterRename,
    /// The fsync of the directory after the spec was unlinked.
    DirAfterRemove,
}

/// Answers an error injected at a sync point (failure tests), else `None`.
pub(crate) type Faults<'a> = &'a dyn Fn(SyncPoint) -> Option<std::io::Error>;

/// Name of a temp file for `target_name`: `.<target_name>.<pid>-<seq>.tmp`.
pub(crate) fn temp_name(target_name: &str) -> String {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(".{target_name}.{}-{seq}.tmp", std::process::id())
}

struct InFlight(PathBuf);

impl InFlight {
    fn register(path: PathBuf) -> InFlight {
        let mut g = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(HashSet::new).insert(path.clone());
        InFlight(path)
    }

    fn contains(path: &Path) -> bool {
        let g = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().is_some_and(|s| s.contains(path))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut g = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.as_mut() {
            s.remove(&self.0);
        }
    }
}

/// fsyncs a directory so that renames and unlinks in it survive a power loss.
pub(crate) fn sync_dir(dir: &Dir, point: SyncPoint, fault: Faults<'_>) -> Result<(), CdiError> {
    match fault(point) {
        Some(e) => Err(e),
        None => dir.sync(),
    }
    .map_err(|e| CdiError::io("fsync directory", dir.path(), e))
}

/// Atomically and durably replaces `target_name` in `dir` with `bytes` (mode 0644).
///
/// `step` is called after the temp file is written and after the rename.
pub(crate) fn replace(
    dir: &Dir,
    target_name: &str,
    bytes: &[u8],
    step: &dyn Fn(WriteStep),
    fault: Faults<'_>,
) -> Result<(), CdiError> {
    let tmp_name = temp_name(target_name);
    let tmp = dir.display(&tmp_name);
    let target = dir.display(target_name);
    let _in_flight = InFlight::register(tmp.clone());
    let file = dir
        .open_file(
            &tmp_name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            SPEC_MODE,
        )
        .map_err(|e| CdiError::io("create temp spec", &tmp, e))?;
    // From here on, any failure removes the temp file.
    let result = (|| {
        let mut file = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| CdiError::io("lock temp spec", &tmp, e.into()))?;
        file.set_permissions(Permissions::from_mode(SPEC_MODE))
            .map_err(|e| CdiError::io("chmod temp spec", &tmp, e))?;
        file.write_all(bytes)
            .map_err(|e| CdiError::io("write temp spec", &tmp, e))?;
        match fault(SyncPoint::TempFile) {
            Some(e) => Err(e),
            None => file.sync_all(),
        }
        .map_err(|e| CdiError::io("fsync temp spec", &tmp, e))?;
        step(WriteStep::TempWritten);
        dir.rename(&tmp_name, target_name)
            .map_err(|e| CdiError::io("rename temp spec onto", &target, e))
    })();
    if let Err(e) = result {
        let _ = dir.unlink(&tmp_name);
        return Err(e);
    }
    sync_dir(dir, SyncPoint::DirAfterRename, fault)?;
    step(WriteStep::Renamed);
    Ok(())
}

/// Removes the temp file `name` in `dir` if its writer is gone; returns whether it did.
pub(crate) fn remove_if_stray(dir: &Dir, name: &str) -> Result<bool, CdiError> {
    let path = dir.display(name);
    if InFlight::contains(&path) {
        return Ok(false);
    }
    let file = match dir.read_file(name) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(false),
        Err(e) => return Err(CdiError::io("open temp spec", &path, e)),
    };
    let Ok(_lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
        // A live writer (perhaps in another process) holds it.
        return Ok(false);
    };
    dir.unlink(name)
        .map_err(|e| CdiError::io("remove stray temp spec", &path, e))
}

/// Unlinks `name` in `dir`; a missing file is success. Returns whether a file was removed.
pub(crate) fn unlink(dir: &Dir, name: &str) -> Result<bool, CdiError> {
    dir.unlink(name)
        .map_err(|e| CdiError::io("remove spec", dir.display(name), e))
}
