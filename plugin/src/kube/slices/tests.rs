//! The pool's content and layout, without any server.

use std::collections::{BTreeMap, BTreeSet};

use policies::{
    Device, FamilyConfig, Inventory, Node, PoolConfig, ProfileConfig, PublishedDevice, Registry,
};
use proptest::prelude::*;

use super::layout::{self, Body, Existing, Write};
use super::limits::*;
use super::*;

/// The demo's simulated GPU under id `id` (PCI address `0000:<id>:00.0`).
fn gpu(id: &str, numa: u32) -> Device {
    let pci = format!("0000:{id}:00.0");
    Device {
        id: id.into(),
        ..crate::fixtures::simulated_gpu(0, numa, Default::default(), pci)
    }
}

fn mig() -> FamilyConfig {
    let p = |name: &str, size, starts: &[u32]| ProfileConfig {
        name: name.into(),
        size,
        memory_mib: 10240 * u64::from(size),
        compute_units: 16 * size,
        starts: starts.to_vec(),
    };
    FamilyConfig::Sliced {
        slots: 8,
        profiles: vec![
            p("1g.10gb", 1, &[0, 1, 2, 3, 4, 5, 6]),
            p("2g.20gb", 2, &[0, 2, 4]),
            p("4g.40gb", 4, &[0]),
        ],
    }
}

fn shared() -> FamilyConfig {
    FamilyConfig::Shared {
        replicas: 4,
        memory_mib_per_share: 20480,
        compute_percent_per_share: 25,
    }
}

struct Fixture {
    inventory: Inventory,
    pools: Vec<PoolConfig>,
    published: Vec<PublishedDevice>,
    roots: BTreeMap<String, String>,
}

impl Fixture {
    fn new(devices: Vec<Device>, pools: Vec<PoolConfig>) -> Fixture {
        let inventory = Inventory {
            devices,
            cpus: Default::default(),
        };
        let node = Node::new(inventory.clone(), &pools, &Registry::with_builtins()).unwrap();
        let roots = inventory
            .devices
            .iter()
            .map(|d| (d.id.clone(), format!("pci0000:{}", d.id)))
            .collect();
        Fixture {
            published: node.published(),
            inventory,
            pools,
            roots,
        }
    }

    fn three_families() -> Fixture {
        Fixture::new(
            vec![gpu("17", 0), gpu("18", 0), gpu("65", 1), gpu("66", 1)],
            vec![
                PoolConfig::of_ids("whole", &["17", "18"], FamilyConfig::Exclusive),
                PoolConfig::of_ids("share", &["65"], shared()),
                PoolConfig::of_ids("mig", &["66"], mig()),
            ],
        )
    }

    fn build(&self, caps: Capabilities, unhealthy: &BTreeSet<String>) -> PoolContent {
        self.build_with(caps, unhealthy, &HeldElsewhere::new())
    }

    fn build_with(
        &self,
        caps: Capabilities,
        unhealthy: &BTreeSet<String>,
        held: &HeldElsewhere,
    ) -> PoolContent {
        let unhealthy = unhealthy
            .iter()
            .map(|id| {
                let u = UnhealthyDevice {
                    since_unix: 1_700_000_000,
                    reason: "device-node-gone".into(),
                };
                (id.clone(), u)
            })
            .collect();
        build(&PoolInput {
            inventory: &self.inventory,
            pools: &self.pools,
            published: &self.published,
            pcie_roots: &self.roots,
            unhealthy: &unhealthy,
            held,
            driver: "accel.nri.io",
            caps,
        })
    }
}

fn attr<'a>(
    d: &'a k8s_openapi::api::resource::v1::Device,
    k: &str,
) -> &'a k8s_openapi::api::resource::v1::DeviceAttribute {
    &d.attributes.as_ref().unwrap()[k]
}

fn find<'a>(c: &'a PoolContent, name: &str) -> &'a k8s_openapi::api::resource::v1::Device {
    &c.devices
        .iter()
        .find(|e| e.device.name == name)
        .unwrap()
        .device
}

#[test]
fn whole_devices_carry_the_attributes_a_device_class_selects_on() {
    let f = Fixture::three_families();
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    let d = find(&c, "whole-17");
    assert_eq!(attr(d, "vendor").string.as_deref(), Some("nvidia"));
    assert_eq!(attr(d, "model").string.as_deref(), Some("H100 SXM5 80GB"));
    assert_eq!(attr(d, "numaNode").int, Some(0));
    assert_eq!(attr(d, PCIE_ROOT).string.as_deref(), Some("pci0000:17"));
    assert_eq!(attr(d, "driver").string.as_deref(), Some("nvidia"));
    assert_eq!(attr(d, "family").string.as_deref(), Some("exclusive"));
    assert_eq!(attr(d, "pool").string.as_deref(), Some("whole"));
    assert_eq!(attr(d, "type").string.as_deref(), Some("device"));
    let cap = d.capacity.as_ref().unwrap();
    assert_eq!(cap["memory"].value.0, "81559Mi");
    assert_eq!(cap["computeUnits"].value.0, "132");
    assert!(d.allow_multiple_allocations.is_none() && d.consumes_counters.is_none());
}

#[test]
fn shared_devices_take_several_claims_one_share_each() {
    let f = Fixture::three_families();
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    let d = find(&c, "share-65");
    assert_eq!(d.allow_multiple_allocations, Some(true));
    let cap = d.capacity.as_ref().unwrap();
    assert_eq!(cap["shares"].value.0, "4");
    let policy = cap["shares"].request_policy.as_ref().unwrap();
    assert_eq!(policy.default.as_ref().unwrap().0, "1");
    // Every capacity of a multiply-allocatable device needs a default, or the first claim
    // would consume all of it.
    assert!(cap.values().all(|c| c.request_policy.is_some()));
    assert_eq!(
        cap["memory"]
            .request_policy
            .as_ref()
            .unwrap()
            .default
            .as_ref()
            .unwrap()
            .0,
        "20480Mi"
    );

    let single = f.build(
        Capabilities {
            partitions: true,
            multiple_allocations: false,
            taints: true,
            numa_list: true,
        },
        &BTreeSet::new(),
    );
    let d = find(&single, "share-65");
    assert_eq!(d.allow_multiple_allocations, None);
    assert!(
        d.capacity
            .as_ref()
            .unwrap()
            .values()
            .all(|c| c.request_policy.is_none())
    );
}

/// Slots a published device covers, from its unit.
fn slots_of(p: &PublishedDevice, slots: u32) -> BTreeSet<u32> {
    match &p.unit {
        Some(policies::Unit::Slice { start, size, .. }) => (*start..start + size).collect(),
        _ => (0..slots).collect(),
    }
}

fn counters_of(d: &k8s_openapi::api::resource::v1::Device) -> BTreeSet<(String, String)> {
    d.consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| {
            c.counters
                .keys()
                .map(|k| (c.counter_set.clone(), k.clone()))
        })
        .collect()
}

#[test]
fn partitions_consume_the_slots_they_cover() {
    let f = Fixture::three_families();
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    assert_eq!(c.counter_sets.len(), 1);
    assert_eq!(c.counter_sets[0].name, "mig-66");
    assert_eq!(c.counter_sets[0].counters.len(), 8);
    let whole = find(&c, "mig-66");
    assert_eq!(counters_of(whole).len(), 8);
    let p = find(&c, "mig-66-2g-20gb-2");
    assert_eq!(attr(p, "type").string.as_deref(), Some("partition"));
    assert_eq!(attr(p, "profile").string.as_deref(), Some("2g.20gb"));
    assert_eq!(attr(p, "sliceStart").int, Some(2));
    let want: BTreeSet<_> = ["s2", "s3"]
        .iter()
        .map(|s| ("mig-66".to_string(), s.to_string()))
        .collect();
    assert_eq!(counters_of(p), want);
    assert_eq!(p.capacity.as_ref().unwrap()["memory"].value.0, "20480Mi");
}

#[test]
fn without_counters_partitions_are_withdrawn_and_the_whole_device_stays() {
    let f = Fixture::three_families();
    let caps = Capabilities {
        partitions: false,
        multiple_allocations: true,
        taints: true,
        numa_list: true,
    };
    let c = f.build(caps, &BTreeSet::new());
    assert!(c.counter_sets.is_empty());
    assert!(
        c.devices
            .iter()
            .all(|e| e.device.consumes_counters.is_none())
    );
    let mig: Vec<_> = c.devices.iter().filter(|e| e.group == "66").collect();
    assert_eq!(mig.len(), 1);
    assert_eq!(mig[0].device.name, "mig-66");
    assert!(c.withdrawn.contains(&Withdrawal::PartitionsUnsupported {
        device: "66".into(),
        partitions: 11
    }));
}

#[test]
fn unhealthy_devices_are_withdrawn_but_their_counters_stay() {
    let f = Fixture::three_families();
    let bad = BTreeSet::from(["66".to_string(), "17".to_string()]);
    let c = f.build(Capabilities::ALL, &bad);
    assert!(c.devices.iter().all(|e| e.group != "66" && e.group != "17"));
    assert_eq!(c.counter_sets.len(), 1);
    assert!(c.withdrawn.contains(&Withdrawal::Unhealthy {
        device: "17".into(),
        taint_dropped: false,
    }));
}

fn tainting(mode: policies::UnhealthyDevices) -> Fixture {
    let mut f = Fixture::three_families();
    for p in &mut f.pools {
        p.unhealthy = mode;
    }
    f
}

#[test]
fn a_pool_set_to_taint_publishes_its_unhealthy_devices_tainted() {
    let f = tainting(policies::UnhealthyDevices::TaintNoExecute);
    let bad = BTreeSet::from(["66".to_string(), "17".to_string()]);
    let c = f.build(Capabilities::ALL, &bad);
    // Every DRA device of the two is there, each with the one taint; the others have none.
    let tainted: Vec<&Entry> = c
        .devices
        .iter()
        .filter(|e| e.group == "66" || e.group == "17")
        .collect();
    assert_eq!(
        tainted.len(),
        1 + f.published.iter().filter(|p| p.device_id == "66").count()
    );
    for e in &tainted {
        let t = e.device.taints.as_deref().unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].key, "accel.nri.io/unhealthy");
        assert_eq!(t[0].value.as_deref(), Some("device-node-gone"));
        assert_eq!(t[0].effect, "NoExecute");
        assert_eq!(
            t[0].time_added.as_ref().unwrap().0.as_second(),
            1_700_000_000
        );
    }
    assert!(
        c.devices
            .iter()
            .filter(|e| e.group != "66" && e.group != "17")
            .all(|e| e.device.taints.is_none())
    );
    assert!(
        c.withdrawn
            .iter()
            .all(|w| !matches!(w, Withdrawal::Unhealthy { .. }))
    );
    assert_eq!(c.tainted.len(), 2);
    assert_eq!(c.tainted[0].effect, "NoExecute");
    // NoSchedule is the other effect.
    let f = tainting(policies::UnhealthyDevices::TaintNoSchedule);
    let c = f.build(Capabilities::ALL, &bad);
    assert_eq!(
        find(&c, "whole-17").taints.as_ref().unwrap()[0].effect,
        "NoSchedule"
    );
}

#[test]
fn a_server_without_taints_gets_the_unhealthy_device_withdrawn_instead() {
    let f = tainting(policies::UnhealthyDevices::TaintNoSchedule);
    let caps = Capabilities {
        taints: false,
        ..Capabilities::ALL
    };
    let c = f.build(caps, &BTreeSet::from(["17".to_string()]));
    assert!(c.devices.iter().all(|e| e.group != "17"));
    assert!(c.devices.iter().all(|e| e.device.taints.is_none()));
    assert!(c.withdrawn.contains(&Withdrawal::Unhealthy {
        device: "17".into(),
        taint_dropped: true,
    }));
    assert!(c.tainted.is_empty());
}

#[test]
fn a_tainted_device_halves_what_its_slice_holds() {
    let mut f = many(100, FamilyConfig::Exclusive);
    f.pools[0].unhealthy = policies::UnhealthyDevices::TaintNoSchedule;
    let healthy = layout::pack(&f.build(Capabilities::ALL, &BTreeSet::new()));
    assert_eq!(healthy.len(), 1);
    let c = f.build(Capabilities::ALL, &BTreeSet::from(["0000".to_string()]));
    let bodies = layout::pack(&c);
    assert_eq!(bodies.len(), 2);
    assert!(
        bodies
            .iter()
            .all(|b| b.device_count() <= MAX_DEVICES_WITH_COUNTERS)
    );
}

fn held(device: &str, claim: &str, units: &[policies::Unit]) -> HeldElsewhere {
    HeldElsewhere::from([(
        device.to_string(),
        units
            .iter()
            .map(|u| (claim.to_string(), u.clone()))
            .collect(),
    )])
}

#[test]
fn a_device_held_through_another_door_is_withdrawn() {
    let f = Fixture::three_families();
    let c = f.build_with(
        Capabilities::ALL,
        &BTreeSet::new(),
        &held("17", "ctr-1", &[policies::Unit::Whole]),
    );
    assert!(c.devices.iter().all(|e| e.group != "17"));
    assert!(c.devices.iter().any(|e| e.group == "18"));
    assert_eq!(
        c.withdrawn,
        vec![Withdrawal::HeldElsewhere {
            device: "17".into(),
            claims: vec!["ctr-1".into()],
            names: vec!["whole-17".into()],
            shares_left: None,
        }]
    );
}

#[test]
fn a_shared_device_held_elsewhere_publishes_the_shares_left() {
    let f = Fixture::three_families();
    let share = |index| policies::Unit::Share { index, count: 1 };
    let shares = |c: &PoolContent| {
        find(c, "share-65").capacity.as_ref().unwrap()["shares"]
            .value
            .0
            .clone()
    };
    let c = f.build_with(
        Capabilities::ALL,
        &BTreeSet::new(),
        &held("65", "ctr-1", &[share(0)]),
    );
    assert_eq!(shares(&c), "3");
    assert!(matches!(
        &c.withdrawn[0],
        Withdrawal::HeldElsewhere { names, shares_left: Some(3), .. } if names.is_empty()
    ));
    // Every replica held: withdrawn.
    let all = [share(0), share(1), share(2), share(3)];
    let c = f.build_with(Capabilities::ALL, &BTreeSet::new(), &held("65", "c", &all));
    assert!(c.devices.iter().all(|e| e.group != "65"));
}

#[test]
fn a_sliced_device_held_elsewhere_keeps_the_partitions_that_do_not_overlap() {
    let f = Fixture::three_families();
    let slice = policies::Unit::Slice {
        profile: "2g.20gb".into(),
        start: 2,
        size: 2,
    };
    let c = f.build_with(
        Capabilities::ALL,
        &BTreeSet::new(),
        &held("66", "ctr-1", &[slice]),
    );
    let names: BTreeSet<&str> = c
        .devices
        .iter()
        .filter(|e| e.group == "66")
        .map(|e| e.device.name.as_str())
        .collect();
    // Slots 2 and 3 are held: the whole device, 1g at 2 and 3, 2g at 2 and 4g at 0 go.
    assert!(!names.contains("mig-66"));
    for gone in [
        "mig-66-1g-10gb-2",
        "mig-66-1g-10gb-3",
        "mig-66-2g-20gb-2",
        "mig-66-4g-40gb-0",
    ] {
        assert!(!names.contains(gone), "{gone} still published");
    }
    for kept in [
        "mig-66-1g-10gb-0",
        "mig-66-1g-10gb-4",
        "mig-66-2g-20gb-0",
        "mig-66-2g-20gb-4",
    ] {
        assert!(names.contains(kept), "{kept} withdrawn");
    }
    // The counter set stays: the scheduler's own claims on the other partitions need it.
    assert_eq!(c.counter_sets.len(), 1);
}

#[test]
fn a_new_holder_is_more_a_release_is_not() {
    let one = held("17", "a", &[policies::Unit::Whole]);
    let none = HeldElsewhere::new();
    assert!(super::doors::holds_more(&one, &none));
    assert!(!super::doors::holds_more(&none, &one));
    assert!(!super::doors::holds_more(&one, &one));
    let other = held("17", "b", &[policies::Unit::Whole]);
    assert!(super::doors::holds_more(&other, &one));
}

#[test]
fn long_names_are_withdrawn_not_sent() {
    let long = "p".repeat(62);
    let f = Fixture::new(
        vec![gpu("17", 0)],
        vec![PoolConfig::of_ids(&long, &["17"], FamilyConfig::Exclusive)],
    );
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    assert!(c.devices.is_empty());
    assert!(matches!(c.withdrawn[0], Withdrawal::BadName { .. }));
}

fn many(n: usize, family: FamilyConfig) -> Fixture {
    let devices: Vec<Device> = (0..n)
        .map(|i| gpu(&format!("{i:04x}"), (i % 2) as u32))
        .collect();
    Fixture::new(devices, vec![PoolConfig::of_ids("p", &[], family)])
}

fn check_limits(bodies: &[Body]) {
    for b in bodies {
        match b {
            Body::Devices(ds) => {
                let counted = ds.iter().any(|d| d.consumes_counters.is_some());
                let limit = if counted {
                    MAX_DEVICES_WITH_COUNTERS
                } else {
                    MAX_DEVICES
                };
                assert!(ds.len() <= limit, "{} devices in a slice", ds.len());
                let consumed: usize = ds.iter().map(|d| counters_of(d).len()).sum();
                assert!(consumed <= MAX_CONSUMED_PER_SLICE);
                for d in ds {
                    let n = d.attributes.as_ref().map_or(0, |a| a.len())
                        + d.capacity.as_ref().map_or(0, |c| c.len());
                    assert!(n <= MAX_ATTRIBUTES_AND_CAPACITIES);
                    assert!(
                        d.consumes_counters.as_ref().map_or(0, |c| c.len()) <= MAX_CONSUMPTIONS
                    );
                    for a in d.attributes.iter().flatten().map(|(_, a)| a) {
                        assert!(
                            a.string
                                .as_ref()
                                .is_none_or(|s| s.len() <= MAX_ATTRIBUTE_STRING)
                        );
                    }
                }
            }
            Body::Counters(cs) => {
                assert!(cs.len() <= MAX_COUNTER_SETS);
                assert!(cs.iter().all(|c| c.counters.len() <= MAX_COUNTERS_PER_SET));
            }
        }
    }
}

#[test]
fn a_thousand_devices_fit_the_limits() {
    let f = many(1000, FamilyConfig::Exclusive);
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    let bodies = layout::pack(&c);
    assert_eq!(bodies.len(), 8);
    check_limits(&bodies);
    let f = many(100, mig());
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    assert_eq!(c.devices.len(), 1200);
    let bodies = layout::pack(&c);
    check_limits(&bodies);
    // A device's whole and partitions stay together: 12 names per device, 5 devices per slice.
    assert!(bodies.iter().all(|b| b.device_count() % 12 == 0));
}

fn existing(plan: &layout::Plan) -> Vec<Existing> {
    plan.slices
        .iter()
        .enumerate()
        .map(|(i, (name, body))| Existing {
            name: name.clone(),
            resource_version: format!("rv{i}"),
            pool: "n1".into(),
            generation: plan.generation,
            count: plan.count as i64,
            body: Some(body.clone()),
        })
        .collect()
}

#[test]
fn a_one_device_change_is_one_write_at_the_same_generation() {
    let f = many(1000, FamilyConfig::Exclusive);
    let healthy = f.build(Capabilities::ALL, &BTreeSet::new());
    let first = layout::plan(&[], &healthy, "n1", "accel.nri.io", "n1");
    assert_eq!(first.generation, 1);
    assert!(
        first
            .writes
            .iter()
            .all(|w| matches!(w, Write::Create { .. }))
    );
    let now = existing(&first);
    assert!(
        layout::plan(&now, &healthy, "n1", "accel.nri.io", "n1")
            .writes
            .is_empty()
    );

    let sick = f.build(Capabilities::ALL, &BTreeSet::from(["0200".to_string()]));
    let p = layout::plan(&now, &sick, "n1", "accel.nri.io", "n1");
    assert_eq!(p.writes.len(), 1);
    assert!(matches!(p.writes[0], Write::Replace { .. }));
    assert_eq!(p.generation, 1);
    // And back: the device returns to the slice it left.
    let p2 = layout::plan(&existing(&p), &healthy, "n1", "accel.nri.io", "n1");
    assert_eq!(p2.writes.len(), 1);
    assert_eq!(p2.slices, first.slices);
}

#[test]
fn a_change_of_several_slices_raises_the_generation_and_rewrites_all() {
    let f = many(300, FamilyConfig::Exclusive);
    let healthy = f.build(Capabilities::ALL, &BTreeSet::new());
    let first = layout::plan(&[], &healthy, "n1", "accel.nri.io", "n1");
    let bad = BTreeSet::from(["0001".to_string(), "0100".to_string()]);
    let sick = f.build(Capabilities::ALL, &bad);
    let p = layout::plan(&existing(&first), &sick, "n1", "accel.nri.io", "n1");
    assert_eq!(p.generation, 2);
    assert!(p.rebuilt);
    assert_eq!(p.writes.len(), p.count);
}

#[test]
fn slices_of_another_pool_or_generation_are_replaced() {
    let f = many(10, FamilyConfig::Exclusive);
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    let stale = vec![Existing {
        name: "old".into(),
        resource_version: "1".into(),
        pool: "renamed".into(),
        generation: 7,
        count: 1,
        body: Some(Body::Devices(vec![])),
    }];
    let p = layout::plan(&stale, &c, "n1", "accel.nri.io", "n1");
    assert_eq!(p.generation, 8);
    assert!(p.writes.contains(&Write::Delete {
        name: "old".into(),
        resource_version: "1".into()
    }));
}

#[test]
fn slice_names_stay_within_253_characters() {
    let long = format!("{}.{}.example.com", "n".repeat(63), "m".repeat(63)).repeat(2);
    let long = long[..long.len().min(253)]
        .trim_end_matches('.')
        .to_string();
    for node in [long.as_str(), &"n".repeat(63), "n1"] {
        let name = layout::slice_name(node, "accel.nri.io", 12);
        assert!(name.len() <= MAX_OBJECT_NAME);
        assert!(crate::names::is_dns_subdomain(&name), "{name}");
    }
    assert_eq!(
        layout::slice_name("n1", "accel.nri.io", 0),
        "n1-accel.nri.io-0"
    );
}

prop_compose! {
    fn profiles()(specs in prop::collection::vec((1u32..=8, prop::collection::btree_set(0u32..8, 1..4)), 1..4))
        -> Vec<ProfileConfig> {
        specs.into_iter().enumerate().filter_map(|(i, (size, starts))| {
            let starts: Vec<u32> = starts.into_iter().filter(|s| s + size <= 8).collect();
            (!starts.is_empty()).then(|| ProfileConfig {
                name: format!("p{i}"), size, memory_mib: 0, compute_units: 0, starts,
            })
        }).collect()
    }
}

proptest! {
    /// Two published names of a sliced device share a counter exactly when their slots overlap:
    /// the scheduler, which never lets a counter be consumed twice, can never allocate both.
    #[test]
    fn overlapping_names_always_share_a_counter(profiles in profiles()) {
        prop_assume!(!profiles.is_empty());
        let family = FamilyConfig::Sliced { slots: 8, profiles };
        let f = Fixture::new(vec![gpu("17", 0)], vec![PoolConfig::of_ids("m", &[], family)]);
        let c = f.build(Capabilities::ALL, &BTreeSet::new());
        for a in &f.published {
            for b in &f.published {
                if a.name >= b.name { continue; }
                let overlap = !slots_of(a, 8).is_disjoint(&slots_of(b, 8));
                let shared = !counters_of(find(&c, &a.name)).is_disjoint(&counters_of(find(&c, &b.name)));
                prop_assert_eq!(overlap, shared, "{} and {}", &a.name, &b.name);
            }
        }
    }
}

#[test]
fn a_gpu_uuid_is_published_as_uuid_and_as_its_partitions_parent_uuid() {
    let uuid = |id: &str| format!("GPU-000000{id}-5f1c-3b7e-a0d2-0000c0ffee00");
    let mut devices = vec![gpu("17", 0), gpu("65", 1), gpu("66", 1)];
    for d in &mut devices {
        d.uuid = Some(uuid(&d.id));
    }
    let f = Fixture::new(
        devices,
        vec![
            PoolConfig::of_ids("whole", &["17"], FamilyConfig::Exclusive),
            PoolConfig::of_ids("share", &["65"], shared()),
            PoolConfig::of_ids("mig", &["66"], mig()),
        ],
    );
    let c = f.build(Capabilities::ALL, &BTreeSet::new());
    for (name, id) in [("whole-17", "17"), ("share-65", "65"), ("mig-66", "66")] {
        let d = find(&c, name);
        assert_eq!(
            attr(d, "uuid").string.as_deref(),
            Some(uuid(id).as_str()),
            "{name}"
        );
    }
    let p = find(&c, "mig-66-2g-20gb-2");
    assert!(!p.attributes.as_ref().unwrap().contains_key("uuid"));
    assert_eq!(
        attr(p, "parentUUID").string.as_deref(),
        Some(uuid("66").as_str())
    );
    // No UUID known: no attribute.
    let plain = Fixture::three_families().build(Capabilities::ALL, &BTreeSet::new());
    assert!(
        !find(&plain, "whole-17")
            .attributes
            .as_ref()
            .unwrap()
            .contains_key("uuid")
    );
}
