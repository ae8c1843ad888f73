//! How the pool's content is laid out in ResourceSlices, and which writes take the published
//! slices from what the API server has to what the content needs.
//!
//! Consumers use only the slices of a pool's highest generation, and only once they have seen
//! `resourceSliceCount` of them. So, as Kubernetes' own ResourceSlice controller does:
//! - a change that fits in ONE existing slice (a device added where there is room, removed,
//!   or changed) is written in place at the same generation: one write, atomic for consumers;
//! - any other change (more than one slice, a slice more or fewer) raises the generation and
//!   writes every slice: consumers ignore the old generation as soon as one new slice exists and
//!   wait until all are there, so they never see half a change.
//!
//! Devices stay in the slice they are in (a device's names are kept together when they fit), so
//! one device's change touches one slice. A rebuild packs the content afresh.

use k8s_openapi::api::resource::v1::{CounterSet, Device};
use serde::Serialize;

use super::limits::{
    MAX_CONSUMED_PER_SLICE, MAX_COUNTER_SETS, MAX_DEVICES, MAX_DEVICES_WITH_COUNTERS,
    MAX_OBJECT_NAME,
};
use super::{Entry, PoolContent};
use crate::names::{is_dns_subdomain, short_hash, truncate};

/// What one slice holds: devices or counter sets, never both.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Devices.
    Devices(Vec<Device>),
    /// Counter sets.
    Counters(Vec<CounterSet>),
}

impl Body {
    /// Devices in it.
    pub fn device_count(&self) -> usize {
        match self {
            Body::Devices(d) => d.len(),
            Body::Counters(_) => 0,
        }
    }

    /// Counter sets in it.
    pub fn counter_set_count(&self) -> usize {
        match self {
            Body::Devices(_) => 0,
            Body::Counters(c) => c.len(),
        }
    }
}

/// A slice as the API server has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Existing {
    /// Object name.
    pub name: String,
    /// Its resourceVersion (writes are conditional on it).
    pub resource_version: String,
    /// `spec.pool.name`.
    pub pool: String,
    /// `spec.pool.generation`.
    pub generation: i64,
    /// `spec.pool.resourceSliceCount`.
    pub count: i64,
    /// Its content; `None` when it holds both devices and counter sets (not ours to keep).
    pub body: Option<Body>,
}

impl Existing {
    /// The same slice without its content (`body: None`), to pair with a body known elsewhere.
    pub fn clone_meta(&self) -> Existing {
        Existing {
            name: self.name.clone(),
            resource_version: self.resource_version.clone(),
            pool: self.pool.clone(),
            generation: self.generation,
            count: self.count,
            body: None,
        }
    }
}

/// One API call; creates and replaces name a slice of [`Plan::slices`] by index.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Create slice `slice` of the plan.
    Create {
        /// Index into [`Plan::slices`].
        slice: usize,
    },
    /// Replace slice `slice` of the plan at its resourceVersion.
    Replace {
        /// Index into [`Plan::slices`].
        slice: usize,
        /// The version replaced.
        resource_version: String,
    },
    /// Delete a slice at its resourceVersion.
    Delete {
        /// Name.
        name: String,
        /// The version deleted.
        resource_version: String,
    },
}

/// What to write for one sync.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pool generation every written slice carries.
    pub generation: i64,
    /// Slices in the pool afterwards.
    pub count: usize,
    /// Whether the generation was raised (every slice rewritten).
    pub rebuilt: bool,
    /// The writes, in order.
    pub writes: Vec<Write>,
    /// The pool afterwards: slice names and contents.
    pub slices: Vec<(String, Body)>,
}

/// One slice of a plan, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SliceSummary {
    /// Object name.
    pub name: String,
    /// Devices in it.
    pub devices: usize,
    /// Counter sets in it.
    pub counter_sets: usize,
}

impl Plan {
    /// The pool's slices, for `status`.
    pub fn summary(&self) -> Vec<SliceSummary> {
        self.slices
            .iter()
            .map(|(name, body)| SliceSummary {
                name: name.clone(),
                devices: body.device_count(),
                counter_sets: body.counter_set_count(),
            })
            .collect()
    }
}

/// The start of the names of the node's slices: `<node>-<driver>`, or, when that would not
/// leave a DNS subdomain with room for a 30-character suffix, the node's first label (cut to
/// 40) and a hash of both.
pub fn name_base(node: &str, driver: &str) -> String {
    let base = format!("{node}-{driver}");
    let labels_ok = base.split('.').all(|l| l.len() + 30 <= 63);
    if base.len() + 30 <= MAX_OBJECT_NAME && labels_ok && is_dns_subdomain(&base) {
        return base;
    }
    let first = node.split('.').next().unwrap_or("");
    let first = truncate(first, 40).trim_end_matches('-');
    format!("{first}-{}", short_hash(&base))
}

/// The name of slice `index` of `driver` on `node` ([`name_base`] `-<index>`).
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{}-{index}", name_base(node, driver))
}

fn consumes(d: &Device) -> usize {
    d.consumes_counters
        .iter()
        .flatten()
        .map(|c| c.counters.len())
        .sum()
}

/// Whether `devices` fit in one slice (64 devices when any consumes counters or has a taint,
/// 128 otherwise).
fn fits(devices: &[&Device]) -> bool {
    let counted = devices
        .iter()
        .any(|d| consumes(d) > 0 || d.taints.as_ref().is_some_and(|t| !t.is_empty()));
    let limit = if counted {
        MAX_DEVICES_WITH_COUNTERS
    } else {
        MAX_DEVICES
    };
    devices.len() <= limit
        && devices.iter().map(|d| consumes(d)).sum::<usize>() <= MAX_CONSUMED_PER_SLICE
}

fn fits_with(current: &[Device], more: &[&Device]) -> bool {
    let all: Vec<&Device> = current.iter().chain(more.iter().copied()).collect();
    fits(&all)
}

/// Packs the content afresh: counter sets first (8 to a slice), then devices, a device's names
/// kept in one slice when they fit. Always at least one slice (an empty pool is one empty slice).
pub fn pack(content: &PoolContent) -> Vec<Body> {
    let mut bodies = Vec::new();
    for chunk in content.counter_sets.chunks(MAX_COUNTER_SETS) {
        bodies.push(Body::Counters(chunk.to_vec()));
    }
    let mut current: Vec<Device> = Vec::new();
    for group in groups(&content.devices) {
        let devices: Vec<&Device> = group.iter().map(|e| &e.device).collect();
        if !fits_with(&current, &devices) && !current.is_empty() {
            bodies.push(Body::Devices(std::mem::take(&mut current)));
        }
        for d in devices {
            if !fits_with(&current, &[d]) {
                bodies.push(Body::Devices(std::mem::take(&mut current)));
            }
            current.push(d.clone());
        }
    }
    if !current.is_empty() || bodies.is_empty() {
        bodies.push(Body::Devices(current));
    }
    bodies
}

/// Consecutive entries of one inventory device.
fn groups(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=entries.len() {
        if i == entries.len() || entries[i].group != entries[start].group {
            if start < i {
                out.push(&entries[start..i]);
            }
            start = i;
        }
    }
    out
}

/// The existing bodies changed to hold `content`, every device and counter set kept in its
/// slice; None when something new has no room (a rebuild is needed).
fn in_place(existing: &[Existing], content: &PoolContent) -> Option<Vec<Body>> {
    let wanted: std::collections::BTreeMap<&str, &Entry> = content
        .devices
        .iter()
        .map(|e| (e.device.name.as_str(), e))
        .collect();
    let rank: std::collections::BTreeMap<&str, usize> = content
        .devices
        .iter()
        .enumerate()
        .map(|(i, e)| (e.device.name.as_str(), i))
        .collect();
    let sets: std::collections::BTreeMap<&str, &CounterSet> = content
        .counter_sets
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    let mut bodies = Vec::with_capacity(existing.len());
    let mut placed = std::collections::BTreeSet::new();
    for e in existing {
        let body = match e.body.as_ref()? {
            // A name found twice (never written so by us) is kept where it is first seen.
            Body::Devices(ds) => Body::Devices(
                ds.iter()
                    .filter_map(|d| wanted.get(d.name.as_str()))
                    .filter(|e| placed.insert(e.device.name.clone()))
                    .map(|e| e.device.clone())
                    .collect(),
            ),
            Body::Counters(cs) => Body::Counters(
                cs.iter()
                    .filter_map(|c| sets.get(c.name.as_str()))
                    .filter(|c| placed.insert(format!("counters/{}", c.name)))
                    .map(|c| (*c).clone())
                    .collect(),
            ),
        };
        bodies.push(body);
    }
    for group in groups(&content.devices) {
        let new: Vec<&Entry> = group
            .iter()
            .filter(|e| !placed.contains(&e.device.name))
            .collect();
        if new.is_empty() {
            continue;
        }
        let sibling = |b: &Body| match b {
            Body::Devices(ds) => ds.iter().any(|d| {
                wanted
                    .get(d.name.as_str())
                    .is_some_and(|w| w.group == group[0].group)
            }),
            Body::Counters(_) => false,
        };
        let devices: Vec<&Device> = new.iter().map(|e| &e.device).collect();
        let target = bodies
            .iter()
            .position(|b| sibling(b) && matches!(b, Body::Devices(ds) if fits_with(ds, &devices)))
            .or_else(|| {
                bodies
                    .iter()
                    .position(|b| matches!(b, Body::Devices(ds) if fits_with(ds, &devices)))
            })?;
        if let Body::Devices(ds) = &mut bodies[target] {
            // In content order, so a device that leaves and comes back lands where it was.
            for d in devices {
                let at =
                    ds.partition_point(|x| rank.get(x.name.as_str()) < rank.get(d.name.as_str()));
                ds.insert(at, d.clone());
            }
        }
    }
    for set in &content.counter_sets {
        if placed.contains(&format!("counters/{}", set.name)) {
            continue;
        }
        let target = bodies
            .iter()
            .position(|b| matches!(b, Body::Counters(cs) if cs.len() < MAX_COUNTER_SETS))?;
        if let Body::Counters(cs) = &mut bodies[target] {
            cs.push(set.clone());
        }
    }
    // A device that changed in place may now consume counters its slice has no room for.
    let all_fit = bodies.iter().all(|b| match b {
        Body::Devices(ds) => fits(&ds.iter().collect::<Vec<_>>()),
        Body::Counters(_) => true,
    });
    all_fit.then_some(bodies)
}

/// The writes that take `existing` (the node's slices of this driver on the API server) to
/// `content` in pool `pool`, named for `node` and `driver`.
pub fn plan(
    existing: &[Existing],
    content: &PoolContent,
    node: &str,
    driver: &str,
    pool: &str,
) -> Plan {
    let generation = existing.iter().map(|e| e.generation).max().unwrap_or(0);
    let coherent = !existing.is_empty()
        && existing.iter().all(|e| {
            e.pool == pool
                && e.generation == generation
                && e.count == existing.len() as i64
                && e.body.is_some()
        });
    if coherent && let Some(bodies) = in_place(existing, content) {
        let changed: Vec<usize> = (0..existing.len())
            .filter(|&i| existing[i].body.as_ref() != Some(&bodies[i]))
            .collect();
        if changed.len() <= 1 {
            let writes = changed
                .iter()
                .map(|&i| Write::Replace {
                    slice: i,
                    resource_version: existing[i].resource_version.clone(),
                })
                .collect();
            return Plan {
                generation,
                count: existing.len(),
                rebuilt: false,
                writes,
                slices: existing
                    .iter()
                    .map(|e| e.name.clone())
                    .zip(bodies)
                    .collect(),
            };
        }
    }
    let bodies = pack(content);
    let slices: Vec<(String, Body)> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, b)| (slice_name(node, driver, i), b))
        .collect();
    let mut writes: Vec<Write> = slices
        .iter()
        .enumerate()
        .map(
            |(i, (name, _))| match existing.iter().find(|e| e.name == *name) {
                Some(e) => Write::Replace {
                    slice: i,
                    resource_version: e.resource_version.clone(),
                },
                None => Write::Create { slice: i },
            },
        )
        .collect();
    writes.extend(
        existing
            .iter()
            .filter(|e| !slices.iter().any(|(n, _)| *n == e.name))
            .map(|e| Write::Delete {
                name: e.name.clone(),
                resource_version: e.resource_version.clone(),
            }),
    );
    Plan {
        generation: generation + 1,
        count: slices.len(),
        rebuilt: true,
        writes,
        slices,
    }
}
