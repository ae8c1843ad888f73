//! Durable file operations: bounded reads, synced writes, directory syncs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use super::error::CheckpointError;
use super::format::MAX_FILE_BYTES;

/// Reads a whole checkpoint file, refusing files over [`MAX_FILE_BYTES`].
/// `Ok(None)` when the file does not exist; any other failure is `Unreadable`.
pub(crate) fn read_bounded(path: &Path, dir: &Path) -> Result<Option<Vec<u8>>, CheckpointError> {
    let unreadable = |source| CheckpointError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e)),
    };
    let len = file.metadata().map_err(unreadable)?.len();
    let too_large = |size: u64| CheckpointError::Corrupt {
        path: path.to_owned(),
        dir: dir.to_owned(),
        reason: format!("it holds {size} bytes, more than the cap of {MAX_FILE_BYTES} bytes"),
    };
    if len > MAX_FILE_BYTES {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

/// Creates (or replaces) `path` with `bytes`, mode 0600, and syncs it.
/// The returned handle is open for reading and writing.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(file)
}

/// Syncs a directory, making renames and creations in it durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` (mode 0700) if missing and syncs its parent; says whether it
/// was created.
pub(crate) fn ensure_dir(dir: &Path) -> Result<bool, CheckpointError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(false),
        Ok(_) => {
            return Err(CheckpointError::Io {
                op: "using as the checkpoint directory",
                path: dir.to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CheckpointError::Unreadable {
                path: dir.to_owned(),
                source,
            });
        }
    }
    let io = |op, path: &Path| {
        let path = path.to_owned();
        move |source| CheckpointError::Io { op, path, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("creating", dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent).map_err(io("syncing", parent))?;
    }
    Ok(true)
}
