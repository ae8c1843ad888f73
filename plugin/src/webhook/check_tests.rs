//! Tests of the verdict: the node's sentences, capacity known and unknown.

use std::collections::BTreeMap;

use policies::{FamilyConfig, PoolConfig};

use super::super::fleet::{Capacity, Published};
use super::super::review::{Container, Pod, PodMeta, PodSpec};
use super::*;

fn rules() -> Rules {
    Rules {
        prefix: "accel.nri.io".into(),
        pools: vec![PoolConfig::of_ids("gpus", &[], FamilyConfig::Exclusive)],
        registry: policies::Registry::with_builtins(),
    }
}

fn pod(annotations: &[(&str, &str)], containers: &[&str]) -> Pod {
    Pod {
        metadata: PodMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..PodMeta::default()
        },
        spec: PodSpec {
            containers: containers
                .iter()
                .map(|c| Container {
                    name: c.to_string(),
                })
                .collect(),
            init_containers: Vec::new(),
            resource_claims: Vec::new(),
        },
    }
}

fn node_with(n: usize, pool: &str, family: &str) -> Vec<Published> {
    (0..n)
        .map(|i| Published {
            device: policies::Device {
                id: format!("gpu{i}"),
                vendor: "nvidia".into(),
                model: "H100".into(),
                pci_address: None,
                pci_id: None,
                numa_node: None,
                local_cpus: Default::default(),
                memory_mib: 0,
                compute_units: 0,
                driver: None,
                nodes: Vec::new(),
                control_nodes: Vec::new(),
                uuid: None,
            },
            pool: pool.into(),
            family: family.into(),
        })
        .collect()
}

fn known(nodes: &[(&str, Vec<Published>)]) -> Capacity {
    Capacity::Known(
        nodes
            .iter()
            .map(|(n, d)| (n.to_string(), d.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
}

#[test]
fn a_pod_without_accelerator_annotations_is_admitted_untouched() {
    let v = check(
        &rules(),
        "ns",
        &pod(&[("other/x", "y")], &["c"]),
        &Capacity::Unknown("x".into()),
    );
    assert_eq!(v, Verdict::allow(Vec::new()));
}

#[test]
fn malformed_annotations_are_refused_with_the_parsers_sentence() {
    let p = pod(&[("accel.nri.io/container.c", "count=two")], &["c"]);
    let v = check(&rules(), "ns", &p, &Capacity::Unknown("x".into()));
    let node = annotations::container_ask(
        "accel.nri.io",
        "ns/p",
        p.metadata.annotations.as_ref().unwrap(),
        "c",
    )
    .unwrap_err()
    .to_string();
    assert!(!v.allowed);
    assert_eq!(v.message.as_deref(), Some(node.as_str()));
}

#[test]
fn a_family_no_pool_has_is_refused_from_the_config_alone() {
    let p = pod(
        &[("accel.nri.io/container.c", "family=sliced,profile=1g")],
        &["c"],
    );
    let v = check(&rules(), "ns", &p, &Capacity::Unknown("x".into()));
    assert_eq!(
        v.message.as_deref(),
        Some(
            "container c of pod ns/p: claim ctr-<container id> refused: no pool of family sliced has devices matching request annotation"
        )
    );
    // Known families pass, with a warning that capacity was not checked.
    let ok = check(
        &rules(),
        "ns",
        &pod(&[("accel.nri.io/container.c", "count=9")], &["c"]),
        &Capacity::Unknown("why".into()),
    );
    assert!(ok.allowed);
    assert!(
        ok.warnings.iter().any(|w| w.contains("why")),
        "{:?}",
        ok.warnings
    );
}

#[test]
fn more_devices_than_any_node_publishes_is_refused_with_the_policys_sentence() {
    let cap = known(&[
        ("a", node_with(2, "gpus", "exclusive")),
        ("b", node_with(4, "gpus", "exclusive")),
    ]);
    let four = pod(&[("accel.nri.io/container.c", "count=4")], &["c"]);
    assert!(check(&rules(), "ns", &four, &cap).allowed);
    let five = pod(&[("accel.nri.io/container.c", "count=5")], &["c"]);
    let v = check(&rules(), "ns", &five, &cap);
    assert_eq!(
        v.message.as_deref(),
        Some(
            "container c of pod ns/p: claim ctr-<container id> refused: it asks 5 units of pool gpus but the pool's devices have at most 4"
        )
    );
    // A vendor no node has: no pool matches.
    let amd = pod(&[("accel.nri.io/container.c", "vendor=amd")], &["c"]);
    let v = check(&rules(), "ns", &amd, &cap);
    assert!(
        v.message
            .unwrap()
            .ends_with("no pool has devices matching request annotation")
    );
    // One pool of another family matches: the node names it.
    let shared = pod(&[("accel.nri.io/container.c", "family=shared")], &["c"]);
    let v = check(&rules(), "ns", &shared, &cap);
    assert!(
        v.message
            .unwrap()
            .ends_with("pool gpus is of family exclusive but the request asks for shared")
    );
}

#[test]
fn annotations_naming_no_container_warn_and_two_vendors_are_refused() {
    let p = pod(&[("accel.nri.io/container.ghost", "count=1")], &["c"]);
    let v = check(
        &rules(),
        "ns",
        &p,
        &known(&[("a", node_with(1, "gpus", "exclusive"))]),
    );
    assert!(v.allowed);
    assert!(
        v.warnings[0].contains("names no container"),
        "{:?}",
        v.warnings
    );
    let mixed = pod(
        &[
            ("accel.nri.io/container.a", "vendor=nvidia"),
            ("accel.nri.io/container.b", "vendor=amd"),
        ],
        &["a", "b"],
    );
    let v = check(&rules(), "ns", &mixed, &Capacity::Unknown("x".into()));
    assert!(v.message.unwrap().contains("two vendors"));
}

/// The node as the DRA driver publishes it: a real `policies::Node` over `devices` and
/// `pools`, its slices built by `kube::slices` (the publisher's pure function).
fn published_node(
    devices: Vec<policies::Device>,
    pools: &[PoolConfig],
) -> (policies::Node, Capacity) {
    use crate::kube::slices::{Capabilities, PoolInput, build};
    use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
    let inventory = policies::Inventory {
        devices,
        cpus: Default::default(),
    };
    let node = policies::Node::new(
        inventory.clone(),
        pools,
        &policies::Registry::with_builtins(),
    )
    .unwrap();
    let published = node.published();
    let content = build(&PoolInput {
        inventory: &inventory,
        pools,
        published: &published,
        pcie_roots: &BTreeMap::new(),
        unhealthy: &Default::default(),
        held: &Default::default(),
        driver: "accel.nri.io",
        caps: Capabilities::ALL,
    });
    let slice = ResourceSlice {
        spec: ResourceSliceSpec {
            driver: "accel.nri.io".into(),
            node_name: Some("node-a".into()),
            pool: ResourcePool {
                name: "node-a".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(content.devices.into_iter().map(|e| e.device).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    let nodes = super::super::fleet::nodes_of(&[slice]);
    assert!(!nodes.is_empty(), "nothing read from the published slice");
    (node, Capacity::Known(nodes))
}

#[test]
fn the_refusals_are_the_ones_the_node_gives_for_what_it_publishes() {
    let gpu = |i: u32| {
        crate::fixtures::simulated_gpu(i, 0, Default::default(), format!("0000:1{i}:00.0"))
    };
    let pools = vec![
        PoolConfig::of_ids("whole", &["gpu0", "gpu1"], FamilyConfig::Exclusive),
        PoolConfig::of_ids(
            "share",
            &["gpu2"],
            FamilyConfig::Shared {
                replicas: 4,
                memory_mib_per_share: 0,
                compute_percent_per_share: 0,
            },
        ),
        PoolConfig::of_ids(
            "mig",
            &["gpu3"],
            FamilyConfig::Sliced {
                slots: 8,
                profiles: vec![policies::ProfileConfig {
                    name: "1g.10gb".into(),
                    size: 1,
                    memory_mib: 10240,
                    compute_units: 16,
                    starts: (0..7).collect(),
                }],
            },
        ),
    ];
    let (mut node, capacity) = published_node(vec![gpu(0), gpu(1), gpu(2), gpu(3)], &pools);
    let rules = Rules {
        prefix: "accel.nri.io".into(),
        pools: pools.clone(),
        registry: policies::Registry::with_builtins(),
    };
    for value in [
        "count=3,family=exclusive",
        "vendor=amd",
        "device=gpu9",
        "model=A100",
        "family=sliced,profile=7g.80gb",
        "family=sliced,profile=1g.10gb,count=8",
        "family=shared,count=5",
        "family=shared,shares=5",
    ] {
        let p = pod(&[("accel.nri.io/container.c", value)], &["c"]);
        let ask = annotations::parse("k", value).unwrap();
        let on_node = node
            .allocate(&ask.to_claim(CLAIM.into(), "ns", "p/c"))
            .expect_err(value)
            .to_string();
        let v = check(&rules, "ns", &p, &capacity);
        assert_eq!(
            v.message.as_deref(),
            Some(format!("container c of pod ns/p: {on_node}").as_str()),
            "{value}"
        );
    }
    // What the node serves, the webhook admits.
    for value in [
        "count=2",
        "family=shared",
        "family=shared,count=4",
        "family=shared,shares=2",
        "device=gpu1",
        "vendor=NVIDIA",
        "family=sliced,profile=1g.10gb,count=7",
        "family=sliced",
    ] {
        let p = pod(&[("accel.nri.io/container.c", value)], &["c"]);
        assert!(check(&rules, "ns", &p, &capacity).allowed, "{value}");
    }
}

#[test]
fn a_pod_whose_containers_together_ask_more_than_any_node_has_is_refused() {
    let capacity = known(&[
        ("n1", node_with(2, "gpus", "exclusive")),
        ("n2", node_with(1, "gpus", "exclusive")),
    ]);
    // Each fits alone, and together on n1: admitted.
    let two = pod(
        &[
            ("accel.nri.io/container.a", "count=1"),
            ("accel.nri.io/container.b", "count=1"),
        ],
        &["a", "b"],
    );
    assert!(check(&rules(), "ns", &two, &capacity).allowed);
    // Three containers of one device each: the third has no device on n1, the second none on
    // n2; the node that got furthest is named.
    let mut three = two.clone();
    three
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("accel.nri.io/container.c".into(), "count=1".into());
    three.spec.containers.push(Container { name: "c".into() });
    let v = check(&rules(), "ns", &three, &capacity);
    assert!(!v.allowed);
    let message = v.message.unwrap();
    assert!(
        message.starts_with("container c of pod ns/p: claim ctr-<container id> refused:"),
        "{message}"
    );
    assert!(
        message.ends_with("before it (a, b), which hold their devices until the pod is deleted"),
        "{message}"
    );
    // An init container's device counts too: it is held until the pod goes.
    let mut init = two.clone();
    init.spec.containers.retain(|c| c.name == "b");
    init.spec
        .init_containers
        .push(Container { name: "a".into() });
    *init
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .get_mut("accel.nri.io/container.b")
        .unwrap() = "count=2".into();
    let v = check(&rules(), "ns", &init, &capacity);
    assert!(!v.allowed, "init a (1) then b (2) on nodes of at most 2");
    assert!(v.message.unwrap().contains("container b of pod ns/p"));
}
