//! Container updates reach the runtime in decision order even when two claims' pushes overlap:
//! the runtime (containerd serves each ttrpc request on its own goroutine) may apply two
//! concurrent UpdateContainers in either order, so an older cpuset delivered after a newer one
//! would stick while the pending entry is already cleared. The interleaving is controlled: the
//! first push is held until the second claim's prepare has returned or a second push has begun.

#[path = "engine_common.rs"]
mod engine_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use engine_common::*;
use nri_accel::engine::UpdateSink;
use policies::ContainerUpdate;
use tokio::sync::Notify;

/// A runtime that applies pushes as they complete; the first push waits for `release`.
#[derive(Default)]
struct HeldSink {
    pushes: Mutex<usize>,
    started_second: Notify,
    release: Notify,
    /// Container -> cpus, as the runtime applied them.
    applied: Mutex<BTreeMap<String, String>>,
}

#[async_trait::async_trait]
impl UpdateSink for HeldSink {
    async fn push(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, String> {
        let n = {
            let mut p = self.pushes.lock().unwrap();
            *p += 1;
            *p
        };
        if n == 1 {
            self.release.notified().await;
        } else {
            self.started_second.notify_one();
        }
        let mut applied = self.applied.lock().unwrap();
        for u in updates {
            applied.insert(u.container_id.clone(), u.cpus.to_string());
        }
        Ok(Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_pushes_leave_the_runtime_with_the_newest_cpuset() {
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 1, None).unwrap();
    let engine = Arc::new(engine);
    engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    let sink = Arc::new(HeldSink::default());
    engine.set_update_sink(Some(sink.clone()));

    // The first claim's push is held by the runtime.
    let e = engine.clone();
    let first = tokio::spawn(async move { e.prepare(claim_count("first", 1)).await });
    // Wait until that push is in flight.
    loop {
        if *sink.pushes.lock().unwrap() >= 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let e = engine.clone();
    let second = tokio::spawn(async move { e.prepare(claim_count("second", 1)).await });
    tokio::select! {
        r = second => { r.unwrap().expect("second prepared"); }
        _ = sink.started_second.notified() => {}
    }
    sink.release.notify_one();
    first.await.unwrap().expect("first prepared");
    // Whatever is still pending goes out now.
    assert_eq!(engine.flush_pending().await, 0);

    let want = engine.snapshot().shared_cpus.to_string();
    let got = sink.applied.lock().unwrap().get("ctr-shared").cloned();
    assert_eq!(
        got.as_deref(),
        Some(want.as_str()),
        "the runtime was left with an older cpuset"
    );
    assert_eq!(engine.pending_updates(), 0);
}
