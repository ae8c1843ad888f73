//! The accept loop of a kubelet-facing socket: every connection is wrapped in a [`KubeletConn`],
//! and one over the cap is accepted and closed at once (the client sees its connection closed;
//! the first refusal of a burst is logged at WARN).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use tokio::net::UnixListener;

use super::{ConnLimits, KubeletConn};

/// How long the loop waits after a failed accept (out of descriptors, for one), so that it does
/// not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The connections of one socket open now.
#[derive(Debug, Clone, Default)]
pub struct ConnCount(Arc<AtomicUsize>);

impl ConnCount {
    /// How many are open.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Takes a slot when fewer than `max` are taken.
    fn take(&self, max: usize) -> Option<Slot> {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.0.clone()))
    }
}

/// One connection's place in the count; freed when the connection is dropped.
pub(super) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The accepted connections of `listener` (named `socket` in logs), at most
/// `limits.max_connections` open at once, counted in `count`.
pub fn incoming(
    listener: UnixListener,
    socket: Arc<str>,
    limits: ConnLimits,
    count: ConnCount,
) -> impl Stream<Item = std::io::Result<KubeletConn>> + Send + 'static {
    futures::stream::unfold(
        (listener, socket, count, false),
        move |(listener, socket, count, mut refusing)| async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(socket = %socket, error = %e,
                            "cannot accept a kubelet connection; retrying");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let Some(slot) = count.take(limits.max_connections) else {
                    if !refusing {
                        tracing::warn!(socket = %socket, max = limits.max_connections,
                            "refusing kubelet connections: this socket already has its maximum open (max_connections in the dra or device_plugin section); the excess is closed at once");
                    }
                    refusing = true;
                    drop(stream);
                    continue;
                };
                if refusing {
                    tracing::info!(socket = %socket, "accepting kubelet connections again");
                    refusing = false;
                }
                let conn = KubeletConn::new(stream, socket.clone(), limits.idle_timeout, slot);
                return Some((Ok(conn), (listener, socket, count, refusing)));
            }
        },
    )
}
