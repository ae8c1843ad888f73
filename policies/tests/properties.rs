//! Properties over random inventories and random sequences of allocate (named
//! and count), release, restore and container start/removal. After every step:
//! no unit is over-committed, slices never overlap, no CPU is given
//! exclusively twice and the shared pool is exactly what is left, updates keep
//! every container's cpuset current, release gives back exactly what allocate
//! took, allocate is idempotent, and restoring a fresh node from the
//! allocations reproduces the same snapshot. The kubelet's preferred-allocation query picks
//! only free units, always includes what it must, keeps to one NUMA node when one suffices, does
//! not depend on the order it is offered units in, changes nothing, and on whole devices picks
//! exactly what a count claim would get.

mod common;

use std::collections::BTreeMap;

use common::*;
use policies::{
    Allocation, Ask, Candidate, ClaimRequest, CountRequest, CpuSet, Device, DeviceSelector,
    FamilyConfig, FamilyKind, Inventory, NamedResult, Node, Placement, PoolConfig, PoolUsage,
    Registry, Snapshot, Unit, UnitResult,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct World {
    devices: Vec<Device>,
    cpus: CpuSet,
    pools: Vec<PoolConfig>,
}

fn world() -> impl Strategy<Value = World> {
    (
        1usize..=16,
        1u32..=2,
        prop::collection::vec((0usize..4, 0u32..2, prop::bool::weighted(0.15)), 16),
        1u32..=4,
        prop::collection::vec(0u32..=2, 3),
    )
        .prop_map(|(n, numas, per_dev, replicas, cpd)| {
            let mut devices = Vec::new();
            let mut members: Vec<Vec<String>> = vec![Vec::new(); 3];
            for (i, (pool, numa, amd)) in per_dev.into_iter().take(n).enumerate() {
                let numa = numa % numas;
                let local = format!("{}-{}", numa * 4, numa * 4 + 3);
                let vendor = if amd { "amd" } else { "nvidia" };
                let id = format!("d{i:02}");
                devices.push(gpu(&id, vendor, numa, &local, 0x10 + i as u8 / 3, i as u32));
                if pool < 3 {
                    members[pool].push(id);
                }
            }
            let families = [FamilyConfig::Exclusive, shared(replicas, 1024, 20), mig()];
            let names = ["ex", "sh", "sl"];
            let pools = (0..3)
                .map(|p| {
                    let ids: Vec<&str> = members[p].iter().map(String::as_str).collect();
                    let mut pc = pool(names[p], &ids, families[p].clone(), cpd[p]);
                    // A pool with no ids would match every device: give it an impossible one.
                    if ids.is_empty() {
                        pc.select.ids = vec!["none".to_string()];
                    }
                    pc
                })
                .collect();
            World {
                devices,
                cpus: cpus(&format!("0-{}", numas * 4 - 1)),
                pools,
            }
        })
}

#[derive(Debug, Clone)]
enum Op {
    Named {
        uid: u8,
        picks: Vec<usize>,
    },
    Count {
        uid: u8,
        reqs: Vec<(u32, u8, u8, bool)>,
    },
    Release {
        uid: u8,
    },
    Restore,
    Started {
        container: u8,
        claims: Vec<u8>,
        /// The CPUs the runtime reports for it, as a bitmask; 0: not pinned.
        pinned: u8,
    },
    Removed {
        container: u8,
    },
    Adopt {
        uid: u8,
        device: usize,
    },
    /// Exact units, as a device plugin's Allocate names them.
    Units {
        uid: u8,
        picks: Vec<usize>,
        layout: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..10, prop::collection::vec(0usize..1000, 1..=3))
            .prop_map(|(uid, picks)| Op::Named { uid, picks }),
        3 => (0u8..10, prop::collection::vec((1u32..=3, 0u8..4, 0u8..6, prop::bool::weighted(0.1)), 1..=2))
            .prop_map(|(uid, reqs)| Op::Count { uid, reqs }),
        3 => (0u8..13).prop_map(|uid| Op::Release { uid }),
        1 => Just(Op::Restore),
        1 => (0u8..4, prop::collection::vec(0u8..10, 0..=2), prop_oneof![Just(0u8), any::<u8>()])
            .prop_map(|(container, claims, pinned)| Op::Started { container, claims, pinned }),
        1 => (0u8..4).prop_map(|container| Op::Removed { container }),
        1 => (0u8..3, 0usize..16).prop_map(|(uid, device)| Op::Adopt { uid, device }),
        2 => (0u8..10, prop::collection::vec(0usize..1000, 1..=3), 0u8..4)
            .prop_map(|(uid, picks, layout)| Op::Units { uid, picks, layout }),
    ]
}

fn uid(i: u8) -> String {
    format!("claim{i}")
}

fn build(w: &World) -> Node {
    Node::new(
        Inventory {
            devices: w.devices.clone(),
            cpus: w.cpus.clone(),
        },
        &w.pools,
        &Registry::with_builtins(),
    )
    .unwrap()
}

/// DRA results naming published devices picked by index (none when nothing is published).
fn named_ask(published: &[policies::PublishedDevice], picks: &[usize]) -> Ask {
    Ask::Named(
        picks
            .iter()
            .enumerate()
            .filter(|_| !published.is_empty())
            .map(|(i, p)| {
                let d = &published[p % published.len()];
                NamedResult {
                    request: format!("r{i}"),
                    pool: d.pool.clone(),
                    device: d.name.clone(),
                }
            })
            .collect(),
    )
}

/// A count request: mostly consistent with one family, sometimes not.
fn count_request(i: usize, (count, kind, pick, odd): (u32, u8, u8, bool)) -> CountRequest {
    let profiles = ["1g.10gb", "2g.20gb", "4g.40gb", "7g.80gb", "9g.90gb"];
    let mut r = CountRequest {
        request: format!("r{i}"),
        count,
        ..CountRequest::default()
    };
    match kind {
        1 => r.family = Some(FamilyKind::Exclusive),
        2 => {
            r.family = Some(FamilyKind::Shared);
            r.shares = (pick % 3 > 0).then_some(u32::from(pick % 3));
        }
        3 => {
            r.family = Some(FamilyKind::Sliced);
            r.profile = Some(profiles[pick as usize % 4].to_string());
        }
        _ => {}
    }
    if odd {
        // Something the pool may not offer: a foreign profile, shares, or an unknown profile.
        match pick % 3 {
            0 => r.profile = Some(profiles[pick as usize % 5].to_string()),
            1 => r.shares = Some(u32::from(pick)),
            _ => r.family = Some(FamilyKind::Sliced),
        }
    }
    r
}

/// Slot ranges a unit covers on a device of `total` units.
fn range(unit: &Unit, total: u32) -> std::ops::Range<u32> {
    match unit {
        Unit::Whole => 0..total,
        Unit::Share { index, count } => *index..index + count,
        Unit::Slice { start, size, .. } => *start..start + size,
    }
}

/// Per device, which claim holds each unit: from the snapshot, and rebuilt from the allocations.
fn occupancy(snap: &Snapshot, allocs: &[Allocation]) -> Result<(), TestCaseError> {
    let mut totals = BTreeMap::new();
    let mut from_snapshot: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for p in &snap.pools {
        for d in &p.devices {
            prop_assert!(d.units_used <= d.units_total, "{} over-committed", d.id);
            totals.insert(d.id.clone(), d.units_total);
            let mut slots = vec![None; d.units_total as usize];
            for h in &d.held {
                for s in range(&h.unit, d.units_total) {
                    prop_assert!(slots[s as usize].is_none(), "{} unit {s} held twice", d.id);
                    slots[s as usize] = Some(h.claim.clone());
                }
            }
            prop_assert_eq!(slots.iter().flatten().count() as u32, d.units_used);
            from_snapshot.insert(d.id.clone(), slots);
        }
    }
    let mut from_records: BTreeMap<String, Vec<Option<String>>> = totals
        .iter()
        .map(|(id, t)| (id.clone(), vec![None; *t as usize]))
        .collect();
    for a in allocs {
        for g in &a.results {
            let slots = from_records
                .get_mut(&g.device_id)
                .expect("granted device is pooled");
            let total = totals[&g.device_id];
            for s in range(&g.unit, total) {
                prop_assert!(
                    slots[s as usize].is_none(),
                    "{} unit {s} granted twice",
                    g.device_id
                );
                slots[s as usize] = Some(a.claim_uid.clone());
            }
        }
    }
    prop_assert_eq!(from_snapshot, from_records);
    Ok(())
}

fn check(w: &World, n: &Node, model: &BTreeMap<String, CpuSet>) -> Result<(), TestCaseError> {
    let snap = n.snapshot();
    let allocs: Vec<Allocation> = n.allocations().cloned().collect();
    occupancy(&snap, &allocs)?;
    // The cheap usage the metrics read agrees with the full snapshot.
    let usage: Vec<(String, PoolUsage)> = n
        .usage()
        .into_iter()
        .map(|(p, u)| (p.to_string(), u))
        .collect();
    let from_snapshot: Vec<(String, PoolUsage)> = snap
        .pools
        .iter()
        .map(|p| (p.name.clone(), PoolUsage::of(p)))
        .collect();
    prop_assert_eq!(usage, from_snapshot);
    // CPUs: exclusive sets disjoint, and the shared pool is exactly what is left.
    let mut given = CpuSet::new();
    for a in &allocs {
        prop_assert!(
            a.cpus.is_disjoint(&given),
            "a CPU of {} is given twice",
            a.claim_uid
        );
        given = given.union(&a.cpus);
        let mut want = 0;
        let mut local = CpuSet::new();
        let mut vendors: Vec<&str> = Vec::new();
        for g in &a.results {
            let pool = w.pools.iter().find(|p| p.name == g.pool).unwrap();
            want += pool.cpus_per_device as usize;
            let d = w.devices.iter().find(|d| d.id == g.device_id).unwrap();
            local = local.union(&d.local_cpus);
            if !vendors.contains(&d.vendor.as_str()) {
                vendors.push(&d.vendor);
            }
        }
        if a.name == "adopted" {
            // Adoption records what runs: no exclusive CPUs, no vendor check.
            prop_assert!(a.cpus.is_empty());
            continue;
        }
        prop_assert_eq!(a.cpus.len(), want);
        prop_assert!(a.cpus.is_subset(&local));
        prop_assert!(vendors.len() <= 1, "claim {} mixes vendors", a.claim_uid);
    }
    prop_assert_eq!(n.shared_cpus(), w.cpus.difference(&given));
    prop_assert!(!n.shared_cpus().is_empty());
    prop_assert_eq!(&snap.shared_cpus, &n.shared_cpus());
    // Containers: the updates handed out kept every cpuset current.
    let actual: BTreeMap<String, CpuSet> = n
        .containers()
        .map(|(id, _, c)| (id.to_string(), c.clone()))
        .collect();
    prop_assert_eq!(&actual, model);
    let managed = w.pools.iter().any(|p| p.cpus_per_device > 0);
    for (id, claims, c) in n.containers() {
        if (managed || !claims.is_empty()) && claims.iter().all(|u| n.allocation(u).is_none()) {
            prop_assert_eq!(c, &n.shared_cpus(), "container {} without claims", id);
        }
    }
    Ok(())
}

fn apply(model: &mut BTreeMap<String, CpuSet>, updates: &[policies::ContainerUpdate]) {
    for u in updates {
        model.insert(u.container_id.clone(), u.cpus.clone());
    }
}

fn run(w: World, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut n = build(&w);
    let mut model: BTreeMap<String, CpuSet> = BTreeMap::new();
    let mut containers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let published = n.published();
    for op in ops {
        match op {
            Op::Named { .. } | Op::Count { .. } | Op::Units { .. } => {
                let req = match &op {
                    Op::Units {
                        uid: u,
                        picks,
                        layout,
                    } => claim(&uid(*u), Ask::Units(units(&n, &w, picks, *layout))),
                    Op::Named { uid: u, picks } => ClaimRequest {
                        uid: uid(*u),
                        namespace: "ns".into(),
                        name: "n".into(),
                        ask: named_ask(&published, picks),
                    },
                    Op::Count { uid: u, reqs } => ClaimRequest {
                        uid: uid(*u),
                        namespace: "ns".into(),
                        name: "n".into(),
                        ask: Ask::Count(
                            reqs.iter()
                                .enumerate()
                                .map(|(i, r)| count_request(i, *r))
                                .collect(),
                        ),
                    },
                    _ => unreachable!(),
                };
                let before = n.snapshot();
                let held = n.allocation(&req.uid).cloned();
                match n.allocate(&req) {
                    Ok(out) => {
                        prop_assert_eq!(out.already, held.is_some());
                        if let Some(h) = held {
                            prop_assert_eq!(&*out.allocation, &h);
                            prop_assert_eq!(n.snapshot(), before.clone());
                        }
                        apply(&mut model, &out.updates);
                        // Idempotent: asking again changes nothing.
                        let snap = n.snapshot();
                        let again = n.allocate(&req).unwrap();
                        prop_assert!(again.already);
                        prop_assert_eq!(&again.allocation, &out.allocation);
                        prop_assert!(again.updates.is_empty());
                        prop_assert_eq!(n.snapshot(), snap);
                    }
                    Err(refusal) => {
                        prop_assert_eq!(&refusal.claim, &req.uid);
                        let prefix = format!("claim {} refused: ", req.uid);
                        prop_assert!(refusal.to_string().starts_with(&prefix), "{}", refusal);
                        prop_assert_eq!(
                            n.snapshot(),
                            before,
                            "refusal changed the node: {}",
                            refusal
                        );
                    }
                }
            }
            Op::Release { uid: u } => {
                // 10..13 release adopted claims.
                let id = if u < 10 {
                    uid(u)
                } else {
                    format!("adopted-{}", u - 10)
                };
                let held = n.allocation(&id).cloned();
                let before = n.snapshot();
                let updates = n.release(&id);
                apply(&mut model, &updates);
                let after = n.snapshot();
                match held {
                    None => prop_assert_eq!(after, before),
                    Some(a) => {
                        // Exactly the claim's units and CPUs came back.
                        let used = |s: &Snapshot| -> BTreeMap<String, u32> {
                            s.pools
                                .iter()
                                .flat_map(|p| p.devices.iter())
                                .map(|d| (d.id.clone(), d.units_used))
                                .collect()
                        };
                        let (ub, ua) = (used(&before), used(&after));
                        let mut freed: BTreeMap<String, u32> = BTreeMap::new();
                        for g in &a.results {
                            let total = before
                                .pools
                                .iter()
                                .flat_map(|p| p.devices.iter())
                                .find(|d| d.id == g.device_id)
                                .unwrap()
                                .units_total;
                            *freed.entry(g.device_id.clone()).or_default() +=
                                range(&g.unit, total).len() as u32;
                        }
                        for (dev, b) in &ub {
                            prop_assert_eq!(b - ua[dev], freed.get(dev).copied().unwrap_or(0));
                        }
                        prop_assert_eq!(after.shared_cpus, before.shared_cpus.union(&a.cpus));
                        prop_assert!(
                            after
                                .pools
                                .iter()
                                .flat_map(|p| p.devices.iter())
                                .all(|d| d.held.iter().all(|h| h.claim != id))
                        );
                    }
                }
            }
            Op::Restore => {
                let records: Vec<Allocation> = n.allocations().cloned().collect();
                let mut fresh = build(&w);
                fresh.restore(&records).unwrap();
                prop_assert_eq!(fresh.snapshot(), n.snapshot());
                // The runtime tells the new process about running containers again.
                // Each where the old node put it: nothing changes.
                for (c, claims) in &containers {
                    let has = Placement::cpus(model[c].clone());
                    let (adj, updates) = fresh.container_started(c, claims, &has);
                    prop_assert!(updates.is_empty());
                    prop_assert_eq!(adj.cpus, None, "container {} moved on restore", c);
                }
                let fresh_model: BTreeMap<String, CpuSet> = fresh
                    .containers()
                    .map(|(id, _, c)| (id.to_string(), c.clone()))
                    .collect();
                prop_assert_eq!(&fresh_model, &model);
                n = fresh;
            }
            Op::Started {
                container,
                claims,
                pinned,
            } => {
                let id = format!("ctr{container}");
                let claims: Vec<String> = claims.into_iter().map(uid).collect();
                let mask: CpuSet = w.cpus.iter().filter(|c| pinned & (1 << c) != 0).collect();
                let has = if mask.is_empty() {
                    Placement::unpinned()
                } else {
                    Placement::cpus(mask.clone())
                };
                let has_cpus = if mask.is_empty() {
                    w.cpus.clone()
                } else {
                    mask
                };
                let (adj, updates) = n.container_started(&id, &claims, &has);
                prop_assert!(updates.is_empty());
                // Set only when it changes what the container has.
                prop_assert!(adj.cpus.as_ref() != Some(&has_cpus));
                let cpus = adj.cpus.unwrap_or(has_cpus);
                let managed = !claims.is_empty() || w.pools.iter().any(|p| p.cpus_per_device > 0);
                let exclusive = claims
                    .iter()
                    .filter_map(|c| n.allocation(c))
                    .fold(CpuSet::new(), |acc, a| acc.union(&a.cpus));
                if !managed {
                    // Left where the runtime put it.
                } else if !exclusive.is_empty() {
                    prop_assert_eq!(&cpus, &exclusive);
                } else {
                    prop_assert!(cpus.is_subset(&n.shared_cpus()) && !cpus.is_empty());
                }
                model.insert(id.clone(), cpus);
                containers.insert(id, claims);
            }
            Op::Adopt { uid, device } => {
                let id = format!("adopted-{uid}");
                let dev = w.devices[device % w.devices.len()].id.clone();
                let before = n.snapshot();
                let held = n.allocation(&id).cloned();
                match n.adopt(&id, &dev) {
                    Ok(out) => {
                        apply(&mut model, &out.updates);
                        prop_assert!(out.allocation.results.iter().any(|g| g.device_id == dev));
                        if out.already {
                            prop_assert_eq!(n.snapshot(), before);
                        } else {
                            let had = held.map_or(0, |h| h.results.len());
                            prop_assert_eq!(out.allocation.results.len(), had + 1);
                        }
                    }
                    Err(refusal) => {
                        prop_assert_eq!(
                            n.snapshot(),
                            before,
                            "refusal changed the node: {}",
                            refusal
                        );
                    }
                }
            }
            Op::Removed { container } => {
                let id = format!("ctr{container}");
                let updates = n.container_removed(&id);
                prop_assert!(updates.is_empty());
                model.remove(&id);
                containers.remove(&id);
            }
        }
        check(&w, &n, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_invariants(w in world(), ops in prop::collection::vec(op(), 1..40)) {
        run(w, ops)?;
    }
}

/// Exact units picked among everything the pools would advertise to a kubelet.
fn units(n: &Node, w: &World, picks: &[usize], layout: u8) -> Vec<UnitResult> {
    let all: Vec<(String, Candidate)> = (0..w.pools.len())
        .flat_map(|p| {
            advertised(n, w, p, layout)
                .into_iter()
                .map(move |c| (w.pools[p].name.clone(), c))
        })
        .collect();
    if all.is_empty() {
        return Vec::new();
    }
    picks
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (pool, c) = all[k % all.len()].clone();
            UnitResult {
                request: format!("r{i}"),
                pool,
                device_id: c.device_id,
                unit: c.unit,
            }
        })
        .collect()
}

/// Applies `ops` to `n`, ignoring refusals: a random state of holdings to choose among.
fn drive(n: &mut Node, w: &World, ops: &[Op]) {
    let published = n.published();
    for op in ops {
        match op {
            Op::Named { uid: u, picks } => {
                let _ = n.allocate(&claim(&uid(*u), named_ask(&published, picks)));
            }
            Op::Count { uid: u, reqs } => {
                let reqs = reqs
                    .iter()
                    .enumerate()
                    .map(|(i, r)| count_request(i, *r))
                    .collect();
                let _ = n.allocate(&counted(&uid(*u), reqs));
            }
            Op::Release { uid: u } => {
                n.release(&uid(*u));
            }
            Op::Adopt { uid: u, device } => {
                let dev = &w.devices[device % w.devices.len()].id;
                let _ = n.adopt(&format!("adopted-{u}"), dev);
            }
            Op::Units {
                uid: u,
                picks,
                layout,
            } => {
                let ask = Ask::Units(units(n, w, picks, *layout));
                let _ = n.allocate(&claim(&uid(*u), ask));
            }
            _ => {}
        }
    }
}

/// What a device plugin advertises for pool `p` of the world: whole devices, every replica of a
/// shared device, or one of a few fixed non-overlapping slice layouts of a sliced device.
fn advertised(n: &Node, w: &World, p: usize, layout: u8) -> Vec<Candidate> {
    let pool = &w.pools[p];
    let slices: Vec<Unit> = {
        let s = |profile: &str, start: u32, size: u32| Unit::Slice {
            profile: profile.to_string(),
            start,
            size,
        };
        match layout {
            0 => (0..8).map(|i| s("1g.10gb", i, 1)).collect(),
            1 => vec![s("4g.40gb", 0, 4), s("4g.40gb", 4, 4)],
            2 => vec![
                s("4g.40gb", 0, 4),
                s("2g.20gb", 4, 2),
                s("1g.10gb", 6, 1),
                s("1g.10gb", 7, 1),
            ],
            _ => vec![Unit::Whole],
        }
    };
    let mut out = Vec::new();
    for d in n.pool_devices(&pool.name).unwrap_or_default() {
        let units: Vec<Unit> = match &pool.family {
            FamilyConfig::Shared { replicas, .. } => (0..*replicas)
                .map(|index| Unit::Share { index, count: 1 })
                .collect(),
            FamilyConfig::Sliced { .. } => slices.clone(),
            _ => vec![Unit::Whole],
        };
        out.extend(units.into_iter().map(|unit| Candidate {
            device_id: d.id.clone(),
            unit,
        }));
    }
    out
}

/// Whether `c` is free in `snap` (no held unit overlaps it).
fn free_in(snap: &Snapshot, c: &Candidate) -> bool {
    snap.pools
        .iter()
        .flat_map(|p| p.devices.iter())
        .find(|d| d.id == c.device_id)
        .is_some_and(|d| {
            let mine = range(&c.unit, d.units_total);
            d.held.iter().all(|h| {
                let theirs = range(&h.unit, d.units_total);
                mine.end <= theirs.start || theirs.end <= mine.start
            })
        })
}

fn overlap(a: &Candidate, b: &Candidate, total: u32) -> bool {
    let (x, y) = (range(&a.unit, total), range(&b.unit, total));
    a.device_id == b.device_id && x.start < y.end && y.start < x.end
}

#[allow(clippy::too_many_arguments)]
fn preferred_case(
    w: World,
    ops: Vec<Op>,
    layout: u8,
    p: usize,
    mask: Vec<bool>,
    must_picks: Vec<usize>,
    size: usize,
) -> Result<(), TestCaseError> {
    let mut n = build(&w);
    drive(&mut n, &w, &ops);
    let pool = w.pools[p].name.clone();
    let all = advertised(&n, &w, p, layout);
    let available: Vec<Candidate> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| mask[i % mask.len()])
        .map(|(_, c)| c.clone())
        .collect();
    let mut must: Vec<Candidate> = Vec::new();
    if !available.is_empty() {
        for m in &must_picks {
            let c = available[m % available.len()].clone();
            if !must.contains(&c) {
                must.push(c);
            }
        }
    }
    let size = size.max(must.len());
    let before = n.snapshot();
    let answer = n.preferred(&pool, &available, &must, size);
    prop_assert_eq!(n.snapshot(), before.clone(), "preferred changed the node");

    // Every unit it must include, once; nothing twice; the rest offered and free.
    for m in &must {
        prop_assert_eq!(answer.iter().filter(|c| *c == m).count(), 1);
    }
    let total = |c: &Candidate| {
        before
            .pools
            .iter()
            .flat_map(|p| p.devices.iter())
            .find(|d| d.id == c.device_id)
            .map_or(1, |d| d.units_total)
    };
    let extra: Vec<&Candidate> = answer.iter().filter(|c| !must.contains(c)).collect();
    for (i, c) in extra.iter().enumerate() {
        prop_assert!(available.contains(c), "{:?} was not offered", c);
        prop_assert!(free_in(&before, c), "{:?} is held", c);
        for other in must.iter().chain(extra[..i].iter().copied()) {
            prop_assert!(!overlap(c, other, total(c)), "{:?} overlaps {:?}", c, other);
        }
    }
    // As many as asked, unless too few free units were offered.
    let free: Vec<&Candidate> = available
        .iter()
        .filter(|c| !must.contains(c) && free_in(&before, c))
        .filter(|c| must.iter().all(|m| !overlap(c, m, total(c))))
        .collect();
    prop_assert_eq!(answer.len(), must.len() + free.len().min(size - must.len()));

    // The order units are offered in does not matter.
    let mut reversed = available.clone();
    reversed.reverse();
    let mut again = n.preferred(&pool, &reversed, &must, size);
    let mut sorted = answer.clone();
    again.sort();
    sorted.sort();
    prop_assert_eq!(again, sorted);

    // One NUMA node when one has enough free units.
    let numa = |c: &Candidate| {
        w.devices
            .iter()
            .find(|d| d.id == c.device_id)
            .and_then(|d| d.numa_node)
    };
    if must.is_empty() {
        let mut per_numa: BTreeMap<Option<u32>, usize> = BTreeMap::new();
        for c in &free {
            *per_numa.entry(numa(c)).or_default() += 1;
        }
        if per_numa.values().any(|k| *k >= size) {
            let nodes: std::collections::BTreeSet<Option<u32>> = answer.iter().map(numa).collect();
            prop_assert!(nodes.len() <= 1, "answer spans NUMA nodes {:?}", nodes);
        }
    }

    // Whole devices and replicas: the same devices a count claim of `size` would get.
    let family = match w.pools[p].family {
        FamilyConfig::Exclusive => Some(FamilyKind::Exclusive),
        FamilyConfig::Shared { .. } => Some(FamilyKind::Shared),
        _ => None,
    };
    if let Some(family) = family {
        let answer = n.preferred(&pool, &all, &[], size);
        let req = counted(
            "probe",
            vec![CountRequest {
                request: "r".into(),
                count: size as u32,
                family: Some(family),
                selector: DeviceSelector {
                    ids: w.pools[p].select.ids.clone(),
                    ..DeviceSelector::default()
                },
                ..CountRequest::default()
            }],
        );
        if let Ok(out) = n.allocate(&req) {
            let mut got: Vec<String> = out
                .allocation
                .results
                .iter()
                .map(|g| g.device_id.clone())
                .collect();
            let mut picked: Vec<String> = answer.iter().map(|c| c.device_id.clone()).collect();
            got.sort();
            picked.sort();
            prop_assert_eq!(picked, got, "preferred and a count claim disagree");
            n.release("probe");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn preferred_allocation_picks_free_close_units(
        w in world(),
        ops in prop::collection::vec(op(), 0..20),
        layout in 0u8..4,
        p in 0usize..3,
        mask in prop::collection::vec(prop::bool::weighted(0.8), 1..16),
        must_picks in prop::collection::vec(0usize..1000, 0..=2),
        size in 1usize..=4,
    ) {
        preferred_case(w, ops, layout, p, mask, must_picks, size)?;
    }
}
