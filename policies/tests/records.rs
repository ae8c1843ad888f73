//! The allocation is the record payload the engine checkpoints: its JSON shape
//! must stay stable, and records written before optional fields existed must
//! still load.

use policies::{Allocation, CpuSet, Grant, Node, Unit};

fn record() -> Allocation {
    Allocation {
        claim_uid: "7f3c".to_string(),
        namespace: "ml".to_string(),
        name: "train".to_string(),
        results: vec![
            Grant {
                request: "gpu".to_string(),
                pool: "gpus".to_string(),
                device: "gpus-0000-17-00-0".to_string(),
                device_id: "0000:17:00.0".to_string(),
                unit: Unit::Whole,
            },
            Grant {
                request: "mps".to_string(),
                pool: "mps".to_string(),
                device: "mps-gpu1".to_string(),
                device_id: "gpu1".to_string(),
                unit: Unit::Share { index: 2, count: 1 },
            },
            Grant {
                request: "mig".to_string(),
                pool: "mig".to_string(),
                device: "mig-gpu2-1g-10gb-3".to_string(),
                device_id: "gpu2".to_string(),
                unit: Unit::Slice {
                    profile: "1g.10gb".to_string(),
                    start: 3,
                    size: 1,
                },
            },
        ],
        cpus: "4-5".parse::<CpuSet>().unwrap(),
    }
}

const JSON: &str = r#"{"claim_uid":"7f3c","namespace":"ml","name":"train","results":[{"request":"gpu","pool":"gpus","device":"gpus-0000-17-00-0","device_id":"0000:17:00.0","unit":{"kind":"whole"}},{"request":"mps","pool":"mps","device":"mps-gpu1","device_id":"gpu1","unit":{"kind":"share","index":2,"count":1}},{"request":"mig","pool":"mig","device":"mig-gpu2-1g-10gb-3","device_id":"gpu2","unit":{"kind":"slice","profile":"1g.10gb","start":3,"size":1}}],"cpus":"4-5"}"#;

#[test]
fn record_json_is_stable() {
    assert_eq!(serde_json::to_string(&record()).unwrap(), JSON);
    let back: Allocation = serde_json::from_str(JSON).unwrap();
    assert_eq!(back, record());
}

#[test]
fn records_without_optional_fields_load() {
    let old = r#"{"claim_uid":"a","results":[{"request":"r","pool":"p","device":"p-g0","device_id":"g0","unit":{"kind":"whole"}}]}"#;
    let a: Allocation = serde_json::from_str(old).unwrap();
    assert!(a.cpus.is_empty());
    assert!(a.namespace.is_empty());
}

#[test]
fn node_is_send() {
    fn send<T: Send>() {}
    send::<Node>();
}
