//! Passthrough pools (whole IOMMU groups of vfio-pci functions) under random claims: a group is
//! never split (every grant carries all of its group's nodes and functions) and never held by
//! two claims, whatever the order of allocations and releases; host devices never mix in.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::gpu;
use policies::{
    Ask, ClaimRequest, CountRequest, Device, DeviceNode, DeviceSelector, FamilyConfig, FamilyKind,
    Inventory, NamedResult, Node, NodeKind, PoolConfig, Registry, VfioGroup,
};
use proptest::prelude::*;

/// A VFIO group device: group `g` of `functions` functions on bus `bus`.
fn group(g: u32, bus: u8, functions: u8) -> Device {
    let fns: Vec<String> = (0..functions)
        .map(|f| format!("0000:{bus:02x}:00.{f}"))
        .collect();
    let node = |path: String, major: u32, minor: u32| DeviceNode {
        path,
        host_path: None,
        kind: NodeKind::Char,
        major,
        minor,
        permissions: "rw".to_string(),
    };
    let mut nodes = vec![node(format!("/dev/vfio/{g}"), 236, g)];
    for f in 0..u32::from(functions) {
        nodes.push(node(
            format!("/dev/vfio/devices/vfio{}", g * 8 + f),
            237,
            g * 8 + f,
        ));
    }
    let mut d = gpu(&fns[0], "nvidia", u32::from(bus % 2), "0-3", bus, 0);
    d.driver = Some("vfio-pci".into());
    d.model = "A10".into();
    d.nodes = nodes;
    d.control_nodes = vec![node("/dev/vfio/vfio".into(), 10, 196)];
    d.vfio = Some(VfioGroup {
        group: g,
        functions: fns,
    });
    d
}

fn node() -> Node {
    let mut devices: Vec<Device> = (0..4u8)
        .map(|i| group(u32::from(i) + 10, 0x20 + i, 1 + i % 2))
        .collect();
    devices.push(gpu("host0", "nvidia", 0, "0-3", 0x80, 0));
    let mut vm = PoolConfig::of_ids("vm", &[], FamilyConfig::Exclusive);
    vm.passthrough = true;
    let pools = vec![PoolConfig::of_ids("host", &[], FamilyConfig::Exclusive), vm];
    let inventory = Inventory {
        devices,
        cpus: "0-7".parse().unwrap(),
    };
    Node::new(inventory, &pools, &Registry::with_builtins()).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A count claim of `n` groups.
    Count(u32, u32),
    /// A DRA claim naming published group `i`.
    Named(u32, usize),
    /// Release claim `k`.
    Release(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6u32, 1..3u32).prop_map(|(k, n)| Op::Count(k, n)),
        (0..6u32, 0..4usize).prop_map(|(k, i)| Op::Named(k, i)),
        (0..6u32).prop_map(Op::Release),
    ]
}

proptest! {
    #[test]
    fn a_group_is_never_split_and_never_held_twice(ops in prop::collection::vec(op(), 1..40)) {
        let mut n = node();
        let published: Vec<String> = n
            .published()
            .into_iter()
            .filter(|p| p.pool == "vm")
            .map(|p| p.name)
            .collect();
        prop_assert_eq!(published.len(), 4);
        let groups: BTreeMap<String, Device> = n
            .inventory()
            .devices
            .iter()
            .filter(|d| d.vfio.is_some())
            .map(|d| (d.id.clone(), d.clone()))
            .collect();
        for o in ops {
            match o {
                Op::Count(k, count) => {
                    let _ = n.allocate(&ClaimRequest {
                        uid: format!("c{k}"),
                        namespace: "vms".into(),
                        name: format!("c{k}"),
                        ask: Ask::Count(vec![CountRequest {
                            request: "gpu".into(),
                            count,
                            family: Some(FamilyKind::Exclusive),
                            // Only groups have this model: a count ask takes a group only when
                            // no pool of host devices matches.
                            selector: DeviceSelector {
                                model: Some("A10".into()),
                                ..DeviceSelector::default()
                            },
                            profile: None,
                            shares: None,
                        }]),
                    });
                }
                Op::Named(k, i) => {
                    let _ = n.allocate(&ClaimRequest {
                        uid: format!("c{k}"),
                        namespace: "vms".into(),
                        name: format!("c{k}"),
                        ask: Ask::Named(vec![NamedResult {
                            request: "gpu".into(),
                            pool: "vm".into(),
                            device: published[i].clone(),
                        }]),
                    });
                }
                Op::Release(k) => {
                    n.release(&format!("c{k}"));
                }
            }
            // Never held twice: each group by at most one claim.
            let mut holders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for a in n.allocations() {
                for g in &a.results {
                    holders.entry(g.device_id.clone()).or_default().insert(a.claim_uid.clone());
                }
                // Never split: a grant of a group carries every node of the group, and its
                // env names every function.
                let edits = n.edits(&a.claim_uid).unwrap();
                for (g, e) in a.results.iter().zip(edits) {
                    let Some(d) = groups.get(&g.device_id) else { continue };
                    for want in &d.nodes {
                        prop_assert!(e.device_nodes.contains(want), "{} lacks {}", a.claim_uid, want.path);
                    }
                    let v = d.vfio.as_ref().unwrap();
                    prop_assert!(e.env.contains(&(v.env_name(), v.functions.join(","))));
                    prop_assert_eq!(&g.pool, "vm");
                }
            }
            for (dev, claims) in &holders {
                if groups.contains_key(dev) {
                    prop_assert_eq!(claims.len(), 1, "group {} held by {:?}", dev, claims);
                    prop_assert_eq!(n.holder_of(dev).len(), 1);
                }
            }
        }
    }
}
