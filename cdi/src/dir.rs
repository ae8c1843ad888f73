//! A directory opened once, with every later operation relative to the open handle.
//!
//! A path is resolved only when the directory is opened. The final component must be a real
//! directory: a symbolic link there is refused (`O_NOFOLLOW`), so a configured directory that
//! points somewhere else (`/var/run/cdi -> /etc`) is an error naming it. Symbolic links higher
//! up the path (`/var/run -> /run`) are followed as usual. After the open, creating, renaming,
//! syncing, listing and unlinking go through the handle (`openat`, `renameat`, `unlinkat`,
//! `fstatat`, `mkdirat`, never a path), with `O_NOFOLLOW` on every name, so nothing outside the
//! opened directory is ever touched, even when the directory is renamed or replaced by a link
//! while the process runs. The CDI spec store and the checkpoint (state dir, checkpoint dir,
//! node lock) share this type.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// A directory opened once; see the module docs.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Why a directory could not be opened as one.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The final component of the path is a symbolic link.
    #[error(
        "{path} is a symbolic link{target}: nri-accel writes and removes files only in a real directory; point the config at the directory itself"
    )]
    Symlink {
        /// The configured path.
        path: PathBuf,
        /// ` (to <target>)` when the link could be read.
        target: String,
    },
    /// Something other than a directory is at the path.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory does not exist (and was not to be created).
    #[error("{path} does not exist")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// Another failure opening or creating it.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
}

/// What is at a directory's path now that it no longer leads to the directory opened there.
///
/// Writers that go through the handle keep working after a rename, but consumers that look the
/// directory up by path (a container runtime reading CDI specs) no longer see what is written:
/// a caller that promises visibility checks [`Dir::check_at_path`] before it acknowledges.
#[derive(Debug, thiserror::Error)]
pub enum DirMoved {
    /// Nothing is at the path.
    #[error("{path} was moved away or removed (nothing is at that path now)")]
    Gone {
        /// The path the directory was opened by.
        path: PathBuf,
    },
    /// A symbolic link is at the path (even one leading back to the opened directory: a link
    /// is refused at open too).
    #[error("{path} was replaced by a symbolic link{target}")]
    Symlink {
        /// The path the directory was opened by.
        path: PathBuf,
        /// ` (to <target>)` when the link could be read.
        target: String,
    },
    /// A file (or anything else that is not a directory) is at the path.
    #[error("{path} was replaced by a file that is not a directory")]
    NotADirectory {
        /// The path the directory was opened by.
        path: PathBuf,
    },
    /// Another directory is at the path.
    #[error("{path} was replaced by another directory")]
    OtherDirectory {
        /// The path the directory was opened by.
        path: PathBuf,
    },
    /// The path or the handle could not be examined.
    #[error("{path} cannot be checked to still be the directory opened there: {source}")]
    Unchecked {
        /// The path the directory was opened by.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
}

impl DirError {
    /// The error as an `io::Error` of the matching kind (for callers that carry `io::Error`).
    pub fn into_io(self) -> io::Error {
        let kind = match &self {
            DirError::Missing { .. } => io::ErrorKind::NotFound,
            DirError::NotADirectory { .. } => io::ErrorKind::NotADirectory,
            DirError::Symlink { .. } => io::ErrorKind::InvalidInput,
            DirError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, self.to_string())
    }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// What an `openat` of a directory's final component found.
fn classify(path: &Path, e: Errno, lstat: impl FnOnce() -> Option<FileStat>) -> DirError {
    match e {
        Errno::ENOENT => DirError::Missing {
            path: path.to_owned(),
        },
        Errno::ELOOP | Errno::ENOTDIR => match lstat() {
            Some(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK => {
                let target = std::fs::read_link(path)
                    .map(|t| format!(" (to {})", t.display()))
                    .unwrap_or_default();
                DirError::Symlink {
                    path: path.to_owned(),
                    target,
                }
            }
            _ => DirError::NotADirectory {
                path: path.to_owned(),
            },
        },
        other => DirError::Io {
            op: "opening the directory",
            path: path.to_owned(),
            source: errno(other),
        },
    }
}

fn is_symlink(path: &Path) -> Option<FileStat> {
    nix::sys::stat::lstat(path).ok()
}

impl Dir {
    /// Opens `path` as a directory, refusing a symbolic link as its final component.
    pub fn open(path: &Path) -> Result<Dir, DirError> {
        let fd = nix::fcntl::open(path, DIR_FLAGS, Mode::empty())
            .map_err(|e| classify(path, e, || is_symlink(path)))?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// Opens `path`, creating it (and missing parents) with `mode` first when it is missing.
    /// Says whether it was created.
    pub fn open_or_create(path: &Path, mode: u32) -> Result<(Dir, bool), DirError> {
        match Dir::open(path) {
            Ok(d) => Ok((d, false)),
            Err(DirError::Missing { .. }) => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(mode)
                    .create(path)
                    .map_err(|source| DirError::Io {
                        op: "creating the directory",
                        path: path.to_owned(),
                        source,
                    })?;
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
                    && let Ok(p) = File::open(parent)
                {
                    let _ = p.sync_all();
                }
                Ok((Dir::open(path)?, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the subdirectory `name` through this handle, creating it with `mode` when missing
    /// and `mode` is given. A symbolic link there is refused.
    pub fn child(&self, name: &str, mode: Option<u32>) -> Result<(Dir, bool), DirError> {
        let path = self.path.join(name);
        let lstat = || fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        match openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok((Dir { fd, path }, false)),
            Err(Errno::ENOENT) if mode.is_some() => {
                let m = Mode::from_bits_truncate(mode.unwrap_or(0o700));
                match mkdirat(&self.fd, name, m) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(DirError::Io {
                            op: "creating the directory",
                            path,
                            source: errno(e),
                        });
                    }
                }
                self.sync().map_err(|source| DirError::Io {
                    op: "syncing the directory",
                    path: self.path.clone(),
                    source,
                })?;
                let fd = openat(&self.fd, name, DIR_FLAGS, Mode::empty())
                    .map_err(|e| classify(&path, e, lstat))?;
                Ok((Dir { fd, path }, true))
            }
            Err(e) => Err(classify(&path, e, lstat)),
        }
    }

    /// The path the directory was opened by (for messages; never used to reach files).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/name`, for messages.
    pub fn display(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The open handle.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens the file `name` in the directory with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` are
    /// always added) and `mode` for a file it creates.
    pub fn open_file(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::from_bits_truncate(mode)).map_err(errno)?;
        Ok(File::from(fd))
    }

    /// Opens `name` for reading; `Ok(None)` when it does not exist.
    pub fn read_file(&self, name: &str) -> io::Result<Option<File>> {
        match self.open_file(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        renameat(&self.fd, from, &self.fd, to).map_err(errno)
    }

    /// Unlinks the file `name`; `Ok(false)` when it was not there.
    pub fn unlink(&self, name: &str) -> io::Result<bool> {
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(errno(e)),
        }
    }

    /// The entry `name` itself (a link is not followed); `Ok(None)` when missing.
    pub fn stat(&self, name: &str) -> io::Result<Option<FileStat>> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Makes creations, renames and unlinks in the directory durable.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(errno)
    }

    /// The names in the directory (not `.` and `..`), read through the handle. A directory
    /// that was removed while open is an error (it would read as empty, which a caller could
    /// take for "nothing there").
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        use std::os::unix::ffi::OsStrExt;
        if fstat(&self.fd).map_err(errno)?.st_nlink == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the directory was removed while nri-accel had it open",
            ));
        }
        let mut dir =
            nix::dir::Dir::openat(&self.fd, ".", DIR_FLAGS, Mode::empty()).map_err(errno)?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            out.push(std::ffi::OsStr::from_bytes(name).to_owned());
        }
        Ok(out)
    }

    /// Whether the configured path still leads to this directory (it was not renamed away or
    /// replaced); [`Dir::check_at_path`] says what is there instead.
    pub fn still_at_path(&self) -> bool {
        self.check_at_path().is_ok()
    }

    /// Checks that the path the directory was opened by still names it: the same device and
    /// inode as the open handle, found without following a final symbolic link (a link there is
    /// refused, as [`Dir::open`] refuses one). Operations through the handle never depend on it;
    /// a caller whose consumers look the directory up by path does.
    pub fn check_at_path(&self) -> Result<(), DirMoved> {
        let path = || self.path.clone();
        let mine = fstat(&self.fd).map_err(|e| DirMoved::Unchecked {
            path: path(),
            source: errno(e),
        })?;
        let now = match nix::sys::stat::lstat(&self.path) {
            Ok(st) => st,
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => {
                return Err(DirMoved::Gone { path: path() });
            }
            Err(e) => {
                return Err(DirMoved::Unchecked {
                    path: path(),
                    source: errno(e),
                });
            }
        };
        if now.st_dev == mine.st_dev && now.st_ino == mine.st_ino {
            return Ok(());
        }
        Err(
            match SFlag::from_bits_truncate(now.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFLNK => DirMoved::Symlink {
                    path: path(),
                    target: std::fs::read_link(&self.path)
                        .map(|t| format!(" (to {})", t.display()))
                        .unwrap_or_default(),
                },
                SFlag::S_IFDIR => DirMoved::OtherDirectory { path: path() },
                _ => DirMoved::NotADirectory { path: path() },
            },
        )
    }

    /// A new open file description of this directory (not a duplicate of the handle): for a
    /// `flock` of the directory itself, which belongs to the description, so two of them
    /// exclude each other as two processes do.
    pub fn reopen(&self) -> io::Result<OwnedFd> {
        openat(&self.fd, ".", DIR_FLAGS, Mode::empty()).map_err(errno)
    }
}
