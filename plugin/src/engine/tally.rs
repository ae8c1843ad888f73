//! What went wrong in the engine, counted for the metrics: refusals by door and reason, and
//! checkpoint and CDI spec writes that failed. The counts only grow; the daemon copies them into
//! its Prometheus counters when it refreshes its gauges, so the core needs no metrics code.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Origin;

/// The engine's counts since it started.
#[derive(Debug, Default)]
pub(super) struct Tally {
    refusals: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    checkpoint_write_failures: AtomicU64,
    spec_write_failures: AtomicU64,
}

/// A copy of the engine's counts ([`super::Engine::tally`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TallySnapshot {
    /// Policy refusals of a Prepare, by door (`claims_api`, which the DRA driver uses too,
    /// `annotation`, `device_plugin`) and reason ([`policies::RefusalReason::label`]).
    pub refusals: BTreeMap<(&'static str, &'static str), u64>,
    /// Checkpoint commits that failed (the claim was not granted, or not released).
    pub checkpoint_write_failures: u64,
    /// CDI spec writes and removals that failed.
    pub spec_write_failures: u64,
}

impl Tally {
    pub(super) fn refused(&self, origin: &Origin, reason: &policies::RefusalReason) {
        let mut map = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry((door(origin), reason.label())).or_default() += 1;
    }

    pub(super) fn checkpoint_failed(&self) {
        self.checkpoint_write_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn spec_failed(&self) {
        self.spec_write_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> TallySnapshot {
        TallySnapshot {
            refusals: self
                .refusals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            checkpoint_write_failures: self.checkpoint_write_failures.load(Ordering::Relaxed),
            spec_write_failures: self.spec_write_failures.load(Ordering::Relaxed),
        }
    }
}

/// The door a claim came through, as the `door` label says it.
fn door(origin: &Origin) -> &'static str {
    match origin {
        Origin::ClaimsApi => "claims_api",
        Origin::Annotation { .. } => "annotation",
        Origin::Adopted { .. } => "adopted",
        Origin::DevicePlugin(_) => "device_plugin",
    }
}
