//! Container updates waiting to reach the runtime.
//!
//! Updates are committed as pending before they are pushed and cleared only
//! when the runtime took them; failed ones stay and are retried. Pushes go
//! through [`UpdateSink`] from outside any NRI handler (calling UpdateContainers
//! from inside one deadlocks older runtimes).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

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

/// The ordering lock for pending-update commits and the current sink.
#[derive(Default)]
pub(super) struct Pending {
    /// Held around every commit that writes or clears pending updates, so an
    /// older decision never replaces a newer one and a clear never drops one it did not push.
    pub(super) order: tokio::sync::Mutex<()>,
    sink: RwLock<Option<Arc<dyn UpdateSink>>>,
}

impl Pending {
    pub(super) fn set_sink(&self, sink: Option<Arc<dyn UpdateSink>>) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = sink;
    }

    fn sink(&self) -> Option<Arc<dyn UpdateSink>> {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

pub(super) async fn flush(engine: &Engine) -> usize {
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
    engine.journal.pending().len()
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
