//! The claim engine over real files: prepare/unprepare, idempotency, early
//! prepares, rollback, pending updates and reconciliation.

mod engine_common;

use std::sync::Arc;

use engine_common::*;
use nri_accel::engine::{CrashPoint, DevicePluginOrigin, EngineError, HookAction, Origin};

#[tokio::test]
async fn prepare_writes_record_and_spec_and_repeats_idempotently() {
    let d = dirs();
    let engine = open(&d);
    let p = engine.prepare(claim_for("uid-a", "gpu0")).await.unwrap();
    assert!(!p.already);
    assert_eq!(p.devices.len(), 1);
    assert_eq!(p.devices[0].cdi_id, "accel.nri.io/device=claim-uid-a-0");
    assert_eq!(spec_uids(&d), vec!["uid-a"]);

    let again = engine.prepare(claim_for("uid-a", "gpu0")).await.unwrap();
    assert!(again.already);
    assert_eq!(again.devices, p.devices);
    drop(engine);
    assert_eq!(record_uids(&d.state), vec!["uid-a"]);
}

#[tokio::test]
async fn unprepare_removes_record_and_spec_and_unknown_is_success() {
    let d = dirs();
    let engine = open(&d);
    engine.prepare(claim_for("uid-a", "gpu0")).await.unwrap();
    engine.unprepare("uid-a").await.unwrap();
    engine.unprepare("uid-a").await.unwrap();
    engine.unprepare("never-seen").await.unwrap();
    assert!(spec_uids(&d).is_empty());
    drop(engine);
    assert!(record_uids(&d.state).is_empty());
}

#[tokio::test]
async fn early_prepare_is_refused_naming_both_claims_until_the_holder_is_unprepared() {
    let d = dirs();
    let engine = open(&d);
    engine
        .prepare(claim_for("old-claim", "gpu1"))
        .await
        .unwrap();
    let err = engine
        .prepare(claim_for("new-claim", "gpu1"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, EngineError::Refused(_)), "{text}");
    assert!(
        text.contains("old-claim") && text.contains("new-claim") && text.contains("gpu1"),
        "{text}"
    );
    assert_eq!(spec_uids(&d), vec!["old-claim"], "a refusal writes nothing");
    // Counted by door and reason (nri_accel_refusals_total), and nothing else.
    let tally = engine.tally();
    assert_eq!(
        tally.refusals.into_iter().collect::<Vec<_>>(),
        vec![(("claims_api", "held_by_other"), 1)]
    );
    assert_eq!(
        (tally.checkpoint_write_failures, tally.spec_write_failures),
        (0, 0)
    );

    engine.unprepare("old-claim").await.unwrap();
    engine
        .prepare(claim_for("new-claim", "gpu1"))
        .await
        .unwrap();
    assert_eq!(spec_uids(&d), vec!["new-claim"]);
}

#[tokio::test]
async fn path_traversal_uid_is_refused_before_anything_is_written() {
    let d = dirs();
    let engine = open(&d);
    for uid in ["../x", "a/b", "", ".."] {
        let err = engine.prepare(claim_for(uid, "gpu0")).await.unwrap_err();
        assert!(
            matches!(err, EngineError::InvalidClaim { .. }),
            "{uid}: {err}"
        );
        assert!(engine.unprepare(uid).await.is_err());
    }
    assert!(spec_uids(&d).is_empty());
    assert!(engine.claims().is_empty());
}

/// Two prepares of different claims naming the same device, interleaved so that
/// the second one decides while the first is between its allocation and its
/// commit: exactly one wins, and the loser names the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_prepares_of_one_device_never_both_win() {
    let d = dirs();
    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let reached_tx = std::sync::Mutex::new(Some(reached_tx));
    let go_rx = std::sync::Mutex::new(Some(go_rx));
    // The first claim to reach "after-allocate" parks there until released.
    let hook: nri_accel::engine::CrashHook = Arc::new(move |p| {
        if p == CrashPoint::AfterAllocate
            && let Some(tx) = reached_tx.lock().unwrap().take()
        {
            tx.send(()).unwrap();
            let rx = go_rx.lock().unwrap().take().unwrap();
            rx.recv().unwrap();
        }
        HookAction::Continue
    });
    let (engine, _) = open_with(&d, 4, 0, Some(hook)).unwrap();
    let engine = Arc::new(engine);
    let first = {
        let e = engine.clone();
        tokio::spawn(async move { e.prepare(claim_for("first", "gpu2")).await })
    };
    tokio::task::spawn_blocking(move || reached_rx.recv().unwrap())
        .await
        .unwrap();
    // "first" holds gpu2 in memory but has not committed: "second" must lose.
    let second = engine.prepare(claim_for("second", "gpu2")).await;
    go_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert!(first.is_ok());
    let err = second.unwrap_err().to_string();
    assert!(err.contains("first") && err.contains("gpu2"), "{err}");
    let holders: Vec<String> = engine
        .claims()
        .into_iter()
        .map(|(a, _)| a.claim_uid)
        .collect();
    assert_eq!(holders, vec!["first"]);
    assert_eq!(spec_uids(&d), vec!["first"]);
}

#[tokio::test]
async fn a_failed_spec_write_rolls_the_claim_back() {
    let d = dirs();
    // The opened CDI dir is removed (a file takes its path) after the prepare's checks and
    // before its spec is written: the spec cannot be written (even as root), and the engine
    // keeps to the directory it opened. (A dir already gone is refused before anything is
    // allocated: durability_dirs.rs.)
    let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook: nri_accel::engine::CrashHook = {
        let (cdi, removed) = (d.cdi.clone(), removed.clone());
        Arc::new(move |step| {
            if step == CrashPoint::AfterUpdatePush
                && !removed.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                std::fs::remove_dir_all(&cdi).unwrap();
                std::fs::write(&cdi, b"not a dir").unwrap();
            }
            HookAction::Continue
        })
    };
    let (engine, _) = open_with(&d, 4, 0, Some(hook)).unwrap();
    let err = engine
        .prepare(claim_for("uid-a", "gpu0"))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Spec { .. }), "{err}");
    assert!(engine.claims().is_empty(), "rolled back in memory");
    drop(engine);
    assert!(record_uids(&d.state).is_empty(), "rolled back on disk");
    std::fs::remove_file(&d.cdi).unwrap();
    std::fs::create_dir(&d.cdi).unwrap();
    // The device is free again and a retry completes.
    let engine = open(&d);
    engine.prepare(claim_for("uid-b", "gpu0")).await.unwrap();
    drop(engine);
    assert_eq!(record_uids(&d.state), vec!["uid-b"]);
}

#[tokio::test]
async fn startup_rolls_back_half_prepared_and_removes_orphans() {
    let d = dirs();
    {
        let engine = open(&d);
        engine.prepare(claim_for("kept", "gpu0")).await.unwrap();
        engine.prepare(claim_for("half", "gpu1")).await.unwrap();
        engine.prepare(claim_for("orphan", "gpu2")).await.unwrap();
        engine.unprepare("orphan").await.unwrap();
    }
    // Make "half" lose its spec and "orphan" regain one (stamped with a commit the
    // checkpoint holds: its release is proven).
    let store = store(&d);
    store.remove("half").unwrap();
    store
        .write_stamped(
            "orphan",
            &cdi::Stamp {
                seq: 1,
                boot_id: BOOT.into(),
            },
            &[cdi::DeviceEdits {
                env: vec![("A".into(), "1".into())],
                ..Default::default()
            }],
        )
        .unwrap();
    let (engine, report) = open_with(&d, 4, 0, None).unwrap();
    assert_eq!(report.plan.restore, vec!["kept"]);
    assert_eq!(report.plan.roll_back, vec!["half"]);
    assert_eq!(report.plan.remove_specs, vec!["orphan"]);
    assert_eq!(spec_uids(&d), vec!["kept"]);
    // "half"'s device is free again, "kept"'s is not.
    engine.prepare(claim_for("next", "gpu1")).await.unwrap();
    assert!(engine.prepare(claim_for("thief", "gpu0")).await.is_err());
}

#[tokio::test]
async fn an_unreadable_spec_dir_stops_startup_and_deletes_nothing() {
    let d = dirs();
    {
        let engine = open(&d);
        engine.prepare(claim_for("kept", "gpu0")).await.unwrap();
    }
    let saved = d.cdi.with_extension("saved");
    std::fs::rename(&d.cdi, &saved).unwrap();
    std::fs::write(&d.cdi, b"not a dir").unwrap();
    // Either the store refuses to open or the engine refuses to start: never an empty start.
    let refused = match try_store(&d) {
        Err(e) => e.to_string(),
        Ok(_) => open_with(&d, 4, 0, None)
            .err()
            .expect("startup must fail")
            .to_string(),
    };
    assert!(refused.contains("cdi"), "{refused}");
    assert_eq!(record_uids(&d.state), vec!["kept"], "the record survives");
}

#[tokio::test]
async fn failed_update_pushes_stay_pending_and_reach_the_runtime_later() {
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 2, None).unwrap();
    // A container in the shared CPU pool: granting CPUs to a claim shrinks its cpuset.
    let (_adj, _) = engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    let sink = Arc::new(FlakySink::default());
    *sink.failing.lock().unwrap() = true;
    engine.set_update_sink(Some(sink.clone()));
    engine
        .prepare(claim_for("cpu-claim", "gpu0"))
        .await
        .unwrap();
    assert_eq!(engine.pending_updates(), 1, "the failed push stays pending");
    assert!(sink.delivered.lock().unwrap().is_empty());

    *sink.failing.lock().unwrap() = false;
    assert_eq!(engine.flush_pending().await, 0);
    let delivered = sink.delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].container_id, "ctr-shared");
    assert!(!delivered[0].cpus.is_empty());
    assert!(
        delivered[0].cpus.len() < 8,
        "the shared pool shrank: {:?}",
        delivered[0].cpus
    );
    drop(engine);
    // Nothing pending survives a restart once delivered.
    let (engine, report) = open_with(&d, 4, 2, None).unwrap();
    assert_eq!(report.pending_updates, 0);
    drop(engine);
}

#[tokio::test]
async fn pending_updates_survive_a_restart() {
    let d = dirs();
    {
        let (engine, _) = open_with(&d, 4, 2, None).unwrap();
        engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
        engine
            .prepare(claim_for("cpu-claim", "gpu0"))
            .await
            .unwrap();
        assert_eq!(engine.pending_updates(), 1, "no sink yet: pending");
    }
    let (engine, report) = open_with(&d, 4, 2, None).unwrap();
    assert_eq!(report.pending_updates, 1);
    let sink = Arc::new(FlakySink::default());
    engine.set_update_sink(Some(sink.clone()));
    assert_eq!(engine.flush_pending().await, 0);
    assert_eq!(sink.delivered.lock().unwrap().len(), 1);
}

/// Work an NRI handler starts never pushes through UpdateContainers, on any path, even where the
/// runtime allows pushes: the annotation path's prepare and releases (RemoveContainer, claims of
/// containers found gone at Synchronize, rollbacks) leave their updates pending; the handler's
/// reply takes them, and a reply's updates are never pushed too. Outside a handler, the same
/// calls push before they return.
#[tokio::test]
async fn work_inside_an_nri_handler_pushes_nothing_on_any_path() {
    use nri_accel::engine::{Delivery, in_nri_handler};
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 2, None).unwrap();
    engine.set_delivery(Delivery::Push);
    engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    let sink = Arc::new(FlakySink::default());
    engine.set_update_sink(Some(sink.clone()));
    let origin = nri_accel::engine::Origin::Annotation {
        container_id: "ctr-new".into(),
    };
    in_nri_handler(engine.prepare_as(claim_for("ctr-new", "gpu0"), origin))
        .await
        .unwrap();
    assert!(
        sink.delivered.lock().unwrap().is_empty(),
        "nothing pushed from inside the handler"
    );
    // The reply takes the update and clears it: the flusher has nothing left to push.
    let carried = in_nri_handler(engine.take_pending_for_reply("ctr-new")).await;
    assert_eq!(carried.len(), 1);
    assert_eq!(carried[0].container_id, "ctr-shared");
    assert_eq!(engine.pending_updates(), 0);
    assert_eq!(engine.flush_pending().await, 0);
    assert!(
        sink.delivered.lock().unwrap().is_empty(),
        "never pushed too"
    );
    // A release inside a handler (RemoveContainer): pending, not pushed.
    in_nri_handler(engine.container_removed("ctr-new"))
        .await
        .unwrap();
    assert!(engine.claims().is_empty());
    assert!(sink.delivered.lock().unwrap().is_empty());
    assert_eq!(
        engine.pending_updates(),
        1,
        "ctr-shared grows back, pending"
    );
    in_nri_handler(engine.unprepare("nothing-here"))
        .await
        .unwrap();
    assert!(sink.delivered.lock().unwrap().is_empty());
    // From the claims API the pusher does deliver, the pending update included.
    engine.prepare(claim_for("api", "gpu1")).await.unwrap();
    assert!(!sink.delivered.lock().unwrap().is_empty());
    assert_eq!(engine.pending_updates(), 0);
}

/// On a runtime before NRI v0.12.1 nothing is ever pushed, from a handler or not: a push that
/// meets an event in flight hangs such a runtime for good. Updates wait for the next reply.
#[tokio::test]
async fn before_nri_0_12_1_updates_only_travel_in_replies() {
    use nri_accel::engine::{Delivery, in_nri_handler};
    assert_eq!(Delivery::for_nri_version("v0.12.0"), Delivery::Replies);
    assert_eq!(Delivery::for_nri_version(""), Delivery::Replies);
    assert_eq!(Delivery::for_nri_version("v0.8.0"), Delivery::Replies);
    assert_eq!(Delivery::for_nri_version("v0.12.1"), Delivery::Push);
    assert_eq!(Delivery::for_nri_version("v0.13.0-rc.1"), Delivery::Push);
    assert_eq!(Delivery::for_nri_version("v1.0.0"), Delivery::Push);
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 2, None).unwrap();
    engine.set_delivery(Delivery::Replies);
    engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    let sink = Arc::new(FlakySink::default());
    engine.set_update_sink(Some(sink.clone()));
    // The claims API: committed, answered, not pushed.
    engine.prepare(claim_for("api", "gpu0")).await.unwrap();
    assert_eq!(engine.flush_pending().await, 1);
    assert!(sink.delivered.lock().unwrap().is_empty());
    // The next event's reply carries it, once.
    let carried = in_nri_handler(engine.take_pending_for_reply("ctr-other")).await;
    assert_eq!(carried.len(), 1);
    assert_eq!(carried[0].container_id, "ctr-shared");
    assert!(
        in_nri_handler(engine.take_pending_for_reply("ctr-other"))
            .await
            .is_empty()
    );
    engine.unprepare("api").await.unwrap();
    assert_eq!(
        engine.pending_updates(),
        1,
        "the release's update waits too"
    );
    assert!(sink.delivered.lock().unwrap().is_empty());
}

/// A removed container's pending update is dropped at RemoveContainer, not kept until the next
/// Synchronize (a runtime that fails updates of unknown containers would see it retried).
#[tokio::test]
async fn a_removed_containers_pending_update_is_dropped() {
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 2, None).unwrap();
    engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
    engine.container_started("ctr-other", &[], &policies::Placement::unpinned());
    // No sink: the updates the claim made stay pending.
    engine
        .prepare(claim_for("cpu-claim", "gpu0"))
        .await
        .unwrap();
    assert_eq!(engine.pending_updates(), 2);
    engine.container_removed("ctr-shared").await.unwrap();
    assert_eq!(engine.pending_updates(), 1);
    let (engine, report) = {
        drop(engine);
        open_with(&d, 4, 2, None).unwrap()
    };
    assert_eq!(report.pending_updates, 1, "dropped durably");
    drop(engine);
}

/// A claim that takes a CPU from the shared pool on a node with 12,000 containers in that pool
/// commits an update for each of them with its record (about 1.3 MB with containerd's 64-digit
/// ids): granted, every update pending durably, and all of them back after a restart. With a
/// 1 MiB cap per commit such a claim was refused past about 9,000 containers.
#[tokio::test]
async fn a_claim_moving_the_shared_pool_of_a_big_node_commits_every_update() {
    const CONTAINERS: usize = 12_000;
    let d = dirs();
    let (engine, _) = open_with(&d, 4, 2, None).unwrap();
    for i in 0..CONTAINERS {
        let (adjustment, updates) =
            engine.container_started(&format!("{i:064x}"), &[], &policies::Placement::unpinned());
        assert!(adjustment.cpus.is_none() && updates.is_empty());
    }
    // No sink: the updates the claim made stay pending.
    engine
        .prepare(claim_for("cpu-claim", "gpu0"))
        .await
        .expect("a claim moving the shared pool of 12,000 containers is granted");
    assert_eq!(engine.pending_updates(), CONTAINERS);
    drop(engine);
    let (engine, report) = open_with(&d, 4, 2, None).unwrap();
    assert_eq!(
        report.pending_updates, CONTAINERS,
        "committed with the claim"
    );
    assert_eq!(engine.claims().len(), 1);
}

/// The claims a scheduler did not allocate are the ones the published slices withdraw: a
/// claim naming its devices by DRA results is the scheduler's, a count claim is not; told
/// apart from what the records already hold, so it is the same after a restart, and the record
/// of a DRA claim is an ordinary claims-API record an older nri-accel reads.
#[tokio::test]
async fn only_claims_no_scheduler_allocated_are_unscheduled_before_and_after_a_restart() {
    let d = dirs();
    let unscheduled = |e: &nri_accel::engine::Engine| {
        e.with_unscheduled_claims(|claims| {
            let mut uids: Vec<String> = claims.map(|a| a.claim_uid.to_string()).collect();
            uids.sort();
            uids
        })
    };
    let engine = open(&d);
    engine
        .prepare(claim_for("dra-claim", "gpu0"))
        .await
        .unwrap();
    engine.prepare(claim_count("count-claim", 1)).await.unwrap();
    // A device plugin's claim is the kubelet's, not a scheduler's, whatever its ask.
    let device_plugin = Origin::DevicePlugin(Box::new(DevicePluginOrigin {
        resource: "accel.nri.io/whole".into(),
        device_ids: vec!["gpu2".into()],
        allocated_at: 0,
        user: None,
    }));
    engine
        .prepare_as(claim_for("dp-claim", "gpu2"), device_plugin)
        .await
        .unwrap();
    assert_eq!(unscheduled(&engine), vec!["count-claim", "dp-claim"]);
    drop(engine);
    let records = std::fs::read_dir(&d.state)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect::<String>();
    assert!(!records.contains(r#""kind":"dra""#), "{records}");

    let engine = open(&d);
    assert_eq!(unscheduled(&engine), vec!["count-claim", "dp-claim"]);
    engine.unprepare("count-claim").await.unwrap();
    engine.unprepare("dp-claim").await.unwrap();
    assert!(unscheduled(&engine).is_empty());
    engine.unprepare("dra-claim").await.unwrap();
    engine
        .prepare(claim_count("dra-claim-reused", 1))
        .await
        .unwrap();
    assert_eq!(unscheduled(&engine), vec!["dra-claim-reused"]);
}
