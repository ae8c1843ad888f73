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

    std::fs::create_dir(&pipe).unwrap();
    engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    // The directory goes again: the prepared claim keeps its grant on a repeat.
    std::fs::remove_dir(&pipe).unwrap();
    let again = engine.prepare(claim_for("c1", "gpu0")).await.unwrap();
    assert!(again.already);
    assert_eq!(spec_uids(&d), ["c1", "c2"]);
}
