//! Container updates waiting to reach the runtime.
//!
//! Updates are committed as pending before they are delivered and cleared only
//! when the runtime took them. They reach the runtime two ways:
//!
//! - **In an event's reply.** CreateContainer and StopContainer replies (and
//!   Synchronize's) carry an update list; [`take_for_reply`] hands every pending
//!   update to such a reply and clears it, so nothing a reply carried is ever
//!   pushed.
//! - **Pushed** through [`UpdateSink`] (an unsolicited UpdateContainers), and
//!   only where the runtime says it is safe ([`Delivery::Push`]). Runtimes
//!   before NRI v0.12.1 (every containerd up to 2.3 and every CRI-O release)
//!   take, for a plugin's UpdateContainers, a lock that an event in progress
//!   holds while it waits for another: a push that meets any event in flight,
//!   even one sent milliseconds after a handler answered, hangs the runtime for
//!   good (containerd#13733, nri#301; seen on real containerd 1.7.34, 2.3.4 and
//!   CRI-O 1.36). There updates wait for the next reply ([`Delivery::Replies`]).
//!
//! The rule is kept in one place. Work an NRI handler starts runs inside
//! [`in_nri_handler`]; a flush asked for there pushes nothing. A handler whose
//! reply cannot carry updates wakes the daemon's flusher ([`wake`],
//! [`wait_for_work`]) once its work is done, on runtimes that allow pushes.
//! Callers outside handlers (the claims API, reconciliation) push before they
//! answer where pushes are allowed, and otherwise leave the updates pending.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use policies::ContainerUpdate;

use super::Engine;
use crate::checkpoint::Change;

/// Where container updates go: the runtime's UpdateContainers.
#[async_trait::async_trait]
pub trait UpdateSink: Send + Sync + 'static {
    /// Pushes `updates`; answers the container IDs the runtime could not update,
    /// or an error when nothing could be delivered.
    async fn push(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, String>;
}

tokio::task_local! {
    /// Set while work started by an NRI handler runs (see the module docs).
    static IN_NRI_HANDLER: ();
}

/// Runs `work` as work of an NRI handler: any flush of pending updates it asks for only wakes the
/// flusher, so nothing it does waits on UpdateContainers. Wrap the future handed to
/// `tokio::spawn`, as the task-local marker does not cross into other tasks.
pub async fn in_nri_handler<F: std::future::Future>(work: F) -> F::Output {
    IN_NRI_HANDLER.scope((), work).await
}

/// How pending container updates may reach the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Only in event replies: the runtime may be inside an event whenever a push would arrive
    /// (NRI before v0.12.1, or a runtime that did not say its version). The default.
    Replies,
    /// In event replies, and pushed through UpdateContainers outside handlers (NRI v0.12.1+).
    Push,
}

impl Delivery {
    /// The delivery a runtime that reports `nri_version` (ConfigureRequest.NRI_version, empty
    /// before NRI v0.12) allows: pushes from v0.12.1 on.
    pub fn for_nri_version(nri_version: &str) -> Delivery {
        match nri_proto::parse_nri_version(nri_version) {
            Some(version) if version >= (0, 12, 1) => Delivery::Push,
            _ => Delivery::Replies,
        }
    }

    /// The name logs and `status` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Replies => "event-replies",
            Delivery::Push => "push",
        }
    }
}

/// Whether the current task runs work of an NRI handler.
pub fn in_handler() -> bool {
    IN_NRI_HANDLER.try_with(|_| ()).is_ok()
}

/// The ordering lock for pending-update commits and the current sink.
#[derive(Default)]
pub(super) struct Pending {
    /// Held around every commit that writes or clears pending updates, so an
    /// older decision never replaces a newer one and a clear never drops one it did not push.
    pub(super) order: tokio::sync::Mutex<()>,
    sink: RwLock<Option<Arc<dyn UpdateSink>>>,
    /// One push at a time: the runtime may apply two overlapping UpdateContainers calls in
    /// either order (containerd serves each request on its own goroutine), and an older cpuset
    /// applied after a newer one would stick with its pending entry already cleared.
    flusher: Mutex<Flusher>,
    /// Woken when updates are committed that nobody pushed (see [`wait_for_work`]).
    work: tokio::sync::Notify,
    /// Whether unsolicited pushes are allowed ([`Delivery::Push`]); off until the runtime says.
    push: AtomicBool,
}

/// Whether a flush is pushing, and whether someone asked for another round meanwhile.
#[derive(Default)]
struct Flusher {
    running: bool,
    again: bool,
}

/// Hands the flusher role back if the flushing future is dropped half-way.
struct FlusherRole<'a>(&'a Pending);

impl Drop for FlusherRole<'_> {
    fn drop(&mut self) {
        let mut f = self.0.flusher();
        f.running = false;
        f.again = false;
    }
}

impl Pending {
    pub(super) fn set_sink(&self, sink: Option<Arc<dyn UpdateSink>>) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = sink;
    }

    pub(super) fn set_delivery(&self, delivery: Delivery) {
        self.push
            .store(delivery == Delivery::Push, Ordering::SeqCst);
    }

    pub(super) fn delivery(&self) -> Delivery {
        if self.push.load(Ordering::SeqCst) {
            Delivery::Push
        } else {
            Delivery::Replies
        }
    }

    fn sink(&self) -> Option<Arc<dyn UpdateSink>> {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn flusher(&self) -> MutexGuard<'_, Flusher> {
        self.flusher.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Pushes what is pending. Pushes never overlap: a flush asked for while another is pushing
/// returns at once and the running one makes another round with the newest pending state, so
/// a newer decision's update always reaches the runtime after an older one's.
pub(super) async fn flush(engine: &Engine) -> usize {
    if engine.pending.delivery() == Delivery::Replies {
        // The next event reply carries them (see the module docs).
        return engine.journal.pending_count();
    }
    if in_handler() {
        // Never from inside a handler: the reply takes them where it can carry updates, and the
        // handler wakes the flusher ([`wake`]) once its event is answered where it cannot.
        return engine.journal.pending_count();
    }
    {
        let mut f = engine.pending.flusher();
        if f.running {
            f.again = true;
            return engine.journal.pending_count();
        }
        f.running = true;
    }
    let _role = FlusherRole(&engine.pending);
    loop {
        let left = flush_once(engine).await;
        let mut f = engine.pending.flusher();
        if f.again {
            f.again = false;
            continue;
        }
        return left;
    }
}

async fn flush_once(engine: &Engine) -> usize {
    let snapshot = engine.journal.pending();
    if snapshot.is_empty() {
        return 0;
    }
    let Some(sink) = engine.pending.sink() else {
        return snapshot.len();
    };
    let updates: Vec<ContainerUpdate> = snapshot.iter().map(|(c, p)| p.to_update(c)).collect();
    let failed: BTreeSet<String> = match sink.push(updates).await {
        Ok(failed) => failed.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, pending = snapshot.len(), "container updates not delivered; they stay pending");
            return snapshot.len();
        }
    };
    let _order = engine.pending.order.lock().await;
    let current = engine.journal.pending();
    let clear: Vec<_> = snapshot
        .iter()
        .filter(|(c, p)| {
            !failed.contains(*c) && current.get(*c).is_some_and(|now| now.seq == p.seq)
        })
        .map(|(c, _)| Change::DeletePending(c.clone()))
        .collect();
    if !clear.is_empty()
        && let Err(e) = engine.commit("pending-updates", clear).await
    {
        tracing::warn!(error = %e, "could not clear delivered container updates; they will be pushed again");
    }
    for c in &failed {
        tracing::warn!(container = %c, "the runtime did not apply a container update; it stays pending");
    }
    engine.journal.pending_count()
}

/// Hands every pending update (but those of `skip`, the container the event is about) to an
/// event reply and clears them all: a reply's updates are never pushed too. While a push is
/// under way its updates are left to it (two deliveries of different ages could land in either
/// order), and this reply carries none.
pub(super) async fn take_for_reply(engine: &Engine, skip: &str) -> Vec<ContainerUpdate> {
    if engine.journal.pending_count() == 0 {
        return Vec::new();
    }
    {
        let mut f = engine.pending.flusher();
        if f.running {
            return Vec::new();
        }
        f.running = true;
    }
    let role = FlusherRole(&engine.pending);
    let updates = {
        let _order = engine.pending.order.lock().await;
        let snapshot = engine.journal.pending();
        let updates: Vec<ContainerUpdate> = snapshot
            .iter()
            .filter(|(c, _)| c.as_str() != skip)
            .map(|(c, p)| p.to_update(c))
            .collect();
        let clear: Vec<_> = snapshot
            .keys()
            .map(|c| Change::DeletePending(c.clone()))
            .collect();
        if !clear.is_empty()
            && let Err(e) = engine.commit("pending-updates", clear).await
        {
            // Memory still has them: a later reply or push delivers them again (the same
            // cpusets, so a second delivery changes nothing).
            tracing::warn!(error = %e, "could not clear container updates handed to an event reply");
        }
        updates
    };
    let again = engine.pending.flusher().again;
    drop(role);
    if again {
        // A flush asked while this reply held the role: the flusher makes that round.
        engine.pending.work.notify_one();
    }
    updates
}

pub(super) async fn forget_except(engine: &Engine, live: &BTreeSet<String>) {
    let _order = engine.pending.order.lock().await;
    let gone: Vec<_> = engine
        .journal
        .pending()
        .keys()
        .filter(|c| !live.contains(*c))
        .map(|c| Change::DeletePending(c.clone()))
        .collect();
    if !gone.is_empty()
        && let Err(e) = engine.commit("pending-updates", gone).await
    {
        tracing::warn!(error = %e, "could not drop updates of containers that are gone");
    }
}

/// Drops the pending updates of one container (it was removed: the runtime no longer has it).
pub(super) async fn forget(engine: &Engine, container_id: &str) {
    if engine.journal.pending_count() == 0 {
        return;
    }
    let _order = engine.pending.order.lock().await;
    if !engine.journal.pending().contains_key(container_id) {
        return;
    }
    let change = vec![Change::DeletePending(container_id.to_string())];
    if let Err(e) = engine.commit("pending-updates", change).await {
        tracing::warn!(container = %container_id, error = %e,
            "could not drop the pending update of a removed container; the next Synchronize drops it");
    }
}

/// Wakes the flusher where pushes are allowed: an NRI handler whose reply cannot carry updates
/// (RemoveContainer, the pod events) calls it once its work is done.
pub(super) fn wake(engine: &Engine) {
    if engine.pending.delivery() == Delivery::Push && engine.journal.pending_count() > 0 {
        engine.pending.work.notify_one();
    }
}

/// Resolves when updates were committed inside an NRI handler and wait for the flusher. A wake
/// that comes while nobody waits is kept for the next call.
pub(super) async fn wait_for_work(engine: &Engine) {
    engine.pending.work.notified().await
}
