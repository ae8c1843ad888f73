//! The verdict on a pod: what the node would refuse at container creation, refused now with
//! the node's own sentence.
//!
//! The annotations are parsed by the node's parser ([`crate::daemon::annotations`]), so a
//! malformed value or two vendors read exactly as the runtime would report them. The pools'
//! families come from the config the nodes share; the capacity from what the nodes publish
//! ([`super::fleet`]). A refusal about pools or capacity is a [`policies::Refusal`], whose
//! sentence the node's policies write; the claim it names is the one the node would create,
//! `ctr-<container id>`, since the container has no id before it exists.

use std::collections::{BTreeMap, BTreeSet};

use policies::{FamilyKind, PoolConfig, Refusal, RefusalReason};

use super::fleet::{Capacity, Published};
use super::review::{Pod, Verdict};
use crate::daemon::annotations::{self, ContainerAsk};

/// The claim named in a refusal: the node names an annotation claim after the container's id,
/// which does not exist before the container does.
pub const CLAIM: &str = "ctr-<container id>";
/// The request name the node gives an annotation ask.
const REQUEST: &str = "annotation";

/// What the check needs besides the pod.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The annotation prefix (`annotations.prefix` in the config).
    pub prefix: String,
    /// The pools of the config the nodes run with.
    pub pools: Vec<PoolConfig>,
}

/// The verdict on `pod` (in `namespace`, when the pod's own metadata lacks it).
pub fn check(rules: &Rules, namespace: &str, pod: &Pod, capacity: &Capacity) -> Verdict {
    let Some(annotations) = pod.metadata.annotations.as_ref() else {
        return Verdict::allow(Vec::new());
    };
    let asked = annotations::asked_names(&rules.prefix, annotations);
    if asked.is_empty() {
        return Verdict::allow(Vec::new());
    }
    let name = match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(g)) => format!("{g}<generated>"),
        _ => "<unnamed>".to_string(),
    };
    let ns = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(namespace);
    let pod_name = format!("{ns}/{name}");
    let containers: Vec<&str> = pod
        .spec
        .init_containers
        .iter()
        .chain(&pod.spec.containers)
        .map(|c| c.name.as_str())
        .collect();
    let mut warnings = Vec::new();
    let present: BTreeSet<&str> = containers.iter().copied().collect();
    for a in &asked {
        if !present.contains(a.as_str()) {
            warnings.push(format!(
                "annotation {} names no container of pod {pod_name}; nri-accel ignores it",
                annotations::key_for(&rules.prefix, a)
            ));
        }
    }
    let mut capacity_checked = false;
    for c in containers {
        let ask = match annotations::container_ask(&rules.prefix, &pod_name, annotations, c) {
            Ok(Some(ask)) => ask,
            Ok(None) => continue,
            // The node's sentence, exactly: the runtime reports the same string.
            Err(e) => return Verdict::refuse(e.to_string()),
        };
        let refusal = match capacity {
            Capacity::Known(nodes) => {
                capacity_checked = true;
                against_nodes(&ask, nodes)
            }
            Capacity::Unknown(_) => against_config(&ask, &rules.pools),
        };
        if let Some(r) = refusal {
            return Verdict::refuse(format!("container {c} of pod {pod_name}: {r}"));
        }
    }
    if let Capacity::Unknown(why) = capacity
        && !capacity_checked
    {
        warnings.push(format!(
            "nri-accel webhook: the accelerator annotations were checked, but not against the nodes' devices: {why}"
        ));
    }
    Verdict::allow(warnings)
}

fn refusal(reason: RefusalReason) -> Refusal {
    Refusal::new(CLAIM, None, reason)
}

/// Without the nodes' devices: a family no pool of the config has cannot be served anywhere.
fn against_config(ask: &ContainerAsk, pools: &[PoolConfig]) -> Option<Refusal> {
    let family = ask.family.as_ref()?;
    if pools.iter().any(|p| p.family.kind() == *family) {
        return None;
    }
    Some(refusal(RefusalReason::NoPoolOfFamily {
        request: REQUEST.into(),
        family: family.name().to_string(),
    }))
}

/// With the nodes' devices: refused when no node could serve the ask even with every device
/// free, with the refusal the node closest to serving it would give.
fn against_nodes(ask: &ContainerAsk, nodes: &BTreeMap<String, Vec<Published>>) -> Option<Refusal> {
    let mut best: Option<((u8, u32), Refusal)> = None;
    for devices in nodes.values() {
        match on_node(ask, devices) {
            None => return None,
            Some((rank, r)) => {
                if best.as_ref().is_none_or(|(b, _)| rank > *b) {
                    best = Some((rank, r));
                }
            }
        }
    }
    best.map(|(_, r)| r)
}

/// Whether one node could serve the ask with all its devices free, as the node's allocator
/// decides it (`policies::Node`): the pools with a device matching the selector, those of the
/// family asked, and for an exclusive pool its matching devices against the count. Shared and
/// sliced pools are left to the node (their units depend on parameters slices do not carry).
/// A refusal comes with a rank: how close the node came (capacity > family > nothing, then the
/// most devices), so the sentence is the one of the node nearest to serving the ask.
fn on_node(ask: &ContainerAsk, devices: &[Published]) -> Option<((u8, u32), Refusal)> {
    let mut by_pool: BTreeMap<&str, (&str, u32)> = BTreeMap::new();
    for p in devices {
        let entry = by_pool.entry(&p.pool).or_insert((&p.family, 0));
        if ask.selector.matches(&p.device) {
            entry.1 += 1;
        }
    }
    let matching: Vec<(&str, &str, u32)> = by_pool
        .iter()
        .filter(|(_, (_, n))| *n > 0)
        .map(|(pool, (family, n))| (*pool, *family, *n))
        .collect();
    let fitting: Vec<&(&str, &str, u32)> = matching
        .iter()
        .filter(|(_, family, _)| ask.family.as_ref().is_none_or(|f| f.name() == *family))
        .collect();
    if fitting.is_empty() {
        let reason = match (&ask.family, matching.as_slice()) {
            (Some(asked), [(pool, family, _)]) => RefusalReason::WrongFamily {
                pool: pool.to_string(),
                family: family.to_string(),
                asked: asked.name().to_string(),
            },
            (Some(asked), [_, _, ..]) => RefusalReason::NoPoolOfFamily {
                request: REQUEST.into(),
                family: asked.name().to_string(),
            },
            _ => RefusalReason::NoMatchingPool {
                request: REQUEST.into(),
            },
        };
        let rank = if matching.is_empty() { 0 } else { 1 };
        return Some(((rank, 0), refusal(reason)));
    }
    let exclusive = FamilyKind::Exclusive.name();
    if fitting
        .iter()
        .any(|(_, family, n)| *family != exclusive || *n >= ask.count)
    {
        return None;
    }
    let (pool, _, most) = fitting
        .iter()
        .max_by_key(|(_, _, n)| *n)
        .map(|p| **p)
        .unwrap_or(("", "", 0));
    Some((
        (2, most),
        refusal(RefusalReason::TooManyUnits {
            pool: pool.to_string(),
            asked: ask.count,
            most,
        }),
    ))
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
