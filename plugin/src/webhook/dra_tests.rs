//! The DRA judge on hand-made slices and classes: what no node could allocate is refused with
//! its sentence; what some node could, or what the judge cannot read, is admitted.

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimSpec, ResourceSlice};
use serde_json::json;

use super::*;

const DRIVER: &str = "accel.nri.io";

/// A node's slice: `whole` exclusive GPUs and `shared` shared ones.
fn slice(node: &str, whole: usize, shared: usize) -> ResourceSlice {
    let mut devices = Vec::new();
    for i in 0..whole {
        devices.push(json!({"name": format!("gpu{i}"), "attributes": {
            "type": {"string": "device"}, "family": {"string": "exclusive"},
            "numa": {"int": i % 2},
            "resource.kubernetes.io/pciBusID": {"string": format!("0000:1{i}:00.0")}}}));
    }
    for i in 0..shared {
        devices.push(
            json!({"name": format!("shared{i}"), "allowMultipleAllocations": true,
            "attributes": {"type": {"string": "shared"}, "family": {"string": "shared"}}}),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-slice")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap()
}

fn class(name: &str, expression: &str) -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]}
    }))
    .unwrap()
}

fn view(slices: &[ResourceSlice]) -> DraView {
    DraView::new(
        DRIVER,
        slices,
        &[
            class(
                "accel-gpu",
                r#"device.driver == "accel.nri.io" && device.attributes["accel.nri.io"].type == "device""#,
            ),
            class(
                "accel-gpu-shared",
                r#"device.driver == "accel.nri.io" && device.attributes["accel.nri.io"].type == "shared""#,
            ),
            class("other-vendor", r#"device.driver == "gpu.example.com""#),
            class(
                "accel-fancy",
                r#"device.driver == "accel.nri.io" && device.attributes["accel.nri.io"].model.startsWith("H")"#,
            ),
        ],
    )
}

fn claim(label: &str, requests: serde_json::Value) -> ClaimAsk {
    let spec: ResourceClaimSpec =
        serde_json::from_value(json!({"devices": {"requests": requests}})).unwrap();
    ClaimAsk {
        label: label.to_string(),
        requests: requests_of(&spec),
    }
}

fn exactly(name: &str, class: &str, count: u32) -> serde_json::Value {
    json!({"name": name, "exactly": {"deviceClassName": class, "count": count}})
}

fn refused(j: Judgement) -> String {
    match j {
        Judgement::Refused(why) => why,
        other => panic!("admitted: {other:?}"),
    }
}

fn servable(j: Judgement) -> Vec<String> {
    match j {
        Judgement::Servable { warnings } => warnings,
        other => panic!("refused: {other:?}"),
    }
}

#[test]
fn more_devices_than_any_node_publishes_is_refused_naming_the_most() {
    let v = view(&[slice("a", 2, 0), slice("b", 3, 0)]);
    let c = claim("claim ns/big", json!([exactly("gpu", "accel-gpu", 4)]));
    let why = refused(judge(&v, "pod ns/p", &[c]));
    assert_eq!(
        why,
        "claim ns/big request gpu: asks for 4 devices of class accel-gpu, but the most any node publishes is 3 (node b); ask for at most 3"
    );
    let c = claim("claim ns/fits", json!([exactly("gpu", "accel-gpu", 3)]));
    assert!(servable(judge(&v, "pod ns/p", &[c])).is_empty());
}

#[test]
fn a_class_no_device_matches_is_refused_and_selectors_narrow_the_devices() {
    let v = view(&[slice("a", 2, 0)]);
    let c = claim("claim ns/s", json!([exactly("s", "accel-gpu-shared", 1)]));
    let why = refused(judge(&v, "pod ns/p", &[c]));
    assert!(
        why.contains("no node publishes a device of class accel-gpu-shared"),
        "{why}"
    );
    // The request's own selector: only NUMA 1 devices, one per node here.
    let numa1 = json!([{"name": "gpu", "exactly": {"deviceClassName": "accel-gpu", "count": 2,
        "selectors": [{"cel": {"expression": "device.attributes[\"accel.nri.io\"].numa == 1"}}]}}]);
    let why = refused(judge(&v, "pod ns/p", &[claim("claim ns/n", numa1)]));
    assert!(why.contains("the most any node publishes is 1"), "{why}");
}

#[test]
fn a_pods_claims_must_fit_one_node_together() {
    let v = view(&[slice("a", 2, 1), slice("b", 2, 0)]);
    let one = claim("claim ns/one", json!([exactly("gpu", "accel-gpu", 2)]));
    let two = claim("claim ns/two", json!([exactly("gpu", "accel-gpu", 1)]));
    let why = refused(judge(&v, "pod ns/p", &[one.clone(), two]));
    assert!(
        why.starts_with("pod ns/p: no one node can serve all its claims together")
            && why.contains("3 devices in all; the most any node can give them at once is 2"),
        "{why}"
    );
    // A shared device is not used up: two claims of one share each fit on node a.
    let s1 = claim("claim ns/s1", json!([exactly("s", "accel-gpu-shared", 1)]));
    let s2 = claim("claim ns/s2", json!([exactly("s", "accel-gpu-shared", 1)]));
    assert!(servable(judge(&v, "pod ns/p", &[one, s1, s2])).is_empty());
}

#[test]
fn what_the_judge_cannot_read_is_admitted_with_a_warning() {
    let v = view(&[slice("a", 1, 0)]);
    for (class, says) in [
        ("other-vendor", "does not select driver accel.nri.io"),
        ("accel-fancy", "does not evaluate"),
        ("missing", "was not found"),
    ] {
        let c = claim("claim ns/c", json!([exactly("r", class, 9)]));
        let warnings = servable(judge(&v, "pod ns/p", &[c]));
        assert!(
            warnings.len() == 1 && warnings[0].contains(says),
            "{class}: {warnings:?}"
        );
    }
    // firstAvailable: served when any alternative is.
    let alts = json!([{"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "accel-gpu", "count": 4},
        {"name": "small", "deviceClassName": "accel-gpu", "count": 1}]}]);
    assert!(servable(judge(&v, "pod ns/p", &[claim("claim ns/f", alts)])).is_empty());
    let none = json!([{"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "accel-gpu", "count": 4},
        {"name": "shared", "deviceClassName": "accel-gpu-shared", "count": 1}]}]);
    let why = refused(judge(&v, "pod ns/p", &[claim("claim ns/f", none)]));
    assert!(
        why.contains("no node publishes devices for any of its alternatives"),
        "{why}"
    );
}
