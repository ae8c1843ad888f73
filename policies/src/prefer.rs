//! Choosing among units someone else offers: the kubelet's GetPreferredAllocation asks which of
//! the devices it could give a container the node would pick.
//!
//! The answer follows the scoring a count claim gets ([`crate::Node::allocate`] with
//! [`crate::Ask::Count`]): keep every result on one NUMA node (the one of the units the answer
//! must include, else the least used node that has enough), then near the first result's PCIe
//! root, then on the least used device, then the unit that leaves the device's longest free run
//! (least fragmenting). Units the node already holds for some claim are never preferred: the
//! kubelet does not know about claims made through other doors.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::naming::{pci_distance, pci_root};
use crate::node::Node;
use crate::{Device, Unit};

/// One unit a caller could be given: a unit of a device of the pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Candidate {
    /// The device's id in the inventory.
    pub device_id: String,
    /// The part of the device.
    pub unit: Unit,
}

/// The units of one device as the choice sees them: which are taken, by anyone.
struct Slots<'a> {
    device: &'a Device,
    taken: Vec<bool>,
    used: u32,
    /// Candidates on this device not chosen yet, as (start, length, candidate).
    open: Vec<(u32, u32, &'a Candidate)>,
}

/// Where a unit lies among a device's `total` units, clipped to the device.
fn span(unit: &Unit, total: u32) -> (u32, u32) {
    let (start, len) = match unit {
        Unit::Whole => (0, total),
        Unit::Share { index, count } => (*index, *count),
        Unit::Slice { start, size, .. } => (*start, *size),
    };
    let start = start.min(total);
    (start, len.min(total - start))
}

impl Slots<'_> {
    fn is_free(&self, start: u32, len: u32) -> bool {
        len > 0
            && self.taken[start as usize..(start + len) as usize]
                .iter()
                .all(|t| !t)
    }

    fn take(&mut self, start: u32, len: u32) {
        for t in &mut self.taken[start as usize..(start + len) as usize] {
            *t = true;
        }
        self.used += len;
    }

    /// The longest run of free units if `start .. start + len` were taken too.
    fn longest_free_after(&self, start: u32, len: u32) -> u32 {
        let (mut best, mut run) = (0, 0);
        for (i, t) in self.taken.iter().enumerate() {
            let i = i as u32;
            if *t || (start..start + len).contains(&i) {
                run = 0;
            } else {
                run += 1;
                best = best.max(run);
            }
        }
        best
    }
}

impl Node {
    /// The units of pool `pool` the node would pick for one container that needs `size` of
    /// them, among `available`, always including `must_include` (the kubelet's
    /// GetPreferredAllocation). Pure: the node does not change.
    ///
    /// The answer holds every unit of `must_include` (once each) and then at most
    /// `size - must_include.len()` more from `available`; it is shorter when too few available
    /// units are free. Units of devices outside the pool, and units the node holds for any
    /// claim, are never picked from `available`. The order of `available` does not matter: the
    /// same set gives the same answer.
    pub fn preferred(
        &self,
        pool: &str,
        available: &[Candidate],
        must_include: &[Candidate],
        size: usize,
    ) -> Vec<Candidate> {
        let must: BTreeSet<&Candidate> = must_include.iter().collect();
        let mut chosen: Vec<Candidate> = must.iter().map(|c| (*c).clone()).collect();
        let Some(&p) = self.pool_index.get(pool) else {
            return chosen;
        };
        let policy = &self.pools[p].policy;
        let snapshot = policy.snapshot();
        let mut devices: BTreeMap<&str, Slots<'_>> = BTreeMap::new();
        for (d, snap) in policy.devices().iter().zip(&snapshot.devices) {
            let mut slots = Slots {
                device: d,
                taken: vec![false; snap.units_total as usize],
                used: 0,
                open: Vec::new(),
            };
            for h in &snap.held {
                let (start, len) = span(&h.unit, snap.units_total);
                slots.take(start, len);
            }
            devices.insert(d.id.as_str(), slots);
        }
        // The units the answer must hold are taken first, wherever they are.
        for c in &must {
            if let Some(s) = devices.get_mut(c.device_id.as_str()) {
                let (start, len) = span(&c.unit, s.taken.len() as u32);
                if s.is_free(start, len) {
                    s.take(start, len);
                }
            }
        }
        let offered: BTreeSet<&Candidate> =
            available.iter().filter(|c| !must.contains(c)).collect();
        for c in offered {
            if let Some(s) = devices.get_mut(c.device_id.as_str()) {
                let (start, len) = span(&c.unit, s.taken.len() as u32);
                if s.is_free(start, len) {
                    s.open.push((start, len, c));
                }
            }
        }
        let need = size.saturating_sub(chosen.len());
        if need == 0 {
            return chosen;
        }
        let first = must
            .iter()
            .find_map(|c| devices.get(c.device_id.as_str()).map(|s| s.device));
        let target = self.target_numa(&devices, first.and_then(|d| d.numa_node), need);
        let mut anchor: Option<String> = first
            .and_then(|d| d.pci_address.as_deref())
            .map(|a| pci_root(a).to_string());
        let order: Vec<&str> = devices.keys().copied().collect();
        for _ in 0..need {
            let best = order
                .iter()
                .enumerate()
                .filter_map(|(i, id)| devices.get(id).map(|s| (i, *id, s)))
                .filter(|(_, _, s)| s.open.iter().any(|(st, len, _)| s.is_free(*st, *len)))
                .min_by_key(|(i, _, s)| {
                    (
                        u8::from(target.is_some_and(|t| t != s.device.numa_node)),
                        pci_distance(anchor.as_deref(), s.device.pci_address.as_deref()),
                        s.used,
                        *i,
                    )
                })
                .map(|(_, id, _)| id);
            let Some(id) = best else {
                break;
            };
            let Some(s) = devices.get_mut(id) else {
                break;
            };
            let pick = s
                .open
                .iter()
                .enumerate()
                .filter(|(_, (st, len, _))| s.is_free(*st, *len))
                .min_by_key(|(_, (st, len, _))| (Reverse(s.longest_free_after(*st, *len)), *st))
                .map(|(k, _)| k);
            let Some(k) = pick else {
                break;
            };
            let (start, len, c) = s.open.swap_remove(k);
            s.take(start, len);
            if anchor.is_none() {
                anchor = s
                    .device
                    .pci_address
                    .as_deref()
                    .map(|a| pci_root(a).to_string());
            }
            chosen.push(c.clone());
        }
        chosen
    }

    /// The NUMA node to keep the picks on: `near` (the units the answer must hold) if it has
    /// `need` free candidates, else the least used node that has, as a count claim chooses.
    fn target_numa(
        &self,
        devices: &BTreeMap<&str, Slots<'_>>,
        near: Option<u32>,
        need: usize,
    ) -> Option<Option<u32>> {
        let mut groups: BTreeMap<Option<u32>, (usize, u64)> = BTreeMap::new();
        for s in devices.values() {
            let g = groups.entry(s.device.numa_node).or_default();
            g.0 += s.open.len();
            g.1 += u64::from(s.used);
        }
        match near {
            Some(n) if groups.get(&Some(n)).is_some_and(|g| g.0 >= need) => Some(Some(n)),
            _ => groups
                .iter()
                .filter(|(_, g)| g.0 >= need)
                .min_by_key(|(numa, g)| (g.1, **numa))
                .map(|(numa, _)| *numa),
        }
    }
}
