//! The policy-guide example (`src/lib.rs`), registered through the same
//! Registry door as the built-ins and driven through the Node.

// The policies crate's own test fixtures (devices shaped like real GPUs), shared rather than copied.
#[path = "../../../policies/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use policies::{FamilyConfig, Inventory, Node, PolicyError, RefusalReason, Registry};

fn spread_pool(max_per_numa: Option<&str>) -> policies::PoolConfig {
    let mut params = BTreeMap::new();
    if let Some(m) = max_per_numa {
        params.insert("max_per_numa".to_string(), m.to_string());
    }
    pool(
        "wide",
        &[],
        FamilyConfig::Custom {
            policy: spread::NAME.to_string(),
            params,
        },
        1,
    )
}

fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.register(spread::NAME, spread::factory);
    r
}

fn spread_node(max_per_numa: Option<&str>) -> Node {
    Node::new(
        Inventory {
            devices: four_gpus(),
            cpus: cpus("0-7"),
        },
        &[spread_pool(max_per_numa)],
        &registry(),
    )
    .unwrap()
}

#[test]
fn spreads_results_over_numa_nodes() {
    let mut n = spread_node(None);
    let out = n.allocate(&counted("a", vec![count("r", 2)])).unwrap();
    let ids: Vec<&str> = out
        .allocation
        .results
        .iter()
        .map(|g| g.device_id.as_str())
        .collect();
    assert_eq!(ids, ["g0", "g2"]);
    // The node's CPU accounting works for author policies too.
    assert_eq!(out.allocation.cpus, cpus("0,4"));
    // Two nodes, one per node: a count of 3 cannot be spread.
    let r = n.allocate(&counted("b", vec![count("r", 3)])).unwrap_err();
    assert!(matches!(r.reason, RefusalReason::NoCapacity { .. }));
    let r = n.allocate(&named("c", &[("wide", "wide-g2")])).unwrap_err();
    assert_eq!(
        r.to_string(),
        "claim c refused: device g2 is held by claim a until that claim is unprepared; \
         free in pool wide: g1, g3"
    );
    // Restoring from the records gives the same state.
    let records: Vec<_> = n.allocations().cloned().collect();
    let mut fresh = spread_node(None);
    fresh.restore(&records).unwrap();
    assert_eq!(fresh.snapshot(), n.snapshot());
    n.release("a");
    assert!(n.holder_of("g0").is_empty());
    assert_eq!(n.shared_cpus(), cpus("0-7"));
}

#[test]
fn params_reach_the_factory() {
    let mut n = spread_node(Some("2"));
    let out = n.allocate(&counted("a", vec![count("r", 3)])).unwrap();
    assert_eq!(out.allocation.results.len(), 3);
    let err = Node::new(
        Inventory {
            devices: four_gpus(),
            cpus: cpus("0-7"),
        },
        &[spread_pool(Some("many"))],
        &registry(),
    )
    .err()
    .unwrap();
    assert!(matches!(err, PolicyError::InvalidPool { .. }), "{err}");
}

#[test]
fn unregistered_policy_is_a_config_error() {
    let err = Node::new(
        Inventory {
            devices: four_gpus(),
            cpus: cpus("0-7"),
        },
        &[spread_pool(None)],
        &Registry::with_builtins(),
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "pool wide: no policy is registered under the name spread; this build registers \
         exclusive, shared, sliced: use one of those, or run a daemon built with spread \
         (docs/policy-guide.md)"
    );
}
