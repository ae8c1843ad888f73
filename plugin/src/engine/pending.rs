//! Container updates waiting to reach the runtime.
//!
//! Updates are committed as pending before they are pushed and cleared only
//! when the runtime took them; failed ones stay and are retried. Pushes go
//! through [`UpdateSink`] and never from inside an NRI handler: runtimes before
//! NRI v0.12.1 hold a lock for the whole event that UpdateContainers also takes,
//! so a handler that waits for its own push waits until the runtime's deadline
//! and is dropped (containerd#13733, nri#301).
//!
//! The rule is kept in one place. Work an NRI handler starts runs inside
//! [`in_nri_handler`]; a flush asked for there pushes nothing: it wakes the
//! daemon's flusher ([`wait_for_work`]), a task of its own that pushes once it
//! runs (on those runtimes the push then waits, without holding anything the
//! handler needs, until the event is answered). Callers outside handlers (the
//! claims API, reconciliation) still push before they answer.

use std::collections::BTreeSet;
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
    if in_handler() {
        // Never from inside a handler: the flusher pushes once it runs.
        engine.pending.work.notify_one();
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

/// Resolves when updates were committed inside an NRI handler and wait for the flusher. A wake
/// that comes while nobody waits is kept for the next call.
pub(super) async fn wait_for_work(engine: &Engine) {
    engine.pending.work.notified().await
}
