//! Behaviour of each built-in family and of the node around them.

mod common;

use common::*;
use policies::{
    CountRequest, DeviceSelector, FamilyConfig, FamilyKind, Placement, PublishedKind,
    RefusalReason, Unit,
};

fn ids(outcome: &policies::Outcome) -> Vec<String> {
    outcome
        .allocation
        .results
        .iter()
        .map(|g| g.device_id.clone())
        .collect()
}

#[test]
fn exclusive_keeps_a_claim_on_one_numa_node() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 0)],
    );
    n.allocate(&named("a", &[("gpus", "gpus-g0")])).unwrap();
    // NUMA 0 has one device left, NUMA 1 two: both results go to NUMA 1.
    let out = n.allocate(&counted("b", vec![count("r", 2)])).unwrap();
    assert_eq!(ids(&out), ["g2", "g3"]);
    assert!(out.allocation.results.iter().all(|g| g.unit == Unit::Whole));
    // Only one left anywhere.
    let out = n.allocate(&counted("c", vec![count("r", 1)])).unwrap();
    assert_eq!(ids(&out), ["g1"]);
    let refused = n.allocate(&counted("d", vec![count("r", 1)])).unwrap_err();
    assert!(matches!(refused.reason, RefusalReason::NoCapacity { .. }));
}

#[test]
fn count_requests_stay_near_the_claims_first_device() {
    let devices = vec![
        gpu("g0", "nvidia", 0, "0-3", 0x65, 0),
        gpu("g1", "nvidia", 0, "0-3", 0x17, 1),
        gpu("g2", "nvidia", 0, "0-3", 0x17, 2),
    ];
    let mut n = node(
        devices,
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 0)],
    );
    let first = CountRequest {
        selector: DeviceSelector {
            ids: vec!["g1".to_string()],
            ..DeviceSelector::default()
        },
        ..count("first", 1)
    };
    let out = n
        .allocate(&counted("a", vec![first, count("second", 1)]))
        .unwrap();
    // g0 sorts first, but g2 shares g1's PCI root bus.
    assert_eq!(ids(&out), ["g1", "g2"]);
}

#[test]
fn allocate_is_idempotent_per_uid_and_release_of_unknown_is_empty() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 0)],
    );
    let first = n.allocate(&counted("a", vec![count("r", 2)])).unwrap();
    let again = n.allocate(&counted("a", vec![count("r", 2)])).unwrap();
    assert!(!first.already);
    assert!(again.already);
    assert_eq!(first.allocation, again.allocation);
    assert_eq!(n.snapshot().claims, 1);
    assert!(n.release("nobody").is_empty());
    n.release("a");
    assert_eq!(n.snapshot().claims, 0);
    assert!(n.holder_of("g0").is_empty());
}

#[test]
fn shared_spreads_shares_and_exports_mps_limits() {
    let mut n = node(
        four_gpus()[..2].to_vec(),
        "0-7",
        &[pool("mps", &[], shared(2, 4096, 50), 0)],
    );
    let a = n.allocate(&counted("a", vec![count("r", 1)])).unwrap();
    let b = n.allocate(&counted("b", vec![count("r", 1)])).unwrap();
    // Least used first: the second claim lands on the other device.
    assert_eq!(ids(&a), ["g0"]);
    assert_eq!(ids(&b), ["g1"]);
    assert_eq!(
        a.allocation.results[0].unit,
        Unit::Share { index: 0, count: 1 }
    );
    let edits = n.edits("a").unwrap();
    assert_eq!(
        edits[0].env,
        [
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
                "50".to_string()
            ),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                "0=4096M".to_string()
            ),
        ]
    );
    let paths: Vec<&str> = edits[0]
        .device_nodes
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/nvidia0", "/dev/nvidiactl"]);
    // Two shares in one result take both replicas of a device.
    let c = CountRequest {
        shares: Some(2),
        ..count("r", 1)
    };
    let refused = n.allocate(&counted("c", vec![c.clone()])).unwrap_err();
    assert!(matches!(refused.reason, RefusalReason::NoCapacity { .. }));
    n.release("b");
    let c = n.allocate(&counted("c", vec![c])).unwrap();
    assert_eq!(
        c.allocation.results[0].unit,
        Unit::Share { index: 0, count: 2 }
    );
    assert_eq!(n.holder_of("g1"), ["c"]);
    assert_eq!(n.edits("c").unwrap()[0].env[0].1, "100");
}

#[test]
fn an_mps_pool_mounts_its_daemon_directories_and_names_them_in_the_env() {
    let mps = policies::MpsConfig {
        pipe_directory: "/run/nvidia/mps".into(),
        log_directory: "/var/log/nvidia-mps".into(),
    };
    let family = FamilyConfig::Shared {
        replicas: 2,
        memory_mib_per_share: 4096,
        compute_percent_per_share: 50,
        mps: Some(mps.clone()),
    };
    let mut n = node(
        four_gpus()[..1].to_vec(),
        "0-7",
        &[pool("mps", &[], family, 0)],
    );
    n.allocate(&counted("a", vec![count("r", 1)])).unwrap();
    let edits = n.edits("a").unwrap();
    assert_eq!(
        edits[0].env[2..],
        [
            (
                policies::MPS_PIPE_ENV.to_string(),
                "/run/nvidia/mps".to_string()
            ),
            (
                policies::MPS_LOG_ENV.to_string(),
                "/var/log/nvidia-mps".to_string()
            ),
        ]
    );
    let mounts: Vec<(&str, &str)> = edits[0]
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/run/nvidia/mps", "/run/nvidia/mps"),
            ("/var/log/nvidia-mps", "/var/log/nvidia-mps")
        ]
    );
    // A relative directory is no pool.
    let bad = FamilyConfig::Shared {
        replicas: 2,
        memory_mib_per_share: 0,
        compute_percent_per_share: 0,
        mps: Some(policies::MpsConfig {
            pipe_directory: "run/mps".into(),
            ..mps
        }),
    };
    let refused = policies::Node::new(
        policies::Inventory {
            devices: four_gpus()[..1].to_vec(),
            cpus: cpus("0-7"),
        },
        &[pool("mps", &[], bad, 0)],
        &policies::Registry::with_builtins(),
    )
    .err()
    .expect("refused");
    assert!(
        refused.to_string().contains("mps.pipe_directory"),
        "{refused}"
    );
}

#[test]
fn shared_uses_generic_limit_names_for_other_vendors() {
    let devices = vec![gpu("a0", "amd", 0, "0-3", 0x17, 0)];
    let mut n = node(
        devices,
        "0-7",
        &[pool("share", &[], shared(4, 1024, 25), 0)],
    );
    // A named shareable device takes one share per result, several claims at once.
    n.allocate(&named("x", &[("share", "share-a0")])).unwrap();
    let y = n.allocate(&named("y", &[("share", "share-a0")])).unwrap();
    assert_eq!(
        y.allocation.results[0].unit,
        Unit::Share { index: 1, count: 1 }
    );
    assert_eq!(
        n.edits("y").unwrap()[0].env,
        [
            ("ACCEL_SHARE_COMPUTE_PERCENT".to_string(), "25".to_string()),
            (
                "ACCEL_SHARE_MEMORY_LIMIT_MIB".to_string(),
                "1024".to_string()
            ),
        ]
    );
    assert_eq!(n.holder_of("a0"), ["x", "y"]);
}

#[test]
fn sliced_places_best_fit_and_reports_no_placement() {
    let mut n = node(
        four_gpus()[..1].to_vec(),
        "0-7",
        &[pool("mig", &[], mig(), 0)],
    );
    let slice = |p: &str| CountRequest {
        profile: Some(p.to_string()),
        ..count("r", 1)
    };
    let a = n.allocate(&counted("a", vec![slice("1g.10gb")])).unwrap();
    assert_eq!(a.allocation.results[0].device, "mig-g0-1g-10gb-0");
    let b = n.allocate(&counted("b", vec![slice("4g.40gb")])).unwrap();
    assert_eq!(
        b.allocation.results[0].unit,
        Unit::Slice {
            profile: "4g.40gb".to_string(),
            start: 4,
            size: 4
        }
    );
    // Slots 1-3 are free: 1 and 3 both leave a run of 2; the lower start wins.
    let c = n.allocate(&counted("c", vec![slice("1g.10gb")])).unwrap();
    assert_eq!(c.allocation.results[0].device, "mig-g0-1g-10gb-1");
    // 2 slots free (2,3) at an allowed 2g start: fits; then nothing for 2g.
    n.allocate(&counted("d", vec![slice("2g.20gb")])).unwrap();
    let refused = n
        .allocate(&counted("e", vec![slice("2g.20gb")]))
        .unwrap_err();
    assert!(matches!(refused.reason, RefusalReason::NoCapacity { .. }));
    assert_eq!(
        n.edits("b").unwrap()[0].env[..3],
        [
            ("ACCEL_SLICE_PROFILE".to_string(), "4g.40gb".to_string()),
            ("ACCEL_SLICE_START".to_string(), "4".to_string()),
            ("ACCEL_SLICE_SIZE".to_string(), "4".to_string()),
        ]
    );
}

#[test]
fn sliced_free_slots_without_an_allowed_start_is_no_placement() {
    let mut n = node(
        four_gpus()[..1].to_vec(),
        "0-7",
        &[pool("mig", &[], mig(), 0)],
    );
    n.allocate(&named(
        "a",
        &[("mig", "mig-g0-1g-10gb-1"), ("mig", "mig-g0-1g-10gb-6")],
    ))
    .unwrap();
    let req = CountRequest {
        profile: Some("4g.40gb".to_string()),
        ..count("r", 1)
    };
    let refused = n.allocate(&counted("b", vec![req])).unwrap_err();
    assert_eq!(
        refused.reason,
        RefusalReason::NoPlacement {
            profile: "4g.40gb".to_string()
        }
    );
    // The whole device overlaps the held slices.
    let refused = n.allocate(&named("c", &[("mig", "mig-g0")])).unwrap_err();
    assert_eq!(
        refused.reason,
        RefusalReason::HeldByOther {
            holder: "a".to_string()
        }
    );
}

#[test]
fn published_names_cover_every_family() {
    let devices = four_gpus();
    let n = node(
        devices,
        "0-7",
        &[
            pool("excl", &["g0"], FamilyConfig::Exclusive, 0),
            pool("mps", &["g1"], shared(4, 0, 0), 0),
            pool("mig", &["g2"], mig(), 0),
        ],
    );
    let published = n.published();
    let find = |name: &str| published.iter().find(|p| p.name == name).unwrap();
    assert_eq!(find("excl-g0").kind, PublishedKind::Whole);
    assert_eq!(find("mps-g1").kind, PublishedKind::Shareable);
    assert_eq!(find("mig-g2").kind, PublishedKind::Whole);
    assert_eq!(find("mig-g2-7g-80gb-0").kind, PublishedKind::Slice);
    // 8 + 4 + 2 + 1 slices + the whole device.
    assert_eq!(published.iter().filter(|p| p.pool == "mig").count(), 16);
    // g3 matches no pool: never published, listed as unpooled.
    assert!(published.iter().all(|p| p.device_id != "g3"));
    assert_eq!(n.snapshot().unpooled, ["g3"]);
    assert_eq!(n.pool_family("mig"), Some(FamilyKind::Sliced));
    assert_eq!(n.device_by_node(195, 2).unwrap().id, "g2");
    assert!(n.device_by_node(195, 255).is_none());
}

#[test]
fn local_cpus_move_between_claims_and_the_shared_pool() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 2)],
    );
    // Unpinned, it already runs on every CPU: nothing to set.
    let (adj, _) = n.container_started("idle", &[], &Placement::unpinned());
    assert_eq!((adj.cpus, adj.mems), (None, None));
    let out = n.allocate(&named("a", &[("gpus", "gpus-g2")])).unwrap();
    assert_eq!(out.allocation.cpus, cpus("4-5"));
    assert_eq!(out.updates.len(), 1);
    assert_eq!(out.updates[0].container_id, "idle");
    assert_eq!(out.updates[0].cpus, cpus("0-3,6-7"));
    assert_eq!(n.shared_cpus(), cpus("0-3,6-7"));
    let (adj, updates) = n.container_started("worker", &["a".to_string()], &Placement::unpinned());
    assert!(updates.is_empty());
    assert_eq!(adj.cpus, Some(cpus("4-5")));
    assert_eq!(adj.mems, Some(cpus("1")));
    let back = n.release("a");
    let idle = back.iter().find(|u| u.container_id == "idle").unwrap();
    assert_eq!(idle.cpus, cpus("0-7"));
    assert_eq!(n.shared_cpus(), cpus("0-7"));
    assert!(n.container_removed("worker").is_empty());
}

#[test]
fn shared_claims_without_exclusive_cpus_get_device_local_shared_cpus() {
    let mut n = node(four_gpus(), "0-7", &[pool("mps", &[], shared(4, 0, 10), 0)]);
    n.allocate(&named("a", &[("mps", "mps-g3")])).unwrap();
    let (adj, _) = n.container_started("c", &["a".to_string()], &Placement::unpinned());
    assert_eq!(adj.cpus, Some(cpus("4-7")));
    assert_eq!(adj.mems, Some(cpus("1")));
    assert_eq!(
        adj.env,
        [(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
            "10".to_string()
        )]
    );
}

#[test]
fn restore_rebuilds_and_refuses_conflicting_records() {
    let pools = [
        pool("gpus", &["g0", "g1"], FamilyConfig::Exclusive, 1),
        pool("mig", &[], mig(), 0),
    ];
    let mut n = node(four_gpus(), "0-7", &pools);
    n.allocate(&counted("a", vec![count("r", 2)])).unwrap();
    n.allocate(&named("b", &[("mig", "mig-g2-2g-20gb-2")]))
        .unwrap();
    let records: Vec<_> = n.allocations().cloned().collect();
    let mut fresh = node(four_gpus(), "0-7", &pools);
    fresh.restore(&records).unwrap();
    assert_eq!(fresh.snapshot(), n.snapshot());

    // A record whose slice overlaps another's is refused, naming claim and device.
    let mut bad = records.clone();
    let mut c = bad[1].clone();
    c.claim_uid = "c".to_string();
    c.cpus = Default::default();
    bad.push(c);
    let err = fresh.restore(&bad).unwrap_err().to_string();
    assert!(
        err.contains("claim c") && err.contains("device g2"),
        "{err}"
    );
    // The node keeps what it held.
    assert_eq!(fresh.snapshot(), n.snapshot());

    let mut gone = records.clone();
    gone[0].results[0].device_id = "g9".to_string();
    let err = fresh.restore(&gone).unwrap_err().to_string();
    assert!(
        err.contains("claim a") && err.contains("device g9"),
        "{err}"
    );
}

#[test]
fn adoption_marks_devices_in_use() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[
            pool("gpus", &["g0"], FamilyConfig::Exclusive, 0),
            pool("mps", &["g1"], shared(2, 0, 0), 0),
        ],
    );
    let out = n.adopt("adopted-c1", "g0").unwrap();
    assert!(!out.already);
    assert!(n.adopt("adopted-c1", "g0").unwrap().already);
    let refused = n.allocate(&named("a", &[("gpus", "gpus-g0")])).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "claim a refused: device g0 is held by claim adopted-c1 until that claim is unprepared; \
         pool gpus has no free device now"
    );
    let out = n.adopt("adopted-c1", "g1").unwrap();
    assert_eq!(out.allocation.results.len(), 2);
    assert_eq!(
        out.allocation.results[1].unit,
        Unit::Share { index: 0, count: 1 }
    );
    assert!(n.adopt("adopted-c2", "g3").is_err());
}
