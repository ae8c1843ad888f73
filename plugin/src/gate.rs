//! The gate: open only while nri-accel knows which containers are running.
//!
//! It is closed at startup and opened once the container runtime's Synchronize has been answered
//! and the work it started is done (releases of the claims of containers that are gone, the
//! container updates). It closes again when the NRI connection is lost, and opens again only after
//! the next Synchronize on the new connection has done the same. While the runtime is away,
//! containers can start that hold one of our devices without a record; the next Synchronize is
//! where they are found and adopted, and a claim granted before it could take such a device.
//!
//! While the gate is closed the claims API refuses Prepare and Unprepare as a whole request
//! (status Unavailable) so callers retry; List and Status are answered. The kubelet-facing
//! services use the same gate.

use std::sync::Arc;

use tokio::sync::watch;

/// The gate's state, shared by the NRI side (which opens and closes it) and the services that
/// refuse claims while it is closed.
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

    /// Opens the gate and wakes every waiter.
    ///
    /// Returns `true` when this call opened it, `false` when it was already open.
    pub fn open(&self) -> bool {
        self.set(true)
    }

    /// Closes the gate: requests that check it from now on are refused until it opens again.
    /// Requests already admitted run to completion.
    ///
    /// Returns `true` when this call closed it, `false` when it was already closed.
    pub fn close(&self) -> bool {
        self.set(false)
    }

    fn set(&self, open: bool) -> bool {
        self.state.send_if_modified(|now| {
            if *now == open {
                false
            } else {
                *now = open;
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
        self.wait_for(true).await
    }

    /// Waits until the gate is closed; returns at once when it already is.
    pub async fn wait_closed(&self) {
        self.wait_for(false).await
    }

    async fn wait_for(&self, open: bool) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so `wait_for` cannot see a closed channel; if it ever did,
        // there is nothing left to wait for either.
        let _ = rx.wait_for(|now| *now == open).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_closed_opens_and_closes_again() {
        let gate = Gate::new();
        assert!(!gate.is_open());
        assert!(!gate.close(), "closing a closed gate changes nothing");
        assert!(gate.open());
        assert!(gate.is_open());
        assert!(!gate.open(), "a second open changes nothing");
        assert!(gate.close());
        assert!(!gate.is_open());
        assert!(gate.open(), "it opens again");
        assert!(gate.is_open());
    }

    #[test]
    fn clones_share_state() {
        let gate = Gate::new();
        let other = gate.clone();
        other.open();
        assert!(gate.is_open());
        gate.close();
        assert!(!other.is_open());
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
    async fn a_waiter_parked_after_a_close_waits_for_the_reopening() {
        let gate = Gate::new();
        gate.open();
        gate.close();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_open().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a closed gate holds its waiters");
        gate.open();
        waiter.await.expect("waiter task");
        // And the other way round.
        let closing = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_closed().await })
        };
        tokio::task::yield_now().await;
        assert!(!closing.is_finished());
        gate.close();
        closing.await.expect("waiter task");
    }

    #[tokio::test]
    async fn wait_on_open_gate_returns_at_once() {
        let gate = Gate::new();
        gate.open();
        gate.wait_open().await;
    }
}
