//! What the stub tells its subscribers about the connection, and the sender both the stub and
//! the plugin service report through. Its own file because both report: the stub (connected,
//! disconnected) and the service it serves (configured, synchronized), and the stub builds that
//! service, so the two must not also reach into each other for the channel.

use tokio::sync::broadcast;

/// What happens to the connection; subscribe with [`crate::Stub::subscribe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StubEvent {
    /// The socket is connected and the plugin service is served; registration follows.
    Connected,
    /// The runtime sent Configure.
    Configured {
        /// Runtime name, e.g. `containerd`.
        runtime_name: String,
        /// Runtime version.
        runtime_version: String,
        /// The runtime's NRI version (empty before v0.12).
        nri_version: String,
    },
    /// The plugin's `synchronize()` returned for the (reassembled) Synchronize; its reply is on
    /// the way. A new connection always brings a new Synchronize, so a daemon can reconcile here.
    /// Wait for the reply to land (e.g. a short delay or the next event) before pushing updates.
    Synchronized {
        /// Pods received.
        pods: usize,
        /// Containers received.
        containers: usize,
    },
    /// The connection is gone; in socket mode the stub reconnects and a new Synchronize follows.
    Disconnected {
        /// Why.
        reason: String,
        /// Whether the runtime answered RegisterPlugin on this connection. `false` for an attempt
        /// that never opened (a runtime that accepts the socket but does not answer): nothing was
        /// lost, and a subscriber should not report it as a lost connection.
        registered: bool,
    },
}

/// The sending side of [`crate::Stub::subscribe`]: a missing subscriber is no error.
#[derive(Clone)]
pub(crate) struct Notifier(broadcast::Sender<StubEvent>);

impl Notifier {
    pub(crate) fn new(tx: broadcast::Sender<StubEvent>) -> Self {
        Notifier(tx)
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<StubEvent> {
        self.0.subscribe()
    }

    pub(crate) fn send(&self, e: StubEvent) {
        tracing::debug!(event = ?e, "NRI stub event");
        let _ = self.0.send(e);
    }
}
