//! The engine's device check (set by the daemon for shared pools in MPS mode): a fresh grant of a
//! device that fails it is refused with one sentence and leaves nothing held or written; once the
//! device passes, the claim is granted; a claim already granted is not refused on a repeat.

mod engine_common;

use std::sync::Arc;

use engine_common::*;
use nri_accel::engine::EngineError;

#[tokio::test]
async fn a_device_failing_the_check_is_refused_until_it_passes() {
    let d = dirs();
    let pipe = d.state.join("mps-pipe");
    let engine = open(&d);
    let p = pipe.clone();
    engine.set_device_check(Arc::new(move |id: &str| {
        (id == "gpu0" && !p.is_dir())
            .then(|| nri_accel::device_health::mps_pipe_missing(&p.to_string_lossy(), id))
    }));
    let err = engine.prepare(claim_for("c1", "gpu0")).await.unwrap_err();
    assert!(matches!(err, EngineError::Refused(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "claim c1 refused: device gpu0 cannot be handed out now: the MPS pipe directory {} of device gpu0 is missing: start the pool's MPS control daemon with CUDA_MPS_PIPE_DIRECTORY={} (nvidia-cuda-mps-control -d); until then the device is not handed out",
            pipe.display(),
            pipe.display()
        )
    );
    // Nothing held, recorded or written.
    assert!(engine.claims().is_empty());
    assert!(spec_uids(&d).is_empty());
    assert!(record_uids(&d.state).is_empty());
    // Other devices are not concerned.
    engine.prepare(claim_for("c2", "gpu1")).await.unwrap();
    // A running container found holding gpu0 is adopted all the same: refusing would leave its
    // device free for another claim.
    engine.adopt("ctr-running", "gpu0").await.unwrap();
    assert_eq!(engine.claims().len(), 2);
    engine.container_removed("ctr-running").await.unwrap();
    assert_eq!(engine.claims().len(), 1);

    std::fs::create_dir(&pipe).unwrap();
    engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    // The directory goes again: the prepared claim keeps its grant on a repeat.
    std::fs::remove_dir(&pipe).unwrap();
    let again = engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    assert!(again.already);
    assert_eq!(spec_uids(&d), ["c1", "c2"]);
}

/// The CDI spec of a share of an MPS pool (what DRA, the claims API and the device plugin's CDI
/// answer name) mounts the daemon's directories and sets their variables, as the official CDI
/// crate reads the file.
#[tokio::test]
async fn a_share_of_an_mps_pool_carries_the_daemon_directories_in_its_spec() {
    let d = dirs();
    let pools = vec![policies::PoolConfig::of_ids(
        "mps",
        &[],
        policies::FamilyConfig::Shared {
            replicas: 2,
            memory_mib_per_share: 0,
            compute_percent_per_share: 50,
            mps: Some(policies::MpsConfig {
                pipe_directory: "/run/nvidia/mps".into(),
                log_directory: "/var/log/nvidia-mps".into(),
            }),
        },
    )];
    let node =
        policies::Node::new(inventory(2), &pools, &policies::Registry::with_builtins()).unwrap();
    let journal =
        nri_accel::checkpoint::Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let (engine, _) = nri_accel::engine::Engine::start(node, journal, store(&d), None).unwrap();
    let ask = policies::ClaimRequest {
        uid: "s1".into(),
        namespace: "default".into(),
        name: "s1".into(),
        ask: policies::Ask::Named(vec![
            policies::NamedResult {
                request: "a".into(),
                pool: "mps".into(),
                device: "mps-gpu0".into(),
            },
            policies::NamedResult {
                request: "b".into(),
                pool: "mps".into(),
                device: "mps-gpu1".into(),
            },
        ]),
    };
    engine.prepare(ask).await.unwrap();
    let spec = container_device_interface::spec::read_spec(&store(&d).spec_path("s1").unwrap(), 10)
        .unwrap_or_else(|e| panic!("the official parser refuses the spec: {e:#}"));
    let json = serde_json::to_value(&spec.cdi_spec).unwrap();
    for dev in json["devices"].as_array().unwrap() {
        let edits = &dev["containerEdits"];
        let env: Vec<&str> = edits["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        for want in [
            "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps",
            "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        ] {
            assert!(env.contains(&want), "{env:?}");
        }
        let mounts: Vec<(&str, &str)> = edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["hostPath"].as_str().unwrap(),
                    m["containerPath"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                ("/run/nvidia/mps", "/run/nvidia/mps"),
                ("/var/log/nvidia-mps", "/var/log/nvidia-mps")
            ]
        );
    }
}
