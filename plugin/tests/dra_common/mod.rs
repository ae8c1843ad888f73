//! A node with the DRA driver on, end to end: the real `nri-accel` binary, the fake runtime,
//! kube-sim's API server (the daemon publishes its ResourceSlices there and reads ResourceClaims
//! from it), kube-sim's scheduler (allocates claims from the published slices' JSON) and
//! kube-sim's kubelet (registers the plugin and calls NodePrepareResources over the real socket).
//! Included next to `e2e_common` by the tests that need it.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;

use fake_runtime::FakeRuntime;
use kube_sim::apiserver::{ApiServer, RESOURCE_CLAIMS};
use kube_sim::kubelet::wire::dra::{Claim, Device};
use kube_sim::kubelet::{DraClient, PluginWatcher, PreparedClaim};
use kube_sim::scheduler::{self, DeviceRequest};
use serde_json::{Value, json};

use super::e2e_common::*;

pub const DRIVER: &str = "accel.nri.io";
pub const NODE: &str = "node-1";
pub const NS: &str = "default";
/// The DeviceClass the test claims name (the scheduler here matches on attributes instead).
pub const CLASS: &str = "gpu.accel.nri.io";

/// A node whose config turns the DRA driver on against a test API server that knows the node,
/// with the fake runtime listening on its NRI socket. The daemon is started by the test.
pub struct DraNode {
    pub node: TestNode,
    pub api: ApiServer,
    pub fake: FakeRuntime,
}

impl DraNode {
    /// The default test shape (2 whole GPUs with 2 local CPUs each, 1 shared, 1 sliced).
    pub async fn new() -> DraNode {
        let api = ApiServer::start().await.expect("api server");
        api.add_node(NODE);
        let node = TestNode::new(Shape::default(), "");
        let kubeconfig = node.dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        node.enable_dra(NODE, &kubeconfig);
        let fake = runtime(&node).await;
        DraNode { node, api, fake }
    }

    /// Starts `nri-accel run` with `env` and waits for its `syncs`-th Synchronize and the gate.
    pub async fn start(&self, env: &[(&str, &str)], syncs: usize) -> DaemonProc {
        let daemon = self.node.spawn(env);
        self.fake
            .wait_synchronized(syncs, WAIT)
            .await
            .expect("synchronized");
        self.node.client_gate_open().await;
        daemon
    }

    /// Waits until `status` says the pool is published, and answers the slices.
    pub async fn published(&self) -> Vec<Value> {
        wait_for("the pool to be published", || async {
            let doc = self.node.status_json().await;
            (doc["kubernetes"]["resource_slices"]["state"] == "published").then_some(())
        })
        .await;
        self.api.resource_slices()
    }

    /// A kubelet that finds the plugin in its registry directory, and a DRA client for it.
    pub async fn kubelet(&self) -> (PluginWatcher, DraClient) {
        let (registry, _) = self.node.kubelet_dirs();
        let mut kubelet = PluginWatcher::new(&registry);
        let plugin = kubelet.wait_for(DRIVER, WAIT).await.expect("registered");
        let client = DraClient::for_plugin(&plugin).await.expect("dra socket");
        (kubelet, client)
    }

    /// The simulated scheduler allocates one device whose `family` attribute is `family` to
    /// claim `name` (UID `uid`) from the published slices and the claims already allocated, and
    /// the allocated claim is stored on the API server. Answers the kubelet's reference to it.
    pub fn schedule(&self, uid: &str, name: &str, family: &str) -> Claim {
        let matches = |d: &Value| scheduler::attribute(d, "family") == Some(family);
        let alloc = scheduler::allocate(
            &self.api.resource_slices(),
            &self.api.all(&RESOURCE_CLAIMS),
            DRIVER,
            NODE,
            uid,
            &[DeviceRequest {
                name: "gpu",
                matches: &matches,
            }],
        )
        .unwrap_or_else(|e| panic!("scheduling {name}: {e}"));
        self.put_claim(uid, name, alloc);
        kube_claim(uid, name)
    }

    /// Stores claim `name` (UID `uid`) with `allocation` as its `status.allocation` (`null`: not
    /// allocated), as given.
    pub fn put_claim(&self, uid: &str, name: &str, allocation: Value) {
        let claim = scheduler::allocated_claim(NS, name, uid, CLASS, &["gpu"], allocation);
        self.api.insert(&RESOURCE_CLAIMS, claim);
    }

    /// The allocation of the stored claim `name`.
    pub fn allocation(&self, name: &str) -> Value {
        self.api
            .get(&RESOURCE_CLAIMS, NS, name)
            .expect("stored claim")["status"]["allocation"]
            .clone()
    }

    /// Claim UIDs with a record (status) and with a spec file, which must agree; no temp file
    /// left in the CDI dir, no unit granted twice.
    pub async fn consistent(&self) -> Vec<String> {
        let doc = self.node.status_json().await;
        let records = status_claims(&doc);
        let specs = self.node.spec_uids();
        assert_eq!(records, specs, "records and specs disagree");
        assert_eq!(
            self.node.cdi_entries().len(),
            specs.len(),
            "a temp file was left: {:?}",
            self.node.cdi_entries()
        );
        assert_no_unit_granted_twice(&doc);
        records.into_iter().collect()
    }
}

/// The kubelet's reference to claim `default/name` with UID `uid`.
pub fn kube_claim(uid: &str, name: &str) -> Claim {
    Claim {
        namespace: NS.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// An allocation of one result naming `device` of this node's pool, as a scheduler would write
/// it (for claims a test forges).
pub fn allocation_of(device: &str) -> Value {
    json!({"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    ]}})
}

/// The devices prepared for `uid`; panics with the refusal otherwise.
pub fn devices<'a>(answer: &'a BTreeMap<String, PreparedClaim>, uid: &str) -> &'a [Device] {
    match answer.get(uid) {
        Some(Ok(d)) => d,
        other => panic!("claim {uid} not prepared: {other:?}"),
    }
}

/// Every CDI id prepared for `uid`.
pub fn cdi_ids(answer: &BTreeMap<String, PreparedClaim>, uid: &str) -> Vec<String> {
    devices(answer, uid)
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The refusal of `uid`; panics if it was prepared.
pub fn refusal(answer: &BTreeMap<String, PreparedClaim>, uid: &str) -> String {
    match answer.get(uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid} should have been refused: {other:?}"),
    }
}
