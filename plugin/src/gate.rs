//! The gate: closed at startup, opened once the container runtime's Synchronize has been answered
//! and its own container updates are done, never closed again in the process's life.
//!
//! While the gate is closed the claims API refuses Prepare and Unprepare as a whole request (status
//! Unavailable) so callers retry; until then the containers already running have not reached the
//! policy, and a claim granted now could collide with a device a running container holds.

use std::sync::Arc;

use tokio::sync::watch;

/// A one-way latch shared by the NRI side (which opens it) and the claims API (which waits on it).
///
/// Cloning is cheap; every clone observes the same state.
#[derive(Clone, Debug)]
pub struct Gate {
    state: Arc<watch::Sender<bool>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        let (state, _) = watch::channel(false);
        Self {
            state: Arc::new(state),
        }
    }

    /// Opens the gate and wakes every waiter. Idempotent: a second call changes nothing.
    ///
    /// Returns `true` when this call opened it, `false` when it was already open.
    pub fn open(&self) -> bool {
        self.state.send_if_modified(|open| {
            if *open {
                false
            } else {
                *open = true;
                true
            }
        })
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        *self.state.borrow()
    }

    /// Waits until the gate is open; returns at once when it already is.
    pub async fn wait_open(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so `wait_for` cannot see a closed channel; if it ever did,
        // there is nothing left to wait for either.
        let _ = rx.wait_for(|open| *open).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_closed_and_opens_once() {
        let gate = Gate::new();
        assert!(!gate.is_open());
        assert!(gate.open());
        assert!(gate.is_open());
        assert!(!gate.open(), "a second open changes nothing");
        assert!(gate.is_open());
    }

    #[test]
    fn clones_share_state() {
        let gate = Gate::new();
        let other = gate.clone();
        other.open();
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn waiter_registered_before_open_is_woken() {
        let gate = Gate::new();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_open().await })
        };
        // Let the waiter subscribe and park before the gate opens.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        gate.open();
        waiter.await.expect("waiter task");
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn wait_on_open_gate_returns_at_once() {
        let gate = Gate::new();
        gate.open();
        gate.wait_open().await;
    }
}
