//! The webhook's judgement of DRA claims and KubeVirt VMs (issue 36 item 4), through kube-rs
//! against the simulated API server: the slices and DeviceClasses the webhook lists, and the
//! claims and templates a pod or a VMI names, read at admission.

use std::time::Duration;

use kube_sim::apiserver::{
    ApiServer, DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES,
};
use nri_accel::kube::KubeClient;
use nri_accel::webhook::admit::review;
use nri_accel::webhook::check::Rules;
use nri_accel::webhook::fleet::{Capacity, Fleet};
use nri_accel::webhook::review::{Verdict, decode};
use policies::{FamilyConfig, PoolConfig, Registry};
use serde_json::{Value, json};

const DRIVER: &str = "accel.nri.io";

fn slice(node: &str, gpus: usize) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"name": format!("whole-gpu{i}"), "attributes": {
                "deviceId": {"string": format!("gpu{i}")}, "pool": {"string": "whole"},
                "family": {"string": "exclusive"}, "type": {"string": "device"}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-accel")},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
}

fn claim_spec(count: u32) -> Value {
    json!({"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "accel-gpu", "count": count}}]}})
}

async fn cluster() -> (ApiServer, KubeClient, Fleet) {
    let server = ApiServer::start().await.unwrap();
    server.insert(&RESOURCE_SLICES, slice("node-a", 2));
    server.insert(&RESOURCE_SLICES, slice("node-b", 1));
    server.insert(
        &DEVICE_CLASSES,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "accel-gpu"},
            "spec": {"selectors": [{"cel": {"expression":
                "device.driver == \"accel.nri.io\" && device.attributes[\"accel.nri.io\"].type == \"device\""}}]}}),
    );
    server.insert(
        &RESOURCE_CLAIM_TEMPLATES,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "three-gpus", "namespace": "vms"},
            "spec": {"spec": claim_spec(3)}}),
    );
    server.insert(
        &RESOURCE_CLAIM_TEMPLATES,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "vms"},
            "spec": {"spec": claim_spec(1)}}),
    );
    server.insert(
        &RESOURCE_CLAIMS,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "two-gpus", "namespace": "vms"}, "spec": claim_spec(2)}),
    );
    let client = KubeClient::for_url(&server.url(), Duration::from_secs(5)).unwrap();
    let fleet = Fleet::fixed(Capacity::Unknown("not read".into()));
    fleet.refresh(&client, DRIVER).await;
    (server, client, fleet)
}

async fn judge(client: &KubeClient, fleet: &Fleet, kind: (&str, &str), object: Value) -> Verdict {
    let rules = Rules {
        prefix: "accel.nri.io".into(),
        pools: vec![PoolConfig::of_ids("whole", &[], FamilyConfig::Exclusive)],
        registry: Registry::with_builtins(),
    };
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "namespace": "vms",
            "kind": {"group": kind.0, "version": "v1", "kind": kind.1}, "object": object}});
    let request = decode(body.to_string().as_bytes()).unwrap();
    review(&rules, fleet, Some(client), "accel.nri.io", &request)
        .await
        .unwrap()
}

fn pod(claims: Value) -> Value {
    json!({"metadata": {"name": "launcher"},
        "spec": {"containers": [{"name": "compute"}], "resourceClaims": claims}})
}

fn vmi(claims: Value, gpus: Value) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "vms"},
        "spec": {"resourceClaims": claims, "domain": {"devices": {"gpus": gpus}}}})
}

#[tokio::test]
async fn pods_with_claims_are_judged_against_what_the_nodes_publish() {
    let (_server, client, fleet) = cluster().await;
    let refused = judge(
        &client,
        &fleet,
        ("", "Pod"),
        pod(json!([{"name": "gpus", "resourceClaimTemplateName": "three-gpus"}])),
    )
    .await;
    assert!(!refused.allowed);
    assert_eq!(
        refused.message.as_deref(),
        Some(
            "claim template vms/three-gpus (pod claim gpus) request gpu: asks for 3 devices of class accel-gpu, but the most any node publishes is 2 (node node-a); ask for at most 2"
        )
    );
    // A direct claim of 2 fits node-a; with one more GPU from a template, no node fits both.
    let fits = judge(
        &client,
        &fleet,
        ("", "Pod"),
        pod(json!([{"name": "a", "resourceClaimName": "two-gpus"}])),
    )
    .await;
    assert!(fits.allowed && fits.warnings.is_empty(), "{fits:?}");
    let together = judge(
        &client,
        &fleet,
        ("", "Pod"),
        pod(json!([{"name": "a", "resourceClaimName": "two-gpus"},
                   {"name": "b", "resourceClaimTemplateName": "one-gpu"}])),
    )
    .await;
    assert!(!together.allowed);
    assert!(
        together
            .message
            .as_deref()
            .unwrap()
            .starts_with("pod vms/launcher: no one node can serve all its claims together"),
        "{together:?}"
    );
    // A claim not created yet is admitted with a warning.
    let later = judge(
        &client,
        &fleet,
        ("", "Pod"),
        pod(json!([{"name": "a", "resourceClaimName": "not-yet"}])),
    )
    .await;
    assert!(later.allowed);
    assert!(
        later.warnings[0].contains("claim vms/not-yet does not exist yet"),
        "{later:?}"
    );
}

#[tokio::test]
async fn vmis_are_judged_by_claim_request_and_by_device_plugin_resource() {
    let (_server, client, fleet) = cluster().await;
    let kind = ("kubevirt.io", "VirtualMachineInstance");
    let refused = judge(
        &client,
        &fleet,
        kind,
        vmi(
            json!([{"name": "gpu", "resourceClaimTemplateName": "three-gpus"}]),
            json!([{"name": "g1", "claimName": "gpu", "requestName": "gpu"}]),
        ),
    )
    .await;
    assert!(!refused.allowed);
    assert!(
        refused.message.as_deref().unwrap().contains(
            "asks for 3 devices of class accel-gpu, but the most any node publishes is 2"
        ),
        "{refused:?}"
    );
    let fits = judge(
        &client,
        &fleet,
        kind,
        vmi(
            json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
            json!([{"name": "g1", "claimName": "gpu", "requestName": "gpu"}]),
        ),
    )
    .await;
    assert!(fits.allowed, "{fits:?}");
    // By device plugin resource: three of accel.nri.io/whole, at most two on a node.
    let by_name = judge(
        &client,
        &fleet,
        kind,
        vmi(
            json!([]),
            json!([{"name": "g1", "deviceName": "accel.nri.io/whole"},
                   {"name": "g2", "deviceName": "accel.nri.io/whole"},
                   {"name": "g3", "deviceName": "accel.nri.io/whole"}]),
        ),
    )
    .await;
    assert_eq!(
        by_name.message.as_deref(),
        Some(
            "VMI vms/vm1 asks for 3 devices of resource accel.nri.io/whole, but the most any node has in pool whole is 2 (node node-a); ask for at most 2"
        )
    );
    // Another vendor's resource is not nri-accel's to judge.
    let other = judge(
        &client,
        &fleet,
        kind,
        vmi(
            json!([]),
            json!([{"name": "g1", "deviceName": "nvidia.com/GA102"}]),
        ),
    )
    .await;
    assert!(other.allowed && other.warnings.is_empty(), "{other:?}");
}
