//! allocate + release on a 64-device node holding 1,000 live claims.
//!
//! 16 exclusive devices (1 accelerator-local CPU each), 24 shared devices of
//! 40 replicas and 24 MIG-like sliced devices over two NUMA nodes; 1,000
//! claims are allocated first, then each measured operation allocates one new
//! claim (a rotating mix: count exclusive, count shared, count 1g slice, named
//! share) and releases it. Every operation is timed on its own and the
//! percentiles are computed from the sorted durations (criterion reports
//! means, the target is a p99).
//!
//! Run: `cargo bench -p nri-accel-policies --bench allocate` (`-- 200000` for more ops).

use std::hint::black_box;
use std::time::{Duration, Instant};

use policies::{
    Ask, ClaimRequest, CountRequest, CpuSet, Device, DeviceSelector, FamilyConfig, FamilyKind,
    Inventory, NamedResult, Node, Placement, PoolConfig, ProfileConfig, Registry,
};

fn device(i: u32) -> Device {
    let numa = i / 32;
    Device {
        id: format!("0000:{:02x}:00.0", 0x10 + i),
        vendor: "nvidia".to_string(),
        model: "bench".to_string(),
        pci_address: Some(format!("0000:{:02x}:00.0", 0x10 + i)),
        pci_id: None,
        numa_node: Some(numa),
        local_cpus: format!("{}-{}", numa * 32, numa * 32 + 31)
            .parse()
            .unwrap_or_default(),
        memory_mib: 81920,
        compute_units: 132,
        driver: None,
        nodes: Vec::new(),
        control_nodes: Vec::new(),
        uuid: None,
    }
}

fn pools(devices: &[Device]) -> Vec<PoolConfig> {
    let ids = |range: std::ops::Range<usize>| DeviceSelector {
        ids: devices[range].iter().map(|d| d.id.clone()).collect(),
        ..DeviceSelector::default()
    };
    let profile = |name: &str, size: u32, starts: Vec<u32>| ProfileConfig {
        name: name.to_string(),
        size,
        memory_mib: 10240 * u64::from(size),
        compute_units: 14 * size,
        starts,
    };
    // Interleave families over both NUMA nodes: devices 0-7 and 32-39 exclusive, ...
    let pick = |parts: &[std::ops::Range<usize>]| DeviceSelector {
        ids: parts.iter().flat_map(|r| ids(r.clone()).ids).collect(),
        ..DeviceSelector::default()
    };
    vec![
        PoolConfig {
            name: "excl".to_string(),
            select: pick(&[0..8, 32..40]),
            family: FamilyConfig::Exclusive,
            cpus_per_device: 1,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        },
        PoolConfig {
            name: "mps".to_string(),
            select: pick(&[8..20, 40..52]),
            family: FamilyConfig::Shared {
                replicas: 40,
                memory_mib_per_share: 2048,
                compute_percent_per_share: 10,
            },
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        },
        PoolConfig {
            name: "mig".to_string(),
            select: pick(&[20..32, 52..64]),
            family: FamilyConfig::Sliced {
                slots: 8,
                profiles: vec![
                    profile("1g.10gb", 1, (0..8).collect()),
                    profile("2g.20gb", 2, vec![0, 2, 4, 6]),
                    profile("4g.40gb", 4, vec![0, 4]),
                    profile("7g.80gb", 7, vec![0]),
                ],
            },
            cpus_per_device: 0,
            unhealthy: Default::default(),
            vendor_cdi: Default::default(),
        },
    ]
}

fn count(uid: String, family: FamilyKind, profile: Option<&str>) -> ClaimRequest {
    ClaimRequest {
        uid,
        namespace: "bench".to_string(),
        name: "c".to_string(),
        ask: Ask::Count(vec![CountRequest {
            request: "r".to_string(),
            count: 1,
            family: Some(family),
            profile: profile.map(str::to_string),
            ..CountRequest::default()
        }]),
    }
}

fn request(i: u64, uid: String) -> ClaimRequest {
    match i % 4 {
        0 => count(uid, FamilyKind::Exclusive, None),
        1 => count(uid, FamilyKind::Shared, None),
        2 => count(uid, FamilyKind::Sliced, Some("1g.10gb")),
        _ => ClaimRequest {
            uid,
            namespace: "bench".to_string(),
            name: "c".to_string(),
            ask: Ask::Named(vec![NamedResult {
                request: "r".to_string(),
                pool: "mps".to_string(),
                device: format!("mps-0000-{:02x}-00-0", 0x10 + 8 + (i / 4) % 12),
            }]),
        },
    }
}

fn main() {
    let ops: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50_000);
    let devices: Vec<Device> = (0..64).map(device).collect();
    let pools = pools(&devices);
    let inventory = Inventory {
        devices,
        cpus: "0-63".parse::<CpuSet>().unwrap_or_default(),
    };
    let mut node = Node::new(inventory, &pools, &Registry::with_builtins()).expect("bench node");
    // 1,000 live claims: 14 exclusive, 800 shares, 186 slices.
    let mut live = 0;
    for i in 0..14 {
        node.allocate(&count(format!("live-x{i}"), FamilyKind::Exclusive, None))
            .expect("exclusive");
        live += 1;
    }
    for i in 0..800 {
        node.allocate(&count(format!("live-s{i}"), FamilyKind::Shared, None))
            .expect("share");
        live += 1;
    }
    for i in 0..186 {
        node.allocate(&count(
            format!("live-m{i}"),
            FamilyKind::Sliced,
            Some("1g.10gb"),
        ))
        .expect("slice");
        live += 1;
    }
    assert_eq!(node.allocations().count(), live);
    report(
        &format!("{live} live claims, no containers, all kinds"),
        measure(&mut node, ops, &[0, 1, 2, 3]),
    );
    // One container per live claim, plus 50 with no claim: every container
    // whose cpuset follows the shared CPU pool gets an update when a claim
    // takes or gives back accelerator-local CPUs (the exclusive kind here).
    let uids: Vec<String> = node.allocations().map(|a| a.claim_uid.clone()).collect();
    for (i, uid) in uids.iter().enumerate() {
        node.container_started(
            &format!("ctr-{i}"),
            std::slice::from_ref(uid),
            &Placement::unpinned(),
        );
    }
    for i in 0..50 {
        node.container_started(&format!("idle-{i}"), &[], &Placement::unpinned());
    }
    report(
        &format!("{live} live claims, 1,050 containers, kinds that move no CPU"),
        measure(&mut node, ops, &[1, 2, 3]),
    );
    report(
        &format!(
            "{live} live claims, 1,050 containers, exclusive + 1 local CPU (1,036 updates each way)"
        ),
        measure(&mut node, ops / 10, &[0]),
    );
}

fn measure(node: &mut Node, ops: usize, kinds: &[u64]) -> Vec<Duration> {
    let mut durations: Vec<Duration> = Vec::with_capacity(ops);
    for i in 0..ops as u64 {
        let kind = kinds[(i % kinds.len() as u64) as usize] + 4 * (i / kinds.len() as u64);
        let req = request(kind, format!("op-{i}"));
        let start = Instant::now();
        let out = node.allocate(black_box(&req));
        let updates = node.release(&req.uid);
        let took = start.elapsed();
        assert!(out.is_ok(), "{:?}", out.err().map(|r| r.to_string()));
        black_box(updates);
        durations.push(took);
    }
    durations.sort_unstable();
    durations
}

fn report(what: &str, durations: Vec<Duration>) {
    let pct = |p: f64| durations[((durations.len() as f64 * p) as usize).min(durations.len() - 1)];
    let mean = durations.iter().sum::<Duration>() / durations.len() as u32;
    println!(
        "allocate+release, 64 devices, {what}, {} ops: mean {:.2?} p50 {:.2?} p90 {:.2?} p99 {:.2?} p99.9 {:.2?} max {:.2?}",
        durations.len(),
        mean,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(0.999),
        durations[durations.len() - 1]
    );
}
