//! Every refusal, reached through the node the way a caller would hit it, and
//! the promise that docs/refusals.md lists every sentence.

mod common;

use common::*;
use policies::{
    Ask, CountRequest, DeviceSelector, FamilyConfig, FamilyKind, Refusal, RefusalReason,
};

fn refused(n: &mut policies::Node, req: &policies::ClaimRequest) -> Refusal {
    let before = n.snapshot();
    let r = n.allocate(req).unwrap_err();
    assert_eq!(n.snapshot(), before, "a refusal must change nothing");
    assert!(n.allocation(&req.uid).is_none());
    r
}

fn gpus() -> policies::Node {
    node(
        four_gpus(),
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 0)],
    )
}

#[test]
fn unknown_device() {
    let r = refused(&mut gpus(), &named("c1", &[("gpus", "gpus-g9")]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: device gpus-g9 is not known on this node"
    );
}

#[test]
fn held_by_other() {
    let mut n = gpus();
    n.allocate(&named("c1", &[("gpus", "gpus-g0")])).unwrap();
    let r = refused(
        &mut n,
        &named("c2", &[("gpus", "gpus-g1"), ("gpus", "gpus-g0")]),
    );
    assert_eq!(
        r.to_string(),
        "claim c2 refused: device g0 is held by claim c1 until that claim is unprepared; \
         free in pool gpus: g1, g2, g3"
    );
    // The first result, taken before the refusal, was given back (and so is named free).
    assert!(n.holder_of("g1").is_empty());
}

#[test]
fn held_by_other_says_when_the_pool_has_nothing_free() {
    let mut n = gpus();
    for (i, g) in ["gpus-g0", "gpus-g1", "gpus-g2", "gpus-g3"]
        .iter()
        .enumerate()
    {
        n.allocate(&named(&format!("c{i}"), &[("gpus", g)]))
            .unwrap();
    }
    let r = refused(&mut n, &named("late", &[("gpus", "gpus-g2")]));
    assert_eq!(
        r.to_string(),
        "claim late refused: device g2 is held by claim c2 until that claim is unprepared; \
         pool gpus has no free device now"
    );
}

#[test]
fn mixed_vendors() {
    let devices = vec![
        gpu("a0", "amd", 0, "0-3", 0x17, 0),
        gpu("n0", "nvidia", 0, "0-3", 0x18, 0),
    ];
    let mut n = node(
        devices,
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 0)],
    );
    let r = refused(
        &mut n,
        &named("c1", &[("gpus", "gpus-n0"), ("gpus", "gpus-a0")]),
    );
    assert_eq!(
        r.to_string(),
        "claim c1 refused: device a0 would mix vendors amd and nvidia in one claim"
    );
    // A count request follows the claim's first vendor instead of mixing.
    let out = n
        .allocate(&counted("c2", vec![count("a", 1), count("b", 1)]))
        .unwrap_err();
    assert!(
        matches!(out.reason, RefusalReason::NoCapacity { .. }),
        "{out}"
    );
}

#[test]
fn too_many_units() {
    let mut n = gpus();
    let r = refused(&mut n, &counted("c1", vec![count("r", 5)]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: it asks 5 units of pool gpus but the pool's devices have at most 4"
    );
    let mut n = node(four_gpus(), "0-7", &[pool("mps", &[], shared(2, 0, 0), 0)]);
    let req = CountRequest {
        shares: Some(3),
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c2", vec![req]));
    assert_eq!(
        r.reason,
        RefusalReason::TooManyUnits {
            pool: "mps".to_string(),
            asked: 3,
            most: 2
        }
    );
}

#[test]
fn unknown_profile() {
    let mut n = node(four_gpus(), "0-7", &[pool("mig", &[], mig(), 0)]);
    let req = CountRequest {
        profile: Some("9g.90gb".to_string()),
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c1", vec![req]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: profile 9g.90gb is not defined in pool mig"
    );
}

#[test]
fn wrong_family() {
    let mut n = gpus();
    let req = CountRequest {
        family: Some(FamilyKind::Shared),
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c1", vec![req]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: pool gpus is of family exclusive but the request asks for shared"
    );
    let req = CountRequest {
        profile: Some("1g.10gb".to_string()),
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c2", vec![req]));
    assert_eq!(
        r.reason,
        RefusalReason::WrongFamily {
            pool: "gpus".to_string(),
            family: "exclusive".to_string(),
            asked: "sliced".to_string()
        }
    );
}

/// With several matching pools, none of the family asked, the refusal names the family rather
/// than one of the pools (which one would be arbitrary).
#[test]
fn no_pool_of_the_family_asked() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[
            pool("whole", &["g0", "g1"], FamilyConfig::Exclusive, 0),
            pool("shared", &["g2", "g3"], shared(4, 0, 0), 0),
        ],
    );
    let req = CountRequest {
        family: Some(FamilyKind::Sliced),
        ..count("train", 1)
    };
    let r = refused(&mut n, &counted("c1", vec![req]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: no pool of family sliced has devices matching request train"
    );
}

#[test]
fn no_placement() {
    let mut n = node(
        four_gpus()[..1].to_vec(),
        "0-7",
        &[pool("mig", &[], mig(), 0)],
    );
    n.allocate(&named(
        "c0",
        &[("mig", "mig-g0-1g-10gb-3"), ("mig", "mig-g0-1g-10gb-7")],
    ))
    .unwrap();
    let req = CountRequest {
        profile: Some("4g.40gb".to_string()),
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c1", vec![req]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: no placement is left for a slice of profile 4g.40gb on any device"
    );
}

#[test]
fn no_capacity() {
    let mut n = gpus();
    n.allocate(&counted("c0", vec![count("r", 3)])).unwrap();
    let r = refused(&mut n, &counted("c1", vec![count("r", 2)]));
    // The sentence, then what the node has: each matching device's holder, and what is free.
    assert_eq!(
        r.to_string(),
        "claim c1 refused: request r cannot be met by the devices free now: g0 is held by claim \
         c0 (ns/claim-c0); g1 is held by claim c0 (ns/claim-c0); g2 is held by claim c0 \
         (ns/claim-c0); free: g3 (not enough for the request)"
    );
}

#[test]
fn no_pool_and_no_matching_pool() {
    let mut n = gpus();
    let r = refused(&mut n, &named("c1", &[("tpus", "tpus-t0")]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: there is no pool named tpus"
    );
    let req = CountRequest {
        selector: DeviceSelector {
            vendor: Some("intel".to_string()),
            ..DeviceSelector::default()
        },
        ..count("r", 1)
    };
    let r = refused(&mut n, &counted("c2", vec![req]));
    assert_eq!(
        r.to_string(),
        "claim c2 refused: no pool has devices matching request r"
    );
}

#[test]
fn not_enough_cpus() {
    let mut n = node(
        four_gpus(),
        "0-7",
        &[pool("gpus", &[], FamilyConfig::Exclusive, 3)],
    );
    n.allocate(&named("c0", &[("gpus", "gpus-g2")])).unwrap();
    let r = refused(&mut n, &named("c1", &[("gpus", "gpus-g3")]));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: device g3 needs 3 accelerator-local CPUs but only 1 are free"
    );
    assert!(n.holder_of("g3").is_empty());
}

#[test]
fn invalid_requests() {
    let mut n = gpus();
    let r = refused(&mut n, &claim("c1", Ask::Count(vec![])));
    assert_eq!(
        r.to_string(),
        "claim c1 refused: the request is invalid: it asks for nothing"
    );
    let r = refused(&mut n, &counted("c2", vec![count("r", 0)]));
    assert!(matches!(r.reason, RefusalReason::InvalidRequest { .. }));
    let r = refused(&mut n, &named("", &[("gpus", "gpus-g0")]));
    assert!(matches!(r.reason, RefusalReason::InvalidRequest { .. }));
    let r = refused(
        &mut n,
        &named("c3", &[("gpus", "gpus-g0"), ("gpus", "gpus-g0")]),
    );
    assert!(matches!(r.reason, RefusalReason::InvalidRequest { .. }));
}

/// Every refusal sentence, rendered with placeholders, appears verbatim in docs/refusals.md.
#[test]
fn docs_list_every_refusal_sentence() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/refusals.md"))
        .expect("docs/refusals.md");
    let s = |x: &str| x.to_string();
    let reasons = vec![
        (true, RefusalReason::UnknownDevice),
        (
            true,
            RefusalReason::HeldByOther {
                holder: s("<holder>"),
            },
        ),
        (
            true,
            RefusalReason::MixedVendors {
                vendors: vec![s("<vendor>"), s("<other vendor>")],
            },
        ),
        (
            false,
            RefusalReason::TooManyUnits {
                pool: s("<pool>"),
                asked: 111,
                most: 222,
            },
        ),
        (
            false,
            RefusalReason::UnknownProfile {
                profile: s("<profile>"),
                pool: s("<pool>"),
            },
        ),
        (
            false,
            RefusalReason::WrongFamily {
                pool: s("<pool>"),
                family: s("<family>"),
                asked: s("<asked>"),
            },
        ),
        (
            true,
            RefusalReason::NoPlacement {
                profile: s("<profile>"),
            },
        ),
        (
            false,
            RefusalReason::NoPlacement {
                profile: s("<profile>"),
            },
        ),
        (
            false,
            RefusalReason::NoCapacity {
                request: s("<request>"),
                context: None,
            },
        ),
        (false, RefusalReason::NoPool { pool: s("<pool>") }),
        (
            false,
            RefusalReason::NoPoolOfFamily {
                request: s("<request>"),
                family: s("<family>"),
            },
        ),
        (
            false,
            RefusalReason::NoMatchingPool {
                request: s("<request>"),
            },
        ),
        (
            true,
            RefusalReason::NotEnoughCpus {
                asked: 111,
                free: 222,
            },
        ),
        (false, RefusalReason::InvalidRequest { why: s("<why>") }),
        (true, RefusalReason::Unavailable { why: s("<why>") }),
    ];
    for (with_device, reason) in reasons {
        let r = Refusal::new("<claim>", with_device.then_some("<device>"), reason);
        let text = r
            .to_string()
            .replace("111", "<asked>")
            .replace("222", "<most>");
        let text = if matches!(r.reason, RefusalReason::NotEnoughCpus { .. }) {
            text.replace("<most>", "<free>")
        } else {
            text
        };
        assert!(docs.contains(&text), "docs/refusals.md lacks: {text}");
    }
}

fn exact(uid: &str, items: &[(&str, &str, policies::Unit)]) -> policies::ClaimRequest {
    claim(
        uid,
        Ask::Units(
            items
                .iter()
                .enumerate()
                .map(|(i, (pool, device, unit))| policies::UnitResult {
                    request: format!("r{i}"),
                    pool: pool.to_string(),
                    device_id: device.to_string(),
                    unit: unit.clone(),
                })
                .collect(),
        ),
    )
}

#[test]
fn exact_units_refusals_name_the_unit_and_the_holder() {
    use policies::Unit;
    let share = |index| Unit::Share { index, count: 1 };
    let mut n = node(
        four_gpus(),
        "0-7",
        &[
            pool("whole", &["g0", "g1"], FamilyConfig::Exclusive, 0),
            pool("shared", &["g2", "g3"], shared(4, 0, 0), 0),
        ],
    );
    // Exactly replica 2 of g2, again idempotently.
    let first = n
        .allocate(&exact("dp1", &[("shared", "g2", share(2))]))
        .unwrap();
    assert_eq!(first.allocation.results[0].unit, share(2));
    assert!(
        n.allocate(&exact("dp1", &[("shared", "g2", share(2))]))
            .unwrap()
            .already
    );
    // The same replica for another claim: refused naming the holder.
    let r = refused(&mut n, &exact("dp2", &[("shared", "g2", share(2))]));
    assert_eq!(
        r.to_string(),
        "claim dp2 refused: device g2 is held by claim dp1 until that claim is unprepared; \
         free in pool shared: g2 (3 of 4 units), g3 (4 of 4 units)"
    );
    // Another replica of the same device is free.
    n.allocate(&exact("dp2", &[("shared", "g2", share(3))]))
        .unwrap();
    // A replica the device does not have, a unit the family has no such thing as, a device of
    // another pool, a unit named twice, and nothing at all.
    let r = refused(&mut n, &exact("dp3", &[("shared", "g2", share(9))]));
    assert!(r.to_string().contains("do not exist"), "{r}");
    let r = refused(&mut n, &exact("dp3", &[("whole", "g0", share(0))]));
    assert_eq!(
        r.to_string(),
        "claim dp3 refused: the request is invalid: an exclusive device is only handed out whole, not as replica 0"
    );
    let r = refused(&mut n, &exact("dp3", &[("whole", "g2", Unit::Whole)]));
    assert_eq!(
        r.to_string(),
        "claim dp3 refused: device g2 is not known on this node"
    );
    let r = refused(
        &mut n,
        &exact(
            "dp3",
            &[("whole", "g0", Unit::Whole), ("whole", "g0", Unit::Whole)],
        ),
    );
    assert!(r.to_string().contains("named twice"), "{r}");
    let r = refused(&mut n, &claim("dp3", Ask::Units(vec![])));
    assert!(r.to_string().contains("names no device"), "{r}");
    // A whole device held through a count claim is refused to exact units too.
    n.allocate(&counted(
        "c1",
        vec![CountRequest {
            family: Some(FamilyKind::Exclusive),
            selector: DeviceSelector {
                ids: vec!["g0".into()],
                ..DeviceSelector::default()
            },
            ..count("gpu", 1)
        }],
    ))
    .unwrap();
    let r = refused(&mut n, &exact("dp3", &[("whole", "g0", Unit::Whole)]));
    assert!(r.to_string().contains("held by claim c1"), "{r}");
}
