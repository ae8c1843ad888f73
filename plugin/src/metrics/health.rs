//! What `/healthz` answers: healthy once the gate is open and the runtime is connected.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

    /// `Ok(())` when healthy, else the reason in one sentence (what `/healthz` answers with 503).
    pub fn check(&self) -> Result<(), &'static str> {
        let connected = self.inner.runtime_connected.load(Ordering::Acquire);
        let open = self.inner.gate_open.load(Ordering::Acquire);
        match (connected, open) {
            (true, true) => Ok(()),
            (false, _) => Err("not connected to the container runtime's NRI socket"),
            (true, false) => Err("gate closed: the runtime has not finished Synchronize yet"),
        }
    }
}
