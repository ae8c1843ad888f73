//! The standard `resource.kubernetes.io/numaNode` (KEP-6072) against the simulated API server
//! in both behaviours: a server that keeps list attribute values (`DRAListTypeAttributes` on)
//! gets the KEP's list, one that drops them and refuses the attribute left empty (the gate off,
//! every 1.34-1.37 server by default) gets the scalar; nri-accel's own `accel.nri.io/numaNode`
//! is published either way, and `status` says which form the server took.

mod kube_common;

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube_common::*;
use kube_sim::apiserver::{ApiServer, Gates, RESOURCE_SLICES};
use nri_accel::kube::{KubeApi, KubeError, SliceEvents};
use serde_json::{Value, json};

const STANDARD: &str = "resource.kubernetes.io/numaNode";

async fn server_with(gates: Gates) -> ApiServer {
    let s = ApiServer::start_with(gates).await.expect("api server");
    s.add_node(NODE);
    s
}

/// Every published device with its two NUMA attributes.
fn numa_attributes(server: &ApiServer) -> Vec<(Value, Value)> {
    devices(&server.resource_slices())
        .iter()
        .map(|d| {
            (
                d["attributes"][STANDARD].clone(),
                d["attributes"]["numaNode"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_server_keeping_lists_gets_the_list() {
    let server = server_with(Gates::ALL).await;
    let side = side(client(&server), source(2));
    let st = published_after(&side, 0).await;
    assert_eq!(st.numa_node_attribute, Some("list"));
    let attrs = numa_attributes(&server);
    assert!(!attrs.is_empty());
    for (standard, own) in &attrs {
        let n = own["int"]
            .as_i64()
            .expect("accel.nri.io/numaNode is an int");
        assert_eq!(*standard, json!({ "ints": [n] }), "{attrs:?}");
    }
    // The list reads back as it was sent: republishing the same writes nothing.
    server.reset_writes();
    side.republish(source(2));
    published_after(&side, st.rounds).await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 0);
}

#[tokio::test]
async fn a_server_dropping_lists_gets_the_scalar() {
    let mut gates = Gates::ALL;
    gates.list_type_attributes = false;
    let server = server_with(gates).await;
    let side = side(client(&server), source(2));
    let st = published_after(&side, 0).await;
    assert_eq!(st.numa_node_attribute, Some("scalar"));
    // Only this gate is missing; the others are not reported for it.
    assert!(st.missing_gates.is_empty(), "{:?}", st.missing_gates);
    let attrs = numa_attributes(&server);
    assert!(!attrs.is_empty());
    for (standard, own) in &attrs {
        assert!(own["int"].is_i64(), "{attrs:?}");
        assert_eq!(standard, own, "{attrs:?}");
    }
    server.reset_writes();
    side.republish(source(2));
    published_after(&side, st.rounds).await;
    assert_eq!(server.writes(&RESOURCE_SLICES).total(), 0);
}

/// A server that answers a dry run without the standard NUMA attribute (it dropped the list
/// without refusing what was left), and forwards everything else.
struct DropsTheList(Arc<dyn KubeApi>);

#[async_trait]
impl KubeApi for DropsTheList {
    async fn resource_claim(&self, ns: &str, name: &str) -> Result<ResourceClaim, KubeError> {
        self.0.resource_claim(ns, name).await
    }
    async fn node(&self, name: &str) -> Result<Node, KubeError> {
        self.0.node(name).await
    }
    async fn list_slices(&self, driver: &str, node: &str) -> Result<Vec<ResourceSlice>, KubeError> {
        self.0.list_slices(driver, node).await
    }
    async fn list_slices_versioned(
        &self,
        driver: &str,
        node: &str,
    ) -> Result<(Vec<ResourceSlice>, String), KubeError> {
        self.0.list_slices_versioned(driver, node).await
    }
    async fn watch_slices(
        &self,
        driver: &str,
        node: &str,
        rv: &str,
    ) -> Result<SliceEvents, KubeError> {
        self.0.watch_slices(driver, node, rv).await
    }
    async fn create_slice(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, KubeError> {
        let mut stored = self.0.create_slice(slice, dry_run).await?;
        if dry_run {
            for d in stored.spec.devices.iter_mut().flatten() {
                if let Some(a) = d.attributes.as_mut() {
                    a.remove(STANDARD);
                }
            }
        }
        Ok(stored)
    }
    async fn replace_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, KubeError> {
        self.0.replace_slice(slice).await
    }
    async fn delete_slice(&self, name: &str, rv: &str) -> Result<(), KubeError> {
        self.0.delete_slice(name, rv).await
    }
}

#[tokio::test]
async fn a_server_answering_without_the_list_gets_the_scalar() {
    let server = server_with(Gates::ALL).await;
    let side = side(Arc::new(DropsTheList(client(&server))), source(2));
    let st = published_after(&side, 0).await;
    assert_eq!(st.numa_node_attribute, Some("scalar"));
    for (standard, own) in numa_attributes(&server) {
        assert!(own["int"].is_i64());
        assert_eq!(standard, own);
    }
}
