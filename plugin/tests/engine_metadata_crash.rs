//! Device metadata is as crash-safe as a spec: a crash at every named step of a prepare (the
//! metadata is written right before the spec) and of an unprepare, then a restart and the
//! daemon's sweep: a claim with a spec has its files and its spec mounts them; a claim without
//! one has no file left (an orphan is removed); a retried prepare writes them again.

mod engine_common;

use std::sync::Arc;

use engine_common::*;
use nri_accel::engine::{CrashPoint, Engine, EngineError};
use nri_accel::metadata::{
    ClaimMetadata, MetadataDevice, MetadataStore, MetadataWriter, RequestMetadata,
};

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

/// The metadata of `claim_for(uid, "gpu0")`.
fn metadata(uid: &str) -> ClaimMetadata {
    ClaimMetadata {
        driver: "accel.nri.io".into(),
        namespace: "default".into(),
        name: format!("{uid}-claim"),
        uid: uid.into(),
        pod_claim_name: None,
        requests: vec![RequestMetadata {
            name: "gpu".into(),
            devices: vec![MetadataDevice {
                driver: "accel.nri.io".into(),
                pool: "node-1".into(),
                name: "gpus-gpu0".into(),
                attributes: [(
                    "resource.kubernetes.io/pciBusID".to_string(),
                    serde_json::json!({"string": "0000:18:00.0"}),
                )]
                .into(),
            }],
        }],
    }
}

/// The engine with device metadata under `md`, swept as the daemon does at start.
async fn start(
    d: &Dirs,
    md: &std::path::Path,
    step: Option<CrashPoint>,
) -> (Engine, Arc<MetadataWriter>) {
    let (engine, _) = open_with(d, 2, 0, step.map(die_at)).unwrap();
    let writer = Arc::new(MetadataWriter::new(MetadataStore::new(md)));
    engine.set_claim_files(writer.clone());
    engine.sweep_claim_files().await.unwrap();
    (engine, writer)
}

fn metadata_uids(md: &std::path::Path) -> Vec<String> {
    MetadataStore::new(md).list().unwrap()
}

/// Whether claim `uid`'s spec mounts its metadata file.
fn spec_mounts_metadata(d: &Dirs, uid: &str) -> bool {
    let text = std::fs::read_to_string(store(d).spec_path(uid).unwrap()).unwrap();
    text.contains("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/")
}

#[tokio::test]
async fn a_crash_at_every_prepare_step_leaves_no_orphaned_metadata() {
    for step in PREPARE_STEPS {
        let d = dirs();
        let md = d.state.join("metadata");
        {
            let (engine, writer) = start(&d, &md, Some(step)).await;
            writer.stage(metadata("victim"));
            let err = engine
                .prepare(claim_for("victim", "gpu0"))
                .await
                .unwrap_err();
            assert!(
                matches!(err, EngineError::Crashed(p) if p == step),
                "{step}: {err}"
            );
        }
        let (engine, writer) = start(&d, &md, None).await;
        if step == CrashPoint::AfterSpecRename {
            assert_eq!(spec_uids(&d), ["victim"], "{step}");
            assert_eq!(
                metadata_uids(&md),
                ["victim"],
                "{step}: a grant keeps its files"
            );
            assert!(spec_mounts_metadata(&d, "victim"), "{step}");
        } else {
            assert!(spec_uids(&d).is_empty(), "{step}");
            assert!(
                metadata_uids(&md).is_empty(),
                "{step}: no half-done metadata after the restart"
            );
        }
        // The kubelet retries: the files and the spec's mounts are there.
        writer.stage(metadata("victim"));
        engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
        writer.unstage("victim");
        assert_eq!(metadata_uids(&md), ["victim"], "{step}");
        assert!(spec_mounts_metadata(&d, "victim"), "{step}");
    }
}

#[tokio::test]
async fn a_crash_at_every_unprepare_step_leaves_no_orphaned_metadata() {
    for step in UNPREPARE_STEPS {
        let d = dirs();
        let md = d.state.join("metadata");
        {
            let (engine, writer) = start(&d, &md, None).await;
            writer.stage(metadata("victim"));
            engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
        }
        {
            let (engine, _) = start(&d, &md, Some(step)).await;
            assert_eq!(
                metadata_uids(&md),
                ["victim"],
                "{step}: kept while prepared"
            );
            let err = engine.unprepare("victim").await.unwrap_err();
            assert!(
                matches!(err, EngineError::Crashed(p) if p == step),
                "{step}: {err}"
            );
        }
        let (engine, _) = start(&d, &md, None).await;
        assert!(engine.claims().is_empty(), "{step}");
        assert!(spec_uids(&d).is_empty(), "{step}");
        assert!(metadata_uids(&md).is_empty(), "{step}: the orphan is swept");
        engine.unprepare("victim").await.unwrap();
    }
}

#[tokio::test]
async fn a_spec_lost_from_a_held_claim_is_written_again_with_its_metadata_mounts() {
    let d = dirs();
    let md = d.state.join("metadata");
    let (engine, writer) = start(&d, &md, None).await;
    writer.stage(metadata("c1"));
    engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    writer.unstage("c1");
    std::fs::remove_file(store(&d).spec_path("c1").unwrap()).unwrap();
    // A repeat (nothing staged) writes the spec from the record and the files on disk.
    engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    assert!(spec_mounts_metadata(&d, "c1"));
    // The periodic reconciliation keeps a held claim's files and sweeps an orphan's.
    std::fs::create_dir_all(md.join("gone/resourceclaims/x/r")).unwrap();
    engine.reconcile().await.unwrap();
    assert_eq!(metadata_uids(&md), ["c1"]);
}

#[tokio::test]
async fn a_metadata_write_that_fails_grants_nothing_and_a_retry_succeeds() {
    let d = dirs();
    let md = d.state.join("metadata");
    let (engine, writer) = start(&d, &md, None).await;
    // A file where the claim's directory goes: the write fails.
    std::fs::create_dir_all(&md).unwrap();
    std::fs::write(md.join("victim"), b"in the way").unwrap();
    writer.stage(metadata("victim"));
    let err = engine
        .prepare(claim_for("victim", "gpu0"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("device metadata") && text.contains(&md.join("victim").display().to_string()),
        "{text}"
    );
    assert!(engine.claims().is_empty(), "{text}");
    assert!(spec_uids(&d).is_empty());
    // The way cleared, the retry writes the files and the spec.
    std::fs::remove_file(md.join("victim")).unwrap();
    engine.prepare(claim_for("victim", "gpu0")).await.unwrap();
    assert_eq!(metadata_uids(&md), ["victim"]);
    assert!(spec_mounts_metadata(&d, "victim"));
}
