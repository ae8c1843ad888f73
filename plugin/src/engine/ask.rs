//! What a claim asked for, and the checks of an ask before anything is allocated: a prepared
//! claim asked again for something else, results for another driver, a share id on a device
//! that is not shared.
//!
//! A DRA allocation never changes under one claim UID, so a Prepare of a prepared UID is an
//! idempotent repeat only when it asks for the same thing: the same results (request, pool,
//! device, in order), the same units (a device plugin's Allocate) or the same count requests.
//! Anything else is a caller's bug or a claim object recreated under an old UID, and is refused
//! naming both asks. The ask is kept in the claim's record so the comparison holds across
//! restarts: a count ask whole, a named or units ask by its kind only, its devices being those
//! the allocation lists. A record written before asks were kept compares by the results of its
//! allocation too (count asks then cannot be compared and are answered as repeats).

use policies::{Allocation, Ask, FamilyKind, Node};

use super::EngineError;

/// One DRA allocation result as a caller hands it, before it becomes a policy request.
#[derive(Debug, Clone, Copy)]
pub struct ResultRef<'a> {
    /// The request it answers.
    pub request: &'a str,
    /// The pool.
    pub pool: &'a str,
    /// The published device.
    pub device: &'a str,
    /// The share id, when given.
    pub share_id: Option<&'a str>,
}

/// Whether `asked` is what the prepared claim asked for (`recorded`, or the results of its
/// allocation when the record keeps no ask).
pub fn same_ask(recorded: Option<&Ask>, allocation: &Allocation, asked: &Ask) -> bool {
    match (recorded, asked) {
        // The kind only (see `to_keep`): the list is the allocation's results.
        (Some(Ask::Named(r)), Ask::Named(_)) if r.is_empty() => same_ask(None, allocation, asked),
        (Some(Ask::Units(r)), Ask::Units(_)) if r.is_empty() => same_ask(None, allocation, asked),
        (Some(r), a) => r == a,
        (None, Ask::Named(named)) => {
            named.len() == allocation.results.len()
                && named.iter().zip(&allocation.results).all(|(n, g)| {
                    n.request == g.request && n.pool == g.pool && n.device == g.device
                })
        }
        (None, Ask::Units(units)) => {
            units.len() == allocation.results.len()
                && units.iter().zip(&allocation.results).all(|(u, g)| {
                    u.request == g.request
                        && u.pool == g.pool
                        && u.device_id == g.device_id
                        && u.unit == g.unit
                })
        }
        (None, Ask::Count(_)) => true,
    }
}

/// The ask a claim's record keeps. A named or units ask lists exactly the results the
/// allocation holds, so only its kind is kept (the ask with an empty list, which no Prepare
/// sends: both are refused empty) and [`same_ask`] compares the allocation's results: 10,000 DRA
/// claims need not keep a second copy of their device names. A count ask is kept whole.
pub fn to_keep(ask: Option<Ask>, allocation: &Allocation) -> Option<Ask> {
    ask.map(|a| match a {
        Ask::Named(_) if same_ask(None, allocation, &a) => Ask::Named(Vec::new()),
        Ask::Units(_) if same_ask(None, allocation, &a) => Ask::Units(Vec::new()),
        other => other,
    })
}

/// A short description of an ask for messages: `devices gpus-gpu0 (pool gpus)` or
/// `1 exclusive unit in request gpu`.
pub fn describe(ask: &Ask) -> String {
    match ask {
        Ask::Named(results) => {
            let parts: Vec<String> = results
                .iter()
                .map(|r| format!("{} (pool {}, request {})", r.device, r.pool, r.request))
                .collect();
            format!("the devices {}", parts.join(", "))
        }
        Ask::Count(requests) => {
            let parts: Vec<String> = requests
                .iter()
                .map(|r| {
                    let family = r.family.as_ref().map_or("any", |f| f.name());
                    let mut s = format!(
                        "{} {family} unit{} in request {}",
                        r.count,
                        if r.count == 1 { "" } else { "s" },
                        r.request
                    );
                    if let Some(p) = &r.profile {
                        s.push_str(&format!(" (profile {p})"));
                    }
                    if let Some(n) = r.shares {
                        s.push_str(&format!(" ({n} shares each)"));
                    }
                    s.push_str(&describe_selector(&r.selector));
                    s
                })
                .collect();
            parts.join(", ")
        }
        Ask::Units(units) => {
            let parts: Vec<String> = units
                .iter()
                .map(|u| format!("{} {} (pool {})", u.device_id, u.unit, u.pool))
                .collect();
            format!("the units {}", parts.join(", "))
        }
    }
}

/// A count request's selector for messages: ` on any device`, or ` on devices with vendor
/// nvidia, model H100, ids gpu0 gpu1`, so two asks that differ only there read differently.
fn describe_selector(sel: &policies::DeviceSelector) -> String {
    let mut parts = Vec::new();
    if let Some(v) = &sel.vendor {
        parts.push(format!("vendor {v}"));
    }
    if let Some(m) = &sel.model {
        parts.push(format!("model {m}"));
    }
    if let Some(p) = &sel.pci_id {
        parts.push(format!("PCI id {p}"));
    }
    if !sel.ids.is_empty() {
        parts.push(format!("ids {}", sel.ids.join(" ")));
    }
    if parts.is_empty() {
        " on any device".to_owned()
    } else {
        format!(" on devices with {}", parts.join(", "))
    }
}

/// What a prepared claim holds, for messages: the ask its record keeps when that is a count
/// ask (with its selector) and the devices it was granted.
pub fn describe_holding(recorded: Option<&Ask>, allocation: &Allocation) -> String {
    match recorded {
        Some(ask @ Ask::Count(_)) => {
            format!("{} (granted {})", describe(ask), describe_held(allocation))
        }
        _ => describe_held(allocation),
    }
}

/// What a prepared claim holds, for messages: `gpus-gpu0 (pool gpus)`.
pub fn describe_held(allocation: &Allocation) -> String {
    let parts: Vec<String> = allocation
        .results
        .iter()
        .map(|g| format!("{} (pool {})", g.device, g.pool))
        .collect();
    parts.join(", ")
}

/// Refuses share ids on devices whose pool is not shared. Nothing is allocated or written.
/// The driver a result names is not checked: any DRA driver may delegate its devices to
/// nri-accel (docs/claims-api.md), which arbitrates by pool and device.
pub fn check_results(node: &Node, uid: &str, results: &[ResultRef<'_>]) -> Result<(), EngineError> {
    for r in results {
        if let Some(share) = r.share_id
            && node.pool_family(r.pool) != Some(FamilyKind::Shared)
        {
            return Err(EngineError::ShareIdNotShared {
                claim: uid.to_string(),
                device: r.device.to_string(),
                pool: r.pool.to_string(),
                share_id: share.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::{CountRequest, Grant, NamedResult, Unit};

    fn named(device: &str) -> Ask {
        Ask::Named(vec![NamedResult {
            request: "gpu".into(),
            pool: "gpus".into(),
            device: device.into(),
        }])
    }

    fn count(n: u32) -> Ask {
        Ask::Count(vec![CountRequest {
            request: "gpu".into(),
            count: n,
            ..Default::default()
        }])
    }

    fn allocation(device: &str) -> Allocation {
        Allocation {
            claim_uid: "c".into(),
            namespace: String::new(),
            name: String::new(),
            results: vec![Grant {
                request: "gpu".into(),
                pool: "gpus".into(),
                device: device.into(),
                device_id: "gpu0".into(),
                unit: Unit::Whole,
            }],
            cpus: Default::default(),
        }
    }

    #[test]
    fn same_only_when_equal_or_derivable() {
        let a = allocation("gpus-gpu0");
        assert!(same_ask(Some(&named("gpus-gpu0")), &a, &named("gpus-gpu0")));
        assert!(!same_ask(
            Some(&named("gpus-gpu0")),
            &a,
            &named("gpus-gpu1")
        ));
        assert!(!same_ask(Some(&named("gpus-gpu0")), &a, &count(1)));
        assert!(!same_ask(Some(&count(1)), &a, &count(2)));
        // A record without an ask compares named asks with its results.
        assert!(same_ask(None, &a, &named("gpus-gpu0")));
        assert!(!same_ask(None, &a, &named("gpus-gpu1")));
        assert!(same_ask(None, &a, &count(3)));
        // Only what the allocation cannot answer for is kept.
        let kept = to_keep(Some(named("gpus-gpu0")), &a);
        assert_eq!(kept, Some(Ask::Named(Vec::new())));
        assert!(same_ask(kept.as_ref(), &a, &named("gpus-gpu0")));
        assert!(!same_ask(kept.as_ref(), &a, &named("gpus-gpu1")));
        assert!(
            !same_ask(kept.as_ref(), &a, &count(1)),
            "the kind tells a count ask apart"
        );
        assert_eq!(
            to_keep(Some(named("gpus-gpu1")), &a),
            Some(named("gpus-gpu1"))
        );
        assert_eq!(to_keep(Some(count(1)), &a), Some(count(1)));
        assert_eq!(to_keep(None, &a), None);
        assert!(describe(&count(2)).contains("2 any units in request gpu"));
        assert!(describe(&named("gpus-gpu1")).contains("gpus-gpu1 (pool gpus"));
    }

    #[test]
    fn asks_that_differ_only_in_their_selector_read_differently() {
        let with = |ids: &[&str]| {
            Ask::Count(vec![CountRequest {
                request: "gpu".into(),
                count: 1,
                selector: policies::DeviceSelector {
                    vendor: Some("nvidia".into()),
                    ids: ids.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                },
                ..Default::default()
            }])
        };
        let held = with(&["gpu3"]);
        let asked = with(&["gpu2"]);
        let holds = describe_holding(Some(&held), &allocation("gpus-gpu3"));
        let asks = describe(&asked);
        assert_ne!(holds, asks);
        assert!(
            holds.contains("on devices with vendor nvidia, ids gpu3")
                && holds.contains("granted gpus-gpu3 (pool gpus)"),
            "{holds}"
        );
        assert!(asks.contains("ids gpu2"), "{asks}");
        assert!(describe(&count(1)).ends_with("on any device"));
        // A named ask's record: the devices granted.
        assert_eq!(
            describe_holding(Some(&Ask::Named(Vec::new())), &allocation("gpus-gpu0")),
            "gpus-gpu0 (pool gpus)"
        );
    }
}
