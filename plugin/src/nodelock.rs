//! The node lock: one flock on `<state dir>/node.lock` held around every
//! checkpoint read-modify-write, so two nri-accel processes (the daemon and an
//! upgrade's successor, or the CLI) never interleave their changes.
//!
//! flock locks belong to an open file description, so every [`NodeLock::lock`]
//! opens the file afresh: two holders in one process exclude each other exactly
//! as two processes do, and the kernel releases the lock when its holder dies.
//! The file is opened through the state dir's handle ([`cdi::Dir`]), never by path.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi::Dir;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};

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
    _flock: Flock<File>,
    path: PathBuf,
}

impl NodeLockGuard {
    /// The lock file held.
    pub fn path(&self) -> &Path {
        &self.path
    }
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
    /// the state dir or the lock file does not exist (then no daemon has ever run there).
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
        let lock = NodeLock {
            path: dir.display(NODE_LOCK_FILE),
            dir: Arc::new(dir),
            read_only: true,
        };
        match lock.dir.stat(NODE_LOCK_FILE) {
            Ok(Some(_)) => Ok(Some(lock)),
            Ok(None) => Ok(None),
            Err(source) => Err(NodeLockError::Open {
                path: lock.path,
                source,
            }),
        }
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
        let mut file = self.open_file()?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(flock) => {
                    return Ok(NodeLockGuard {
                        _flock: flock,
                        path: self.path.clone(),
                    });
                }
                Err((back, Errno::EWOULDBLOCK)) | Err((back, Errno::EINTR)) => {
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(NodeLockError::Busy {
                            path: self.path.clone(),
                            waited,
                        });
                    }
                    std::thread::sleep(POLL_INTERVAL.min(timeout - waited));
                    file = back;
                }
                Err((_, source)) => {
                    return Err(NodeLockError::Lock {
                        path: self.path.clone(),
                        source,
                    });
                }
            }
        }
    }
}
