//! Durable file operations through the checkpoint directory's handle: bounded reads and
//! synced writes.

use std::fs::File;
use std::io::{self, Read, Write};

use cdi::Dir;
use nix::fcntl::OFlag;

use super::error::CheckpointError;
use super::format::MAX_FILE_BYTES;

/// Reads a whole checkpoint file, refusing files over [`MAX_FILE_BYTES`].
/// `Ok(None)` when the file does not exist; any other failure is `Unreadable`.
pub(crate) fn read_bounded(dir: &Dir, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
    let path = dir.display(name);
    let unreadable = |source| CheckpointError::Unreadable {
        what: "file",
        path: path.clone(),
        source,
    };
    let file = match dir.read_file(name) {
        Ok(Some(file)) => file,
        Ok(None) => return Ok(None),
        Err(e) => return Err(unreadable(e)),
    };
    let meta = file.metadata().map_err(unreadable)?;
    let too_large = |size: u64| CheckpointError::Corrupt {
        path: path.clone(),
        dir: dir.path().to_owned(),
        reason: format!("it holds {size} bytes, more than the cap of {MAX_FILE_BYTES} bytes"),
    };
    if !meta.is_file() {
        return Err(CheckpointError::Corrupt {
            path: path.clone(),
            dir: dir.path().to_owned(),
            reason: "it is not a regular file".into(),
        });
    }
    check_single_link(&path, &meta)?;
    let len = meta.len();
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

/// Refuses a checkpoint file that has another name on the file system (a hard link): the log
/// is appended to in place, so writing it would change the other name's file too.
pub(crate) fn check_single_link(
    path: &std::path::Path,
    meta: &std::fs::Metadata,
) -> Result<(), CheckpointError> {
    use std::os::unix::fs::MetadataExt;
    match meta.nlink() {
        0 | 1 => Ok(()),
        links => Err(CheckpointError::HardLinked {
            path: path.to_owned(),
            links,
        }),
    }
}

/// Creates `name` in `dir` as a new file with `bytes`, mode 0600, and syncs it. A leftover
/// of that name is unlinked first and the new file is created exclusively (`O_EXCL`), so a
/// file planted there (a hard link to a file elsewhere) is never opened, let alone truncated.
/// The returned handle is open for reading and writing.
pub(crate) fn write_synced(dir: &Dir, name: &str, bytes: &[u8]) -> io::Result<File> {
    dir.unlink(name)?;
    let mut file = dir.open_file(name, OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL, 0o600)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(file)
}
