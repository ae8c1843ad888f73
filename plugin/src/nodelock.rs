//! The node lock: held around every checkpoint read-modify-write, so two nri-accel processes
//! (the daemon and an upgrade's successor, or the CLI) never interleave their changes.
//!
//! It is two `flock`s, taken together or not at all:
//! - on the **state dir itself** (a directory handle): its identity cannot be swapped under a
//!   holder. Removing or replacing a lock *file* makes a new inode, and a flock of a new inode is
//!   a new lock: with `node.lock` alone, `rm node.lock` let a second daemon in beside a running
//!   one (issue 39). A directory that holds the checkpoint cannot be removed that way, and one
//!   renamed away takes its checkpoint with it;
//! - on `<state dir>/node.lock`, which nri-accel before issue 39 locked alone: an older process
//!   on the same state dir (an upgrade or a rollback in progress) is still excluded. After
//!   locking it, the file locked must still be the one at that name; one removed or replaced
//!   between the open and the flock is tried again.
//!
//! A holder can check at any time that what it locked is still what the names point to
//! ([`NodeLockWatch::check`]): the daemon does before each change and every 2 s, and stops
//! granting once either was removed or replaced (docs/state.md, "The node lock").
//!
//! flock locks belong to an open file description, so every [`NodeLock::lock`] opens both
//! afresh: two holders in one process exclude each other exactly as two processes do, and the
//! kernel releases the lock when its holder dies. The file is opened through the state dir's
//! handle ([`cdi::Dir`]), never by path.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi::{Dir, DirMoved};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{FileStat, fstat};

/// Name of the lock file inside the state dir.
pub const NODE_LOCK_FILE: &str = "node.lock";

/// How often a waiting [`NodeLock::lock`] tries again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Errors of the node lock; each names the lock file.
#[derive(Debug, thiserror::Error)]
pub enum NodeLockError {
    /// The lock file could not be created or opened.
    #[error(
        "cannot open the node lock {path}: {source}; check that the state dir exists and is writable by nri-accel"
    )]
    Open {
        /// The lock file.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// Another holder kept the lock for the whole timeout.
    #[error(
        "the node lock {path} is held by another nri-accel process (the daemon, an upgrade or the CLI); gave up after {waited:?}. Retry when it is done"
    )]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// How long this caller waited.
        waited: Duration,
    },
    /// flock failed for a reason other than contention.
    #[error("cannot lock the node lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// What the kernel said.
        source: Errno,
    },
}

/// The node lock of one state dir. Cheap to keep and clone; taking it is [`NodeLock::lock`].
#[derive(Debug, Clone)]
pub struct NodeLock {
    dir: Arc<Dir>,
    path: PathBuf,
    read_only: bool,
}

/// Proof that this caller holds the node lock; dropping it releases the lock.
#[derive(Debug)]
pub struct NodeLockGuard {
    _dir: Flock<OwnedFd>,
    _file: Option<Flock<File>>,
    watch: NodeLockWatch,
}

impl NodeLockGuard {
    /// The lock file held.
    pub fn path(&self) -> &Path {
        &self.watch.path
    }

    /// What checks, for as long as the lock is held, that it still is what its names point to.
    pub fn watch(&self) -> NodeLockWatch {
        self.watch.clone()
    }
}

/// Checks that a held node lock is still what its names point to: the state dir at its path,
/// and `node.lock` in it the file locked. Cheap to clone; holds no lock itself.
#[derive(Debug, Clone)]
pub struct NodeLockWatch {
    dir: Arc<Dir>,
    path: PathBuf,
    /// (device, inode) of the lock file locked; `None` for a read-only probe that found none.
    file: Option<(u64, u64)>,
}

/// How a held node lock stopped being what its names point to.
#[derive(Debug, thiserror::Error)]
pub enum LockLost {
    /// `node.lock` is gone from the state dir.
    #[error("the node lock {path} was removed")]
    Removed {
        /// The lock file.
        path: PathBuf,
    },
    /// Another file is at `node.lock`'s name.
    #[error("the node lock {path} was replaced by another file")]
    Replaced {
        /// The lock file.
        path: PathBuf,
    },
    /// The state dir is no longer at its path.
    #[error("the node lock's state dir {0}")]
    StateDir(DirMoved),
    /// The lock file could not be examined.
    #[error("the node lock {path} cannot be checked: {source}")]
    Unchecked {
        /// The lock file.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
}

fn identity(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

impl NodeLockWatch {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `Ok` while the state dir is still at its path and `node.lock` in it is still the file
    /// locked; otherwise how it changed. Once either changed, another nri-accel can take the
    /// lock: the holder must stop changing the state.
    pub fn check(&self) -> Result<(), LockLost> {
        self.dir.check_at_path().map_err(LockLost::StateDir)?;
        let Some(mine) = self.file else {
            return Ok(());
        };
        match self.dir.stat(NODE_LOCK_FILE) {
            Ok(Some(st)) if identity(&st) == mine => Ok(()),
            Ok(Some(_)) => Err(LockLost::Replaced {
                path: self.path.clone(),
            }),
            Ok(None) => Err(LockLost::Removed {
                path: self.path.clone(),
            }),
            Err(source) => Err(LockLost::Unchecked {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// What one attempt at both locks found.
enum Attempt {
    Locked(NodeLockGuard),
    /// Another holder has one of them (or the file changed under the attempt): try again.
    Busy,
}

impl NodeLock {
    /// Creates (mode 0600) or opens `<state_dir>/node.lock`; takes no lock yet. The state
    /// dir must exist and not be a symbolic link.
    pub fn open(state_dir: &Path) -> Result<NodeLock, NodeLockError> {
        let dir = Dir::open(state_dir).map_err(|e| NodeLockError::Open {
            path: state_dir.join(NODE_LOCK_FILE),
            source: e.into_io(),
        })?;
        Self::open_in(Arc::new(dir))
    }

    /// [`NodeLock::open`] in an opened state dir.
    pub fn open_in(dir: Arc<Dir>) -> Result<NodeLock, NodeLockError> {
        let lock = NodeLock {
            path: dir.display(NODE_LOCK_FILE),
            dir,
            read_only: false,
        };
        lock.open_file()?;
        Ok(lock)
    }

    /// The node lock of `state_dir` for a read-only caller: creates nothing. `Ok(None)` when
    /// the state dir does not exist (then no daemon has ever run there). Without a lock file in
    /// it, taking the lock takes the state dir's alone.
    pub fn open_existing(state_dir: &Path) -> Result<Option<NodeLock>, NodeLockError> {
        let dir = match Dir::open(state_dir) {
            Ok(d) => d,
            Err(cdi::DirError::Missing { .. }) => return Ok(None),
            Err(e) => {
                return Err(NodeLockError::Open {
                    path: state_dir.join(NODE_LOCK_FILE),
                    source: e.into_io(),
                });
            }
        };
        Ok(Some(NodeLock {
            path: dir.display(NODE_LOCK_FILE),
            dir: Arc::new(dir),
            read_only: true,
        }))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_file(&self) -> Result<File, NodeLockError> {
        let flags = if self.read_only {
            OFlag::O_RDONLY
        } else {
            OFlag::O_RDWR | OFlag::O_CREAT
        };
        self.dir
            .open_file(NODE_LOCK_FILE, flags, 0o600)
            .map_err(|source| NodeLockError::Open {
                path: self.path.clone(),
                source,
            })
    }

    /// Takes the lock exclusively, trying every [`POLL_INTERVAL`] until
    /// `timeout` has passed (a zero timeout tries once).
    pub fn lock(&self, timeout: Duration) -> Result<NodeLockGuard, NodeLockError> {
        let start = Instant::now();
        loop {
            if let Attempt::Locked(guard) = self.attempt()? {
                return Ok(guard);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(NodeLockError::Busy {
                    path: self.path.clone(),
                    waited,
                });
            }
            std::thread::sleep(POLL_INTERVAL.min(timeout - waited));
        }
    }

    /// One try at both locks, the state dir's first; neither is kept unless both are taken,
    /// so a waiter never holds one while it waits for the other.
    fn attempt(&self) -> Result<Attempt, NodeLockError> {
        let lock_error = |source| NodeLockError::Lock {
            path: self.path.clone(),
            source,
        };
        let dir_fd = self.dir.reopen().map_err(|source| NodeLockError::Open {
            path: self.dir.path().to_path_buf(),
            source,
        })?;
        let dir_lock = match Flock::lock(dir_fd, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, Errno::EWOULDBLOCK | Errno::EINTR)) => return Ok(Attempt::Busy),
            Err((_, e)) => return Err(lock_error(e)),
        };
        let file = match self.open_file() {
            Ok(f) => Some(f),
            // A read-only probe of a state dir without the file (removed, or never made).
            Err(NodeLockError::Open { source, .. })
                if self.read_only && source.kind() == io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let (file_lock, file_id) = match file {
            None => (None, None),
            Some(file) => {
                let flock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                    Ok(l) => l,
                    Err((_, Errno::EWOULDBLOCK | Errno::EINTR)) => return Ok(Attempt::Busy),
                    Err((_, e)) => return Err(lock_error(e)),
                };
                let mine = identity(&fstat(&*flock).map_err(lock_error)?);
                // Removed or replaced between the open and the flock: a lock nobody else sees.
                match self.dir.stat(NODE_LOCK_FILE) {
                    Ok(Some(st)) if identity(&st) == mine => {}
                    Ok(_) => return Ok(Attempt::Busy),
                    Err(source) => {
                        return Err(NodeLockError::Open {
                            path: self.path.clone(),
                            source,
                        });
                    }
                }
                (Some(flock), Some(mine))
            }
        };
        Ok(Attempt::Locked(NodeLockGuard {
            _dir: dir_lock,
            _file: file_lock,
            watch: NodeLockWatch {
                dir: self.dir.clone(),
                path: self.path.clone(),
                file: file_id,
            },
        }))
    }
}
