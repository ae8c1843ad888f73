//! The standard `resource.kubernetes.io/numaNode` (KEP-6072) against the simulated API server
//! in both behaviours: a server that keeps list attribute values (`DRAListTypeAttributes` on)
//! gets the KEP's list, one that drops them and refuses the attribute left empty (the gate off,
//! every 1.34-1.37 server by default) gets the scalar; nri-accel's own `accel.nri.io/numaNode`
//! is published either way, and `status` says which form the server took.

mod kube_common;

use kube_common::*;
use kube_sim::apiserver::{ApiServer, Gates, RESOURCE_SLICES};
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
