//! What a grant depends on staying what the engine opened (issue 39): the node lock, which keeps
//! every other nri-accel off the state only while its names still point at what was locked, and
//! the CDI dir, which the container runtime reads by its path while the engine writes through a
//! handle opened at start.
//!
//! Both are checked before a prepare changes anything and again before its grant is answered,
//! and the daemon checks them every 2 s for /healthz, `status` and the metrics:
//! - A node lock removed or replaced (or its state dir moved) is lost for good: another process
//!   may have taken the lock and changed the state since, so nothing the engine holds in memory
//!   can be trusted to be current. Prepares, unprepares, reconciliation and every commit are
//!   refused until a restart; said once in the log.
//! - A CDI dir that is no longer at its path refuses prepares (a spec the runtime cannot find is
//!   no grant) for as long as it is so; unprepares still remove specs through the handle. Said
//!   in the log each time it changes.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::Serialize;

use super::{Engine, EngineError, Prepared, Then, blocking};
use crate::nodelock::NodeLockWatch;

/// Where the node lock the daemon holds stands (the `node_lock` member of `status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeLockStatus {
    /// The lock file.
    pub path: PathBuf,
    /// Whether the lock is still what its names point to.
    pub held: bool,
    /// When it is not: what happened and what to do, in one sentence.
    pub problem: Option<String>,
}

/// Where the CDI dir stands (the `cdi_dir` member of `status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CdiDirStatus {
    /// The configured CDI dir.
    pub path: PathBuf,
    /// Whether the configured path still leads to the directory opened at start.
    pub in_place: bool,
    /// When it does not: what is there instead and what to do, in one sentence.
    pub problem: Option<String>,
}

/// The engine's watch over the node lock and the CDI dir.
#[derive(Default)]
pub(super) struct Identity {
    lock: Mutex<Option<NodeLockWatch>>,
    /// How the node lock was lost, kept for good from the first check that found it.
    lost: OnceLock<String>,
    /// What is at the CDI dir's path instead of the opened dir, as last said (`None`: in place).
    cdi_said: Mutex<Option<String>>,
}

/// The sentence for a lost node lock (`lost` says how), for the log, /healthz and `status`.
pub fn lock_lost_sentence(lost: &str) -> String {
    format!(
        "{lost} while this nri-accel held it: another nri-accel may take the lock and change the \
         same state, so this one stops granting and releasing claims (prepares and unprepares are \
         refused); stop every nri-accel on this node, then start one"
    )
}

/// The sentence for a CDI dir no longer at its path (`moved` says what is there), for the log,
/// /healthz and `status`.
pub fn cdi_moved_sentence(moved: &str) -> String {
    format!(
        "since nri-accel opened the CDI dir, {moved}: prepares are refused while it is so, \
         because the container runtime reads CDI specs by that path; put the directory back, or \
         restart nri-accel"
    )
}

impl Identity {
    /// Watches `watch` from now on.
    pub(super) fn watch_lock(&self, watch: NodeLockWatch) {
        *self.lock.lock().unwrap_or_else(PoisonError::into_inner) = Some(watch);
    }

    fn watch(&self) -> Option<NodeLockWatch> {
        self.lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How the node lock was lost, if an earlier check found it (no system call).
    pub(super) fn lost(&self) -> Option<&str> {
        self.lost.get().map(String::as_str)
    }

    /// Checks the node lock now; `Err` says how it was lost. The first loss is kept for good
    /// and logged once. `Ok` without a watched lock (tests, one-shot commands).
    pub(super) fn check_lock(&self) -> Result<(), String> {
        if let Some(lost) = self.lost() {
            return Err(lost.to_string());
        }
        let Some(watch) = self.watch() else {
            return Ok(());
        };
        let Err(e) = watch.check() else {
            return Ok(());
        };
        let said = e.to_string();
        if self.lost.set(said.clone()).is_ok() {
            tracing::error!(lock = %watch.path().display(), "{}", lock_lost_sentence(&said));
        }
        Err(self.lost().map_or(said, str::to_string))
    }

    /// Checks the CDI dir now; `Err` says what is at its path instead of the opened dir. A
    /// change either way is logged once.
    pub(super) fn check_cdi(&self, specs: &cdi::SpecStore) -> Result<(), String> {
        let now = specs.check_dir().map_err(|m| m.to_string());
        let mut said = self.cdi_said.lock().unwrap_or_else(PoisonError::into_inner);
        if said.as_deref() != now.as_ref().err().map(String::as_str) {
            match &now {
                Err(moved) => {
                    tracing::error!(dir = %specs.dir().display(), "{}", cdi_moved_sentence(moved))
                }
                Ok(()) => tracing::info!(dir = %specs.dir().display(),
                    "the CDI dir is the directory nri-accel opened again: prepares are served"),
            }
            *said = now.as_ref().err().cloned();
        }
        now
    }

    /// The node lock's status, checked now; `None` without a watched lock.
    pub(super) fn lock_status(&self) -> Option<NodeLockStatus> {
        let path = self.watch()?.path().to_path_buf();
        let problem = self.check_lock().err().map(|l| lock_lost_sentence(&l));
        Some(NodeLockStatus {
            path,
            held: problem.is_none(),
            problem,
        })
    }

    /// The CDI dir's status, checked now.
    pub(super) fn cdi_status(&self, specs: &cdi::SpecStore) -> CdiDirStatus {
        let problem = self.check_cdi(specs).err().map(|m| cdi_moved_sentence(&m));
        CdiDirStatus {
            path: specs.dir().to_path_buf(),
            in_place: problem.is_none(),
            problem,
        }
    }
}

impl Engine {
    /// Refuses a prepare while the node lock is lost or, when `cdi`, the CDI dir is not at its
    /// path; `then` says what the refusal means for the claim. An adoption passes `cdi: false`:
    /// its spec is the record that a running container holds the device, never read by the
    /// runtime, and refusing it would leave the device free to grant once the dir is back.
    pub(super) async fn fence(&self, uid: &str, then: Then, cdi: bool) -> Result<(), EngineError> {
        let (identity, specs) = (self.identity.clone(), self.specs.clone());
        let (lock, cdi) = blocking(uid, move || {
            let lock = identity.check_lock();
            (
                lock,
                if cdi {
                    identity.check_cdi(&specs)
                } else {
                    Ok(())
                },
            )
        })
        .await?;
        match (lock, cdi) {
            (Err(lost), _) => Err(EngineError::NodeLockLost {
                claim: uid.to_string(),
                what: "prepared",
                lost,
                then,
            }),
            (Ok(()), Err(moved)) => Err(EngineError::CdiDirMoved {
                claim: uid.to_string(),
                moved,
                then,
            }),
            (Ok(()), Ok(())) => Ok(()),
        }
    }

    /// The last step of a prepare, after its spec is in place: the grant is answered only if the
    /// node lock and the CDI dir are still what they were when the prepare began. Otherwise a
    /// repeat's earlier grant stands, and a fresh grant is undone as a failed spec write is
    /// (its spec removed, its record rolled back) and refused.
    pub(super) async fn acknowledge(
        &self,
        uid: &str,
        prepared: Prepared,
        cdi: bool,
    ) -> Result<Prepared, EngineError> {
        let Err(refused) = self.fence(uid, Then::KeptAsBefore, cdi).await else {
            return Ok(prepared);
        };
        if prepared.already {
            return Err(refused);
        }
        let then = match self.undo_grant(uid, true, prepared.devices.len()).await {
            Err(then) => then,
            // Its spec could not be removed: the claim stays prepared where the runtime may
            // not look; a retry answers it once the cause is fixed.
            Ok(_) => Then::Unsaid,
        };
        Err(match refused {
            EngineError::NodeLockLost {
                claim, what, lost, ..
            } => EngineError::NodeLockLost {
                claim,
                what,
                lost,
                then,
            },
            EngineError::CdiDirMoved { claim, moved, .. } => {
                EngineError::CdiDirMoved { claim, moved, then }
            }
            other => other,
        })
    }

    /// Refuses any change to the state once the node lock was found lost (no system call:
    /// the checks before each prepare and unprepare, and the daemon's, look).
    pub(super) fn fence_commit(&self, uid: &str) -> Result<(), EngineError> {
        match self.identity.lost() {
            Some(lost) => Err(EngineError::NodeLockLost {
                claim: uid.to_string(),
                what: "changed",
                lost: lost.to_string(),
                then: Then::Unsaid,
            }),
            None => Ok(()),
        }
    }

    /// Watches the node lock the daemon holds: once it is removed or replaced (or its state
    /// dir moved), the engine grants and releases nothing more.
    pub fn watch_node_lock(&self, watch: crate::nodelock::NodeLockWatch) {
        self.identity.watch_lock(watch);
    }

    /// The watched node lock, checked now (`None` when none is watched).
    pub fn node_lock_status(&self) -> Option<NodeLockStatus> {
        self.identity.lock_status()
    }

    /// The CDI dir, checked now: whether its path still leads to the directory opened.
    pub fn cdi_dir_status(&self) -> CdiDirStatus {
        self.identity.cdi_status(&self.specs)
    }

    /// Checks the node lock off the async threads; the inner `Err` says how it was lost.
    pub(super) async fn check_lock(&self, uid: &str) -> Result<Result<(), String>, EngineError> {
        let identity = self.identity.clone();
        blocking(uid, move || identity.check_lock()).await
    }
}
