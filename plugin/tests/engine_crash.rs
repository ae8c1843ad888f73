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
            engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
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
            engine.container_started("ctr-shared", &[], &policies::Placement::unpinned());
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

fn agent_over(engine: nri_accel::engine::Engine) -> nri_accel::daemon::Agent {
    let agent = nri_accel::daemon::Agent::new(
        std::sync::Arc::new(engine),
        nri_accel::daemon::AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    );
    // As after the runtime's first Synchronize.
    drop(agent.sync_started());
    agent
}

fn view(id: &str, annotations: &[(&str, &str)]) -> nri_accel::daemon::ContainerView {
    nri_accel::daemon::ContainerView {
        id: id.into(),
        name: "app".into(),
        pod_namespace: "ns".into(),
        pod_name: format!("pod-{id}"),
        pod_annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// The release paths of the NRI side (RemoveContainer, and the claims of a container found gone
/// at Synchronize) die at every unprepare step, inside handler work (nothing is pushed there);
/// after a restart and a Synchronize the claim is gone, records and specs agree, and the other
/// container's CPUs come back in the Synchronize answer.
#[tokio::test]
async fn crash_at_every_step_of_a_release_by_the_nri_side_then_restart_and_synchronize() {
    use nri_accel::engine::in_nri_handler;
    let ask = [("accel.nri.io/container.app", "count=1")];
    for at_sync in [false, true] {
        for step in UNPREPARE_STEPS {
            let d = dirs();
            let mut bystander = view("bystander", &[]);
            {
                let (engine, _) = open_with(&d, 2, 1, None).unwrap();
                let agent = agent_over(engine);
                agent.create_container(&bystander).await.unwrap();
                let (_, updates) = agent.create_container(&view("c-ann", &ask)).await.unwrap();
                assert_eq!(updates.len(), 1, "the bystander gives a CPU up");
                // The runtime applies it: the bystander is reported there from now on.
                bystander.placement = policies::Placement::cpus(updates[0].cpus.clone());
            }
            {
                let (engine, _) = open_with(&d, 2, 1, Some(die_at(step))).unwrap();
                let agent = agent_over(engine);
                let err = if at_sync {
                    // The container went while nri-accel was away.
                    let synced = agent.synchronize(std::slice::from_ref(&bystander)).await;
                    assert_eq!(synced.gone, vec!["c-ann".to_string()]);
                    in_nri_handler(agent.remove_container("c-ann")).await
                } else {
                    agent
                        .synchronize(&[bystander.clone(), view("c-ann", &[])])
                        .await;
                    in_nri_handler(agent.remove_container("c-ann")).await
                };
                let err = err.unwrap_err();
                assert!(err.contains(step.name()), "{step}: {err}");
            }
            let (engine, _) = open_with(&d, 2, 1, None).unwrap();
            let agent = agent_over(engine);
            let synced = agent.synchronize(std::slice::from_ref(&bystander)).await;
            agent.release_gone(&synced.gone).await;
            let engine = agent.engine();
            assert_consistent(&d, engine);
            assert!(
                engine.claims().is_empty(),
                "{step} (at sync {at_sync}): released"
            );
            let back = synced
                .updates
                .iter()
                .find(|u| u.container_id == "bystander")
                .map(|u| u.cpus.to_string());
            assert_eq!(back.as_deref(), Some("0-7"), "{step}: the CPUs come back");
        }
    }
}
