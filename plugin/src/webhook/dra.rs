//! The verdict on DRA claims (issue 36): what no node could ever allocate, refused at create.
//!
//! A pod's claims (and a KubeVirt VM's, whose launcher pod carries them) are allocated on one
//! node. For each node the check asks whether every request of every claim could be given devices
//! there at once, with every device free: the requests' DeviceClass and own CEL selectors are
//! evaluated on the devices the node publishes ([`super::cel`]), and requests for devices that
//! only one claim may hold (whole devices) are matched to distinct devices (a bipartite
//! matching, so the answer is exact, not a greedy guess). When no node could, the ask is refused
//! with a sentence naming the claim, the request, the class and the most a node has.
//!
//! The check only ever refuses what the scheduler could never place: a request whose class is
//! not nri-accel's, or whose selectors use CEL the webhook does not read, is left to the
//! scheduler; `firstAvailable` requests and `All` mode are checked alone (some device somewhere),
//! never jointly; shared devices and partitions are never counted as used up.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimSpec, ResourceSlice};

use super::cel::{self, AttrValue, CelDevice, CelError};

/// A device of a ResourceSlice as requests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// Its name in the slice.
    pub name: String,
    /// Driver and attributes, for the selectors.
    pub cel: CelDevice,
    /// Whether one claim holds it alone (not shared, not a partition drawing on counters).
    pub exclusive: bool,
}

/// What the webhook knows for DRA asks: the devices by node and the DeviceClasses' selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraView {
    /// nri-accel's DRA driver name.
    pub driver: String,
    /// Node -> the devices its slices publish.
    pub nodes: BTreeMap<String, Vec<SliceDevice>>,
    /// DeviceClass name -> its CEL selectors.
    pub classes: BTreeMap<String, Vec<String>>,
}

impl DraView {
    /// The view of `slices` (all of `driver`) and `classes`.
    pub fn new(driver: &str, slices: &[ResourceSlice], classes: &[DeviceClass]) -> DraView {
        let mut nodes: BTreeMap<String, Vec<SliceDevice>> = BTreeMap::new();
        for slice in slices {
            let Some(node) = slice.spec.node_name.clone().filter(|n| !n.is_empty()) else {
                continue;
            };
            for d in slice.spec.devices.iter().flatten() {
                let mut attributes: BTreeMap<String, BTreeMap<String, AttrValue>> = BTreeMap::new();
                for (key, a) in d.attributes.iter().flatten() {
                    let (domain, name) = key
                        .split_once('/')
                        .unwrap_or((slice.spec.driver.as_str(), key.as_str()));
                    let value = match (&a.string, a.int, a.bool, &a.version) {
                        (Some(s), ..) => AttrValue::Str(s.clone()),
                        (_, Some(i), ..) => AttrValue::Int(i),
                        (_, _, Some(b), _) => AttrValue::Bool(b),
                        (.., Some(v)) => AttrValue::Version(v.clone()),
                        _ => continue,
                    };
                    attributes
                        .entry(domain.to_string())
                        .or_default()
                        .insert(name.to_string(), value);
                }
                nodes.entry(node.clone()).or_default().push(SliceDevice {
                    name: d.name.clone(),
                    cel: CelDevice {
                        driver: slice.spec.driver.clone(),
                        attributes,
                    },
                    exclusive: !d.allow_multiple_allocations.unwrap_or(false)
                        && d.consumes_counters.as_ref().is_none_or(Vec::is_empty),
                });
            }
        }
        let classes = classes
            .iter()
            .filter_map(|c| {
                let name = c.metadata.name.clone()?;
                let selectors = c
                    .spec
                    .selectors
                    .iter()
                    .flatten()
                    .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
                    .collect();
                Some((name, selectors))
            })
            .collect();
        DraView {
            driver: driver.to_string(),
            nodes,
            classes,
        }
    }
}

/// One request of a claim as the check reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The request's name.
    pub name: String,
    /// Its alternatives: one for `exactly`, the sub-requests of `firstAvailable` in order.
    pub alternatives: Vec<Alternative>,
}

/// A device ask: a class, a count (none: `All`) and the request's own selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    /// The DeviceClass.
    pub class: String,
    /// Devices asked (`ExactCount`); `None` for `All`.
    pub count: Option<u32>,
    /// The request's CEL selectors.
    pub selectors: Vec<String>,
}

/// A claim of the pod or VM: how to name it in a sentence and its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAsk {
    /// `claim ns/name`, or `claim template ns/name (pod claim gpu)`.
    pub label: String,
    /// Its requests (those a VM names, for a VM; all, for a pod).
    pub requests: Vec<Request>,
}

/// The requests of a claim's spec.
pub fn requests_of(spec: &ResourceClaimSpec) -> Vec<Request> {
    let count = |mode: &Option<String>, count: Option<i64>| match mode.as_deref() {
        Some("All") => None,
        _ => Some(u32::try_from(count.unwrap_or(1)).unwrap_or(u32::MAX)),
    };
    let selectors = |s: &Option<Vec<k8s_openapi::api::resource::v1::DeviceSelector>>| {
        s.iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect::<Vec<_>>()
    };
    spec.devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
        .map(|r| {
            let alternatives = match (&r.exactly, &r.first_available) {
                (Some(e), _) => vec![Alternative {
                    class: e.device_class_name.clone(),
                    count: count(&e.allocation_mode, e.count),
                    selectors: selectors(&e.selectors),
                }],
                (None, Some(subs)) => subs
                    .iter()
                    .map(|s| Alternative {
                        class: s.device_class_name.clone(),
                        count: count(&s.allocation_mode, s.count),
                        selectors: selectors(&s.selectors),
                    })
                    .collect(),
                (None, None) => Vec::new(),
            };
            Request {
                name: r.name.clone(),
                alternatives,
            }
        })
        .collect()
}

/// The check's answer: a refusal sentence, or admitted with warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Some node could serve every judged request at once.
    Servable {
        /// What was not judged, and why (for the admission warnings).
        warnings: Vec<String>,
    },
    /// No node could ever: the sentence.
    Refused(String),
}

/// A judged alternative: its candidates on one node.
struct Judged<'a> {
    claim: &'a str,
    request: &'a str,
    class: &'a str,
    count: Option<u32>,
}

/// Whether some node of `view` could serve all of `claims` at once; `whose` names the pod or VM.
pub fn judge(view: &DraView, whose: &str, claims: &[ClaimAsk]) -> Judgement {
    let mut warnings = Vec::new();
    // The single-alternative requests judged jointly, and the others alone.
    let mut joint: Vec<(Judged<'_>, &Alternative)> = Vec::new();
    let mut alone: Vec<(&ClaimAsk, &Request)> = Vec::new();
    for claim in claims {
        for request in &claim.requests {
            let judged: Vec<&Alternative> = request
                .alternatives
                .iter()
                .filter(|a| match judgeable(view, a) {
                    Ok(()) => true,
                    Err(why) => {
                        warnings.push(format!(
                            "{} request {}: not checked by nri-accel's webhook: {why}",
                            claim.label, request.name
                        ));
                        false
                    }
                })
                .collect();
            if judged.len() != request.alternatives.len() || judged.is_empty() {
                continue;
            }
            if judged.len() == 1 && judged[0].count.is_some() {
                joint.push((
                    Judged {
                        claim: &claim.label,
                        request: &request.name,
                        class: &judged[0].class,
                        count: judged[0].count,
                    },
                    judged[0],
                ));
            } else {
                alone.push((claim, request));
            }
        }
    }
    if joint.is_empty() && alone.is_empty() {
        return Judgement::Servable { warnings };
    }
    // Each request alone first: its own sentence when no node has enough for it.
    for (j, alt) in &joint {
        let asked = j.count.unwrap_or(1);
        let (best, node) = most_on_one_node(view, alt);
        if best < asked as usize {
            return Judgement::Refused(too_few(j, asked, best, node.as_deref(), view));
        }
    }
    for (claim, request) in &alone {
        let some = request
            .alternatives
            .iter()
            .any(|a| most_on_one_node(view, a).0 >= a.count.unwrap_or(1) as usize);
        if !some {
            return Judgement::Refused(format!(
                "{} request {}: no node publishes devices for any of its alternatives ({}); no node can ever allocate it",
                claim.label,
                request.name,
                request
                    .alternatives
                    .iter()
                    .map(|a| format!(
                        "{} of class {}",
                        a.count.map_or("all".to_string(), |c| c.to_string()),
                        a.class
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    // Then all together on one node.
    let total: u32 = joint.iter().map(|(j, _)| j.count.unwrap_or(0)).sum();
    let mut best_together = 0;
    for devices in view.nodes.values() {
        let served = served_together(view, devices, &joint);
        if served == total as usize {
            return Judgement::Servable { warnings };
        }
        best_together = best_together.max(served);
    }
    let names: Vec<String> = joint
        .iter()
        .map(|(j, _)| {
            format!(
                "{} request {} ({})",
                j.claim,
                j.request,
                j.count.unwrap_or(0)
            )
        })
        .collect();
    Judgement::Refused(format!(
        "{whose}: no one node can serve all its claims together ({}: {total} devices in all; the most any node can give them at once is {best_together}); a pod's claims are allocated on one node, so ask for fewer or split them across pods",
        names.join(", ")
    ))
}

/// Whether the check reads `alt`: its class is known, selects nri-accel's driver, and every
/// selector is CEL it evaluates.
fn judgeable(view: &DraView, alt: &Alternative) -> Result<(), String> {
    let Some(class) = view.classes.get(&alt.class) else {
        return Err(format!(
            "DeviceClass {} was not found (it may be created later)",
            alt.class
        ));
    };
    let driver = format!("\"{}\"", view.driver);
    if !class.iter().any(|s| s.contains(&driver)) {
        return Err(format!(
            "DeviceClass {} does not select driver {}",
            alt.class, view.driver
        ));
    }
    for s in class.iter().chain(&alt.selectors) {
        if let Err(e @ CelError::Unsupported(_)) = cel::supported(s) {
            return Err(e.to_string());
        }
    }
    Ok(())
}

/// Whether `device` is one `alt` could be given.
fn candidate(view: &DraView, alt: &Alternative, device: &SliceDevice) -> bool {
    let class = view.classes.get(&alt.class).map_or(&[][..], Vec::as_slice);
    class
        .iter()
        .chain(&alt.selectors)
        .all(|s| cel::matches(s, &device.cel) == Ok(true))
}

/// The most devices `alt` finds on one node, and that node.
fn most_on_one_node(view: &DraView, alt: &Alternative) -> (usize, Option<String>) {
    let mut best = (0, None);
    for (node, devices) in &view.nodes {
        let n = devices.iter().filter(|d| candidate(view, alt, d)).count();
        if n > best.0 {
            best = (n, Some(node.clone()));
        }
    }
    best
}

fn too_few(j: &Judged<'_>, asked: u32, best: usize, node: Option<&str>, view: &DraView) -> String {
    if best == 0 {
        let all: usize = view.nodes.values().map(Vec::len).sum();
        return format!(
            "{} request {}: no node publishes a device of class {} that its selectors match (the {} nodes publish {all} devices of driver {}); no node can ever allocate it",
            j.claim,
            j.request,
            j.class,
            view.nodes.len(),
            view.driver
        );
    }
    format!(
        "{} request {}: asks for {asked} devices of class {}, but the most any node publishes is {best} (node {}); ask for at most {best}",
        j.claim,
        j.request,
        j.class,
        node.unwrap_or("?")
    )
}

/// How many of the joint requests' devices one node could give at once: a maximum bipartite
/// matching of the requests' device slots to devices, where a whole device serves one slot
/// and a shared one serves one slot per request.
fn served_together(
    view: &DraView,
    devices: &[SliceDevice],
    joint: &[(Judged<'_>, &Alternative)],
) -> usize {
    // Right-hand vertices: whole devices once; shared devices once per request.
    let mut right: BTreeMap<(usize, Option<usize>), usize> = BTreeMap::new();
    let mut edges: Vec<Vec<usize>> = Vec::new();
    for (r, (j, alt)) in joint.iter().enumerate() {
        let mut targets = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            if candidate(view, alt, d) {
                let key = if d.exclusive { (i, None) } else { (i, Some(r)) };
                let next = right.len();
                targets.push(*right.entry(key).or_insert(next));
            }
        }
        for _ in 0..j.count.unwrap_or(0) {
            edges.push(targets.clone());
        }
    }
    let mut owner: Vec<Option<usize>> = vec![None; right.len()];
    let mut matched = 0;
    for slot in 0..edges.len() {
        let mut seen = vec![false; right.len()];
        if augment(slot, &edges, &mut owner, &mut seen) {
            matched += 1;
        }
    }
    matched
}

/// Kuhn's augmenting path from `slot`.
fn augment(
    slot: usize,
    edges: &[Vec<usize>],
    owner: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for &t in &edges[slot] {
        if seen[t] {
            continue;
        }
        seen[t] = true;
        if owner[t].is_none_or(|o| augment(o, edges, owner, seen)) {
            owner[t] = Some(slot);
            return true;
        }
    }
    false
}

#[cfg(test)]
#[path = "dra_tests.rs"]
mod tests;
