//! A crash at every named step of prepare and unprepare, then a restart:
//! records and specs agree, no device is granted twice, none is leaked, and a
//! retried prepare or unprepare completes.

mod engine_common;

use engine_common::*;
use nri_accel::engine::{CrashPoint, EngineError};

const PREPARE_STEPS: [CrashPoint; 5] = [
    CrashPoint::AfterAllocate,
    CrashPoint::AfterCheckpoint,
    CrashPoint::AfterUpdatePush,
    CrashPoint::AfterSpecTemp,
    CrashPoint::AfterSpecRename,
];

const UNPREPARE_STEPS: [CrashPoint; 4] = [
    CrashPoint::AfterCheckpoint,
    CrashPoint::AfterRelease,
    CrashPoint::AfterUpdatePush,
    CrashPoint::AfterSpecRemove,
];

/// After a restart: every record has its spec and the other way round, and
/// every device is held by at most one claim.
fn assert_consistent(d: &Dirs, engine: &nri_accel::engine::Engine) {
    let records = {
        let mut v: Vec<String> = engine
            .claims()
            .into_iter()
            .map(|(a, _)| a.claim_uid)
            .collect();
        v.sort();
        v
    };
    assert_eq!(records, spec_uids(d), "records and specs agree");
    let mut held = std::collections::BTreeMap::new();
    for (a, _) in engine.claims() {
        for g in a.results {
            if let Some(other) = held.insert(g.device_id.clone(), a.claim_uid.clone()) {
                panic!(
                    "device {} granted to {} and {}",
                    g.device_id, other, a.claim_uid
                );
            }
        }
    }
}

#[tokio::test]
async fn crash_at_every_prepare_step_then_restart_and_retry() {
    for step in PREPARE_STEPS {
        let d = dirs();
        {
            let (engine, _) = open_with(&d, 2, 1, Some(die_at(step))).unwrap();
            engine.container_started("ctr-shared", &[]);
            let err = engine
                .prepare(claim_for("victim", "gpu0"))
                .await
                .unwrap_err();
            assert!(
                matches!(err, EngineError::Crashed(p) if p == step),
                "{step}: {err}"
            );
        }
        let (engine, _) = open_with(&d, 2, 1, None).unwrap();
        assert_consistent(&d, &engine);
        // No leak: the device is either still the victim's (the crash came
        // after the grant was complete) or free for anyone.
        let holders: Vec<String> = engine
            .claims()
            .into_iter()
            .map(|(a, _)| a.claim_uid)
            .collect();
        if step == CrashPoint::AfterSpecRename {
            assert_eq!(
                holders,
                vec!["victim"],
                "{step}: a spec in place is a grant"
            );
        } else {
            assert!(holders.is_empty(), "{step}: rolled back, got {holders:?}");
        }
        // The kubelet retries: it completes, and answers the same either way.
        let p = engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
        assert_eq!(
            p.devices[0].cdi_id, "accel.nri.io/device=claim-victim-0",
            "{step}"
        );
        assert_consistent(&d, &engine);
        assert!(
            engine.prepare(claim_for("other", "gpu0")).await.is_err(),
            "{step}"
        );
    }
}

#[tokio::test]
async fn crash_at_every_unprepare_step_then_restart_and_retry() {
    for step in UNPREPARE_STEPS {
        let d = dirs();
        {
            let (engine, _) = open_with(&d, 2, 1, None).unwrap();
            engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
        }
        {
            let (engine, _) = open_with(&d, 2, 1, Some(die_at(step))).unwrap();
            engine.container_started("ctr-shared", &[]);
            let err = engine.unprepare("victim").await.unwrap_err();
            assert!(
                matches!(err, EngineError::Crashed(p) if p == step),
                "{step}: {err}"
            );
        }
        let (engine, _) = open_with(&d, 2, 1, None).unwrap();
        assert_consistent(&d, &engine);
        // Every unprepare step comes after the record's removal is durable.
        assert!(engine.claims().is_empty(), "{step}: released");
        engine.unprepare("victim").await.unwrap();
        assert_consistent(&d, &engine);
        engine.prepare(claim_for("next", "gpu0")).await.unwrap();
    }
}
