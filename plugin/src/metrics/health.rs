//! What `/healthz` answers: healthy once the gate is open and the runtime is connected, and for
//! as long as the node lock and the CDI dir are what the daemon opened (issue 39).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Shared health flags, set by the daemon and read by `/healthz`.
///
/// Cloning shares the same flags. Both start false: a daemon is healthy only after it connected to
/// the runtime and opened the gate (Synchronize answered and its updates delivered).
#[derive(Clone, Debug, Default)]
pub struct HealthState {
    inner: Arc<Flags>,
}

#[derive(Debug, Default)]
struct Flags {
    gate_open: AtomicBool,
    runtime_connected: AtomicBool,
    /// Why the node lock is no longer held, in one sentence.
    node_lock: Mutex<Option<String>>,
    /// Why the CDI dir is no longer the one opened, in one sentence.
    cdi_dir: Mutex<Option<String>>,
}

impl HealthState {
    /// New state: gate closed, runtime not connected.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record whether the gate is open (it closes while the NRI connection is lost).
    pub fn set_gate_open(&self, open: bool) {
        self.inner.gate_open.store(open, Ordering::Release);
    }

    /// Record whether the NRI connection to the runtime is up.
    pub fn set_runtime_connected(&self, connected: bool) {
        self.inner
            .runtime_connected
            .store(connected, Ordering::Release);
    }

    /// Record why the node lock is no longer held (`None`: it is).
    pub fn set_node_lock_problem(&self, problem: Option<String>) {
        *self
            .inner
            .node_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// Record why the configured CDI dir is not the one opened (`None`: it is).
    pub fn set_cdi_dir_problem(&self, problem: Option<String>) {
        *self
            .inner
            .cdi_dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// `Ok(())` when healthy, else the reason in one sentence (what `/healthz` answers with 503).
    /// A lost node lock goes first, then a moved CDI dir: either refuses claims whatever the
    /// runtime does.
    pub fn check(&self) -> Result<(), String> {
        for problem in [&self.inner.node_lock, &self.inner.cdi_dir] {
            if let Some(p) = problem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
            {
                return Err(p);
            }
        }
        let connected = self.inner.runtime_connected.load(Ordering::Acquire);
        let open = self.inner.gate_open.load(Ordering::Acquire);
        match (connected, open) {
            (true, true) => Ok(()),
            (false, _) => Err("not connected to the container runtime's NRI socket".into()),
            (true, false) => {
                Err("gate closed: the runtime has not finished Synchronize yet".into())
            }
        }
    }
}
