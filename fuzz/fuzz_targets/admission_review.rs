//! The admission webhook's input: arbitrary bytes as an AdmissionReview body, decoded and, when it
//! is a pod review, judged against a fixed node of two exclusive GPUs and one shared GPU.
#![no_main]

use nri_accel::webhook::check::{Rules, check};
use nri_accel::webhook::fleet::{Capacity, Published};
use nri_accel::webhook::review::{decode, encode};
use policies::{FamilyConfig, PoolConfig, Registry};

fn gpu(i: u32, pool: &str, family: &str) -> Published {
    Published {
        device: nri_accel::fixtures::simulated_gpu(i, 0, Default::default(), format!("0000:1{i}:00.0")),
        pool: pool.into(),
        family: family.into(),
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(request) = decode(data) else {
        return;
    };
    let rules = Rules {
        prefix: "accel.nri.io".into(),
        pools: vec![
            PoolConfig::of_ids("whole", &["gpu0", "gpu1"], FamilyConfig::Exclusive),
            PoolConfig::of_ids(
                "share",
                &["gpu2"],
                FamilyConfig::Shared {
                    replicas: 4,
                    memory_mib_per_share: 0,
                    compute_percent_per_share: 0,
                    mps: None,
                },
            ),
        ],
        registry: Registry::with_builtins(),
    };
    let nodes = [(
        "node-a".to_string(),
        vec![gpu(0, "whole", "exclusive"), gpu(1, "whole", "exclusive"), gpu(2, "share", "shared")],
    )];
    let capacity = Capacity::Known(nodes.into_iter().collect());
    // An object that is not a pod is refused by the server as a bad review, never a panic.
    let Ok(Some(pod)) = request.pod() else {
        return;
    };
    let verdict = check(&rules, "ns", &pod, &capacity);
    // A refusal always says why; the answer is JSON carrying the request's uid.
    assert_eq!(verdict.allowed, verdict.message.is_none());
    let answer: serde_json::Value = serde_json::from_slice(&encode(&request.uid, &verdict)).unwrap();
    assert_eq!(answer["response"]["uid"], request.uid.as_str());
    assert_eq!(answer["response"]["allowed"], verdict.allowed);
});
