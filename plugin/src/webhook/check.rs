//! The verdict on a pod: what the node would refuse at container creation, refused now with
//! the node's own sentence.
//!
//! The annotations are parsed by the node's parser ([`crate::daemon::annotations`]), so a
//! malformed value or two vendors read exactly as the runtime would report them. The pools'
//! families come from the config the nodes share; the capacity from what the nodes publish
//! ([`super::fleet`]): each node's published devices are put in a `policies::Node` with the
//! config's pools, and its allocator answers the ask as it would on the node with every device
//! free. A refusal is that [`policies::Refusal`]; the claim it names is the one the node would
//! create, `ctr-<container id>`, since the container has no id before it exists.

use std::collections::{BTreeMap, BTreeSet};

use policies::{DeviceSelector, Inventory, Node, PoolConfig, Refusal, RefusalReason, Registry};

use super::fleet::{Capacity, Published};
use super::review::{Pod, Verdict};
use crate::daemon::annotations::{self, ContainerAsk};

/// The claim named in a refusal: the node names an annotation claim after the container's id,
/// which does not exist before the container does.
pub const CLAIM: &str = "ctr-<container id>";
/// The request name the node gives an annotation ask.
const REQUEST: &str = "annotation";

/// What the check needs besides the pod.
#[derive(Clone)]
pub struct Rules {
    /// The annotation prefix (`annotations.prefix` in the config).
    pub prefix: String,
    /// The pools of the config the nodes run with.
    pub pools: Vec<PoolConfig>,
    /// The policies the pools may name (the nodes' build's; the stock one's built-ins).
    pub registry: Registry,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("prefix", &self.prefix)
            .field("pools", &self.pools)
            .finish_non_exhaustive()
    }
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
    let mut asks = Vec::new();
    for c in containers {
        let ask = match annotations::container_ask(&rules.prefix, &pod_name, annotations, c) {
            Ok(Some(ask)) => ask,
            Ok(None) => continue,
            // The node's sentence, exactly: the runtime reports the same string.
            Err(e) => return Verdict::refuse(e.to_string()),
        };
        let refusal = match capacity {
            Capacity::Known(nodes) => against_nodes(&ask, nodes, rules),
            Capacity::Unknown(_) => against_config(&ask, &rules.pools),
        };
        if let Some(r) = refusal {
            return Verdict::refuse(format!("container {c} of pod {pod_name}: {r}"));
        }
        asks.push((c, ask));
    }
    if let Capacity::Known(nodes) = capacity
        && asks.len() > 1
        && let Some((at, r)) = pod_against_nodes(&asks, nodes, rules)
    {
        let before: Vec<&str> = asks[..at].iter().map(|(c, _)| *c).collect();
        return Verdict::refuse(format!(
            "container {} of pod {pod_name}: {r}; no node has enough for it beside the pod's containers before it ({}), which hold their devices until the pod is deleted",
            asks[at].0,
            before.join(", ")
        ));
    }
    if let Capacity::Unknown(why) = capacity {
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
/// free, with the refusal of the node that came nearest.
fn against_nodes(
    ask: &ContainerAsk,
    nodes: &BTreeMap<String, Vec<Published>>,
    rules: &Rules,
) -> Option<Refusal> {
    let mut best: Option<((u8, u32), Refusal)> = None;
    for devices in nodes.values() {
        let r = on_node(ask, devices, rules)?;
        let rank = rank(&r.reason);
        if best.as_ref().is_none_or(|(b, _)| rank > *b) {
            best = Some((rank, r));
        }
    }
    best.map(|(_, r)| r)
}

/// With the nodes' devices, the pod as a whole: its containers' asks allocated one after the
/// other on one node, as the node would grant them at creation (init containers first; a
/// container's claim lives until the container is removed, which for a pod's containers is when
/// the pod goes). `None` when some node serves them all, or cannot be modelled; otherwise the
/// index of the first container refused on the node that served the most, and its refusal.
fn pod_against_nodes(
    asks: &[(&str, ContainerAsk)],
    nodes: &BTreeMap<String, Vec<Published>>,
    rules: &Rules,
) -> Option<(usize, Refusal)> {
    let mut best: Option<(usize, Refusal)> = None;
    for devices in nodes.values() {
        let mut node = model(devices, rules)?;
        // Each container's claim under a name saying whose it is: a refusal's context names
        // the holders ("accel0 is held by claim ctr-<container id of prep>").
        let refused = asks.iter().enumerate().find_map(|(i, (c, ask))| {
            node.allocate(&ask.to_claim(format!("ctr-<container id of {c}>"), "", ""))
                .err()
                .map(|r| (i, Refusal::new(CLAIM, None, r.reason)))
        });
        let (at, r) = refused?;
        if best.as_ref().is_none_or(|(b, _)| at > *b) {
            best = Some((at, r));
        }
    }
    best
}

/// How near a refusal came to a grant, to pick the most telling node's: a request that fits
/// a pool but asks too much (the more the pool has, the nearer) > a pool of another family >
/// nothing matching.
fn rank(reason: &RefusalReason) -> (u8, u32) {
    match reason {
        RefusalReason::NoMatchingPool { .. } | RefusalReason::UnknownDevice => (0, 0),
        RefusalReason::WrongFamily { .. } | RefusalReason::NoPoolOfFamily { .. } => (1, 0),
        RefusalReason::TooManyUnits { most, .. } => (2, *most),
        _ => (2, 0),
    }
}

/// What one node answers the ask with all its devices free, decided by the node's own
/// allocator ([`model`]). `None`: it serves the ask, or it cannot be modelled, and is given the
/// benefit of the doubt. The pools' accelerator-local CPUs are left out: what CPUs are free is
/// the node's business at creation time.
fn on_node(ask: &ContainerAsk, devices: &[Published], rules: &Rules) -> Option<Refusal> {
    let mut node = model(devices, rules)?;
    node.allocate(&ask.to_claim(CLAIM.to_string(), "", ""))
        .err()
}

/// A node as its allocator sees it with every device free: the devices it publishes, in the
/// pools it publishes them in, with the config's family parameters. `None` when it cannot be
/// modelled (a pool the config does not have, a policy this build lacks).
fn model(devices: &[Published], rules: &Rules) -> Option<Node> {
    let mut members: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in devices {
        members
            .entry(p.pool.as_str())
            .or_default()
            .push(p.device.id.clone());
    }
    let mut pools = Vec::new();
    for config in &rules.pools {
        if let Some(ids) = members.remove(config.name.as_str()) {
            pools.push(PoolConfig {
                name: config.name.clone(),
                select: DeviceSelector {
                    ids,
                    ..DeviceSelector::default()
                },
                family: config.family.clone(),
                cpus_per_device: 0,
                unhealthy: Default::default(),
                vendor_cdi: Default::default(),
            });
        }
    }
    if !members.is_empty() {
        return None;
    }
    let inventory = Inventory {
        devices: devices.iter().map(|p| p.device.clone()).collect(),
        cpus: Default::default(),
    };
    Node::new(inventory, &pools, &rules.registry).ok()
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
