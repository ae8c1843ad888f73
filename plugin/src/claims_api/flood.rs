//! Keeping the claims API open to new peers under a flood of connections, and saying so in a
//! few lines (issue 39 item 6).
//!
//! Connections that sit on a slot without a call in flight are what shut new clients out: 128
//! idle connections (the default `claims_api.max_connections`) held the socket for the whole
//! idle timeout. So a connection that has sent no request within
//! `claims_api.first_request_timeout_seconds` is closed, and when every slot is taken a new
//! connection evicts one that has no call in flight: first the oldest that never sent a
//! request, else the one silent longest. Only when every slot has a call in flight is a new
//! connection refused. A per-uid cap would not help: the peers admitted are root, nri-accel's
//! own uid and one group, so a flooding root process and the kubelet's DRA driver look alike.
//!
//! Every refused, evicted or closed connection is counted in [`ConnLog`], which writes one line
//! when the first happens and then one summary with counts per [`SUMMARY_EVERY`] while more
//! come, instead of a line per connection.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::sync::Notify;

/// How often a flood is summed up in the log while it lasts.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// What a connection is doing, as the acceptor needs to know to pick one to evict.
pub(crate) struct ConnState {
    /// Milliseconds since the table's epoch of the connection's last read or write.
    last_active_ms: AtomicU64,
    /// Requests read whose response has not been written yet.
    in_flight: AtomicUsize,
    /// Whether a request was ever read on it.
    requested: AtomicBool,
    /// Set by the acceptor: the connection ends at its next poll, as if the peer had closed.
    evicted: AtomicBool,
    waker: AtomicWaker,
    epoch: Instant,
    /// The table's signal that a call ended.
    call_ended: Arc<Notify>,
}

impl ConnState {
    /// Notes activity: a read or a write, and the calls in flight after it.
    pub(crate) fn active(&self, in_flight: usize, requested: bool) {
        self.last_active_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        let before = self.in_flight.swap(in_flight, Ordering::Relaxed);
        if before > 0 && in_flight == 0 {
            self.call_ended.notify_one();
        }
        if requested {
            self.requested.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the acceptor evicted the connection; registers the task's waker first so an
    /// eviction after this check wakes it.
    pub(crate) fn evicted(&self, cx: &std::task::Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.evicted.load(Ordering::Acquire)
    }
}

/// The open connections, for eviction.
pub(crate) struct ConnTable {
    epoch: Instant,
    conns: Mutex<Vec<Weak<ConnState>>>,
    /// Told when a connection's last call in flight ends: it can be evicted now.
    call_ended: Arc<Notify>,
}

impl Default for ConnTable {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            conns: Mutex::new(Vec::new()),
            call_ended: Arc::new(Notify::new()),
        }
    }
}

impl ConnTable {
    /// Adds a connection; it leaves the table when its state is dropped.
    pub(crate) fn register(&self) -> Arc<ConnState> {
        let state = Arc::new(ConnState {
            last_active_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            in_flight: AtomicUsize::new(0),
            requested: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            epoch: self.epoch,
            call_ended: Arc::clone(&self.call_ended),
        });
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|w| w.strong_count() > 0);
        conns.push(Arc::downgrade(&state));
        state
    }

    /// Ends one connection with no call in flight to make room: the oldest that never sent a
    /// request, else the one silent longest. Answers whether one was found; its slot is freed
    /// once its task has seen the eviction.
    pub(crate) fn evict_one(&self) -> Option<Eviction> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|w| w.strong_count() > 0);
        let victim = conns
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| {
                c.in_flight.load(Ordering::Relaxed) == 0 && !c.evicted.load(Ordering::Relaxed)
            })
            .min_by_key(|c| {
                (
                    c.requested.load(Ordering::Relaxed),
                    c.last_active_ms.load(Ordering::Relaxed),
                )
            })?;
        victim.evicted.store(true, Ordering::Release);
        victim.waker.wake();
        Some(if victim.requested.load(Ordering::Relaxed) {
            Eviction::Idle
        } else {
            Eviction::NeverRequested
        })
    }

    /// [`ConnTable::evict_one`], waiting up to `grace` for a call in flight to end when every
    /// connection has one. A peer reads its answer as soon as the bytes are written, before the
    /// connection's task has counted the write: a client that reconnects at once would otherwise
    /// be refused because of its own call, already answered.
    pub(crate) async fn evict_one_within(&self, grace: Duration) -> Option<Eviction> {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Asked for before the check, so a call ending in between is not missed (a
            // notification with no waiter is kept for the next one).
            let ended = self.call_ended.notified();
            if let Some(eviction) = self.evict_one() {
                return Some(eviction);
            }
            tokio::time::timeout_at(deadline, ended).await.ok()?;
        }
    }
}

/// Which kind of connection made room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// One that never sent a request.
    NeverRequested,
    /// One with no call in flight that had sent requests before.
    Idle,
}

/// What happened to a connection, as counted in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnEvent {
    /// Closed to make room for a new one (it never sent a request).
    EvictedNeverRequested,
    /// Closed to make room for a new one (idle, no call in flight).
    EvictedIdle,
    /// Refused: every slot had a call in flight.
    RefusedFull,
    /// Refused by credentials.
    RefusedPeer,
    /// Its credentials could not be read.
    NoCredentials,
    /// Closed: no request within the first-request timeout.
    NoFirstRequest,
    /// Closed: idle past the idle timeout.
    Idle,
}

impl ConnEvent {
    const ALL: [ConnEvent; 7] = [
        ConnEvent::EvictedNeverRequested,
        ConnEvent::EvictedIdle,
        ConnEvent::RefusedFull,
        ConnEvent::RefusedPeer,
        ConnEvent::NoCredentials,
        ConnEvent::NoFirstRequest,
        ConnEvent::Idle,
    ];

    fn index(self) -> usize {
        Self::ALL.iter().position(|e| *e == self).unwrap_or(0)
    }

    /// The count's name in a summary.
    fn name(self) -> &'static str {
        match self {
            ConnEvent::EvictedNeverRequested => "evicted_without_request",
            ConnEvent::EvictedIdle => "evicted_idle",
            ConnEvent::RefusedFull => "refused_all_busy",
            ConnEvent::RefusedPeer => "refused_credentials",
            ConnEvent::NoCredentials => "refused_unreadable_credentials",
            ConnEvent::NoFirstRequest => "closed_without_request",
            ConnEvent::Idle => "closed_idle",
        }
    }

    /// Whether it is worth a warning (a client was turned away or cut off early) rather than
    /// information (a connection closed by the rules it agreed to).
    fn warns(self) -> bool {
        !matches!(self, ConnEvent::Idle | ConnEvent::NoFirstRequest)
    }
}

#[derive(Default)]
struct LogState {
    counts: [u64; ConnEvent::ALL.len()],
    /// Whether a summary is due (a window is open): events are then only counted.
    window_open: bool,
}

/// Counts connection events and logs them rate-limited: the first of a quiet period at once,
/// with its reason; then, while more come, one line per [`SUMMARY_EVERY`] with the counts.
pub(crate) struct ConnLog {
    state: Mutex<LogState>,
    every: Duration,
    cap: usize,
}

impl ConnLog {
    /// A log for a server of `cap` connections.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Self::with_period(cap, SUMMARY_EVERY)
    }

    /// A log whose summaries come every `every`.
    pub(crate) fn with_period(cap: usize, every: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(LogState::default()),
            every,
            cap,
        })
    }

    /// Counts `event` for peer `uid`; the first of a quiet period is logged with `why`.
    /// Needs a tokio runtime (the summary is written by a task of its own).
    pub(crate) fn note(self: &Arc<Self>, event: ConnEvent, uid: Option<u32>, why: &str) {
        let first = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.window_open {
                st.counts[event.index()] += 1;
                false
            } else {
                st.window_open = true;
                true
            }
        };
        if !first {
            return;
        }
        let uid = uid
            .map(|u| u.to_string())
            .unwrap_or_else(|| "unknown".into());
        let secs = self.every.as_secs();
        if event.warns() {
            tracing::warn!(peer_uid = %uid, event = event.name(),
                "claims API connection {why}; further connection events are summed up every {secs}s while they last");
        } else {
            tracing::info!(peer_uid = %uid, event = event.name(),
                "claims API connection {why}; further connection events are summed up every {secs}s while they last");
        }
        let log = Arc::clone(self);
        tokio::spawn(async move { log.summarize().await });
    }

    /// Writes a summary per period while events come; closes the window after a quiet one.
    async fn summarize(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.every).await;
            let counts = {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let counts = std::mem::take(&mut st.counts);
                if counts.iter().all(|c| *c == 0) {
                    st.window_open = false;
                    return;
                }
                counts
            };
            let mut text = String::new();
            let mut warns = false;
            for event in ConnEvent::ALL {
                let n = counts[event.index()];
                if n > 0 {
                    let _ = write!(
                        text,
                        "{}{}={n}",
                        if text.is_empty() { "" } else { " " },
                        event.name()
                    );
                    warns |= event.warns();
                }
            }
            let secs = self.every.as_secs();
            let cap = self.cap;
            if warns {
                tracing::warn!(counts = %text, max_connections = cap,
                    "claims API connections in the last {secs}s: {text}; idle connections are closed to admit new peers, and a peer is refused only when all {cap} connections (claims_api.max_connections) have a call in flight");
            } else {
                tracing::info!(counts = %text, "claims API connections in the last {secs}s: {text}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log text written while the guard lives (the test's own thread).
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl Logs {
        fn lines(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .map(str::to_string)
                .collect()
        }
    }

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Polls until `done` (no assertion depends on how long it takes; a minute guards a hang).
    async fn until(mut done: impl FnMut() -> bool) {
        let guard = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < guard, "gave up waiting");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_thousand_connection_events_are_one_line_then_one_summary_with_counts() {
        let (logs, _guard) = capture();
        let log = ConnLog::with_period(8, Duration::from_millis(20));
        for _ in 0..900 {
            log.note(
                ConnEvent::EvictedNeverRequested,
                Some(1000),
                "closed to make room",
            );
        }
        for _ in 0..100 {
            log.note(ConnEvent::RefusedPeer, Some(1001), "refused: not allowed");
        }
        assert_eq!(logs.lines().len(), 1, "{:?}", logs.lines());
        assert!(logs.lines()[0].contains("closed to make room"));
        until(|| logs.lines().len() >= 2).await;
        let lines = logs.lines();
        assert!(
            lines[1].contains("evicted_without_request=899 refused_credentials=100"),
            "{lines:?}"
        );
        // A quiet period closes the window: the next event is logged at once again.
        until(|| !log.state.lock().unwrap().window_open).await;
        log.note(ConnEvent::Idle, Some(0), "closed: idle");
        let lines = logs.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].contains("closed: idle"), "{lines:?}");
    }

    #[test]
    fn eviction_takes_a_silent_connection_first_then_the_longest_idle_never_a_busy_one() {
        let table = ConnTable::default();
        let busy = table.register();
        busy.active(1, true);
        let idle = table.register();
        idle.active(0, true);
        let silent = table.register();
        assert_eq!(table.evict_one(), Some(Eviction::NeverRequested));
        assert!(silent.evicted.load(Ordering::SeqCst));
        assert_eq!(table.evict_one(), Some(Eviction::Idle));
        assert!(idle.evicted.load(Ordering::SeqCst));
        assert_eq!(
            table.evict_one(),
            None,
            "a connection with a call in flight stays"
        );
        assert!(!busy.evicted.load(Ordering::SeqCst));
        drop((busy, idle, silent));
        assert_eq!(table.evict_one(), None);
    }

    #[tokio::test]
    async fn a_call_ending_while_a_new_peer_waits_makes_room_instead_of_a_refusal() {
        let table = Arc::new(ConnTable::default());
        let busy = table.register();
        busy.active(1, true);
        let waiting = tokio::spawn({
            let table = Arc::clone(&table);
            async move { table.evict_one_within(Duration::from_secs(60)).await }
        });
        // The new peer is waiting: every connection has a call in flight.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        assert!(!busy.evicted.load(Ordering::SeqCst));
        // The call's answer is written: the connection is idle and makes room.
        busy.active(0, true);
        assert_eq!(waiting.await.unwrap(), Some(Eviction::Idle));
        assert!(busy.evicted.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_peer_is_refused_when_every_call_stays_in_flight_past_the_grace() {
        let table = ConnTable::default();
        let busy = table.register();
        busy.active(1, true);
        // Activity that leaves the call in flight wakes nobody for nothing.
        busy.active(1, true);
        assert_eq!(
            table.evict_one_within(Duration::from_millis(20)).await,
            None
        );
        assert!(!busy.evicted.load(Ordering::SeqCst));
    }
}
